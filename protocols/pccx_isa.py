"""The pccx v002 64-bit instruction set: exact encode / decode, disassembler and assembler.

Source of every bit position: reference/pccx.md §1.1-§1.4 (from
``v002:LLM/rtl/packages/isa/isa_pkg.sv`` and the Sail model).

* word = opcode ``[63:60]`` + 60-bit body ``[59:0]``;
* opcodes: GEMV 0, GEMM 1, MEMCPY 2, MEMSET 3, CVO 4; 5-15 reserved (§1.1);
* body layouts (§1.2, absolute word bits; flag sub-fields are named as in the
  reference: ``findemax``/``accm``/``w_scale`` and ``sub_emax``/``recip_scale``/``accm``);
* CVO function codes (§1.3) and the 8-bit memory routes (§1.4).

Text form (``emu pccx disasm`` / ``emu pccx asm``): one instruction per line, the
mnemonic then ``field=value`` pairs in layout order, values in decimal::

    GEMV dest_reg=64 src_addr=0 findemax=0 accm=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0 parallel_lane=4

The assembler accepts exactly that (fields in any order, missing fields = 0,
values decimal or ``0x`` hex, ``cvo_func`` may also be a function name; ``#``
starts a comment).  Reserved fields are never printed; a word with a reserved
opcode, non-zero reserved bits or an undefined enumerated value (MEMSET
``dest_cache`` 2/3, CVO function 8-15) is rejected by :func:`decode` with
:class:`IsaError` (the Sail model's architectural error, §1.7); ``decode(...,
strict=False)`` returns what the RTL decoder would see instead (an unknown opcode
gives ``None``: the RTL drops it silently).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "OPCODES", "MNEMONICS", "LAYOUTS", "CVO_FUNCS", "CVO_NAMES", "ROUTES", "KICK_WORD",
    "IsaError", "Instr", "encode", "decode", "disasm", "disasm_word", "assemble_line", "assemble",
    "memcpy_route", "CVO_EXT_FUNCS", "ERR_RESERVED_OPCODE", "ERR_RESERVED_BITS", "ERR_UNDEFINED_VALUE",
    "ERR_L2_RANGE", "ERR_CVO_LENGTH", "ERROR_NAMES",
]

OPCODES = {"GEMV": 0x0, "GEMM": 0x1, "MEMCPY": 0x2, "MEMSET": 0x3, "CVO": 0x4}
MNEMONICS = {v: k for k, v in OPCODES.items()}

#: the "kick" marker pushed by an AXI-Lite write to 0x008 (reference §1.5 item 1);
#: it decodes as opcode 0x8 and the RTL decoder drops it.
KICK_WORD = 0x8000_0000_0000_0000

_GEMX = [  # GEMV_op_x64_t; GEMM_op_x64_t is a typedef of it (§1.2)
    ("dest_reg", 59, 43), ("src_addr", 42, 26),
    ("findemax", 25, 25), ("accm", 24, 24), ("w_scale", 23, 23), ("_rsv_flags", 22, 20),
    ("size_ptr_addr", 19, 14), ("shape_ptr_addr", 13, 8), ("parallel_lane", 7, 3), ("_rsv", 2, 0),
]

#: field layouts ``(name, hi, lo)`` per mnemonic; names starting with ``_`` are reserved (must be 0)
LAYOUTS: dict[str, list[tuple[str, int, int]]] = {
    "GEMV": _GEMX,
    "GEMM": _GEMX,
    "MEMCPY": [
        ("from_device", 59, 59), ("to_device", 58, 58), ("dest_addr", 57, 41), ("src_addr", 40, 24),
        ("aux_addr", 23, 7), ("shape_ptr_addr", 6, 1), ("async", 0, 0),
    ],
    "MEMSET": [
        ("dest_cache", 59, 58), ("dest_addr", 57, 52), ("a_value", 51, 36), ("b_value", 35, 20),
        ("c_value", 19, 4), ("_rsv", 3, 0),
    ],
    "CVO": [
        ("cvo_func", 59, 56), ("src_addr", 55, 39), ("dst_addr", 38, 22), ("length", 21, 6),
        ("sub_emax", 5, 5), ("recip_scale", 4, 4), ("accm", 3, 3), ("_rsv", 2, 1), ("async", 0, 0),
    ],
}

#: CVO function codes (§1.3); 0x8-0xF reserved
CVO_FUNCS = {"EXP": 0x0, "SQRT": 0x1, "GELU": 0x2, "SIN": 0x3, "COS": 0x4, "REDUCE_SUM": 0x5, "SCALE": 0x6,
             "RECIP": 0x7}
CVO_NAMES = {v: k for k, v in CVO_FUNCS.items()}
#: what-if SFU functions a profile may enable (``cvo.tanh``); not in the real CVO (reference §1.3)
CVO_EXT_FUNCS = {"TANH": 0x8}

#: 8-bit data routes {source[7:4], dest[3:0]} (§1.4)
ROUTES = {"HOST_TO_L2": 0x01, "L2_TO_HOST": 0x10, "L2_TO_GEMM_L1": 0x12, "L2_TO_GEMV_L1": 0x13,
          "L2_TO_CVO": 0x14, "GEMM_TO_L2": 0x21, "GEMV_TO_L2": 0x31, "CVO_TO_L2": 0x41}

# error classes = the status-word error codes of actors/pccx (all of them, in this one place; the ERROR
# bit and the code field are emulator additions, see actors/pccx/frontend.py)
ERR_RESERVED_OPCODE = 1
ERR_RESERVED_BITS = 2
ERR_UNDEFINED_VALUE = 2   # an undefined enumerated value is a reserved encoding: same class
ERR_L2_RANGE = 3          # Global Scheduler / dispatcher: an L2 base address >= l2.words
ERR_CVO_LENGTH = 4        # Global Scheduler: CVO length > cvo.max_length
ERROR_NAMES = {ERR_RESERVED_OPCODE: "reserved opcode", ERR_RESERVED_BITS: "reserved bits/value",
               ERR_L2_RANGE: "L2 address out of range", ERR_CVO_LENGTH: "CVO length > max"}


class IsaError(ValueError):
    """A word or a line that is not a legal instruction; ``code`` is the error class."""

    def __init__(self, text: str, code: int = ERR_RESERVED_BITS):
        super().__init__(text)
        self.code = code


@dataclass(frozen=True)
class Instr:
    """A decoded instruction: mnemonic and its (non-reserved) fields."""

    op: str
    fields: dict = field(default_factory=dict)

    @property
    def opcode(self) -> int:
        return OPCODES[self.op]

    def __getitem__(self, name: str) -> int:
        return self.fields[name]

    def __str__(self) -> str:
        return disasm(self)


def _width(hi: int, lo: int) -> int:
    return hi - lo + 1


def encode(op: str, **fields: int) -> int:
    """The 64-bit word of ``op`` with ``fields`` (missing fields are 0); range-checked."""
    op = op.upper()
    if op not in OPCODES:
        raise IsaError(f"unknown mnemonic {op!r} (known: {', '.join(OPCODES)})", ERR_RESERVED_OPCODE)
    layout = LAYOUTS[op]
    names = {n for n, _, _ in layout if not n.startswith("_")}
    for name in fields:
        if name not in names:
            raise IsaError(f"{op} has no field {name!r} (fields: {', '.join(n for n, _, _ in layout if n in names)})")
    word = OPCODES[op] << 60
    for name, hi, lo in layout:
        if name.startswith("_"):
            continue
        value = fields.get(name, 0)
        if not isinstance(value, int):
            raise IsaError(f"{op}.{name}: expected an integer, found {value!r}")
        value = int(value)
        w = _width(hi, lo)
        if not 0 <= value < (1 << w):
            raise IsaError(f"{op}.{name}={value} does not fit in {w} bit(s) [{hi}:{lo}] (0..{(1 << w) - 1})")
        word |= value << lo
    return word


def decode(word: int, *, strict: bool = True, cvo_ext: frozenset = frozenset()) -> Instr | None:
    """Decode a 64-bit word.

    ``strict``: reserved opcode, non-zero reserved bits, MEMSET ``dest_cache`` 2/3
    and CVO functions 8-15 raise :class:`IsaError` (``cvo_ext``: extension codes of
    CVO_EXT_FUNCS the machine has, accepted).  Not strict (the RTL): a
    reserved opcode returns ``None`` (dropped), reserved bits are ignored.
    """
    if not isinstance(word, int) or not 0 <= word < (1 << 64):
        raise IsaError(f"not a 64-bit word: {word!r}", ERR_RESERVED_BITS)
    opcode = word >> 60
    op = MNEMONICS.get(opcode)
    if op is None:
        if strict:
            raise IsaError(f"reserved opcode 0x{opcode:X}", ERR_RESERVED_OPCODE)
        return None
    fields = {}
    for name, hi, lo in LAYOUTS[op]:
        value = (word >> lo) & ((1 << _width(hi, lo)) - 1)
        if name.startswith("_"):
            if value and strict:
                raise IsaError(f"{op}: reserved bits [{hi}:{lo}] = 0b{value:0{_width(hi, lo)}b}, must be 0",
                               ERR_RESERVED_BITS)
            continue
        fields[name] = value
    if strict:
        if op == "MEMSET" and fields["dest_cache"] > 1:
            raise IsaError(f"MEMSET: dest_cache={fields['dest_cache']} is undefined (0 fmap_shape, 1 weight_shape)",
                           ERR_UNDEFINED_VALUE)
        if op == "CVO" and fields["cvo_func"] not in CVO_NAMES and fields["cvo_func"] not in cvo_ext:
            raise IsaError(f"CVO: cvo_func={fields['cvo_func']} is reserved (0-7 defined)", ERR_UNDEFINED_VALUE)
    return Instr(op, fields)


def disasm(instr: Instr) -> str:
    """The text line of a decoded instruction."""
    return " ".join([instr.op] + [f"{k}={v}" for k, v in instr.fields.items()])


def disasm_word(word: int) -> str:
    """One line for ``word``: the instruction, or ``error: 0x...: <reason>`` (never raises)."""
    try:
        return disasm(decode(word, strict=True))
    except IsaError as e:
        return f"error: 0x{word:016X}: {e}" if isinstance(word, int) and word >= 0 else f"error: {e}"


_PAIR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S+)$")


def assemble_line(text: str) -> int | None:
    """The word of one text line (``None`` for a blank or comment line); :class:`IsaError` if malformed."""
    text = text.split("#", 1)[0].strip()
    if not text:
        return None
    parts = text.split()
    op = parts[0].upper()
    if op not in OPCODES:
        raise IsaError(f"unknown mnemonic {parts[0]!r} (known: {', '.join(OPCODES)})", ERR_RESERVED_OPCODE)
    fields = {}
    for tok in parts[1:]:
        m = _PAIR.match(tok)
        if not m:
            raise IsaError(f"expected field=value, found {tok!r}")
        name, raw = m.group(1), m.group(2)
        if name in fields:
            raise IsaError(f"field {name!r} given twice")
        if op == "CVO" and name == "cvo_func" and raw.upper() in CVO_FUNCS:
            fields[name] = CVO_FUNCS[raw.upper()]
            continue
        try:
            fields[name] = int(raw, 0)
        except ValueError:
            raise IsaError(f"{name}: expected a decimal or 0x-hex integer, found {raw!r}") from None
    word = encode(op, **fields)
    decode(word, strict=True)  # undefined enumerated values are errors in text too
    return word


def assemble(text: str) -> list[int]:
    """Words of a multi-line program; errors name the line number."""
    words = []
    for i, line in enumerate(text.splitlines(), 1):
        try:
            w = assemble_line(line)
        except IsaError as e:
            raise IsaError(f"line {i}: {e}", e.code) from None
        if w is not None:
            words.append(w)
    return words


#: GEMV ``parallel_lane`` bit 4: head parallelism (pccx docs gemv_core.rst §4: the field "selects the number of
#: active cores and the partition axis"; which bit is an ASSUMPTION); bits [3:0]: lanes used (1..lanes, else all)
HEAD_AXIS = 0x10


def gemv_mode(parallel_lane: int, lanes: int, head_parallel: bool) -> tuple[bool, int]:
    """(head-parallel?, lanes used) of a GEMV's ``parallel_lane`` on a machine of ``lanes`` lanes that has
    (``head_parallel``) or lacks the head axis (the RTL: bit 4 then means nothing)."""
    n = parallel_lane & 0xF
    return bool(head_parallel and parallel_lane & HEAD_AXIS), (n if 1 <= n <= lanes else lanes)


def memcpy_route(from_device: int, to_device: int) -> int:
    """The RTL's MEMCPY translation (§1.4): (from=HOST, to=NPU) -> 0x01, every other combination -> 0x10."""
    return ROUTES["HOST_TO_L2"] if (from_device, to_device) == (1, 0) else ROUTES["L2_TO_HOST"]

"""pccx v002 ISA codec: round trip over every field, known vectors from reference §1.2, text form, CLI."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import pccx_isa as isa

# (name, hi, lo) written out again from reference/pccx.md §1.2, independently of the codec's tables
REF = {
    "GEMV": [("dest_reg", 59, 43), ("src_addr", 42, 26), ("findemax", 25, 25), ("accm", 24, 24),
             ("w_scale", 23, 23), ("size_ptr_addr", 19, 14), ("shape_ptr_addr", 13, 8), ("parallel_lane", 7, 3)],
    "MEMCPY": [("from_device", 59, 59), ("to_device", 58, 58), ("dest_addr", 57, 41), ("src_addr", 40, 24),
               ("aux_addr", 23, 7), ("shape_ptr_addr", 6, 1), ("async", 0, 0)],
    "MEMSET": [("dest_cache", 59, 58), ("dest_addr", 57, 52), ("a_value", 51, 36), ("b_value", 35, 20),
               ("c_value", 19, 4)],
    "CVO": [("cvo_func", 59, 56), ("src_addr", 55, 39), ("dst_addr", 38, 22), ("length", 21, 6),
            ("sub_emax", 5, 5), ("recip_scale", 4, 4), ("accm", 3, 3), ("async", 0, 0)],
}
REF["GEMM"] = REF["GEMV"]
OPC = {"GEMV": 0, "GEMM": 1, "MEMCPY": 2, "MEMSET": 3, "CVO": 4}
# legal value ranges narrower than the bit width (undefined encodings are errors in strict decode)
LIMIT = {("MEMSET", "dest_cache"): 1, ("CVO", "cvo_func"): 7}


def ref_word(op, fields):
    w = OPC[op] << 60
    for name, hi, lo in REF[op]:
        w |= fields.get(name, 0) << lo
    return w


@st.composite
def instructions(draw):
    op = draw(st.sampled_from(sorted(REF)))
    fields = {name: draw(st.integers(0, LIMIT.get((op, name), (1 << (hi - lo + 1)) - 1)))
              for name, hi, lo in REF[op]}
    return op, fields


@settings(max_examples=400, deadline=None)
@given(instructions())
def test_round_trip_every_field(ins):
    op, fields = ins
    word = isa.encode(op, **fields)
    assert word == ref_word(op, fields)
    d = isa.decode(word)
    assert d.op == op and d.fields == fields
    line = isa.disasm(d)
    assert isa.assemble_line(line) == word
    assert isa.disasm_word(word) == line


@settings(max_examples=200, deadline=None)
@given(st.integers(0, (1 << 64) - 1))
def test_any_word_decodes_or_errors_cleanly(word):
    try:
        d = isa.decode(word)
    except isa.IsaError as e:
        assert isa.disasm_word(word).startswith("error: 0x")
        assert e.code in (isa.ERR_RESERVED_OPCODE, isa.ERR_RESERVED_BITS)
    else:
        assert isa.encode(d.op, **d.fields) == word   # strict decode only accepts canonical words
    lenient = isa.decode(word, strict=False)
    assert lenient is None or lenient.op in OPC


def test_known_vectors_from_reference():
    # one bit per field, at the positions of reference §1.2
    assert isa.encode("GEMV", dest_reg=1) == 1 << 43
    assert isa.encode("GEMV", src_addr=1) == 1 << 26
    assert isa.encode("GEMV", findemax=1) == 1 << 25
    assert isa.encode("GEMV", accm=1) == 1 << 24
    assert isa.encode("GEMV", w_scale=1) == 1 << 23
    assert isa.encode("GEMV", size_ptr_addr=1) == 1 << 14
    assert isa.encode("GEMV", shape_ptr_addr=1) == 1 << 8
    assert isa.encode("GEMV", parallel_lane=1) == 1 << 3
    assert isa.encode("GEMM") == 0x1000_0000_0000_0000
    assert isa.encode("GEMV", dest_reg=0x1FFFF) == 0x0FFF_F800_0000_0000
    assert isa.encode("MEMCPY", from_device=1) == 0x2800_0000_0000_0000
    assert isa.encode("MEMCPY", to_device=1) == 0x2400_0000_0000_0000
    assert isa.encode("MEMCPY", dest_addr=1) == 0x2000_0200_0000_0000
    assert isa.encode("MEMCPY", src_addr=1, aux_addr=1, shape_ptr_addr=1, **{"async": 1}) == \
        0x2000_0000_0000_0000 | 1 << 24 | 1 << 7 | 1 << 1 | 1
    assert isa.encode("MEMSET", dest_cache=1, dest_addr=63) == 0x3000_0000_0000_0000 | 1 << 58 | 63 << 52
    assert isa.encode("MEMSET", a_value=0xFFFF, b_value=1, c_value=2) == \
        0x3000_0000_0000_0000 | 0xFFFF << 36 | 1 << 20 | 2 << 4
    assert isa.encode("CVO", cvo_func=isa.CVO_FUNCS["REDUCE_SUM"]) == 0x4500_0000_0000_0000
    assert isa.encode("CVO", length=2048, sub_emax=1, recip_scale=1, accm=1, **{"async": 1}) == \
        0x4000_0000_0000_0000 | 2048 << 6 | 1 << 5 | 1 << 4 | 1 << 3 | 1
    assert isa.CVO_FUNCS == {"EXP": 0, "SQRT": 1, "GELU": 2, "SIN": 3, "COS": 4, "REDUCE_SUM": 5, "SCALE": 6,
                             "RECIP": 7}
    assert isa.ROUTES["HOST_TO_L2"] == 0x01 and isa.ROUTES["L2_TO_HOST"] == 0x10 and isa.ROUTES["CVO_TO_L2"] == 0x41
    # RTL MEMCPY translation: only (HOST -> NPU) is 0x01, everything else 0x10 (reference §1.4)
    assert isa.memcpy_route(1, 0) == 0x01
    assert {isa.memcpy_route(f, t) for f, t in ((0, 0), (0, 1), (1, 1))} == {0x10}


@pytest.mark.parametrize("word, code, needle", [
    (0x5000_0000_0000_0000, isa.ERR_RESERVED_OPCODE, "reserved opcode 0x5"),
    (isa.KICK_WORD, isa.ERR_RESERVED_OPCODE, "reserved opcode 0x8"),
    (0xF000_0000_0000_0000, isa.ERR_RESERVED_OPCODE, "reserved opcode 0xF"),
    (0x0000_0000_0010_0000, isa.ERR_RESERVED_BITS, "reserved bits [22:20]"),
    (0x1000_0000_0000_0001, isa.ERR_RESERVED_BITS, "reserved bits [2:0]"),
    (0x3000_0000_0000_0008, isa.ERR_RESERVED_BITS, "reserved bits [3:0]"),
    (0x4000_0000_0000_0002, isa.ERR_RESERVED_BITS, "reserved bits [2:1]"),
    (0x3800_0000_0000_0000, isa.ERR_UNDEFINED_VALUE, "dest_cache=2"),
    (0x4900_0000_0000_0000, isa.ERR_UNDEFINED_VALUE, "cvo_func=9"),
])
def test_strict_rejects_and_rtl_view(word, code, needle):
    with pytest.raises(isa.IsaError) as e:
        isa.decode(word)
    assert e.value.code == code and needle in str(e.value)
    line = isa.disasm_word(word)
    assert line.startswith(f"error: 0x{word:016X}: ") and needle in line
    lenient = isa.decode(word, strict=False)
    assert (lenient is None) == (code == isa.ERR_RESERVED_OPCODE)


def test_assembler_errors_and_forms():
    assert isa.assemble_line("  # only a comment") is None
    assert isa.assemble_line("cvo cvo_func=scale length=0x10 async=1  # softmax") == \
        isa.encode("CVO", cvo_func=6, length=16, **{"async": 1})
    with pytest.raises(isa.IsaError, match="does not fit in 17 bit"):
        isa.assemble_line("GEMV dest_reg=131072")
    with pytest.raises(isa.IsaError, match="has no field 'lenght'"):
        isa.assemble_line("CVO lenght=3")
    with pytest.raises(isa.IsaError, match="unknown mnemonic 'NOP'"):
        isa.assemble_line("NOP")
    with pytest.raises(isa.IsaError, match="line 2: expected field=value"):
        isa.assemble("MEMSET a_value=1\nMEMSET a_value 1\n")
    with pytest.raises(isa.IsaError, match="cvo_func=12 is reserved"):
        isa.assemble_line("CVO cvo_func=12")


def test_cli_disasm_and_asm(emu, tmp_path):
    w1 = isa.encode("GEMV", dest_reg=64, src_addr=0, w_scale=1, size_ptr_addr=1, parallel_lane=4)
    w2 = isa.encode("CVO", cvo_func=6, src_addr=4161, dst_addr=4176, length=65, recip_scale=1)
    p = emu("pccx", "disasm", f"0x{w1:016X}", f"{w2:x}", check=0)
    lines = p.stdout.splitlines()
    assert lines == [isa.disasm(isa.decode(w1)), isa.disasm(isa.decode(w2))]
    assert lines[1].startswith("CVO cvo_func=6 src_addr=4161 dst_addr=4176 length=65 sub_emax=0 recip_scale=1")
    src = tmp_path / "prog.txt"
    src.write_text(p.stdout)
    a = emu("pccx", "asm", str(src), check=0)
    assert a.stdout.split() == [f"0x{w1:016X}", f"0x{w2:016X}"]
    bad = emu("pccx", "disasm", "0x5000000000000000", "zz", check=2)
    assert bad.stdout.splitlines() == ["error: 0x5000000000000000: reserved opcode 0x5",
                                       "error: 'zz' is not a hexadecimal word"]
    assert "Traceback" not in bad.stderr
    src.write_text("GEMV dest_reg=1\nGEMV flags=3\n")
    e = emu("pccx", "asm", str(src), check=2)
    assert "line 2" in e.stderr and "Traceback" not in e.stderr

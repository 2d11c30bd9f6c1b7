"""``emu pccx``: the pccx v002 ISA on the command line.

* ``emu pccx disasm WORD...`` — hex words (``0x`` optional, ``_`` allowed) -> one line
  each: the mnemonic and ``field=value`` pairs (protocols/pccx_isa.py); an illegal
  word prints ``error: 0x...: <reason>`` and the exit status is 2 (bad input).
* ``emu pccx asm FILE|-`` — that text (one instruction per line, ``#`` comments)
  -> one ``0x%016X`` word per line; errors name the line, exit status 2.
"""
from __future__ import annotations

import sys

from protocols import pccx_isa as isa

__all__ = ["add_parser"]


def cmd_disasm(args) -> int:
    status = 0
    for tok in args.words:
        try:
            word = int(tok.replace("_", ""), 16)
        except ValueError:
            print(f"error: {tok!r} is not a hexadecimal word")
            status = 2
            continue
        if not 0 <= word < 1 << 64:
            print(f"error: {tok!r} does not fit in 64 bits")
            status = 2
            continue
        line = isa.disasm_word(word)
        if line.startswith("error:"):
            status = 2
        print(line)
    return status


def cmd_asm(args) -> int:
    from emulator.schema import SchemaError, decode_text, read_text

    try:   # the input limits of every file the tool reads (size, UTF-8, no NUL)
        text = (decode_text(sys.stdin.buffer.read(), "<stdin>", what="a UTF-8 .pasm program") if args.file == "-"
                else read_text(args.file, what="a UTF-8 .pasm program"))
    except SchemaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        words = isa.assemble(text)
    except isa.IsaError as e:
        print(f"error: {args.file}: {e}", file=sys.stderr)
        return 2
    for w in words:
        print(f"0x{w:016X}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("pccx", help="pccx v002 ISA tools (disasm, asm)")
    psub = p.add_subparsers(dest="pccx_cmd", required=True)
    d = psub.add_parser("disasm", help="disassemble 64-bit instruction words (hex)")
    d.add_argument("words", nargs="+", metavar="WORD")
    d.set_defaults(func=cmd_disasm)
    a = psub.add_parser("asm", help="assemble the disasm text form into hex words")
    a.add_argument("file", metavar="FILE|-")
    a.set_defaults(func=cmd_asm)

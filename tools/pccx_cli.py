"""``emu pccx``: the pccx v002 ISA on the command line.

* ``emu pccx disasm WORD...`` — hex words (``0x`` optional, ``_`` allowed) -> one line
  each: the mnemonic and ``field=value`` pairs (protocols/pccx_isa.py); an illegal
  word prints ``error: 0x...: <reason>`` and the exit status is 2 (bad input).
* ``emu pccx asm FILE|-`` — that text (one instruction per line, ``#`` comments)
  -> one ``0x%016X`` word per line; errors name the line, exit status 2.
* ``emu pccx compile CONFIG [-o prog.pasm] [--profile P] [--context N] [--tokens N]`` —
  compile a Gemma 3N config (scenarios/pccx/gemma3n/models/CONFIG.yaml or a path) into
  the ``.pasm`` text form (instructions + ``stream``/``wait``/``host`` driver directives
  as comments) and print the per-stage instruction count.
"""
from __future__ import annotations

import argparse
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


def cmd_compile(args) -> int:
    from collections import Counter

    from actors.pccx.gemma3n.compiler import STAGES, CompileError, Compiler
    from actors.pccx.gemma3n.config import load_config
    from actors.pccx.gemv import MULTICAST
    from actors.pccx.profile import load_profile
    from emulator.errors import EmulatorError

    try:
        c = load_config(args.config)
        comp = Compiler(c, load_profile(args.profile), prefetch=not args.no_prefetch,
                        ple_overlap=not args.no_ple_overlap)
        for _ in range(args.context):
            comp.ring.append()
        steps = comp.setup()
        for t in range(args.context, args.context + args.tokens):
            steps += comp.token(t)
    except (CompileError, EmulatorError, OSError) as e:
        print(f"error: {args.config}: {e}", file=sys.stderr)
        return 2
    lines = [f"# {c['name']} on {args.profile}: {args.tokens} token(s) after {args.context} context positions",
             f"# emu pccx compile {args.config}; stages per instruction in the trailing comment"]
    seq = 0
    for st in steps:
        if st[0] == "push":
            tok, layer, stage = comp.where[seq]
            lines.append(f"{isa.disasm_word(st[1])}   # t{tok} L{layer} {stage}")
            seq += 1
        elif st[0] == "hp":
            dest = st[5] if len(st) > 5 else 0
            to = f"lanes=0x{dest & 0xF:X}" if dest & MULTICAST else f"lane={dest}"
            lines.append(f"# stream port={st[1]} id={st[2]} ddr=0x{st[3]:X} bytes={st[4]} {to}"
                         + (f" for=#{st[6]}" if len(st) > 6 and st[6] >= 0 else ""))
        elif st[0] == "wait":
            lines.append(f"wait {st[1]}")
        elif st[0] == "host":
            lines.append(f"# host {st[1]} {st[2]} ps")
        elif st[0] == "mark" and st[1] == "prefetch":
            lines.append(f"# prefetch stream {st[2]['stream']} ({st[2]['bytes']} bytes) issued here")
        elif st[0] == "mark":
            lines.append(f"# {st[1]} " + " ".join(f"{k}={v}" for k, v in st[2].items()))
        else:
            lines.append(f"# {' '.join(map(str, st))}")
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    per = Counter()
    for (stage, op), n in comp.counts.items():
        per[stage] += n
    print(f"{'stage':16s} {'instr':>7s}  GEMV  GEMM MEMCPY MEMSET  CVO")
    for stage in STAGES:
        if per[stage]:
            ops = [comp.counts.get((stage, op), 0) for op in ("GEMV", "GEMM", "MEMCPY", "MEMSET", "CVO")]
            print(f"{stage:16s} {per[stage]:7d} " + " ".join(f"{n:5d}" for n in ops))
    hp, kv = comp.weight_bytes_per_token() // args.tokens, comp.kv_bytes // args.tokens
    print(f"{'total':16s} {sum(per.values()):7d}   HP bytes/token {hp} (weights {hp - kv}, KV {kv}; KV read once "
          f"{comp.kv_once // args.tokens})  L2 words used {comp.l2.used_words()} of {comp.l2.words}  host DDR "
          f"{comp.ddr.top} bytes")
    return 0


def _count(minimum: int):
    """argparse type: an integer >= ``minimum`` (a clear usage error otherwise, never a traceback)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{n} is below {minimum}")
        return n
    return parse


def add_parser(sub) -> None:
    p = sub.add_parser("pccx", help="pccx v002 ISA tools (disasm, asm, compile)")
    psub = p.add_subparsers(dest="pccx_cmd", required=True)
    d = psub.add_parser("disasm", help="disassemble 64-bit instruction words (hex)")
    d.add_argument("words", nargs="+", metavar="WORD", help="64-bit instruction words (0x... hex)")
    d.set_defaults(func=cmd_disasm)
    a = psub.add_parser("asm", help="assemble the disasm text form into hex words")
    a.add_argument("file", metavar="FILE|-", help="the disasm text form, one instruction a line (-: standard input)")
    a.set_defaults(func=cmd_asm)
    c = psub.add_parser("compile", help="compile a Gemma 3N config into a pccx program (.pasm text)")
    c.add_argument("config", metavar="CONFIG", help="a Gemma 3N model config (scenarios/pccx/gemma3n/models/*.yaml)")
    c.add_argument("-o", "--output", metavar="PASM", help="write the program here (default: standard output)")
    c.add_argument("--profile", default="pccx-v002-documented", help="the pccx machine profile it is compiled for")
    c.add_argument("--context", type=_count(0), default=0, help="positions already in the KV ring")
    c.add_argument("--tokens", type=_count(1), default=1, help="decode tokens to compile")
    c.add_argument("--no-prefetch", action="store_true", help="seed §3.2 rule 1 off")
    c.add_argument("--no-ple-overlap", action="store_true", help="seed §3.2 rule 3 off (PLE injection serialised)")
    c.set_defaults(func=cmd_compile)

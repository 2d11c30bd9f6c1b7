"""``emu trace``: tools over binary traces (perfetto, chakra, summary, diff, replay).

This module only parses the command line and prints; the work is done in
``tools/trace/perfetto.py``, ``tools/trace/summary.py``, ``tools/trace/diff.py`` and
``tools/trace/replay.py`` so that tests and notebooks can call it directly.  Every
user error (missing or corrupt file, bad filter, unknown actor) is a clear
one-line message with a non-zero exit status, never a traceback.

Exit status: 0 ok / identical / replay matches, 1 differs / diverges / tool error,
2 bad input (a missing or corrupt trace file: the ValueError reaches tools/cli.py),
2 bad usage.
"""
from __future__ import annotations

import json
import os
import sys

from emulator.input_paths import add_allow_path_argument
from emulator.trace import KIND_CODES, read_trace
from emulator.units import UnitError, parse_time

__all__ = ["add_parser", "main"]


def add_parser(sub) -> None:
    t = sub.add_parser("trace", help="tools over traces: perfetto, chakra, summary, diff, replay")
    t.set_defaults(func=main)
    ts = t.add_subparsers(dest="trace_cmd", required=True)

    p = ts.add_parser("perfetto", help="export for ui.perfetto.dev: Perfetto protobuf (default) or trace-event JSON")
    p.add_argument("trace", help="a binary trace (.emutrace)")
    p.add_argument("-o", "--out", help="output file (default: TRACE with .pftrace, or .json with --format json)")
    p.add_argument("--format", choices=["proto", "json"], default=None,
                   help="proto: native Perfetto protobuf, names interned (default; .json outputs default to json)")
    p.add_argument("--actors", action="append", default=[], metavar="GLOB",
                   help="keep only actors matching GLOB (repeatable); messages need both ends kept; "
                        "default: every actor")
    p.add_argument("--kinds", action="append", default=[], metavar="KIND[,KIND]",
                   help=f"keep only these event kinds ({', '.join(KIND_CODES)}); default: every kind")
    p.add_argument("--start", help="keep events from this virtual time (e.g. 2us); default: the start")
    p.add_argument("--end", help="keep events up to this virtual time (e.g. 10us); default: the end")
    p.add_argument("--max-mb", type=float, default=200.0, help="refuse to write more than this (default 200 MB)")
    p.add_argument("--trim", action="store_true", help="at the size cap, keep the first events instead of refusing")

    s = ts.add_parser("summary", help="utilisation, link traffic, longest waits, critical path")
    s.add_argument("trace", help="a binary trace (.emutrace)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--top", type=int, default=10, help="how many longest waits (default 10)")
    s.add_argument("--rows", type=int, default=15, help="rows per table in the text output (default 15)")

    d = ts.add_parser("diff", help="compare two traces: 'identical' or the first diverging event")
    d.add_argument("a", help="the first trace")
    d.add_argument("b", help="the second trace")
    d.add_argument("--context", type=int, default=3, help="events shown around the divergence (default 3)")

    c = ts.add_parser("chakra", help="export as Chakra execution traces (one ET file per PE) for ASTRA-sim")
    c.add_argument("trace", help="a .emutrace or a run bundle directory")
    c.add_argument("--out", required=True, help="directory for chakra.<rank>.et")

    r = ts.add_parser("replay", help="replay one actor alone against its recorded inputs and check its sends")
    r.add_argument("trace", help="the recorded run's trace (.emutrace, recorded with payloads)")
    r.add_argument("--actor", required=True, help="the actor's full name, e.g. cube05/pe0")
    from tools.cli_help import add_set_argument
    add_set_argument(r, what="recorded run's scenario before the actor is rebuilt")
    add_allow_path_argument(r)


def _time(opt: str, value):
    if value is None:
        return None
    try:
        return parse_time(value)
    except (UnitError, ValueError) as e:
        raise _Usage(f"{opt}: {e}") from None


class _Usage(Exception):
    pass


def _read(path: str):
    import os

    if not os.path.exists(path):
        raise ValueError(f"{path}: no such trace file")
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, not a trace file")
    try:
        return read_trace(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a trace file") from None


def cmd_perfetto(args) -> int:
    from tools.trace.perfetto import PerfettoTooLarge, export_perfetto

    kinds = [k.strip() for item in args.kinds for k in item.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KIND_CODES]
    if bad:
        raise _Usage(f"--kinds: unknown event kind(s) {', '.join(bad)} (known: {', '.join(KIND_CODES)})")
    start, end = _time("--start", args.start), _time("--end", args.end)
    if start is not None and end is not None and end <= start:
        raise _Usage(f"--end ({args.end}) must be after --start ({args.start})")
    if args.max_mb <= 0:
        raise _Usage("--max-mb must be positive")
    from emulator.trace import TraceStream

    try:
        trace = TraceStream(args.trace, payloads=False)     # streamed: flat memory whatever the trace's size
    except IsADirectoryError:
        raise ValueError(f"{args.trace}: is a directory, not a trace file") from None
    fmt = args.format or ("json" if args.out and args.out.endswith(".json") else "proto")
    stem = args.trace[:-len(".emutrace")] if args.trace.endswith(".emutrace") else args.trace
    out = args.out or stem + (".json" if fmt == "json" else ".pftrace")
    try:
        stats = export_perfetto(trace, out, actors=args.actors or None, kinds=kinds or None, start=start, end=end,
                                max_mb=args.max_mb, trim=args.trim, fmt=fmt)
    except PerfettoTooLarge as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({'Perfetto protobuf' if fmt == 'proto' else 'trace-event JSON'}): "
          f"{stats.events} trace events, {stats.bytes / 1e6:.2f} MB")
    if stats.trimmed:
        print(f"warning: {stats.cut_note(args.max_mb)}", file=sys.stderr)
    return 0


def cmd_summary(args) -> int:
    from tools.trace.summary import format_summary, summarise

    from tools.trace.compact import compact

    if os.path.isdir(args.trace):
        raise ValueError(f"{args.trace}: is a directory, not a trace file")
    s = summarise(compact(args.trace), top=args.top)      # streamed into columns: bounded memory
    if args.json:
        print(json.dumps(s, indent=1))
    else:
        print(format_summary(s, rows=args.rows))
    return 0


def cmd_diff(args) -> int:
    from tools.trace.diff import diff_traces, format_diff

    res = diff_traces(_read(args.a), _read(args.b), context=max(0, args.context))
    print(format_diff(res))
    return 0 if res.identical else 1


def cmd_replay(args) -> int:
    from emulator.input_paths import input_roots
    from tools.trace.replay import ReplayError, replay_actor

    roots = input_roots(os.path.dirname(os.path.abspath(args.trace)), allow=args.allow_path,
                        own="the trace's folder")
    try:
        res = replay_actor(_read(args.trace), args.actor, sets=args.set, input_roots=roots)
    except ReplayError as e:     # the replay cannot be set up (unknown actor, ...): bad input
        raise _Usage(str(e)) from None
    print(res.text())
    return 0 if res.ok else 1


def cmd_chakra(args) -> int:
    from tools.trace.chakra import export_chakra

    stats = export_chakra(args.trace, args.out)      # a ChakraExportError (a ValueError) reaches tools/cli.py
    print(stats.text())
    if stats.unmatched:
        print(f"warning: {stats.unmatched} send/receive node(s) without a partner (the run ended with messages "
              "in flight)", file=sys.stderr)
    return 0


COMMANDS = {"chakra": cmd_chakra, "perfetto": cmd_perfetto, "summary": cmd_summary, "diff": cmd_diff, "replay": cmd_replay}


def main(args) -> int:
    try:
        return COMMANDS[args.trace_cmd](args)
    except _Usage as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

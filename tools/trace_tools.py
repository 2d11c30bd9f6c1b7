"""``emu trace``: tools over binary traces (perfetto, summary, diff, replay)."""
from __future__ import annotations


def add_parser(sub) -> None:
    t = sub.add_parser("trace", help="tools over traces: perfetto, summary, diff, replay")
    t.set_defaults(func=lambda args: main(args))
    ts = t.add_subparsers(dest="trace_cmd", required=True)
    s = ts.add_parser("summary", help="utilisation, link traffic, longest waits")
    s.add_argument("trace")


def main(args) -> int:
    raise NotImplementedError(args.trace_cmd)

"""``emu bisect A B``: the first checkpoint interval in which two runs part, from their checkpoints alone.

A run with ``emu run --checkpoint-every N`` records in ``result.json`` the digest of its events up to
every multiple of ``N`` (``checkpoints``: emulator/system.py ``System._checkpointer``), with no trace
file.  Two runs of the same machine -- the same scenario with another seed, a fault, a changed
parameter, or two versions of the code -- are in the same state at a multiple ``b`` exactly when their
digests there are equal.  This command walks the multiples both runs recorded, in order, and reports the
last one where they agree and the first where they differ: the runs part within that interval of
``N`` (``[b - N, b)``).  To see how, re-run both with ``--stop-at`` at either end and ``emu inspect``
them, or record traces of that window (``emu trace diff`` finds the first differing event).

Exit status: 0 the runs agree at every common checkpoint and end alike, 1 they part (the interval is
printed), 2 bad input (no checkpoints, different ``N``).
"""
from __future__ import annotations

import bisect as _bisect
import json
from pathlib import Path

from emulator.units import format_time

__all__ = ["add_parser", "main", "first_divergence", "digest_at"]


class BisectError(ValueError):
    """A run without checkpoints or two runs whose checkpoints cannot be compared (exit status 2)."""


def _load(path: str) -> dict:
    from emulator.input_paths import bundle_file
    p = Path(path)
    f = (bundle_file(p, "result.json") if p.is_dir() else p) or p / "result.json"   # (not a link out of the bundle)
    try:
        res = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise BisectError(f"{path}: no readable result.json ({type(e).__name__})") from None
    if not isinstance(res, dict) or not (res.get("checkpoints") or {}).get("marks"):
        raise BisectError(f"{path}: the run recorded no checkpoints (run it with emu run --checkpoint-every TIME)")
    return res


def digest_at(marks: list[dict], b: int) -> tuple[str, int] | None:
    """(digest, events) of a run's state at the multiple ``b``: the mark covering it (``from_ps <= b <=
    t_ps``), or None when the run recorded none there (it ended before ``b``)."""
    i = _bisect.bisect_left([m["t_ps"] for m in marks], b)
    if i < len(marks) and marks[i]["from_ps"] <= b:
        return marks[i]["digest"], marks[i]["events"]
    return None


def first_divergence(a: dict, b: dict) -> dict:
    """Where two runs' checkpoints part: ``agree_until_ps`` (the last common multiple where they are equal,
    0 for none), ``differ_at_ps`` (the first where they differ, None: never), the events either run had."""
    every = a["checkpoints"]["every_ps"]
    if b["checkpoints"]["every_ps"] != every:
        raise BisectError(f"the runs' checkpoints are every {format_time(every)} and every "
                          f"{format_time(b['checkpoints']['every_ps'])}: re-run one with the other's interval")
    ma, mb = a["checkpoints"]["marks"], b["checkpoints"]["marks"]
    points = sorted({m["t_ps"] for m in ma + mb} | {m["from_ps"] for m in ma + mb})
    agree = 0
    for t in points:
        da, db = digest_at(ma, t), digest_at(mb, t)
        if da is None or db is None:
            break
        if da[0] != db[0]:
            # the multiples between the last agreement and t: the first that differs is the first after it
            # that either run's mark covers; any multiple with the same digest in both agrees
            return {"every_ps": every, "agree_until_ps": agree, "differ_at_ps": t, "events": [da[1], db[1]]}
        agree = t
    same_end = a.get("digest") == b.get("digest")
    return {"every_ps": every, "agree_until_ps": agree, "differ_at_ps": None if same_end else "end",
            "events": [a.get("events"), b.get("events")]}


def main(args) -> int:
    a, b = _load(args.a), _load(args.b)
    d = first_divergence(a, b)
    every = format_time(d["every_ps"])
    if d["differ_at_ps"] is None:
        print(f"same state at every common checkpoint (every {every}, up to {format_time(d['agree_until_ps'])}) "
              f"and the same end (digest {a['digest']})")
        return 0
    if d["differ_at_ps"] == "end":
        print(f"same state at every common checkpoint (every {every}, up to {format_time(d['agree_until_ps'])}), "
              f"different ends: {a['digest']} at {format_time(a['end_time_ps'])} vs {b['digest']} at "
              f"{format_time(b['end_time_ps'])} (the runs part after the last checkpoint)")
        return 1
    t = d["differ_at_ps"]
    lo = max(d["agree_until_ps"], t - d["every_ps"])
    print(f"the runs part between {format_time(lo)} and {format_time(t)}: the same state at "
          f"{format_time(d['agree_until_ps'])}, different at {format_time(t)} "
          f"({d['events'][0]:,} vs {d['events'][1]:,} events by then)")
    print(f"  to see how: emu run SCENARIO --stop-at {format_time(t)} for each, then emu inspect the bundles")
    return 1


def add_parser(sub) -> None:
    p = sub.add_parser("bisect", help="the first checkpoint interval where two runs part (emu run --checkpoint-every)",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("a", help="a run's bundle directory (or its result.json), recorded with --checkpoint-every")
    p.add_argument("b", help="the other run's, with the same checkpoint interval")
    p.set_defaults(func=main)   # its errors are ValueErrors: "error: ...", exit 2 (tools/cli.py)


"""Where a Gemma 3N token's time sits, per stage: the token's span partitioned by what finishes next.

The engines retire instructions (the AXI-Lite status block's ``retire`` records, frontend.py) and
the host driver works in spans (``HostDriver.host_spans``, labelled ``stage:...``); the compiler
names each instruction's ``(token, layer, stage)`` (``Compiler.where``).  Sorting every retirement
and host span by its end, the time from the previous end to this one is charged to this one's
stage: the stage the machine was finishing then, i.e. the stage the token was waiting for (a
weight stream's time goes to the GEMV it feeds, a host step's to its stage).  The intervals
partition ``[t0, t1]`` (the emulated tokens' span), so the per-stage times sum to the token time;
unlike the per-stage engine-busy and host figures they never double-count overlapped work.
"""
from __future__ import annotations

from collections import defaultdict

__all__ = ["stage_time", "stage_segments"]


def stage_segments(records, host_spans, where, t0: int, t1: int) -> list[tuple[int, int, str]]:
    """``[(start, end, stage)]`` partitioning ``[t0, t1]`` in time order (module docstring);
    ``where[seq] = (token, layer, stage)``."""
    ends = [(r["end"], r["seq"], where[r["seq"]][2]) for r in records
            if r["kind"] == "retire" and 0 <= r["seq"] < len(where)]
    ends += [(e, -1, lab.split(":")[0]) for s, e, lab in host_spans]
    ends.sort()
    out = []
    prev = t0
    for end, _, stage in ends:
        if end <= prev:
            continue
        e = min(end, t1)
        out.append((prev, e, stage))
        prev = e
        if prev >= t1:
            break
    if prev < t1:
        out.append((prev, t1, "(after the last retirement)"))
    return out


def stage_time(records, host_spans, where, t0: int, t1: int) -> dict[str, int]:
    """``{stage: ps}`` over ``[t0, t1]``: :func:`stage_segments` summed per stage."""
    out: dict[str, int] = defaultdict(int)
    for s, e, stage in stage_segments(records, host_spans, where, t0, t1):
        out[stage] += e - s
    return dict(out)

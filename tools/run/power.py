"""Power over time for the bundle (docs/energy.md): the trace says *when* each component was busy.

The energy itself comes from the counters (emulator/energy.py, exact); this module only
distributes each component's dynamic energy over time, in proportion to its busy time per
window: an actor's BUSY spans, a link's serialisation time after each SEND (``bytes /
bandwidth``, at least 1 ps), and, for a component that is never busy itself (a router, a TCM),
the serialisation of the links into and out of it.  Read once from the recorded trace after
the run: nothing is added to the run, the digest is unchanged.
"""
from __future__ import annotations

from emulator.energy import power_series
from emulator.trace import BUSY, SEND, TraceStream
from emulator.units import transfer_ps

__all__ = ["POWER_WINDOWS", "busy_per_window", "run_power"]

#: the run is cut into this many windows for the power profile (the window is stated in result.json)
POWER_WINDOWS = 200


def _add(row: list, a: int, b: int, window: int) -> None:
    n = len(row)
    while a < b:
        w = min(a // window, n - 1)
        edge = min(b, (w + 1) * window) if w < n - 1 else b
        row[w] += edge - a
        a = edge


def busy_per_window(trace_path: str, end_ps: int, window: int) -> dict:
    """Component name -> busy ps in each window, from the trace at ``trace_path``."""
    s = TraceStream(trace_path, payloads=False, allow_truncated=True)
    names, links = s.header["actors"], s.header["links"]
    n = max(-(-end_ps // window), 1)
    busy: dict[str, list] = {}
    touch: dict[str, list] = {}
    for ev in s:
        k = ev[0]
        if k == BUSY:
            _add(busy.setdefault(names[ev[2]], [0] * n), ev[1], max(ev[3], ev[1] + 1), window)
        elif k == SEND:
            link = links[ev[2]]
            t = ev[1]
            t1 = t + max(transfer_ps(ev[4], link["bandwidth_Bps"]), 1)
            _add(busy.setdefault(link["name"], [0] * n), t, t1, window)
            for end in (link["src"], link["dst"]):
                _add(touch.setdefault(end, [0] * n), t, t1, window)
    for name, row in touch.items():
        if not any(busy.get(name, ())):
            busy[name] = row
    return busy


def run_power(acc, trace_path: str | None, end_ps: int) -> dict | None:
    """The power profile of a run (``emulator.energy.power_series``), None without a trace."""
    if acc is None or not trace_path or end_ps <= 0:
        return None
    window = max(-(-end_ps // POWER_WINDOWS), 1)
    return power_series(acc, busy_per_window(trace_path, end_ps, window), window)

"""The pccx per-opcode latency report (from the status block's retire records)."""
from __future__ import annotations

from actors.pccx.profile import clocks
from protocols.pccx_isa import OPCODES

__all__ = ["latency_table"]


def _num(x: float):
    return int(x) if float(x).is_integer() else f"{x:.1f}"


def latency_table(system, profile: dict) -> list[dict]:
    """Per-opcode engine latency (µop arrival at its engine/dispatcher -> retirement)."""
    tc, _ = clocks(profile)
    stat = system.actors["pccx/axil_stat"]
    rows = []
    for op in OPCODES:
        lat = [r["end"] - r["start"] for r in stat.records if r["kind"] == "retire" and r["op"] == op]
        if not lat:
            continue
        cyc = [x / tc for x in lat]
        rows.append({"op": op, "count": len(lat), "min_cycles": _num(min(cyc)), "mean_cycles": _num(sum(cyc) / len(cyc)),
                     "max_cycles": _num(max(cyc)), "mean_ns": f"{sum(lat) / len(lat) / 1000:.1f}"})
    dropped = [r for r in stat.records if r["kind"] != "retire"]
    if dropped:
        rows.append({"op": "dropped/error", "count": len(dropped), "min_cycles": None, "mean_cycles": None,
                     "max_cycles": None, "mean_ns": None})
    return rows


"""``emu bench engine``: the emulator against SimPy on the same model, in the same run.

Workloads (the demo machine, scenarios/machines/demo.yaml):

* ``ring-sparse``: 64 nodes, 1 token -- one message per time step, the worst
  case for any discrete-event engine (engine-perf.md §3);
* ``ring-dense``: 64 nodes, 64 tokens -- many messages per time step;
* ``reduce``: the 128-PE 2-level reduce-to-root in data mode, numpy merges included.

Each repetition runs every workload on both engines (emulator first, then the
SimPy peer of tools/simpy_peer.py), checks that both reach the same virtual
end time and deliver the same number of messages (and, for the reduce, the same
root output), and records messages per wall second.  The printed figures are
medians over repetitions; the ratio is the median of per-repetition ratios, as
in engine-perf.md §0, because this machine's speed drifts.  Build time is
excluded on both sides.  Peak RSS of the process is reported too.
"""
from __future__ import annotations

import json
import resource
import statistics
import sys

import numpy as np

from actors.demo import machine as demo
from emulator.system import System
from tools import simpy_peer

PROFILE = {
    "cubes_x": 4, "cubes_y": 4, "pes_per_cube": 8,
    "pe_link": {"latency": 20_000, "bandwidth": 64 * 10**9, "capacity": 2},
    "mesh_link": {"latency": 50_000, "bandwidth": 32 * 10**9, "capacity": 2},
}


def _workloads(scale: float):
    s = max(scale, 0.01)
    return [
        ("ring-sparse", "ring", {"nodes": 64, "tokens": 1, "hops": int(20000 * s), "service": 0}, "timing"),
        ("ring-dense", "ring", {"nodes": 64, "tokens": 64, "hops": int(300 * s), "service": 0}, "timing"),
        ("reduce", "reduce", {"rounds": max(1, int(20 * s)), "period": 5_000_000, "produce": 100_000,
                              "merge": 8_000, "G": 8, "d": 128, "root": [1, 1]}, "data"),
    ]


def _emu(kind: str, params: dict, mode: str, seed: int = 1) -> dict:
    system = System(f"bench-{kind}", seed=seed, mode=mode)
    demo.WORKLOADS[kind].build(system, PROFILE, params)
    res = system.run()
    out = {"end_time_ps": res.end_time_ps, "messages": res.messages, "wall_s": res.wall_s}
    if kind == "reduce" and mode == "data":
        root = next(a for a in system.actors.values() if a.is_root)
        out["output"] = system.reports[root.name]["output"]
    return out


def _simpy(kind: str, params: dict, mode: str, seed: int = 1) -> dict:
    if kind == "ring":
        return simpy_peer.run_ring(PROFILE, params)
    return simpy_peer.run_reduce(PROFILE, params, mode, seed)


def run_bench(repeats: int = 3, scale: float = 1.0) -> dict:
    rows = []
    for name, kind, params, mode in _workloads(scale):
        emu_rates, simpy_rates, ratios = [], [], []
        for _ in range(repeats):
            a = _emu(kind, params, mode)
            b = _simpy(kind, params, mode)
            if a["end_time_ps"] != b["end_time_ps"] or a["messages"] != b["messages"]:
                raise RuntimeError(f"{name}: emulator and SimPy models disagree: end {a['end_time_ps']} vs "
                                   f"{b['end_time_ps']} ps, messages {a['messages']} vs {b['messages']}")
            if "output" in a and not np.allclose(a["output"], b["output"], rtol=1e-5, atol=1e-6):
                raise RuntimeError(f"{name}: root outputs differ between the emulator and SimPy")
            ea = a["messages"] / a["wall_s"]
            sb = b["messages"] / b["wall_s"]
            emu_rates.append(ea)
            simpy_rates.append(sb)
            ratios.append(ea / sb)
        rows.append({"name": name, "messages": a["messages"], "end_time_ps": a["end_time_ps"],
                     "emu_msgs_per_s": round(statistics.median(emu_rates)),
                     "simpy_msgs_per_s": round(statistics.median(simpy_rates)),
                     "ratio": round(statistics.median(ratios), 3)})
    return {"workloads": rows, "repeats": repeats,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def bench_engine(*, json_out: bool = False, repeats: int = 3, scale: float = 1.0) -> int:
    try:
        import simpy  # noqa: F401
    except ImportError:
        print("emu bench engine needs SimPy: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    out = run_bench(repeats, scale)
    if json_out:
        print(json.dumps(out, indent=1))
        return 0
    print(f"engine benchmark: emulator vs SimPy on the same model ({repeats} repetitions, medians)")
    print(f"  {'workload':<12} {'messages':>9} {'emu msg/s':>11} {'simpy msg/s':>12} {'ratio':>6}")
    for r in out["workloads"]:
        print(f"  {r['name']:<12} {r['messages']:>9} {r['emu_msgs_per_s']:>11,} {r['simpy_msgs_per_s']:>12,}"
              f" {r['ratio']:>6.2f}")
    print(f"  peak RSS {out['peak_rss_mib']} MiB; ratio > 1 means the emulator is faster")
    return 0

"""``emu bench engine``: the emulator against SimPy on the same model, in the same run.

Workloads (the demo machine, scenarios/machines/demo.yaml):

* ``ring-sparse``: 64 nodes, 1 token -- one message per time step, the worst
  case for any discrete-event engine (engine-perf.md §3);
* ``ring-dense``: 64 nodes, 64 tokens -- many messages per time step;
* ``reduce``: the 128-PE 2-level reduce-to-root in data mode, numpy merges included.

Repetitions are interleaved: each one runs every workload on both engines
(the emulator and the SimPy peer of tools/bench/simpy_peer.py, back to back, the
emulator first in even repetitions and the peer first in odd ones), so drift of
a shared machine hits both sides alike and neither always runs second.  Each pair is checked to reach the same
virtual end time and deliver the same number of messages (and, for the reduce,
the same root output).  Recorded per run: messages per wall second and per
second of process CPU time (``time.process_time``: less sensitive to other
users of the machine).  The printed figures are medians over repetitions; the
ratios are medians of per-repetition ratios, as in engine-perf.md §0, and the
spread (min-max of the per-repetition wall ratios) is printed as the noise.
Build time is excluded on both sides.  Peak RSS of the process is reported too.
"""
from __future__ import annotations

import gc
import json
import resource
import statistics
import sys
import time

import numpy as np

from actors.demo import machine as demo
from emulator.system import System
from tools.bench import simpy_peer

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


def loop_ns(n: int = 200_000) -> float:
    """CPU ns per iteration of a fixed pure-Python loop: how fast this machine runs Python right now.

    The calibration of reference/engine-perf.md §0 (``empty_loop_ns``, 11-41 ns on the 2-core VM it
    was measured on): on a shared machine the same run takes up to twice as long a few minutes
    later, so absolute CPU seconds are only comparable at a similar calibration.  Printed by both
    benches (median over the repetitions), to say under which conditions their seconds were taken.
    It gauges the interpreter's speed, not a neighbour's pressure on caches and memory: a machine run
    can be 14 % slower at a similar reading (issue #13), so ratios within one run and instruction
    counts (``make bench-instructions``) remain the figures to compare."""
    c0 = time.process_time()
    x = 0
    for i in range(n):
        x += i
    return (time.process_time() - c0) / n * 1e9


def _emu(kind: str, params: dict, mode: str, seed: int = 1) -> dict:
    system = System(f"bench-{kind}", seed=seed, mode=mode)
    demo.WORKLOADS[kind].build(system, PROFILE, params)
    c0 = time.process_time()
    res = system.run()
    cpu = time.process_time() - c0
    out = {"end_time_ps": res.end_time_ps, "messages": res.messages, "wall_s": res.wall_s, "cpu_s": cpu}
    if kind == "reduce" and mode == "data":
        root = next(a for a in system.actors.values() if a.is_root)
        out["output"] = system.reports[root.name]["output"]
    return out


def _simpy(kind: str, params: dict, mode: str, seed: int = 1) -> dict:
    if kind == "ring":
        return simpy_peer.run_ring(PROFILE, params)
    return simpy_peer.run_reduce(PROFILE, params, mode, seed)


def run_bench(repeats: int = 5, scale: float = 1.0) -> dict:
    workloads = _workloads(scale)
    runs = {name: [] for name, *_ in workloads}
    loops = []
    for rep in range(repeats):
        loops.append(loop_ns())
        for name, kind, params, mode in workloads:
            if rep % 2 == 0:
                a = _emu(kind, params, mode)
                b = _simpy(kind, params, mode)
            else:   # every other repetition the peer goes first: no side always runs on a warmer machine
                b = _simpy(kind, params, mode)
                a = _emu(kind, params, mode)
            if a["end_time_ps"] != b["end_time_ps"] or a["messages"] != b["messages"]:
                raise RuntimeError(f"{name}: emulator and SimPy models disagree: end {a['end_time_ps']} vs "
                                   f"{b['end_time_ps']} ps, messages {a['messages']} vs {b['messages']}")
            if "output" in a and not np.allclose(a["output"], b["output"], rtol=1e-5, atol=1e-6):
                raise RuntimeError(f"{name}: root outputs differ between the emulator and SimPy")
            runs[name].append((a, b))
    rows = []
    med = statistics.median
    for name, pairs in runs.items():
        a = pairs[0][0]
        emu_rates = [x["messages"] / x["wall_s"] for x, _ in pairs]
        simpy_rates = [y["messages"] / y["wall_s"] for _, y in pairs]
        ratios = [e / s for e, s in zip(emu_rates, simpy_rates)]
        cpu_ratios = [y["cpu_s"] / x["cpu_s"] for x, y in pairs]
        rows.append({"name": name, "messages": a["messages"], "end_time_ps": a["end_time_ps"],
                     "emu_msgs_per_s": round(med(emu_rates)),
                     "simpy_msgs_per_s": round(med(simpy_rates)),
                     "ratio": round(med(ratios), 3),
                     "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
                     "emu_cpu_us_per_msg": round(med(x["cpu_s"] / x["messages"] * 1e6 for x, _ in pairs), 2),
                     "simpy_cpu_us_per_msg": round(med(y["cpu_s"] / y["messages"] * 1e6 for _, y in pairs), 2),
                     "cpu_ratio": round(med(cpu_ratios), 3)})
    return {"workloads": rows, "repeats": repeats, "loop_ns": round(med(loops), 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def bench_engine(*, json_out: bool = False, repeats: int = 5, scale: float = 1.0) -> int:
    try:
        import simpy  # noqa: F401
    except ImportError:
        print("emu bench engine needs SimPy: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    out = run_bench(repeats, scale)
    if json_out:
        print(json.dumps(out, indent=1))
        return 0
    print(f"engine benchmark: emulator vs SimPy on the same model ({repeats} interleaved repetitions, medians)")
    print(f"  {'workload':<12} {'messages':>9} {'emu msg/s':>11} {'simpy msg/s':>12} {'ratio':>6} {'(min-max)':>11}"
          f" {'emu cpu us/msg':>15} {'simpy cpu us/msg':>17} {'cpu ratio':>9}")
    for r in out["workloads"]:
        print(f"  {r['name']:<12} {r['messages']:>9} {r['emu_msgs_per_s']:>11,} {r['simpy_msgs_per_s']:>12,}"
              f" {r['ratio']:>6.2f} {r['ratio_min']:>5.2f}-{r['ratio_max']:<5.2f}"
              f" {r['emu_cpu_us_per_msg']:>15.2f} {r['simpy_cpu_us_per_msg']:>17.2f} {r['cpu_ratio']:>9.2f}")
    print(f"  peak RSS {out['peak_rss_mib']} MiB; ratio > 1 means the emulator is faster (wall; cpu ratio: process CPU);"
          f" Python loop {out['loop_ns']} ns/iteration (tools.bench.command.loop_ns)")
    return 0


# --------------------------------------------------------------------------- emu bench machine
MACHINE_SCENARIOS = [
    ("ahbm-decode-32", "scenarios/ahbm/attention_decode_32ranks.yaml"),
    ("pccx-program", "scenarios/pccx/program.yaml"),
]
IDLE_SCENARIO = ("ahbm-idle-4sip", "scenarios/ahbm/idle-4sip.yaml")
FULL_SCENARIO = ("ahbm-decode-128", "scenarios/ahbm/attention_decode_4sip.yaml")
#: with ``--full`` also (once each): issue 22's long-context runs, Llama3-70B on 1 SIP, and the milestone's
#: multi-user and 4-SIP points (issue 36; fidelity stream, the Ring at pipeline): 16 users at mixed contexts on 1 SIP, 8 users at 8K on
#: 4 SIPs, the 32K decode and the 2K Ring prefill with all eight KV heads on 4 SIPs
LONG_SCENARIOS = [("ahbm-ring-8k", "scenarios/ahbm/gqa/llama70b_prefill_ring_8k_1sip.yaml"),
                  ("ahbm-decode-128k", "scenarios/ahbm/gqa/llama70b_decode_128k_1sip.yaml"),
                  ("ahbm-16users", "scenarios/ahbm/requests/llama70b_decode_16users_1sip.yaml"),
                  ("ahbm-8users-4sip", "scenarios/ahbm/requests/llama70b_decode_8users_4sip.yaml"),
                  ("ahbm-decode-32k-4sip", "scenarios/ahbm/gqa/llama70b_decode_32k_4sip.yaml"),
                  ("ahbm-ring-2k-4sip", "scenarios/ahbm/gqa/llama70b_prefill_ring_4sip.yaml")]


def _kind(actor_name: str) -> str:
    """Component kind of an actor name: ``sip0/cube03/pe5/math`` -> ``math``, ``.../hbm/pc2`` -> ``hbm``."""
    parts = actor_name.split("/")
    last = parts[-1].rstrip("0123456789")
    if len(parts) > 1 and parts[-2] == "hbm":
        return "hbm" if last in ("pc", "stack") else "hbmport"   # stack: memory.HbmStack (fidelity pipeline)
    return last


def message_pairs(system) -> dict:
    """Messages of a finished run per unordered pair of component kinds (``cpu<->tcm``: both directions)."""
    pairs: dict[str, int] = {}
    for link in system.links:
        if link.messages:
            a, b = sorted((_kind(link.src.owner.name), _kind(link.dst.owner.name)))
            pairs[f"{a}<->{b}"] = pairs.get(f"{a}<->{b}", 0) + link.messages
    return dict(sorted(pairs.items(), key=lambda kv: -kv[1]))


def _kernel_ops(reports: dict) -> int:
    """``tl`` operations of the run (the host's per-PE ``ops`` counts; 0 for other workloads)."""
    host = reports.get("io/host") or {}
    return sum(sum((pe.get("ops") or {}).values()) for pe in (host.get("pes") or {}).values())


def _machine_run(path: str) -> dict:
    """Build and run one scenario; process CPU time of the build and of the run, separately."""
    from pathlib import Path

    from actors import registry
    from emulator.scenario import load_scenario
    from tools.run.runner import build_system

    root = Path(__file__).resolve().parents[2]
    scenario = load_scenario(root / path, registry)
    # the previous repetition's machine is garbage now (reference cycles): collect it before the
    # clock starts, or the build's own collection (emulator.system.building) would charge this
    # machine for freeing the last one -- a fresh ``emu run`` has no such garbage
    gc.collect()
    c0 = time.process_time()
    system, _ = build_system(scenario)
    c1 = time.process_time()
    res = system.run()
    c2 = time.process_time()
    if res.status != "finished":
        raise RuntimeError(f"{path}: run ended with status {res.status}: {res.error or res.deadlock}")
    return {"messages": res.messages, "events": res.events, "digest": res.digest, "end_time_ps": res.end_time_ps,
            "pairs": message_pairs(system), "ops": _kernel_ops(res.reports),
            "build_cpu_s": c1 - c0, "run_cpu_s": c2 - c1, "wall_s": res.wall_s, "tasks": len(system.actors) + len(
                system.links)}


def run_machine_bench(repeats: int = 3, full: bool = False) -> dict:
    """``emu bench machine``: whole-machine runs, rated per second of process CPU time.

    * AHBM 32-rank attention decode and a pccx program: messages and trace
      events per CPU second of the run (build excluded);
    * the 4-SIP AHBM machine with an idle workload: the fixed cost of building,
      starting and cancelling its tasks (build + run CPU);
    * with ``full``: the 128-rank decode on the 4-SIP machine, the Llama3-70B 8K Ring prefill
      (fidelity pipeline) and 128K decode on 1 SIP (issue 22), the milestone's multi-user and 4-SIP points
      (:data:`LONG_SCENARIOS`, issue 36): CPU seconds, once.

    Each row also has the run's end time and digest, its messages per pair of
    component kinds (:func:`message_pairs`) and, for ``tl`` kernels, the number
    of kernel operations (messages per op: the intra-PE chatter of issue 13).

    Repetitions are interleaved; figures are medians, with the min-max spread of
    the CPU rates as the noise of this (shared) machine.
    """
    med = statistics.median
    todo = MACHINE_SCENARIOS + [IDLE_SCENARIO]
    runs = {name: [] for name, _ in todo}
    loops = []
    for _ in range(repeats):
        loops.append(loop_ns())
        for name, path in todo:
            runs[name].append(_machine_run(path))
    rows = []
    for name, path in todo:
        rs = runs[name]
        if len({r["digest"] for r in rs}) != 1:
            raise RuntimeError(f"{path}: repetitions gave different digests")
        msg_rate = [r["messages"] / r["run_cpu_s"] for r in rs]
        ev_rate = [r["events"] / r["run_cpu_s"] for r in rs]
        rows.append({"name": name, "scenario": path, "messages": rs[0]["messages"], "events": rs[0]["events"],
                     "tasks": rs[0]["tasks"],
                     "run_cpu_s": round(med(r["run_cpu_s"] for r in rs), 3),
                     "build_cpu_s": round(med(r["build_cpu_s"] for r in rs), 3),
                     "fixed_cpu_s": round(med(r["build_cpu_s"] + r["run_cpu_s"] for r in rs), 3),
                     "msgs_per_cpu_s": round(med(msg_rate)), "msgs_per_cpu_s_min": round(min(msg_rate)),
                     "msgs_per_cpu_s_max": round(max(msg_rate)),
                     "events_per_cpu_s": round(med(ev_rate)),
                     "wall_s": round(med(r["wall_s"] for r in rs), 3),
                     "end_time_ps": rs[0]["end_time_ps"], "digest": rs[0]["digest"], "pairs": rs[0]["pairs"],
                     "ops": rs[0]["ops"]})
    for name, path in ([FULL_SCENARIO] + LONG_SCENARIOS if full else []):
        loops.append(loop_ns())
        r = _machine_run(path)
        rows.append({"name": name, "scenario": path, "messages": r["messages"], "events": r["events"],
                     "tasks": r["tasks"], "run_cpu_s": round(r["run_cpu_s"], 3),
                     "build_cpu_s": round(r["build_cpu_s"], 3),
                     "fixed_cpu_s": round(r["build_cpu_s"] + r["run_cpu_s"], 3),
                     "msgs_per_cpu_s": round(r["messages"] / r["run_cpu_s"]),
                     "msgs_per_cpu_s_min": None, "msgs_per_cpu_s_max": None,
                     "events_per_cpu_s": round(r["events"] / r["run_cpu_s"]), "wall_s": round(r["wall_s"], 3),
                     "end_time_ps": r["end_time_ps"], "digest": r["digest"], "pairs": r["pairs"], "ops": r["ops"]})
    return {"machines": rows, "repeats": repeats, "loop_ns": round(med(loops), 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def bench_machine(*, json_out: bool = False, repeats: int = 3, full: bool = False) -> int:
    out = run_machine_bench(repeats, full)
    if json_out:
        print(json.dumps(out, indent=1))
        return 0
    print(f"machine benchmark: per second of process CPU time ({repeats} interleaved repetitions, medians)")
    print(f"  {'run':<16} {'tasks':>6} {'messages':>9} {'events':>9} {'build cpu s':>11} {'run cpu s':>9}"
          f" {'msg/cpu-s':>10} {'(min-max)':>15} {'events/cpu-s':>12}")
    for r in out["machines"]:
        spread = (f"{r['msgs_per_cpu_s_min']:,}-{r['msgs_per_cpu_s_max']:,}" if r["msgs_per_cpu_s_min"] is not None
                  else "")
        print(f"  {r['name']:<16} {r['tasks']:>6} {r['messages']:>9} {r['events']:>9} {r['build_cpu_s']:>11.3f}"
              f" {r['run_cpu_s']:>9.3f} {r['msgs_per_cpu_s']:>10,} {spread:>15} {r['events_per_cpu_s']:>12,}")
    for r in out["machines"]:
        if r["ops"]:
            top = ", ".join(f"{k} {v} ({100 * v / r['messages']:.0f} %)" for k, v in list(r["pairs"].items())[:4])
            print(f"  {r['name']}: {r['ops']} tl ops, {r['messages'] / r['ops']:.2f} messages per op; {top}")
    idle = next(r for r in out["machines"] if r["name"] == IDLE_SCENARIO[0])
    print(f"  idle 4-SIP machine fixed cost (build + start + cancel): {idle['fixed_cpu_s']:.3f} s CPU;"
          f" peak RSS {out['peak_rss_mib']} MiB; Python loop {out['loop_ns']} ns/iteration (tools.bench.command.loop_ns)")
    return 0

"""``emu faults campaign SCENARIO``: chaos testing of a machine or kernel.

N seeded random fault plans are drawn from the machine's *real* actors and
links (the scenario is built once to list them) and from the fault registry
(:data:`emulator.faults.KINDS`): kinds, windows, probabilities, counts and each
kind's own parameters, within the ranges the kinds declare
(:class:`emulator.faults.Param`).  Windows and kill times are drawn inside the
fault-free run's duration.  ``--kinds`` and ``--targets`` (a glob) restrict
the draw.

Each plan runs on the sweep's process pool (tools.sweep.backends, ``--jobs``) with a virtual-time limit
(10x the fault-free end time) and a wall-clock guard, and is classified:

==================  ===========================================================
outcome             meaning
==================  ===========================================================
same                finished, same workload result as the fault-free run
                    (status and the workload's checked outputs, e.g.
                    ``max_abs_err``; end time may differ)
different           finished with a different workload result
deadlock            the run stopped with a deadlock report
error               a clear error (a protocol error naming link and message,
                    a model error, a scenario error)
killed              the workload did not complete: its actors were killed
time-limit          the virtual-time limit or the wall-clock guard fired
crash               a Python traceback escaped the tool (a bug: never expected)
hang                the worker did not answer within 3x the wall guard (a bug)
==================  ===========================================================

Written to ``--out`` (default ``runs/<scenario>-campaign``): ``outcomes.csv``
(one row per plan), ``summary.txt`` (the tables printed), and for every plan
that is not ``same`` a reproducer scenario ``repro/plan-<n>.yaml`` reduced to
the fewest faults that still give the same outcome (faults are removed one at
a time while the outcome holds); the files they name (the machine profile,
workload inputs) are copied beside them, as in a result bundle.
"""
from __future__ import annotations

import csv
import fnmatch
import json
import math
import re
import sys
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from emulator.faults import KINDS
from emulator.input_paths import add_allow_path_argument
from emulator.units import format_time

__all__ = ["run_campaign", "draw_plan", "classify", "add_parser", "OUTCOMES"]

OUTCOMES = ["same", "different", "deadlock", "error", "killed", "time-limit", "crash", "hang"]
#: the workload results compared between a faulted run and the fault-free one
RESULT_KEYS = ("max_abs_err", "max_rel_err")
_QUANTITY_UNIT = {"time": "ps", "size": "B", "bandwidth": "B/s", "frequency": "Hz"}


def target_class(name: str) -> str:
    """A target's class: its name with every number replaced by ``#`` (``cube#/pe#.up->cube#/pe#.in``)."""
    return re.sub(r"\d+", "#", name)


def _loguniform(rng, low: float, high: float) -> float:
    if low <= 0:
        low = min(1.0, high)
    return float(math.exp(rng.uniform(math.log(low), math.log(high)))) if high > low else float(low)


def _param_value(rng, param) -> object:
    """A value for one kind-specific key, inside its declared range, written as a scenario would."""
    spec = param.spec
    value = _loguniform(rng, param.low, param.high)
    kind = getattr(spec, "kind", None)
    if kind is not None:
        return f"{int(round(value))}{_QUANTITY_UNIT[kind]}"
    if type(spec).__name__ == "Int":
        return int(round(value))
    return round(value, 3)


def draw_plan(rng, actors: list[str], links: list[dict], horizon: int, *, kinds=None, targets: str = "*",
              max_faults: int = 3) -> list[dict]:
    """One random fault plan: 1..``max_faults`` faults on real targets matching ``targets``.

    ``links`` are ``{"name", "bandwidth"}`` (a slow link fault needs finite
    bandwidth); ``horizon`` is the fault-free run's end time in ps.
    """
    names = {"actor": [a for a in actors if fnmatch.fnmatchcase(a, targets)],
             "link": [l["name"] for l in links if fnmatch.fnmatchcase(l["name"], targets)]}
    finite = {l["name"] for l in links if l["bandwidth"]}
    choices = [(k, t) for (k, t) in sorted(KINDS) if (kinds is None or k in kinds) and names[t]
               and not (k == "slow" and t == "link" and not finite & set(names["link"]))]
    if not choices:
        raise ValueError(f"no fault kind can target {targets!r} (kinds {kinds or 'all'})")
    plan = []
    horizon = max(horizon, 1000)
    for _ in range(int(rng.integers(1, max_faults + 1))):
        kind, target = choices[int(rng.integers(len(choices)))]
        pool = sorted(finite & set(names["link"])) if (kind, target) == ("slow", "link") else names[target]
        f = {"kind": kind, target: pool[int(rng.integers(len(pool)))]}
        cls = KINDS[(kind, target)]
        for key, param in cls.params.items():
            f[key] = _param_value(rng, param)
        if kind == "kill":
            f["at"] = f"{int(rng.integers(0, horizon))}ps"
        else:
            start = int(rng.integers(0, horizon))
            f["start"] = f"{start}ps"
            if cls.needs_window_end or rng.random() < 0.5:
                f["end"] = f"{start + 1 + int(_loguniform(rng, 1000, horizon))}ps"
            if rng.random() < 0.5:
                f["probability"] = round(float(rng.uniform(0.05, 1.0)), 3)
            if rng.random() < 0.3:
                f["count"] = int(rng.integers(1, 11))
        plan.append(f)
    return plan


def _same_result(res: dict, baseline: dict) -> bool:
    """Same workload result: the checked error against the numpy reference (``max_abs_err``) equal
    within 1e-6 (a fault that only reorders float32 merges moves it by ~1e-8; a corrupted value by far
    more).  ``max_rel_err`` is reported, not compared: near-zero reference values make it jumpy."""
    for key in RESULT_KEYS[:1]:
        a, b = res.get(key), baseline.get(key)
        if (a is None) != (b is None) or (a is not None and not abs(a - b) <= 1e-6):
            return False
    return True


def classify(res: dict, baseline: dict) -> str:
    """The outcome of one run (``res`` as ``emu run --json`` prints it) against the fault-free ``baseline``."""
    status = res["status"]
    if status == "finished":
        return "same" if _same_result(res, baseline) else "different"
    return {"deadlock": "deadlock", "error": "error", "killed": "killed", "time-limit": "time-limit",
            "wall-timeout": "time-limit"}.get(status, "error")


def _run_one(job: dict) -> dict:
    """Worker: run ``job['scenario']`` with ``job['sets']`` and return its classified row."""
    from actors import registry
    from emulator.errors import BuildError
    from emulator.scenario import load_scenario
    from emulator.schema import SchemaError
    from tools.run.runner import run_scenario

    try:
        sc = load_scenario(job["scenario"], registry, job["sets"], allow=job.get("allow", ()))
        res, _, _ = run_scenario(sc)
    except (SchemaError, BuildError) as e:
        return {"outcome": "error", "status": "bad-input", "end_time_ps": None, "error": str(e).splitlines()[-1]}
    except Exception:   # a traceback escaping the tool: a bug the campaign exists to find
        return {"outcome": "crash", "status": "crash", "end_time_ps": None,
                "error": traceback.format_exc().strip().splitlines()[-1]}
    base_end = (job.get("baseline") or {}).get("end_time_ps")
    row = {"status": res["status"], "end_time_ps": res["end_time_ps"],
           "end_delta_ps": res["end_time_ps"] - base_end if base_end is not None else None,
           "error": ((res.get("error") or "").splitlines() or [""])[0][:200],
           "injected": sum(f["injected"] for f in res.get("faults") or []),
           "never_fired": sum(not f["fired"] for f in res.get("faults") or [])}
    row.update({k: res.get(k) for k in RESULT_KEYS})
    if job.get("baseline") is not None:
        row["outcome"] = classify(res, job["baseline"])
    return row


class _Pool:
    """The sweep's process pool (tools.sweep.backends.PoolBackend): a fresh process per run, and a
    run still going ``timeout`` seconds after it started is killed (a hang becomes an outcome, not a stall)."""

    def __init__(self, jobs: int, timeout: float, progress: bool = False):
        from tools.sweep.backends import PoolBackend
        self.progress, self.timeout = progress, timeout
        self.backend = PoolBackend(jobs, work=_run_one, preload=["tools.robust.campaign", "tools.run.runner", "actors"])

    def map(self, jobs: list[dict]) -> list[dict]:
        out: list = [None] * len(jobs)
        progress, n = self.progress, len(jobs)

        class Events:
            done_count = 0

            @staticmethod
            def running(_n):
                pass

            @classmethod
            def done(cls, task, record):
                if "result" in record:    # the pool's own failure record: killed or the worker died
                    failed = record["result"]
                    outcome = "hang" if failed["status"] == "wall-timeout" else "crash"
                    record = {"outcome": outcome, "status": outcome, "end_time_ps": None, "error": failed["error"]}
                out[task["index"]] = record
                cls.done_count += 1
                if progress and cls.done_count % 50 == 0:
                    print(f"... {cls.done_count}/{n} runs", file=sys.stderr, flush=True)

        self.backend.run([{**j, "index": i, "kill_after_s": self.timeout} for i, j in enumerate(jobs)], Events)
        return out


def _sets(base_sets: list[str], faults: list[dict], max_time: str, wall: str) -> list[str]:
    """The ``--set`` items that turn the scenario into one plan's run (JSON is YAML)."""
    return list(base_sets) + [f"faults={json.dumps(faults)}", f"stop.max_time={max_time}",
                              f"stop.wall_timeout={wall}", "trace.enabled=false"]


def _reproducer(sc, faults: list[dict], max_time: str, repro: Path) -> dict:
    """A standalone scenario: the source with the plan's faults; the files it names copied into ``repro``
    like a bundle's (tools/run/bundle.py), so it runs confined to its own folder (emulator/input_paths.py)."""
    from tools.run.bundle import runnable_scenario

    doc = runnable_scenario(sc, repro)
    doc["faults"] = faults
    doc["stop"] = {**(doc.get("stop") or {}), "max_time": max_time}
    doc.pop("output", None)
    return doc


def run_campaign(scenario_path: str, *, plans: int = 100, seed: int = 0, kinds=None, targets: str = "*",
                 jobs: int = 2, out: str | None = None, wall_timeout: float = 20.0, sets=None, max_faults: int = 3,
                 minimise: bool = True, echo=print, allow=()) -> dict:
    """Run the campaign; returns ``{"rows": [...], "counts": Counter, "out": dir}`` and writes the files.
    ``allow``: ``--allow-path`` folders (emulator/input_paths.py)."""
    from actors import registry
    from emulator.scenario import load_scenario
    from tools.run.runner import build_system

    sc = load_scenario(scenario_path, registry, sets, allow=allow)
    system, _ = build_system(sc)
    actors = list(system.actors)
    links = [{"name": l.name, "bandwidth": l.bandwidth} for l in system.links]
    out_dir = Path(out or Path("runs") / f"{sc.name}-campaign")
    out_dir.mkdir(parents=True, exist_ok=True)
    wall = f"{wall_timeout:g}s"
    base_sets = list(sets or [])
    pool = _Pool(jobs, timeout=3 * wall_timeout + 30, progress=True)
    job = {"scenario": scenario_path, "allow": list(allow)}
    (baseline,) = pool.map([{**job, "sets": _sets(base_sets, [], "1000s", wall)}])
    if baseline.get("outcome") in ("crash", "hang") or baseline["end_time_ps"] is None:
        raise RuntimeError(f"the fault-free run failed: {baseline}")
    horizon = baseline["end_time_ps"]
    max_time = f"{10 * horizon + 10**6}ps"
    echo(f"fault-free run: {baseline['status']}, end {format_time(horizon)}; {len(actors)} actors, "
         f"{len(links)} links; {plans} plans (seed {seed}) on {jobs} worker(s)")
    rng = np.random.default_rng(seed)
    drawn = [draw_plan(rng, actors, links, horizon, kinds=kinds, targets=targets, max_faults=max_faults)
             for _ in range(plans)]
    jobs_ = [{**job, "baseline": baseline, "sets": _sets(base_sets, plan, max_time, wall)} for plan in drawn]
    results = pool.map(jobs_)
    rows = []
    for i, (plan, res) in enumerate(zip(drawn, results)):
        kinds = "+".join(f"{f['kind']}/{'link' if 'link' in f else 'actor'}" for f in plan)
        rows.append({"plan": i, "faults": len(plan), "kinds": kinds,
                     "targets": " ".join(f.get("link") or f.get("actor") for f in plan), **res})
    _write_reproducers(pool, sc, job, base_sets, rows, drawn, baseline, out_dir, max_time, wall, minimise)
    counts = Counter(r["outcome"] for r in rows)
    text = summary_text(rows, drawn, counts)
    (out_dir / "summary.txt").write_text(text + "\n")
    _write_csv(out_dir / "outcomes.csv", rows)
    echo(text)
    echo(f"written: {out_dir}/outcomes.csv, summary.txt, repro/ ({sum(1 for r in rows if r['outcome'] != 'same')}"
         " reproducer(s))")
    return {"rows": rows, "counts": counts, "out": str(out_dir), "baseline": baseline}


def _write_reproducers(pool, sc, job, base_sets, rows, drawn, baseline, out_dir, max_time, wall,
                       minimise: bool = True) -> None:
    """For each plan that is not 'same': the fewest of its faults that still give its outcome, as a scenario
    (``minimise=False``: the whole plan); ``job``: the scenario and allowed folders every run gets."""
    repro = out_dir / "repro"
    repro.mkdir(exist_ok=True)
    for row in rows:
        if row["outcome"] == "same":
            continue
        plan = list(drawn[row["plan"]])
        # drop faults one at a time while the outcome holds (at most len(plan) rounds)
        changed = minimise and len(plan) > 1
        while changed and len(plan) > 1:
            changed = False
            trials = [plan[:j] + plan[j + 1:] for j in range(len(plan))]
            jobs = [{**job, "baseline": baseline, "sets": _sets(base_sets, t, max_time, wall)} for t in trials]
            for t, res in zip(trials, pool.map(jobs)):
                if res["outcome"] == row["outcome"]:
                    plan, changed = t, True
                    break
        doc = _reproducer(sc, plan, max_time, repro)
        doc["name"] = f"{sc.name}-repro-{row['plan']}"
        doc["description"] = (f"emu faults campaign reproducer: plan {row['plan']} -> {row['outcome']} "
                              f"({row['status']}) {row['error'][:120]}").strip()
        path = repro / f"plan-{row['plan']}.yaml"
        path.write_text(f"# {doc['description']}\n# run: emu run {path}\n" + yaml.safe_dump(doc, sort_keys=False))
        row["reproducer"] = str(path)
        row["min_faults"] = len(plan)


def summary_text(rows: list[dict], drawn: list[list[dict]], counts: Counter) -> str:
    """The campaign's tables: outcomes overall, per fault kind and per target class (a plan counts once per fault)."""
    cols = [o for o in OUTCOMES if counts.get(o)] or ["same"]
    by_kind: dict[str, Counter] = {}
    by_class: dict[str, Counter] = {}
    for row in rows:
        for f in drawn[row["plan"]]:
            target = "link" if "link" in f else "actor"
            by_kind.setdefault(f"{f['kind']}/{target}", Counter())[row["outcome"]] += 1
            by_class.setdefault(target_class(f[target]), Counter())[row["outcome"]] += 1
    lines = [f"{len(rows)} plans, {sum(len(p) for p in drawn)} faults: "
             + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES if counts.get(o))]
    for title, table in (("fault kind", by_kind), ("target class", by_class)):
        width = max([len(title)] + [len(k) for k in table])
        lines.append("")
        lines.append(f"{title:<{width}}  " + "  ".join(f"{c:>10}" for c in cols))
        for key in sorted(table):
            lines.append(f"{key:<{width}}  " + "  ".join(f"{table[key].get(c, 0):>10}" for c in cols))
    return "\n".join(lines)


def _write_csv(path: Path, rows: list[dict]) -> None:
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def cmd_campaign(args) -> int:
    kinds = set(args.kinds.split(",")) if args.kinds else None
    unknown = (kinds or set()) - {k for k, _ in KINDS}
    if unknown:
        from emulator.schema import Problem, SchemaError
        raise SchemaError([Problem("--kinds", None, "", "fault kinds among " + ", ".join(sorted({k for k, _ in KINDS})),
                                   ", ".join(sorted(unknown)))])
    from emulator.interrupt import stop_signals_interrupt
    try:
        with stop_signals_interrupt():
            result = run_campaign(args.scenario, plans=args.plans, seed=args.seed, kinds=kinds, targets=args.targets,
                                  jobs=args.jobs, out=args.out, wall_timeout=args.wall_timeout, sets=args.set,
                                  max_faults=args.max_faults, minimise=not args.no_minimise,
                                  allow=args.allow_path)
    except KeyboardInterrupt as e:
        why = f" ({e.args[0]})" if e.args else ""
        print(f"campaign interrupted{why}: no summary written", file=sys.stderr)
        return 130
    bugs = result["counts"].get("crash", 0) + result["counts"].get("hang", 0)
    return 1 if bugs else 0


def add_parser(sub) -> None:
    f = sub.add_parser("faults", help="fault tools (campaign: random fault plans, outcomes classified)")
    fsub = f.add_subparsers(dest="faults_cmd", required=True)
    c = fsub.add_parser("campaign", help="run N seeded random fault plans and classify each run's outcome")
    c.add_argument("scenario", help="the scenario the fault plans are drawn for")
    c.add_argument("--plans", type=int, default=50, help="number of fault plans (default 50)")
    c.add_argument("--seed", type=int, default=0, help="seed of the plan draw")
    c.add_argument("--kinds", help="comma-separated fault kinds to draw from (default: all)")
    c.add_argument("--targets", default="*", help="glob restricting the actors and links targeted")
    c.add_argument("--max-faults", type=int, default=3, help="faults per plan: 1..N (default 3)")
    c.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    c.add_argument("--wall-timeout", type=float, default=20.0, help="wall-clock guard per run, seconds")
    c.add_argument("--out", help="output directory (default runs/<scenario>-campaign)")
    c.add_argument("--no-minimise", action="store_true", help="write reproducers of the whole plan (no shrinking)")
    from tools.cli_help import add_set_argument
    add_set_argument(c)
    add_allow_path_argument(c)
    c.set_defaults(func=cmd_campaign)

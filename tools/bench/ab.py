"""CPU of one scenario under two source trees of this project, measured side by side.

Why: on the shared 2-core machine the CPU seconds of the same run swing by 1.5x
between hours (issue #13: the 128-rank decode took 48.8 s one day and 71.5 s the
next, same code), so an absolute target such as "<= 50 s of CPU" cannot be told
from the phase the machine is in.  Two trees running *at the same time*, one on
each core, see the same phase; the ratio of their CPU times is what a change
bought, and ``ratio x (the base's figure on a calm day)`` is the head's figure on
such a day.

How: two lanes, one per tree, each runs the scenario again and again in a fresh
process (``python -c`` in the tree's directory, so that tree's ``emulator``,
``actors`` and ``tools`` are imported; the interpreter and the installed
packages are this one's).  The child reports the process CPU of the build and of
the run separately (``time.process_time``, like ``emu bench machine``).  Both
lanes count their runs until each has ``runs`` of them (with ``minutes``: and
that time has passed), so the quicker side counts more runs, over the same
stretch of time as the slower one (a phase of the machine then weighs on both
sides alike); a lane that is done keeps starting runs that are not counted
while the other still has a counted run going, so no counted run had the
machine to itself.  Figures are medians, with the min-max of the run CPU.

Both trees must model the same thing: the two sides' end times must agree (the
digest may differ: a tree that sends fewer messages has another trace).  A side
whose run fails, or whose end time differs, is an error, not a ratio.

``python -m tools.bench.ab --base 308d103`` (a git revision: checked out with
``git worktree`` into a temporary directory, removed afterwards) or ``--base
DIR`` (a tree already on disk); ``--head`` defaults to this tree.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: what a child runs, in the tree's directory: build and run one scenario, print one JSON line.  Not
#: the tree's own ``tools.bench.command._machine_run``: a private helper whose results differ between
#: versions and which takes no ``--set`` overrides; this uses only the entry points every version has
#: (load_scenario, build_system, System.run)
_CHILD = """
import json, sys, time
sys.path.insert(0, ".")
from pathlib import Path
from actors import registry
from emulator.scenario import load_scenario
from tools.run.runner import build_system
import emulator
scenario = load_scenario(Path(sys.argv[1]), registry, sys.argv[2:] or None)
c0 = time.process_time()
system, _ = build_system(scenario)
c1 = time.process_time()
res = system.run()
c2 = time.process_time()
print(json.dumps({"status": res.status, "end_time_ps": res.end_time_ps, "messages": res.messages,
                  "digest": res.digest, "build_cpu_s": c1 - c0, "run_cpu_s": c2 - c1,
                  "imported_from": str(Path(emulator.__file__).resolve().parents[1])}))
"""


class AbError(RuntimeError):
    """A side could not be measured (a failed run, trees that model different timings, a bad revision)."""


def run_once(tree: Path, scenario: str, sets: list[str], stop=None) -> dict | None:
    """One fresh-process run of ``scenario`` in ``tree``: the child's JSON line, or None if ``stop`` (anything with
    ``is_set()``) was set before it finished (the child is killed)."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, scenario, *sets], cwd=tree, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONHASHSEED": "0"})
    while True:
        try:
            out, err = proc.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            if stop is not None and stop.is_set():
                proc.kill()
                proc.communicate()
                return None
    if proc.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-5:])
        raise AbError(f"{tree}: the run of {scenario} failed (exit {proc.returncode}):\n{tail}")
    line = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        res = json.loads(line)
    except json.JSONDecodeError:
        raise AbError(f"{tree}: the run of {scenario} printed no result (last line {line!r})") from None
    if Path(res["imported_from"]) != Path(tree).resolve():
        raise AbError(f"{tree}: the child imported the emulator from {res['imported_from']}, not from the tree")
    if res["status"] != "finished":
        raise AbError(f"{tree}: the run of {scenario} ended with status {res['status']}")
    return res


def measure(trees: dict[str, Path], scenario: str, sets: list[str], *, runs: int = 3,
            minutes: float = 0.0) -> dict[str, list[dict]]:
    """Run both trees side by side (module docstring); the counted results of each side."""
    counted: dict[str, list[dict]] = {side: [] for side in trees}
    counting = set(trees)                # the lanes still counting runs
    lock = threading.Lock()
    all_counted = threading.Event()      # no lane counts any more (or one failed): fillers end
    abort = threading.Event()            # a side failed or the user interrupted: every run ends
    errors: list[BaseException] = []
    deadline = time.monotonic() + minutes * 60

    def done_counting(side: str) -> None:
        with lock:
            counting.discard(side)
            if not counting:
                all_counted.set()

    def lane(side: str) -> None:
        try:
            tree = trees[side]
            # count until *both* sides have their runs (and the time is up): the counted runs of the
            # quicker side then span the same stretch of time as the slower side's
            while min(len(c) for c in counted.values()) < runs or time.monotonic() < deadline:
                res = run_once(tree, scenario, sets, abort)
                if res is None:
                    return
                counted[side].append(res)
            done_counting(side)
            while not all_counted.is_set():
                run_once(tree, scenario, sets, all_counted)   # keeps the other side's counted run company
        except BaseException as e:    # reported by measure(), after both lanes ended
            errors.append(e)
            abort.set()
            all_counted.set()

    threads = [threading.Thread(target=lane, args=(side,), daemon=True) for side in trees]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:         # each lane kills its child within run_once's poll interval
        abort.set()
        all_counted.set()
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]
    return counted


def summarise(counted: dict[str, list[dict]], base_cpu: float | None = None) -> dict:
    """Medians per side and the head/base ratios; the two sides must reach the same end time."""
    med = statistics.median
    ends = {side: {r["end_time_ps"] for r in rs} for side, rs in counted.items()}
    for side, e in ends.items():
        if len(e) != 1:
            raise AbError(f"{side}: its runs reached different end times {sorted(e)}")
    if ends["base"] != ends["head"]:
        raise AbError(f"the trees model different timings: end time {ends['base'].pop()} ps (base) against "
                      f"{ends['head'].pop()} ps (head); a CPU ratio would compare different work")
    sides = {}
    for side, rs in counted.items():
        run = [r["run_cpu_s"] for r in rs]
        sides[side] = {"runs": len(rs), "messages": rs[0]["messages"], "digest": rs[0]["digest"],
                       "run_cpu_s": round(med(run), 3), "run_cpu_s_min": round(min(run), 3),
                       "run_cpu_s_max": round(max(run), 3),
                       "total_cpu_s": round(med(r["build_cpu_s"] + r["run_cpu_s"] for r in rs), 3)}
    out = {"end_time_ps": counted["head"][0]["end_time_ps"], "sides": sides,
           "run_ratio": round(sides["head"]["run_cpu_s"] / sides["base"]["run_cpu_s"], 3),
           "total_ratio": round(sides["head"]["total_cpu_s"] / sides["base"]["total_cpu_s"], 3)}
    if base_cpu is not None:
        out["base_cpu_s_given"] = base_cpu
        out["head_cpu_s_implied"] = round(out["total_ratio"] * base_cpu, 1)
    return out


def _worktree(rev: str, where: Path) -> Path:
    tree = where / "base"
    proc = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise AbError(f"--base {rev}: not a revision git can check out here ({proc.stderr.strip()})")
    return tree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="a git revision of this repository, or a directory holding a tree")
    p.add_argument("--head", default=str(ROOT), help="the tree to compare (default: this one)")
    p.add_argument("--scenario", default="scenarios/ahbm/attention_decode_4sip.yaml",
                   help="scenario path, relative to each tree (default: the 128-rank decode)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="scenario override, as emu run --set (repeatable)")
    p.add_argument("--runs", type=int, default=3, help="counted runs per side, at least (default 3)")
    p.add_argument("--minutes", type=float, default=0.0, help="go on counting until this much time has passed")
    p.add_argument("--base-cpu", type=float, default=None,
                   help="the base's CPU seconds on a reference day: prints the head's implied figure")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    tmp = None
    try:
        if Path(args.base).is_dir():
            base = Path(args.base).resolve()
        else:
            tmp = Path(tempfile.mkdtemp(prefix="bench-ab-"))
            base = _worktree(args.base, tmp)
        head = Path(args.head).resolve()
        for side, tree in (("base", base), ("head", head)):
            if not (tree / args.scenario).is_file():
                raise AbError(f"{side} tree {tree} has no scenario {args.scenario}")
        out = summarise(measure({"base": base, "head": head}, args.scenario, args.sets, runs=args.runs,
                                minutes=args.minutes), args.base_cpu)
    except AbError as e:
        print(f"bench-ab: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench-ab: interrupted (the runs under way were stopped)", file=sys.stderr)
        return 130
    finally:
        if tmp is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "base")],
                           capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)
    out = {"scenario": args.scenario, "base": args.base, "head": str(head), **out}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"A/B, side by side (one tree per core): {args.scenario}, end time {out['end_time_ps']:,} ps")
    print(f"  {'side':<5} {'runs':>4} {'messages':>10} {'run cpu s':>10} {'(min-max)':>15} {'total cpu s':>11}  tree")
    for side in ("base", "head"):
        s = out["sides"][side]
        spread = f"{s['run_cpu_s_min']:.2f}-{s['run_cpu_s_max']:.2f}"
        print(f"  {side:<5} {s['runs']:>4} {s['messages']:>10,} {s['run_cpu_s']:>10.2f} {spread:>15}"
              f" {s['total_cpu_s']:>11.2f}  {args.base if side == 'base' else head}")
    line = f"  head/base: run {out['run_ratio']:.3f}, total {out['total_ratio']:.3f}"
    if args.base_cpu is not None:
        line += f"; with the base at {args.base_cpu:g} s, the head would take {out['head_cpu_s_implied']:g} s"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

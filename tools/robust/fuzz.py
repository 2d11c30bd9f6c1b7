"""Hostile input files: mutate the shipped scenarios and check the tool never shows a traceback or hangs.

A mutant is a shipped scenario with one damage applied (:data:`MUTATIONS`):
a deleted or renamed key, a value of the wrong type, a quantity with its unit
stripped or wrong, an extreme number, deep nesting, an alias bomb, a NUL or a
non-UTF-8 byte, a truncated file.  :func:`check_mutant` runs ``emu validate``
and, when that passes, ``emu run`` in-process under a virtual-time limit and a
wall-clock guard, and says what happened:

* ``rejected``  - exit 2, every stderr line one problem (``error: ...`` or an indented problem);
* ``ran``       - the run ended normally (any run status: finished, deadlock, error, ...);
* ``traceback`` - an exception escaped ``emu`` (a bug);
* ``hang``      - no answer within the wall bound (a bug; only the campaign's pool can see it).

``python -m tools.robust.fuzz --mutants N`` runs the campaign (``make fuzz-campaign``)
on a local process pool and prints the counts per mutation and outcome.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import random
import re
import sys
import traceback
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p for d in ("demo", "faults", "ahbm", "pccx") for p in (ROOT / "scenarios" / d).glob("*.yaml"))

__all__ = ["MUTATIONS", "mutate", "check_mutant", "SCENARIOS"]

_QTY = re.compile(r"\b([0-9]+(?:\.[0-9]+)?)(ps|ns|us|ms|s|GHz|MHz|GB/s|MB/s|KiB|MiB|GiB|B)\b")


def _paths(node, prefix=()):
    """Every key path of a parsed YAML tree (maps and lists)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _parent(doc, path):
    node = doc
    for p in path[:-1]:
        node = node[p]
    return node


def _tree_mutation(fn):
    def apply(text: str, rnd: random.Random) -> str:
        doc = yaml.safe_load(text)
        paths = list(_paths(doc))
        if not paths:
            return text
        path = rnd.choice(paths)
        fn(_parent(doc, path), path[-1], rnd)
        return yaml.safe_dump(doc, sort_keys=False)
    return apply


def _delete(parent, key, rnd):
    del parent[key]


def _rename(parent, key, rnd):
    if isinstance(parent, dict):
        parent[str(key)[:-1] + "x" if str(key) else "x"] = parent.pop(key)


WRONG = [None, True, "", "text", [], {}, [1, 2], {"a": 1}, -1, 0, 1.5, "12", "1e30ns"]


def _wrong_type(parent, key, rnd):
    parent[key] = rnd.choice(WRONG)


EXTREME = [10**30, -(10**30), 2**63, 2**62 + 1, 2**31, -1, 0, 1e308, float("inf"), float("nan"),
           "1e30ns", "1e30GB/s", "0GB/s", "0Hz", "1e300KiB", "99999999999999999999999ps", "0.5ps", "-5ns"]


def _extreme(parent, key, rnd):
    parent[key] = rnd.choice(EXTREME)


def _strip_unit(text, rnd):
    hits = list(_QTY.finditer(text))
    if not hits:
        return text
    m = rnd.choice(hits)
    unit = rnd.choice(["", "", "GB/s", "ns", "GHz", "KiB", "parsecs"])
    return text[:m.start()] + m.group(1) + unit + text[m.end():]


def _deep(text, rnd):
    depth = rnd.choice([100, 1200, 20000])
    if rnd.random() < 0.5:
        return text + f"\ndeep: {'[' * depth}{']' * depth}\n"
    return text + "\n" + "".join(f"{' ' * i}k{i}:\n" for i in range(min(depth, 1200))) + " " * 1200 + "v: 1\n"


def _bomb(text, rnd):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return text + "\n" + "\n".join(lines) + "\n"


def _nul(text, rnd):
    i = rnd.randrange(len(text) + 1)
    return text[:i] + "\0" + text[i:]


def _bad_byte(text, rnd):   # returns bytes: the only mutation that is not text
    raw = text.encode()
    i = rnd.randrange(len(raw) + 1)
    return raw[:i] + bytes([rnd.choice([0xff, 0xc3, 0x80, 0xfe])]) + raw[i:]


def _truncate(text, rnd):
    return text[:rnd.randrange(len(text) + 1)]


MUTATIONS = {
    "delete-key": _tree_mutation(_delete),
    "rename-key": _tree_mutation(_rename),
    "wrong-type": _tree_mutation(_wrong_type),
    "extreme-number": _tree_mutation(_extreme),
    "unit": _strip_unit,
    "deep-nesting": _deep,
    "alias-bomb": _bomb,
    "nul-byte": _nul,
    "non-utf8": _bad_byte,
    "truncate": _truncate,
}


def mutate(scenario: Path, mutation: str, seed: int) -> bytes:
    """The bytes of ``scenario`` with ``mutation`` applied (drawn from ``seed``)."""
    out = MUTATIONS[mutation](scenario.read_text(), random.Random(seed))
    return out if isinstance(out, bytes) else out.encode()


def _emu(argv: list[str]) -> tuple[int | None, str, str | None]:
    """Run ``emu`` in-process: (exit code, stderr, traceback text if an exception escaped)."""
    from tools.cli import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
    except SystemExit as e:   # argparse
        return (e.code if isinstance(e.code, int) else 2), err.getvalue(), None
    except BaseException:
        return None, err.getvalue(), traceback.format_exc()
    return rc, err.getvalue(), None


def _one_line_per_problem(stderr: str) -> bool:
    lines = [l for l in stderr.splitlines() if l.strip()]
    return bool(lines) and lines[0].startswith("error:") and all(
        l.startswith(("error:", "  ", "note:")) for l in lines) and "Traceback" not in stderr


def check_mutant(path: Path, *, run: bool = True, max_time: str = "20us", wall: str = "10s") -> tuple[str, str]:
    """``(outcome, detail)`` of ``emu validate`` then, if valid, ``emu run`` on the mutant at ``path``."""
    rc, err, tb = _emu(["validate", str(path)])
    if tb is not None:
        return "traceback", tb.strip().splitlines()[-1]
    if rc == 2:
        return ("rejected", err.splitlines()[-1][:160]) if _one_line_per_problem(err) else ("bad-message", err[:300])
    if rc != 0:
        return "bad-exit", f"validate exit {rc}: {err[:200]}"
    if not run:
        return "valid", ""
    rc, err, tb = _emu(["run", str(path), "--no-bundle", "--quiet", "--set", f"stop.max_time={max_time}",
                        "--set", f"stop.wall_timeout={wall}", "--set", "trace.enabled=false"])
    if tb is not None:
        return "traceback", tb.strip().splitlines()[-1]
    if rc == 2:
        return ("rejected-at-run", err.splitlines()[-1][:160])   # validate should have said so
    return "ran", f"exit {rc}"


def _campaign_job(job):
    scenario, mutation, seed, workdir = job
    path = Path(workdir) / f"{Path(scenario).stem}-{mutation}-{seed}.yaml"
    path.write_bytes(mutate(Path(scenario), mutation, seed))
    outcome, detail = check_mutant(path)
    if outcome in ("ran", "rejected", "valid"):
        path.unlink()
    return scenario, mutation, seed, outcome, detail


def campaign(n: int, seed: int, jobs: int, workdir: Path, timeout: float = 120.0, skip: str = "") -> Counter:
    """``n`` mutants over every shipped scenario, on a local pool; a mutant with no answer in ``timeout`` is a hang."""
    workdir.mkdir(parents=True, exist_ok=True)
    for prog in (ROOT / "scenarios" / "pccx").glob("*.pasm"):   # programs the mutants name relatively
        (workdir / prog.name).write_bytes(prog.read_bytes())
    rnd = random.Random(seed)
    scenarios = [p for p in SCENARIOS if not (skip and re.search(skip, p.name))]
    todo = [(str(scenarios[i % len(scenarios)]), rnd.choice(sorted(MUTATIONS)), rnd.randrange(10**9), str(workdir))
            for i in range(n)]
    ctx = multiprocessing.get_context("forkserver")
    counts: Counter = Counter()
    bad = []
    with ctx.Pool(jobs, maxtasksperchild=20) as pool:
        pending = [(job, pool.apply_async(_campaign_job, (job,))) for job in todo]
        for job, p in pending:
            try:
                scenario, mutation, s, outcome, detail = p.get(timeout=timeout)
            except multiprocessing.TimeoutError:
                scenario, mutation, s, outcome, detail = job[0], job[1], job[2], "hang", f"no answer in {timeout}s"
            counts[(mutation, outcome)] += 1
            done = sum(counts.values())
            if done % 50 == 0:
                print(f"... {done}/{n}: " + ", ".join(f"{o} {c}" for o, c in sorted(Counter(
                    o for (_, o), c in counts.items() for _ in range(c)).items())), flush=True)
            if outcome not in ("ran", "rejected", "valid"):
                bad.append(f"{outcome}: {Path(scenario).name} {mutation} seed {s}: {detail}")
                print(bad[-1], flush=True)
        pool.terminate()
    outcomes = sorted({o for _, o in counts})
    print(f"{n} mutants of {len(scenarios)} shipped scenarios (seed {seed})")
    print(f"{'mutation':<16}" + "".join(f"{o:>17}" for o in outcomes))
    for m in sorted(MUTATIONS):
        print(f"{m:<16}" + "".join(f"{counts.get((m, o), 0):>17}" for o in outcomes))
    total = Counter()
    for (_, o), c in counts.items():
        total[o] += c
    print(f"{'total':<16}" + "".join(f"{total.get(o, 0):>17}" for o in outcomes))
    for line in bad:
        print(line)
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.robust.fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--mutants", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--workdir", default="runs/fuzz")
    p.add_argument("--skip", default="", help="regex of scenario file names to leave out")
    args = p.parse_args(argv)
    total = campaign(args.mutants, args.seed, args.jobs, Path(args.workdir), skip=args.skip)
    return 0 if set(total) <= {"ran", "rejected", "valid"} else 1


if __name__ == "__main__":
    sys.exit(main())

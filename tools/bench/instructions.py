"""Instructions per message of the engine benchmark, counted by Valgrind: a figure noise cannot move.

``emu bench engine`` times the emulator against SimPy in CPU seconds.  On a
shared virtual machine those swing by 2x within minutes (issue #13: the same
run took 10.5 to 21.7 µs per hop), so a change of a few per cent cannot be seen
in them.  This counts the instructions each side executes instead
(``valgrind --tool=cachegrind --cache-sim=no``, the ``I refs`` total), which
is the same on every run of the same code (``PYTHONHASHSEED=0``).

Per message: each workload of :mod:`tools.bench.command` runs once at full scale and
once at a tenth, each in its own process; the difference of the two counts
divided by the difference of their message counts removes the start-up
(imports, building the model) and leaves what one more message costs.  Two
processes run at a time.

Machines: the AHBM 16-rank attention decode (timing mode) is counted the same way against
itself stopped at its first picosecond (same imports, build, start and end of every task), so
its figure is what the run costs per message, the quantity ``emu bench machine`` times in CPU
seconds.

It is a proxy, not the benchmark: an instruction of a memory-bound loop costs
more than one of a tight loop, and the emulator runs at a lower IPC than SimPy
(in CPU time its lead is smaller than in instructions).  Use it to see whether a
change made the hot path cheaper; ``emu bench engine`` stays the figure of the
goals.  ``make bench-instructions``; needs ``valgrind`` on the PATH.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tools.bench import command as bench

#: the two scales of :func:`tools.bench.command._workloads` whose difference is measured
SCALES = (1.0, 0.1)

_CHILD = """
import sys
from tools.bench import command as bench
name, kind, params, mode = bench._workloads(float(sys.argv[2]))[int(sys.argv[1])]
out = bench._emu(kind, params, mode) if sys.argv[3] == "emu" else bench._simpy(kind, params, mode)
print("messages", out["messages"])
"""


#: machine runs counted per message: (name, scenario, --set options)
MACHINE_RUNS = [("ahbm-decode-16", "scenarios/ahbm/attention_decode_16ranks.yaml", ["mode=timing"])]

_MACHINE_CHILD = """
import sys
from pathlib import Path
from actors import registry
from emulator.scenario import load_scenario
from tools.run.runner import build_system
scenario = load_scenario(Path(sys.argv[1]), registry, sys.argv[3:])
system, _ = build_system(scenario)
print("messages", system.run(until=1 if sys.argv[2] == "stopped" else None).messages)
"""


def parse_refs(text: str) -> int:
    """The ``I refs`` total of cachegrind's summary (``==123== I   refs:      2,837,187,601``)."""
    m = re.search(r"I\s+refs:\s+([\d,]+)", text)
    if m is None:
        raise RuntimeError(f"no 'I refs' line in valgrind's output:\n{text[-2000:]}")
    return int(m.group(1).replace(",", ""))


def per_message(big: tuple[int, int], small: tuple[int, int]) -> float:
    """Instructions per message from two runs ``(instructions, messages)`` of different sizes."""
    (i1, m1), (i0, m0) = big, small
    if m1 <= m0:
        raise ValueError(f"the larger run must carry more messages ({m1} <= {m0})")
    return (i1 - i0) / (m1 - m0)


def _valgrind(args: list[str], what: str) -> tuple[int, int]:
    """``(instructions, messages)`` of ``python args`` under cachegrind (the child prints ``messages N``)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", sys.executable, *args],
        capture_output=True, text=True, env=env, cwd=str(Path(__file__).resolve().parents[2]))
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed under valgrind:\n{proc.stderr[-2000:]}")
    messages = int(re.search(r"messages (\d+)", proc.stdout).group(1))
    return parse_refs(proc.stderr), messages


def _count(index: int, scale: float, side: str) -> tuple[int, int]:
    """``(instructions, messages)`` of one workload run on one side, under cachegrind."""
    return _valgrind(["-c", _CHILD, str(index), str(scale), side], f"workload {index} ({side}, scale {scale})")


def _count_machine(path: str, sets: list[str], stopped: bool) -> tuple[int, int]:
    """``(instructions, messages)`` of a machine scenario, run whole or stopped at its first picosecond."""
    how = "stopped" if stopped else "whole"
    return _valgrind(["-c", _MACHINE_CHILD, path, how, *sets], f"{path} ({how})")


def main() -> int:
    if shutil.which("valgrind") is None:
        print("bench-instructions needs valgrind on the PATH (apt install valgrind)", file=sys.stderr)
        return 2
    names = [name for name, *_ in bench._workloads(1.0)]
    jobs = [(i, scale, side) for i in range(len(names)) for side in ("emu", "simpy") for scale in SCALES]
    machine_jobs = [(path, sets, stopped) for _, path, sets in MACHINE_RUNS for stopped in (False, True)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(jobs, pool.map(lambda job: _count(*job), jobs)))
        machine = dict(zip([(p, s) for p, _, s in machine_jobs],
                           pool.map(lambda job: _count_machine(*job), machine_jobs)))
    print("engine benchmark in instructions per message (cachegrind; full scale minus a tenth)")
    print(f"  {'workload':<12} {'emu instr/msg':>14} {'simpy instr/msg':>16} {'ratio':>6}")
    for i, name in enumerate(names):
        emu = per_message(counts[(i, SCALES[0], "emu")], counts[(i, SCALES[1], "emu")])
        peer = per_message(counts[(i, SCALES[0], "simpy")], counts[(i, SCALES[1], "simpy")])
        print(f"  {name:<12} {emu:>14,.0f} {peer:>16,.0f} {peer / emu:>6.2f}")
    print("  ratio > 1: the emulator executes fewer instructions per message than SimPy")
    for name, path, _ in MACHINE_RUNS:
        (whole, messages), (stopped, _) = machine[(path, False)], machine[(path, True)]
        print(f"  {name:<12} {(whole - stopped) / messages:>14,.0f}   (machine run: instructions per message,"
              f" {messages} messages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fuzzing the shipped scenarios (issue 15): a mutated file is rejected with one line per problem
(exit 2) or runs normally -- never a traceback, never a hang.

Hypothesis draws a shipped scenario, a mutation (tools/robust/fuzz.py: deleted/renamed keys, wrong types,
stripped/wrong units, extreme numbers, deep nesting, aliases, NUL and non-UTF-8 bytes, truncation)
and its seed; ``emu validate`` and, if valid, ``emu run`` (virtual-time and wall-clock bounded) run
in-process.  SIGALRM turns a hang into a failure.  Bounded to a few dozen examples; the long
campaign (>= 1,000 mutants over every scenario) is ``make fuzz-campaign``.
"""
from __future__ import annotations

import signal
from contextlib import contextmanager

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.robust.fuzz import MUTATIONS, ROOT, check_mutant, mutate

RUNNABLE = sorted((ROOT / "scenarios" / "demo").glob("*.yaml")) + sorted((ROOT / "scenarios" / "faults").glob("*.yaml"))
VALIDATE_ONLY = [ROOT / "scenarios" / "pccx" / "softmax-asm.yaml", ROOT / "scenarios" / "ahbm" / "attention_decode.yaml"]


class Hang(Exception):
    pass


@contextmanager
def wall_bound(seconds: int):
    def on_alarm(*_):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scenario=st.sampled_from(RUNNABLE + VALIDATE_ONLY), mutation=st.sampled_from(sorted(MUTATIONS)),
       seed=st.integers(0, 2**32))
def test_a_mutated_scenario_is_rejected_clearly_or_runs(tmp_path, scenario, mutation, seed):
    path = tmp_path / f"{scenario.stem}-{mutation}-{seed}.yaml"
    path.write_bytes(mutate(scenario, mutation, seed))
    (tmp_path / "softmax.pasm").write_bytes((ROOT / "scenarios" / "pccx" / "softmax.pasm").read_bytes())
    with wall_bound(120):
        outcome, detail = check_mutant(path, run=scenario in RUNNABLE, max_time="20us", wall="10s")
    assert outcome in ("rejected", "ran", "valid"), f"{mutation} of {scenario.name} (seed {seed}): {detail}"


def test_every_mutation_changes_the_file():
    reduce = ROOT / "scenarios" / "demo" / "reduce.yaml"
    for name in MUTATIONS:
        assert any(mutate(reduce, name, s) != reduce.read_bytes() for s in range(5)), name

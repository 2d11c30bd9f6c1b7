import os
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.testing import deterministic, vclock  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
EMU = [sys.executable, "-m", "tools.cli"]

#: The suite's two tiers (docs/testing.md).  ``make test`` (the README's command) runs every test not marked
#: ``slow``: each feature at validation scale, in a few minutes on two cores.  A test marked
#: ``@pytest.mark.slow`` (or a ``pytest.param(..., marks=pytest.mark.slow)``) is a further parametrisation or
#: a larger scale of something the fast tier already checks; ``make test-all`` (``pytest --slow``) runs them
#: too and CI runs them after the fast tier (``make test-slow``).
SLOW_REASON = "slow tier: `make test-all` (pytest --slow) runs it"


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (make test-all; docs/testing.md)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a larger scale or a further parametrisation of a feature the fast "
                                       "tier checks; run by `make test-all` / `pytest --slow` (docs/testing.md)")


def pytest_collection_modifyitems(config, items):
    """Without ``--slow`` the slow tier is deselected (reported as deselected, with the count)."""
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


@pytest.fixture
def emu(tmp_path):
    """Run the real ``emu`` entry point in a subprocess: ``emu("run", path, "--json")``."""

    def call(*args, check=None, cwd=None):
        env = dict(os.environ, PYTHONHASHSEED=os.environ.get("PYTHONHASHSEED", "random"))
        proc = subprocess.run([*EMU, *map(str, args)], cwd=cwd or tmp_path, capture_output=True, text=True,
                              env=env, timeout=600)
        if check is not None:
            assert proc.returncode == check, proc.stdout + proc.stderr
        return proc

    return call


@pytest.fixture(scope="session")
def run_with_context():
    """``run(scenario) -> (result dict, system, context)``: ``tools.run.runner.run_scenario`` plus the context the
    workload's ``build`` returned (``RunOutcome.context``; the runner binds it to ``check``)."""
    from tools.run import runner

    def run(scenario):
        outcome = runner.execute(runner.plan_run(scenario, bundle=False))
        return outcome.res, outcome.system, outcome.context

    return run


@pytest.fixture(scope="session")
def machine_trace_files(tmp_path_factory):
    """Full traces of the AHBM attention prefill and the pccx program (``emu run --no-bundle --trace``),
    recorded once per session: ``{"ahbm": path, "pccx": path}``."""
    from actors import registry
    from emulator.scenario import load_scenario
    from tools.run.runner import run_scenario

    d = tmp_path_factory.mktemp("machine-traces")
    out = {}
    for key, scen in (("ahbm", "ahbm/attention_prefill.yaml"), ("pccx", "pccx/program.yaml")):
        path = d / f"{key}.emutrace"
        res, _, _ = run_scenario(load_scenario(str(ROOT / "scenarios" / scen), registry), trace_path=str(path))
        assert res["status"] == "finished", res
        out[key] = path
    return out

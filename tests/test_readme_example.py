"""The README's test examples, copied into a fresh project directory and run there by pytest.

Nothing of this repository's pytest configuration applies there (no conftest.py, no
``trio_mode``): the installed package's pytest plugin (entry point ``pytest11``) must
provide the virtual clock and the async test support on its own.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_snippet(after: str) -> str:
    """The first ```python block of README.md after the line starting with ``after``."""
    text = (ROOT / "README.md").read_text()
    start = text.index(after)
    m = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert m, f"no python block after {after!r} in README.md"
    return m.group(1)


def run_pytest_in(project: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"], cwd=project,
                          capture_output=True, text=True, env=env, timeout=600)


def test_readme_test_examples_pass_in_a_fresh_directory(tmp_path):
    project = tmp_path / "my-tests"
    project.mkdir()
    engine = readme_snippet("Engine level")
    scenario = readme_snippet("Scenario level")
    assert "async def test_" in engine and "vclock" in engine
    (project / "test_engine_example.py").write_text(engine)
    (project / "test_scenario_example.py").write_text(scenario)
    (project / "test_compare_example.py").write_text(readme_snippet("Several runs in one test"))
    p = run_pytest_in(project)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "3 passed" in p.stdout, p.stdout
    assert str(ROOT / "tests") not in p.stdout          # rootdir is the fresh project, not this repository


def test_a_failing_virtual_time_claim_fails_there_too(tmp_path):
    """The fresh project really runs the async test on virtual time (not skipped, not a no-op)."""
    project = tmp_path / "wrong"
    project.mkdir()
    engine = readme_snippet("Engine level").replace("[30_000]", "[31_000]")
    (project / "test_wrong.py").write_text(engine)
    p = run_pytest_in(project)
    assert p.returncode == 1 and "1 failed" in p.stdout and "30000" in p.stdout, p.stdout + p.stderr

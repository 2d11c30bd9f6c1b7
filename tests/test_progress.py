"""The run's progress line (tools/run/progress.py): share of the work, ETA, phase; wired to the workload's hook."""
import io
import time
from types import SimpleNamespace

from actors import registry
from conftest import ROOT
from emulator.scenario import load_scenario
from tools.run.progress import Progress, format_duration
from tools.run.runner import run_scenario


def fake_system(now_ps=13_050_000, events=415_000):
    return SimpleNamespace(clock=SimpleNamespace(now=now_ps), recorder=SimpleNamespace(count=events, events=[]))


def test_the_line_has_the_share_of_the_work_and_an_eta():
    t = [100.0]
    p = Progress(io.StringIO(), clock=lambda: t[0], start=False)
    assert p.line().startswith("build") and "wall 0.0s" in p.line()
    t[0] = 102.0
    p.attach(fake_system(), lambda: (25, 100, "MACs"))
    t[0] = 112.0                                           # 10 s of run for a quarter of the work
    line = p.line()
    assert line.startswith("run") and " 25.0 % of MACs" in line and "ETA 30.0s" in line
    assert "virtual 13.05us" in line and "415,000 events (41,500/s)" in line and "wall 12.0s" in line
    p.phase("check")
    assert p.line().startswith("check") and "%" not in p.line()
    p.attach(fake_system(), None)                          # no known total: no share, no ETA
    assert "%" not in p.line() and "ETA" not in p.line() and "virtual" in p.line()
    assert format_duration(75.2) == "1m15s" and format_duration(7300) == "2h01m"


def test_the_thread_draws_the_first_line_at_once():
    buf = io.StringIO()
    p = Progress(buf, every_s=0.01)
    try:
        t0 = time.monotonic()
        while not buf.getvalue() and time.monotonic() - t0 < 10:
            time.sleep(0.01)
    finally:
        p.close()
    assert buf.getvalue().startswith("\r  build") and buf.getvalue().endswith("\r")


class Recorder:
    def __init__(self):
        self.phases, self.work, self.system = [], None, None

    def phase(self, name):
        self.phases.append(name)

    def attach(self, system, work=None):
        self.system, self.work = system, work
        self.phases.append("run")


def test_the_runner_hands_the_display_the_kernels_macs():
    rec = Recorder()
    sc = load_scenario(str(ROOT / "scenarios/ahbm/gqa/prefill_ring.yaml"), registry, ["mode=timing"])
    res, system, _ = run_scenario(sc, progress=rec)
    assert res["status"] == "finished" and rec.phases == ["run", "check"]
    done, total, unit = rec.work()
    assert done == total > 0 and unit == "MACs"            # the build-time total is what the engines did


def test_the_runner_hands_the_display_the_gemma_layers():
    rec = Recorder()
    sc = load_scenario(str(ROOT / "scenarios/pccx/gemma3n/tiny-timing.yaml"), registry, ["workload.params.tokens=1"])
    res, system, _ = run_scenario(sc, progress=rec)
    assert res["status"] == "finished"
    done, total, unit = rec.work()
    assert done == total > 0 and unit == "layers"          # every layer of the token polled its DONE

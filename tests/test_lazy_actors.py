"""Servers started by their first message (``Actor.starts_on``) give the same run as servers started at once.

Real scenarios run both ways in one process (``System.lazy_actors``, the in-process form of
``EMU_EAGER_ACTORS=1``); status, digest, end time, messages, events, the deadlock report and the
error are compared, and the lazy run must have left servers unstarted and started some by a
message (else the comparison proves nothing).
"""
import pytest

from emulator import system as system_module

SCENARIOS = ["scenarios/ahbm/attention_decode.yaml",        # data mode: HBM, DMA, GEMM, MATH, TCM
             "scenarios/ahbm/microbench-cut-through.yaml",  # every engine, remote loads, host loads
             "scenarios/ahbm/gqa/decode_sp.yaml",           # composites: PE scheduler, GEMM via the scheduler
             "scenarios/ahbm/idle-4sip.yaml"]               # 45 k actors and links, nothing to do


def _run(path, lazy: bool, text: str | None = None, tmp_path=None):
    from actors import registry
    from conftest import ROOT
    from emulator.scenario import load_scenario
    from tools.run.runner import build_system

    if text is None:
        file = ROOT / path
    else:
        file = tmp_path / "scenario.yaml"
        file.write_text(text)
    started = []
    start = system_module.System._start_on_first_message

    def counting(self, port):
        started.append(port.owner.name)
        start(self, port)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(system_module, "LAZY_ACTOR_START", lazy)
        mp.setattr(system_module.System, "_start_on_first_message", counting)
        system, _ = build_system(load_scenario(file, registry))
        res = system.run()
    unstarted = sum(1 for a in system.actors.values() for p in a.inputs.values() if p.unstarted)
    out = (res.status, res.digest, res.end_time_ps, res.messages, res.events, str(res.deadlock), res.error)
    return out, len(started), unstarted


@pytest.mark.parametrize("path", SCENARIOS)
def test_a_server_started_by_its_first_message_gives_the_same_run(path):
    lazy, started, unstarted = _run(path, True)
    eager, started_eager, unstarted_eager = _run(path, False)
    assert lazy == eager
    assert started_eager == unstarted_eager == 0
    assert unstarted > 0, "no server was left unstarted"
    if "idle" not in path:
        assert started > 0, "no server was started by a message"


def test_a_deadlock_report_counts_unstarted_servers_as_idle(tmp_path):
    """Every command to one PE's DMA engine is dropped: the engine is never started, the CPU waits for it
    forever, and the report (idle servers counted, blocked tasks listed) is the eager run's."""
    from conftest import ROOT

    text = (ROOT / "scenarios/ahbm/attention_decode.yaml").read_text() + (
        "faults:\n"
        "  - {kind: drop, link: 'sip0/cube00/pe0/cpu.dma->sip0/cube00/pe0/dma.cmd', count: 1000}\n")
    lazy, started, unstarted = _run(None, True, text, tmp_path)
    eager, _, _ = _run(None, False, text, tmp_path)
    assert lazy[0] == "deadlock"
    assert "idle server task(s)" in lazy[5] and "sip0/cube00/pe0/cpu" in lazy[5]
    assert lazy == eager
    assert unstarted > 0 and started > 0

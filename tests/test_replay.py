"""``emu trace replay``: one actor alone against its recorded inputs."""
from __future__ import annotations

from pathlib import Path

import pytest

from actors import registry
from emulator.scenario import load_scenario
from emulator.trace import read_trace
from tools.trace.replay import ReplayError, replay_actor
from tools.run.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"
RING = ROOT / "scenarios" / "demo" / "ring.yaml"
SMALL = ["workload.params.rounds=2", "machine.overrides.cubes_x=2", "machine.overrides.cubes_y=2",
         "workload.params.root=[1,1]"]


def record(path, scenario, sets=()):
    sc = load_scenario(str(scenario), registry, list(sets))
    res, _, _ = run_scenario(sc, trace_path=str(path))
    return res, read_trace(str(path))


@pytest.fixture(scope="module")
def reduce_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "reduce.emutrace"
    res, tr = record(path, REDUCE, SMALL)
    assert res["status"] == "finished"
    return path, tr


def test_cli_replay_matches_then_diverges_when_merge_time_changes(reduce_trace, emu):
    path, tr = reduce_trace
    # cube03/pe1 has children (pe3, pe4): it merges, then sends up to cube03/pe0
    p = emu("trace", "replay", path, "--actor", "cube03/pe1", check=0)
    assert p.stdout.startswith("replay of cube03/pe1: 2 messages match")
    p = emu("trace", "replay", path, "--actor", "cube03/pe1", "--set", "workload.params.merge=16ns", check=1)
    sends = [ev for ev in tr.events if ev[0] == 0 and tr.links[ev[2]]["name"] == "cube03/pe1.up->cube03/pe0.in"]
    t0 = sends[0][1]
    # the first merge ends before the second child arrives, so only the last merge (8ns -> 16ns) shows:
    # the first partial leaves 8ns later.  The recorded run's own --set edits (SMALL) are kept.
    assert ("diverges on cube03/pe1.up->cube03/pe0.in, message 0: "
            f"expected at {t0 / 1000:g}ns ({t0} ps), got at {(t0 + 8000) / 1000:g}ns ({t0 + 8000} ps)") in p.stdout
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("actor", ["cube03/pe0", "cube00/pe0", "cube02/pe2", "cube01/pe7", "cube03/pe3"])
def test_every_kind_of_reduce_pe_replays_exactly(reduce_trace, actor):
    _, tr = reduce_trace
    res = replay_actor(tr, actor)
    assert res.ok, res.text()
    out_links = [i for i, l in enumerate(tr.links) if l["src"] == actor]
    assert res.matched == res.expected == sum(1 for ev in tr.events if ev[0] == 0 and ev[2] in out_links)
    assert res.status == "finished"


def test_a_leaf_ignores_merge_time_but_not_its_seed(reduce_trace):
    _, tr = reduce_trace
    assert replay_actor(tr, "cube01/pe7", sets=["workload.params.merge=16ns"]).ok
    res = replay_actor(tr, "cube01/pe7", sets=["seed=2"])   # data mode: the partial comes from the seed
    assert not res.ok
    assert "on cube01/pe7.up->cube01/pe3.in, message 0" in res.text() and "content differs" in res.text()
    assert "payloads differ first at byte" in res.text()


def test_root_replay_checks_its_finish_time(reduce_trace):
    _, tr = reduce_trace
    res = replay_actor(tr, "cube03/pe0", sets=["workload.params.merge=9ns"])
    assert not res.ok and res.expected == 0
    assert "the trace says it finished at" in res.text() and "the replay finished at" in res.text()


def test_replay_reproduces_back_pressure(tmp_path):
    # every round starts at once, merges are slow and links hold one message: children block on their sends
    # until the parent takes the previous partial.  Only if the sinks take at the recorded times (credits
    # come back when they did) does every actor send when it did.
    path = tmp_path / "bp.emutrace"
    _, tr = record(path, REDUCE, SMALL + ["workload.params.rounds=4", "workload.params.period=0ns",
                                          "workload.params.merge=150ns", "machine.overrides.pe_link.capacity=1",
                                          "machine.overrides.mesh_link.capacity=1"])
    blocked = {tr.links[ev[2]]["src"] for ev in tr.events if ev[0] == 8}
    assert len(blocked) > 10
    for actor in tr.actors:
        res = replay_actor(tr, actor)
        assert res.ok and res.matched == (0 if actor == "cube03/pe0" else 4), res.text()


def test_ring_replay(tmp_path):
    # dense ring (6 tokens, 4 nodes), capacity-1 links: some senders block
    path = tmp_path / "ring.emutrace"
    _, tr = record(path, RING, ["workload.params.nodes=4", "workload.params.tokens=6", "workload.params.hops=12",
                                "machine.overrides.pe_link.capacity=1"])
    assert any(ev[0] == 8 for ev in tr.events)       # there were blocked sends
    for node in ("ring/n0", "ring/n1", "ring/n2", "ring/n3"):
        res = replay_actor(tr, node)
        assert res.ok and res.matched > 0, res.text()
    res = replay_actor(tr, "ring/n1", sets=["workload.params.service=3ns"])
    assert not res.ok and "diverges on ring/n1.out->ring/n2.in" in res.text()


def test_replay_of_a_deadlocked_run_and_with_faults(tmp_path):
    _, tr = record(tmp_path / "dl.emutrace", ROOT / "scenarios" / "demo" / "deadlock.yaml")
    res = replay_actor(tr, "ring/n0")      # its first token leaves, the second send blocks forever, as recorded
    assert res.ok and res.matched == 1, res.text()
    _, tr = record(tmp_path / "stall.emutrace", ROOT / "scenarios" / "faults" / "stall.yaml")
    res = replay_actor(tr, "cube05/pe7")   # the stall fault is re-installed on the replayed actor
    assert res.ok and res.matched == 2, res.text()


def test_replay_errors_are_clear(reduce_trace, emu, tmp_path):
    path, tr = reduce_trace
    p = emu("trace", "replay", path, "--actor", "cube03/pe9", check=2)
    assert "no actor named 'cube03/pe9'" in p.stderr and "did you mean" in p.stderr
    p = emu("trace", "replay", path, "--actor", "cube03/pe1", "--set", "workload.params.merge=fast", check=2)
    assert "workload.params.merge" in p.stderr and "Traceback" not in p.stderr
    nopay = tmp_path / "nopay.emutrace"
    record(nopay, REDUCE, SMALL + ["trace.payloads=false"])
    with pytest.raises(ReplayError, match="no payload"):
        replay_actor(read_trace(str(nopay)), "cube03/pe1")


def test_replay_refuses_a_filtered_trace(tmp_path):
    path = tmp_path / "filtered.emutrace"
    record(path, REDUCE, SMALL + ["trace.kinds=[busy, send]"])
    with pytest.raises(ReplayError, match="replay needs the deliver, done, take events"):
        replay_actor(read_trace(str(path)), "cube03/pe1")
    record(path, REDUCE, SMALL + ["trace.links=['cube00/*']"])
    with pytest.raises(ReplayError, match="link filter left out cube03/pe"):
        replay_actor(read_trace(str(path)), "cube03/pe1")


# -- the shipped machines (issue 14 item 8) -------------------------------------------
AHBM_PREFILL = ROOT / "scenarios" / "ahbm" / "attention_prefill.yaml"


@pytest.fixture(scope="module")
def machine_traces(machine_trace_files):
    return {key: (path, read_trace(str(path))) for key, path in machine_trace_files.items()}


def test_cli_replays_an_ahbm_pe_cpu(machine_traces, emu):
    path, tr = machine_traces["ahbm"]
    p = emu("trace", "replay", path, "--actor", "sip0/cube00/pe3/cpu", check=0)
    sent = sum(1 for ev in tr.events if ev[0] == 0 and tr.links[ev[2]]["src"] == "sip0/cube00/pe3/cpu")
    assert p.stdout.startswith(f"replay of sip0/cube00/pe3/cpu: {sent} messages match") and sent > 100


def _one_of_each_kind(tr) -> list[str]:
    from tools.trace.summary import component_kind, kind_stems

    stems, seen = kind_stems(tr.actors), {}
    for a in tr.actors:
        seen.setdefault(component_kind(a, stems), a)
    return list(seen.values())


def test_every_kind_of_ahbm_actor_replays_exactly(machine_traces):
    _, tr = machine_traces["ahbm"]
    actors = _one_of_each_kind(tr)
    assert {"cpu", "sched", "dma", "gemm", "math", "tcm", "ipcq", "pc", "port", "router", "host"} <= {
        a.rsplit("/", 1)[-1].rstrip("0123456789") for a in actors}
    for a in actors:
        res = replay_actor(tr, a)
        assert res.ok, res.text()


def test_every_pccx_actor_replays_exactly(machine_traces):
    _, tr = machine_traces["pccx"]
    for a in tr.actors:
        res = replay_actor(tr, a)
        assert res.ok and res.matched == res.expected, res.text()


def test_a_cut_through_router_is_refused_up_front(tmp_path, emu):
    path = tmp_path / "ct.emutrace"
    _, tr = record(path, AHBM_PREFILL, ["machine.overrides.noc.switching=cut_through"])
    p = emu("trace", "replay", path, "--actor", "sip0/cube00/router", check=2)
    assert "sip0/cube00/router cannot be replayed alone: a cut-through router serialises its links" in p.stderr
    assert "Traceback" not in p.stderr and "diverges" not in p.stdout
    assert replay_actor(tr, "sip0/cube00/pe0/hbm/port").ok      # the actors around it replay fine


def test_detach_moves_a_built_actor_into_another_system():
    """The engine API replay rests on: Actor.detach() and Recorder.tap()."""
    from emulator.system import System

    sc = load_scenario(str(REDUCE), registry, SMALL)
    from tools.run.runner import build_system
    old, _ = build_system(sc)
    actor = old.actors["cube00/pe1"]
    assert actor.inputs and all(p.links for p in actor.inputs.values())
    actor.detach()
    assert actor.system is None and all(not p.links for p in actor.inputs.values())
    assert all(p.link is None for p in actor.outputs.values())
    new = System("again", seed=1)
    seen = []
    new.recorder.tap(seen.append)
    new.add(actor)
    assert new.actors["cube00/pe1"] is actor and actor.id == 0
    new.recorder.emit((6, 0, 0, "hello", 1))
    assert seen == [(6, 0, 0, "hello", 1)] and new.recorder.events == seen

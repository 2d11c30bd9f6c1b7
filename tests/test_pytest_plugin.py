"""The user-facing pytest helpers (tools/pytest_plugin.py), used as a user would."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from emulator.schema import SchemaError

pytest_plugins = ["tools.pytest_plugin"]

ROOT = Path(__file__).resolve().parents[1]
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"
SMALL = ["workload.params.rounds=1", "machine.overrides.cubes_x=2", "machine.overrides.cubes_y=2",
         "workload.params.root=[1,1]"]


async def test_run_a_scenario_and_query_its_events(vclock, emu_sim):
    run = await emu_sim.run(REDUCE, set=SMALL)
    run.assert_status("finished")
    assert run.reports["checks"]["max_abs_err"] < 1e-5          # the workload's own check ran
    assert vclock.now == run.end_time                          # it ran on the test's virtual clock
    delivers = run.events("deliver", link="cube00/pe1*")
    assert [(e.link, e.seq) for e in delivers] == [("cube00/pe1.up->cube00/pe0.in", 1)]
    assert delivers[0].dst == "cube00/pe0" and delivers[0].actor == "cube00/pe0"
    assert run.count("send") == run.count("deliver") == 4 * 8 - 1
    assert run.count("busy", actor="cube03/pe0", label="merge") == 2 + 2   # 2 PE children + 2 neighbouring CUBE roots
    run.assert_count("done", 32)
    msgs = run.assert_latency(link="cube0?/pe[1-7].up->*", min="20ns", max="200ns")
    assert len(msgs) == 4 * 7 and all(m["latency"] > 20_000 for m in msgs)
    # the two CUBE-mesh hops into the root, then its last merge
    root_in = run.events("take", link="cube0[12]/pe0.up->cube03/pe0.in")
    last = run.events("busy", actor="cube03/pe0", label="merge")[-1]
    run.assert_order(run.events("busy", label="produce"), root_in, last)
    run.assert_within(run.events("deliver"), start="100ns", end="1us")


async def test_assertions_fail_with_messages_that_name_the_events(vclock, emu_sim):
    run = await emu_sim.run(REDUCE, set=SMALL)
    with pytest.raises(AssertionError, match=r"message #1 on cube00/pe1.up->cube00/pe0.in sent at .* took "
                                             r".* > max 50ns"):
        run.assert_latency(link="cube00/pe1.up*", max="50ns")
    with pytest.raises(AssertionError, match=r"order violated: <busy .*label=merge.*> \(argument 0\) is not before"):
        run.assert_order(run.events("busy", label="merge"), run.events("busy", label="produce"))
    with pytest.raises(AssertionError, match=r"expected 3 done event\(s\) matching \{\}, found 32"):
        run.assert_count("done", 3)
    with pytest.raises(AssertionError, match="run ended 'finished', expected 'deadlock'"):
        run.assert_status("deadlock")
    with pytest.raises(AssertionError, match="no message was sent on a link matching 'nowhere'"):
        run.assert_latency(link="nowhere", max="1ns")
    with pytest.raises(ValueError, match="unknown event kind 'delivered'"):
        run.events("delivered")
    with pytest.raises(AttributeError, match="deliver event has no field 'label'"):
        run.events("deliver")[0].label


async def test_extra_faults_are_validated_and_injected(vclock, emu_sim):
    run = await emu_sim.run(REDUCE, set=SMALL, faults=[
        {"kind": "drop", "link": "cube00/pe1.up->*", "count": 1}])
    run.assert_status("deadlock")
    # the CUBE root waits for the lost partial, and the chain above it (row, then column) waits for it
    assert [b.actor for b in run.deadlock.blocked] == ["cube00/pe0", "cube01/pe0", "cube03/pe0"]
    (f,) = run.events("fault")
    assert f.target == "cube00/pe1.up->cube00/pe0.in" and f.fault == "drop@cube00/pe1.up->*"
    with pytest.raises(AssertionError, match="message #1 on cube00/pe1.up->cube00/pe0.in .* was never delivered"):
        run.assert_latency(link="cube00/pe1.up*", max="1us")
    run.assert_latency(link="cube00/pe1.up*", max="1us", delivered=False)


async def test_a_delay_fault_shows_in_latency(vclock, emu_sim):
    run = await emu_sim.run(REDUCE, set=SMALL, faults=[{"kind": "delay", "link": "cube01/pe2.up*", "delay": "1us"}])
    (m,) = run.messages("cube01/pe2.up*")
    assert m["latency"] > 1_000_000
    run.assert_latency(link="cube01/pe2.up*", min="1us", max="1.2us")


def test_bad_inputs_are_clear(tmp_path):
    from tools.pytest_plugin import SimHarness

    h = SimHarness(tmp_path)
    with pytest.raises(SchemaError, match=r"faults\[0\]\.delay: expected 'delay' for a delay fault"):
        h.load(REDUCE, faults=[{"kind": "delay", "link": "*"}])
    with pytest.raises(SchemaError, match="workload.params.rounds"):
        h.load(REDUCE, set=["workload.params.rounds=zero"])
    sc = h.load(REDUCE, seed=7, mode="timing")
    assert (sc.seed, sc.mode) == (7, "timing")


async def test_needs_the_virtual_clock_and_one_run_per_test(emu_sim):
    with pytest.raises(RuntimeError, match="add the `vclock` fixture"):
        await emu_sim.run(REDUCE, set=SMALL)


async def test_second_run_in_a_test_is_refused(vclock, emu_sim):
    await emu_sim.run(REDUCE, set=SMALL)
    with pytest.raises(RuntimeError, match="one scenario per test"):
        await emu_sim.run(REDUCE, set=SMALL)


async def test_in_process_run_has_the_same_digest_as_emu_run(vclock, emu_sim, emu):
    run = await emu_sim.run(REDUCE, set=SMALL)
    sets = [x for s in SMALL for x in ("--set", s)]
    p = emu("run", REDUCE, "--json", "--no-bundle", *sets, check=0)
    assert json.loads(p.stdout)["digest"] == run.digest     # in-process == the real command


GQA_DECODE = ROOT / "scenarios" / "ahbm" / "gqa" / "decode.yaml"


async def test_workload_metrics_are_in_the_run(vclock, emu_sim, emu):
    run = await emu_sim.run(GQA_DECODE)
    run.assert_status("finished")
    p = emu("run", GQA_DECODE, "--json", "--no-bundle", check=0)
    cli = json.loads(p.stdout)
    assert run.json["digest"] == cli["digest"] and run.json["status"] == "finished"
    for key in ("latency_ps", "ratio_to_bound", "bound_ps", "max_abs_err", "kv_bytes_read"):
        assert run.metric(key) == cli[key], key          # the same numbers as result.json
    assert run.assert_metric("ratio_to_bound", min=1.0, max=3.0) == cli["ratio_to_bound"]
    run.assert_metric("latency_ps", max=f"{cli['latency_ps'] + 1}ps", min="1ns")
    with pytest.raises(AssertionError, match=r"metric ratio_to_bound = .* > max 1.0"):
        run.assert_metric("ratio_to_bound", max=1.0)
    with pytest.raises(KeyError, match=r"no metric 'tok_per_s'; its scalar metrics: .*latency_ps"):
        run.metric("tok_per_s")


def test_run_sync_has_the_metrics_of_emu_run(emu_sim):
    run = emu_sim.run_sync(REDUCE, set=SMALL)
    assert run.metrics["max_abs_err"] == run.json["max_abs_err"] < 1e-5
    assert run.json["end_time_ps"] == run.end_time and run.json["digest"] == run.digest


def _ipcq_hop_in_flight(sim) -> bool:
    return any(l.inflight for l in sim.system.links
               if l.src.owner.name.endswith("/ipcq") and l.dst.owner.name.endswith("/ipcq"))


async def test_a_stepped_run_pauses_for_inspection_and_resumes_to_the_same_run(vclock, emu_sim, emu):
    """run_until(T), run_until(condition), state(path), resume(): pausing reads the machine mid-run and
    changes nothing (the finished run has the digest of an uninterrupted emu run)."""
    import json as _json
    whole = _json.loads(emu("run", f"{ROOT}/scenarios/ahbm/gqa/decode_sp.yaml", "--json", "--compact",
                            "--no-bundle", "--quiet", check=0).stdout)
    async with emu_sim.stepped("scenarios/ahbm/gqa/decode_sp.yaml") as sim:
        assert await sim.run_until("1us") == 1_000_000 == sim.now
        cpu = sim.state("sip0/cube00/pe0/cpu")
        assert cpu["type"] == "PeCpu" and cpu["state"] in ("busy", "recv", "waiting")
        assert len(sim.state("sip0/cube00/pe0/*")) >= 5
        assert not _ipcq_hop_in_flight(sim)
        t = await sim.run_until(_ipcq_hop_in_flight)            # the Level-2 reduction's first hop
        hops = {n: l for n, l in sim.state("links").items() if "/ipcq.tx_" in n and l["in_flight"]}
        assert hops and all(m["kind"] == "IpcqData" and m["deliver_ps"] > t for l in hops.values()
                            for m in l["in_flight"])
        run = await sim.resume()
    assert run.status == "finished" and run.digest == whole["digest"] and run.end_time == whole["end_time_ps"]


async def test_run_until_past_the_end_says_the_run_ended(vclock, emu_sim):
    async with emu_sim.stepped("scenarios/demo/reduce.yaml") as sim:
        with pytest.raises(AssertionError, match="the run ended .finished. at 16.1418us before run_until.1ms."):
            await sim.run_until("1ms")
        with pytest.raises(AssertionError, match="the run is over"):
            await sim.run_until("2ms")

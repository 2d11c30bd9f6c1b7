"""``fidelity: pipeline`` (actors/ahbm/pipeline.py) against the default block model, through the real CLI.

The coarser level must stay within 1 % of the default's end time (issue 22) on the small shipped
Ring prefill (timing mode: pipeline batches only TCM-resident composites in timing mode) and cut
its messages; the default must not change (its digest is the shipped one).
"""
import json
import subprocess
import sys

import numpy as np
import pytest
import trio

from actors.ahbm.energy import energy_inventory
from actors.ahbm.testkit import load_profile, log, remote_load_store
from emulator.clock import VirtualClock

SC = "scenarios/ahbm/gqa/prefill_ring.yaml"


def _run(*sets, sc=SC):
    cmd = [sys.executable, "-m", "tools.cli", "run", sc, "--json", "--compact", "--no-bundle", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


@pytest.mark.parametrize("variant", [[], pytest.param(["workload.params.ring_order=zigzag"], marks=pytest.mark.slow),
                                     pytest.param(["workload.params.ring_state=hbm"], marks=pytest.mark.slow)],
                         ids=["contiguous", "zigzag", "hbm-state"])
def test_pipeline_end_time_within_one_percent_and_fewer_messages(variant):
    block = _run("mode=timing", *variant)
    pipe = _run("mode=timing", "workload.params.fidelity=pipeline", *variant)
    assert pipe["status"] == "finished"
    assert abs(pipe["end_time_ps"] - block["end_time_ps"]) <= 0.01 * block["end_time_ps"]
    assert pipe["messages"] < 0.6 * block["messages"]
    assert pipe["latency_ps"] == block["latency_ps"]


def test_block_is_the_default():
    assert _run("mode=timing")["digest"] == _run("mode=timing", "workload.params.fidelity=block")["digest"]


def test_pipeline_in_data_mode_is_the_block_model():
    a, b = _run(), _run("workload.params.fidelity=pipeline")
    assert a["digest"] == b["digest"] and a["max_abs_err"] == b["max_abs_err"]


# ------------------------------------------------------------------ the HBM stack (memory.HbmStack)
def _hbm_energy(r):
    e = r["energy"]
    return e["by_class_j"]["hbm"], {k: v for k, v in e["actions"].items() if k.startswith("energy.hbm")}


def _compute_energy(r):
    """The MATH and GEMM energy: element ops and MACs, counted by the engines whatever the command form."""
    e = r["energy"]
    return ({k: e["by_class_j"][k] for k in ("math", "gemm")},
            {k: v for k, v in e["actions"].items() if k.startswith(("energy.math", "energy.gemm"))})


@pytest.mark.parametrize("sc,sets", [(SC, ["workload.params.ring_state=hbm"]), ("scenarios/ahbm/gqa/decode.yaml", []),
                                     pytest.param("scenarios/ahbm/attention_decode.yaml", [], marks=pytest.mark.slow)],
                         ids=["ring-hbm-state", "gqa-decode", "attention-decode"])
def test_pipeline_hbm_stack_same_end_time_and_hbm_energy(sc, sets):
    """At pipeline (timing mode) a PE's channels are one HbmStack: the same per-channel timing, so these
    scenarios (whose composites the pipeline times exactly) end at the same ps, and the HBM energy (bytes per
    channel, static power of every channel) is the channels' to the attojoule."""
    block = _run("mode=timing", *sets, sc=sc)
    pipe = _run("mode=timing", "workload.params.fidelity=pipeline", *sets, sc=sc)
    assert pipe["status"] == "finished"
    assert pipe["end_time_ps"] == block["end_time_ps"]
    assert _hbm_energy(pipe) == _hbm_energy(block)
    assert _compute_energy(pipe) == _compute_energy(block)   # MathOps and MathBatches count their elements
    # the TCM is charged per message: what pipeline does not message is missing, and the result says so
    assert "TCM accesses not charged" in pipe["energy"]["caveat"] and "caveat" not in block["energy"]
    assert pipe["messages"] < block["messages"]


def _remote(fidelity):
    me, owner = (0, 0, 0), (0, 5, 1)
    data = np.arange(3000, dtype=np.uint8)     # several bursts per channel, a ragged last one
    prof = load_profile("ahbm-1sip")
    system, m, _, _, _ = remote_load_store(me, owner, data, prof, fidelity=fidelity)
    return system, m, prof, me


def test_remote_hbm_through_the_port_same_times_and_energy():
    """Remote DMAs served by the owner's HBM port (hbmport.py): with the stack the port sends one request and
    gets one answer per access; the load's and the store's times and the HBM energy are the channels'."""
    out = {}
    for fid in ("block", "pipeline"):
        system, m, prof, me = _remote(fid)
        res = trio.run(system.run_async, clock=VirtualClock())     # each run on its own virtual clock
        assert res.status == "finished", res.error
        charges, leaks = energy_inventory(system, prof, res.end_time_ps)
        hbm = (sorted((c.component, c.coef, c.count) for c in charges if c.cls == "hbm"),
               sorted((l.component, l.power_uw) for l in leaks if l.cls == "hbm"))
        out[fid] = (res.end_time_ps, log(m, me, "rload"), log(m, me, "rstore"), hbm, system)
    b, p = out["block"], out["pipeline"]
    assert p[:4] == b[:4]
    stack = p[4].actors["sip0/cube05/pe1/hbm/stack"]
    assert sum(stack.pc_bursts) > stack.prm.pcs and stack.bytes_by_op == {"read": 3000, "write": 3000}
    assert "sip0/cube05/pe1/hbm/pc0" not in p[4].actors
    pc_links = [ln for ln in p[4].links if ln.src.owner is stack or ln.dst.owner is stack]
    assert sum(ln.messages for ln in pc_links) == 4        # port -> stack, stack -> port: load and store


# ---------------------------------------------------------------- composites with an HBM operand (issue 22)
# At pipeline the PE scheduler keeps the block stream's DMAs, panels and epilogue commands for a composite
# that reads B (or A) from HBM, holds the GEMM array for the run and times its steps with the engine's
# formulas (pipeline.HeldArray): the end times are the block model's exactly.

HBM_OPERAND = ["scenarios/ahbm/gqa/decode.yaml",
               pytest.param("scenarios/ahbm/gqa/decode_sp.yaml", marks=pytest.mark.slow), "scenarios/ahbm/gqa/prefill.yaml"]


def _run_sc(sc, *sets):
    cmd = [sys.executable, "-m", "tools.cli", "run", sc, "--json", "--compact", "--no-bundle", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


@pytest.mark.parametrize("sc", HBM_OPERAND, ids=["decode", "decode_sp", "prefill-no-sp"])
def test_hbm_operand_composites_exact_with_fewer_messages(sc):
    block = _run_sc(sc, "mode=timing")
    pipe = _run_sc(sc, "mode=timing", "workload.params.fidelity=pipeline")
    stream = _run_sc(sc, "mode=timing", "workload.params.fidelity=stream")
    assert pipe["status"] == stream["status"] == "finished"
    assert pipe["end_time_ps"] == block["end_time_ps"] == stream["end_time_ps"]
    assert pipe["latency_ps"] == block["latency_ps"] == stream["latency_ps"]
    assert pipe["messages"] < 0.75 * block["messages"]
    assert stream["messages"] < 0.9 * pipe["messages"]      # no DMA command, HBM request or answer per block
    assert _hbm_energy(stream) == _hbm_energy(block)         # the held run's channel bytes reach the stack


def _script_run(fidelity, script, tcm=()):
    from actors.ahbm.builder import build_machine
    from actors.ahbm.placement import Placement
    from actors.ahbm.testkit import load_profile
    from emulator.system import System

    system = System("fidelity-test", seed=0, mode="timing")
    m = build_machine(system, load_profile(), scripts={(0, 0, 0): script}, fidelity=fidelity)
    place = Placement(m, False)
    for name, arr in tcm:
        place.tcm_put((0, 0, 0), name, arr)
    return system, m, place


def _composites(place, n, M=80, K=160, N=48):
    import numpy as np
    a = place.put((0, 0, 0), np.zeros((M, K), np.float16))
    b = place.put((0, 0, 0), np.zeros((K, N), np.float16))
    cmds = []
    for i in range(n):
        c = place.put((0, 0, 0), np.zeros((M, N), np.float16))
        cmds.append({"op": "composite", "a_addr": a, "b_addr": b, "c_addr": c, "m": M, "k": K, "n": N,
                     "dtype": "<f2", "epilogue": [["scale", 0.5], ["relu", 0]], "label": f"c{i}", "async": True})
    return cmds + [{"op": "wait"}]


async def test_held_array_times_the_steps_as_the_engine_does(vclock):
    """Three HBM-operand composites back to back (the 2nd and 3rd taken ahead, panels, epilogues, HBM stores):
    at pipeline the GEMM engine's busy spans, occupancy and every command's times equal the block model's,
    though the scheduler sent it no GemmCmd; at stream also with no DmaCmd to the DMA engine (pipeline.HeldDma),
    whose setup spans and bytes, and the HBM stack's per-channel bursts and bytes, are pipeline's."""
    from actors.ahbm.testkit import log

    out, dma = {}, {}
    for fid in ("block", "pipeline", "stream"):
        script = []
        system, m, place = _script_run(fid, script)
        script += _composites(place, 3)
        res = await system.run_async()
        assert res.status == "finished", res.error
        pe = m.pe(0, 0, 0)
        rows = [log(m, (0, 0, 0), f"c{i}") for i in range(3)]
        t0 = rows[0][1]    # the two runs share the test's virtual clock: times relative to the first start
        out[fid] = (res.end_time_ps - t0, [[r[0]] + [t - t0 for t in r[1:]] for r in rows], pe.gemm.busy_ps,
                    pe.gemm.busy_spans, pe.gemm.array_ps, pe.gemm.macs, pe.dma.bytes_moved)
        if fid != "block":
            assert pe.sched.held_runs >= 1 and pe.sched.taken_ahead >= 1 and pe.gemm.held_back == 0
            assert system.link(f"{pe.sched.name}.gemm->{pe.gemm.name}.cmd").messages == 2 * pe.sched.held_runs
            st = pe.stack
            dma[fid] = (pe.dma.busy_ps, pe.dma.busy_spans, pe.dma.loads_by_region, st.pc_busy_ps, st.pc_bursts,
                        st.pc_bytes, st.bytes_by_op, [f - t0 for f in st.free_at], st.busy_ps)
        if fid == "stream":   # the hold and the release only, to the DMA engine and from it to the stack
            held = 2 * pe.sched.held_runs
            assert system.link(f"{pe.sched.name}.dma->{pe.dma.name}.cmd").messages == held
            assert system.link(f"{pe.dma.name}.hbm->{pe.stack.name}.req").messages == held
            assert pe.dma.held_back == 0 and pe.stack.held_back == 0
    assert out["pipeline"] == out["block"]
    assert out["stream"] == out["block"]
    assert dma["stream"] == dma["pipeline"] and dma["stream"][0] > 0


async def test_cpu_gemm_waits_for_the_held_array(vclock):
    """The coarser part: a CPU GEMM that reaches the engine while the scheduler holds it is served after the
    release (the block model would interleave it between the composite's steps); nothing overlaps."""
    import numpy as np

    script = []
    system, m, place = _script_run("pipeline", script, tcm=[("a", np.zeros((32, 64), np.float16)),
                                                             ("b", np.zeros((64, 32), np.float16))])
    script += _composites(place, 1)[:-1] + [
        {"op": "gemm", "a": "a", "b": "b", "acc": "c", "m": 32, "k": 64, "n": 32, "label": "g", "async": True},
        {"op": "wait"}]
    res = await system.run_async()
    assert res.status == "finished", res.error
    pe = m.pe(0, 0, 0)
    assert pe.gemm.held_back == 1
    from actors.ahbm.testkit import log
    assert log(m, (0, 0, 0), "g")[3] >= log(m, (0, 0, 0), "c0")[3] - 200_000   # served after the composite's steps


async def test_cpu_dma_waits_for_the_held_dma_engine(vclock):
    """fidelity stream's coarser part: a CPU DMA that reaches the engine while the scheduler holds it is served
    after the release (the block and pipeline models queue it among the composite's loads)."""
    from actors.ahbm.testkit import log

    ends = {}
    for fid in ("pipeline", "stream"):
        script = []
        system, m, place = _script_run(fid, script)
        x = place.put((0, 0, 0), np.zeros(2048, np.uint8))
        script += _composites(place, 1)[:-1] + [
            {"op": "dma", "kind": "load", "addr": x, "row_bytes": 2048, "buf": "x", "shape": [2048], "dtype": "|u1",
             "label": "x", "async": True}, {"op": "wait"}]
        res = await system.run_async()
        assert res.status == "finished", res.error
        pe = m.pe(0, 0, 0)
        t0 = log(m, (0, 0, 0), "c0")[1]
        ends[fid] = (pe.dma.busy_until - t0, pe.gemm.busy_until - t0, 0)
        assert pe.dma.held_back == (1 if fid == "stream" else 0)
    (_, gemm_p, _), (dma_s, gemm_s, _) = ends["pipeline"], ends["stream"]
    assert gemm_s < gemm_p                        # at pipeline the CPU's load went among the composite's, delaying it
    assert dma_s - m.prm.dma_setup >= gemm_s      # at stream its setup (the engine's last span) after the run's GEMMs


async def test_select_until_returns_a_message_before_the_deadline_or_none_at_it(vclock):
    """emulator.link.select_until (the scheduler's wait for a held GEMM step): a message that arrives
    before the deadline, or at it, is returned at its arrival; otherwise ``None`` at the deadline."""
    from emulator.actor import Actor
    from emulator.link import select_until
    from emulator.system import System
    from emulator.testing import Source, run
    from emulator.units import ns
    from protocols.demo import Token

    class Until(Actor):
        def __init__(self, name, deadlines):
            super().__init__(name)
            self.a, self.b = self.in_port("a"), self.in_port("b")
            self.deadlines, self.got = deadlines, []

        async def run(self):
            for t in self.deadlines:
                got = await select_until((self.a, self.b), t)
                self.got.append((self.now, None if got is None else (got[0].name, got[1].token)))

    system = System("until")
    u = system.add(Until("u", [ns(5), ns(20), ns(25), ns(35), ns(41), ns(200), ns(300)]))
    s1 = system.add(Source("s1", [(ns(30), Token(1, 0))]))
    s2 = system.add(Source("s2", [(ns(10), Token(2, 0)), (ns(40), Token(3, 0)), (ns(100), Token(4, 0))]))
    system.connect(s1.out, u.a, latency=ns(1))
    system.connect(s2.out, u.b, latency=ns(1))
    await run(system)
    assert u.got == [(ns(5), None), (ns(11), ("b", 2)), (ns(25), None), (ns(31), ("a", 1)), (ns(41), ("b", 3)),
                     (ns(101), ("b", 4)), (ns(300), None)]



# ---------------------------------------------------------------- MATH runs (issue 22)
# At pipeline the tl runtime sends consecutive MATH ops as one MathRun (runtime.Tl._flush); the MATH engine serves
# each op at its own arrival (mathunit.MathEngine._runs) and the CPU charges the same dispatch time: every MATH
# engine's busy time, spans and element ops and every CPU's busy time are the block model's.

SLOW_DISPATCH = {"cpu": {"dispatch_cycles": {"math": 64}}}   # dispatch slower than most MATH ops: the gaps count


@pytest.mark.parametrize("params,over", [({}, None), ({"ring_state": "hbm", "q_tile": 4}, None),
                                         ({"case": "decode", "C": 2, "P": 8, "context": 1000, "tile": 32}, None),
                                         ({}, SLOW_DISPATCH)],
                         ids=["ring", "ring-spilled", "decode-sp", "ring-slow-dispatch"])
def test_math_runs_keep_every_math_span_and_cpu_time(params, over):
    from actors.ahbm.tl.gqa_workload import WORKLOAD
    from actors.ahbm.testkit import build_workload

    base = {"case": "prefill", "C": 1, "P": 8, "G": 4, "d": 64, "context": 256, "chunk": 256, **params}
    out = {}
    for fid in ("block", "pipeline"):
        system, _, _, _ = build_workload(WORKLOAD, {**base, "fidelity": fid}, name="runs", mode="timing",
                                         overrides=over)
        res = system.run()
        assert res.status == "finished", res.error
        maths = [a for a in system.actors.values() if type(a).__name__ == "MathEngine" and a.busy_spans]
        cpus = [a for a in system.actors.values() if type(a).__name__ == "PeCpu" and a.busy_spans]
        runs = sum(ln.messages for ln in system.links if ln.name.endswith("/math.cmd") and "/cpu.math->" in ln.name)
        out[fid] = (res.end_time_ps, [(a.name, a.busy_ps, a.busy_spans, a.elements) for a in maths],
                    sorted((a.name, a.busy_ps) for a in cpus), runs)
    assert out["pipeline"][:3] == out["block"][:3]
    assert 0 < out["pipeline"][3] < out["block"][3] / 2     # fewer CPU -> MATH messages: ops go in runs

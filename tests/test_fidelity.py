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


@pytest.mark.parametrize("variant", [[], ["workload.params.ring_order=zigzag"], ["workload.params.ring_state=hbm"]],
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
                                     ("scenarios/ahbm/attention_decode.yaml", [])],
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

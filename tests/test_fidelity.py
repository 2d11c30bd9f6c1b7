"""``fidelity: pipeline`` (actors/ahbm/pipeline.py) against the default block model, through the real CLI.

The coarser level must stay within 1 % of the default's end time (issue 22) on the small shipped
Ring prefill (timing mode: pipeline batches only TCM-resident composites in timing mode) and cut
its messages; the default must not change (its digest is the shipped one).
"""
import json
import subprocess
import sys

import pytest

SC = "scenarios/ahbm/gqa/prefill_ring.yaml"


def _run(*sets):
    cmd = [sys.executable, "-m", "tools.cli", "run", SC, "--json", "--compact", "--no-bundle", "--quiet"]
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

"""The GQA report's phase breakdown (actors/ahbm/tl/gqa_phases.py): launch, sweep, one reduction phase per
hop of the critical chain, store, completion; they sum to the kernel latency."""
import json

import pytest


@pytest.mark.parametrize("scenario, sets", [
    ("scenarios/ahbm/gqa/decode_sp.yaml", []),
    pytest.param("scenarios/ahbm/gqa/llama70b_decode_8k_1sip.yaml", ["--set", "workload.params.C=4",
                                                                      "--set", "workload.params.context=16384"],
                 marks=pytest.mark.slow),      # Llama shapes: the same tree at scale
])
def test_decode_phases_sum_to_the_latency_and_follow_the_tree(emu, scenario, sets):
    res = json.loads(emu("run", scenario, *sets, "--no-bundle", "--json", "--quiet", check=0).stdout)
    ph = res["phases"]
    assert sum(p["ps"] for p in ph) == res["latency_ps"]
    names = [p["phase"] for p in ph]
    assert names[:2] == ["launch", "sweep"] and names[-2:] == ["store", "completion"]
    # the chain climbs the Level-2 tree, then the Level-1 tree: as many hops as the trees are deep
    assert names.count("reduction L2") == res["l2_rounds"] and names.count("reduction L1") == res["l1_rounds"]
    hops = [p["where"] for p in ph if p["phase"].startswith("reduction")]
    for a, b in zip(hops, hops[1:]):
        assert a.split(" -> ")[1] == b.split(" -> ")[0]     # one chain: each hop starts where the last ended
    assert max(ph, key=lambda p: p["ps"])["phase"] == "sweep"


def test_no_reduction_gives_launch_kernel_completion(emu):
    res = json.loads(emu("run", "scenarios/ahbm/gqa/prefill.yaml", "--no-bundle", "--json", "--quiet",
                         check=0).stdout)
    assert [p["phase"] for p in res["phases"]] == ["launch", "kernel", "completion"]
    assert sum(p["ps"] for p in res["phases"]) == res["latency_ps"]


def test_gemma_stage_time_partitions_the_token(emu):
    """Per-token stage time (actors/pccx/gemma3n/phases.py): the stages' times sum to the token time, and
    on the tiny model (one token: its stage times are those of the scenario's 4) the FFN up-projection (the largest weight stream) is where the time sits."""
    res = json.loads(emu("run", "scenarios/pccx/gemma3n/tiny-timing.yaml", "--set", "workload.params.tokens=1", "--no-bundle", "--json", "--quiet",
                         check=0).stdout)
    st = res["stage_time_us"]
    assert abs(sum(st.values()) - res["token_time_us"]) < 0.01 * len(st)
    assert max(st, key=st.get) == "ffn_up"
    rows = res["tables"]["gemma3n per-stage (per token)"]
    assert all("time_us" in r for r in rows)

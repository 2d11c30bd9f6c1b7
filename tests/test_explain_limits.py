"""What limits a run (tools/explain/limits.py): the bound's binding term named right, and the
critical path's time put into resource classes that sum to the run."""
import json

import pytest

from tools.explain.limits import _gemma_binding, _gqa_binding, step_class

GQA = "scenarios/ahbm/gqa/llama70b_decode_8k_1sip.yaml"
# Llama3-70B decode at 8K with C = 2 CUBEs a KV head: 512 tokens a PE, the per-PE shapes of 16K at C = 4 (the
# docs' example) at half the PEs and the run time
LLAMA_C2 = ["--set", "workload.params.C=2"]
# Gemma 3N tiny, one token after the context: the per-token stage times are those of the scenario's 4 tokens
GEMMA_1 = ["--set", "workload.params.tokens=1"]


def _gqa_res(kv, gemm, red=10):
    return {"bound_ps": 100 + max(kv, gemm) + red, "ring_q_tile": 1,
            "bound_terms": {"launch_ps": 50, "first_access_ps": 50, "kv_ps": kv, "gemm_ps": gemm,
                            "reduction_ps": red}}


def test_gqa_binding_term_is_the_larger_of_kv_and_gemm_and_names_padding():
    prof = {"gemm": {"array_rows": 32, "charge_padded": True}}
    decode = {"case": "decode", "G": 8, "C": 4, "P": 8}
    b = _gqa_binding(_gqa_res(1000, 4000), prof, decode)
    assert b["binding"] == "gemm (padded rows: M = 8 of 32)" and b["runner_up"]["name"] == "kv stream"
    assert _gqa_binding(_gqa_res(4000, 1000), prof, decode)["binding"] == "kv stream"
    # no padding charged, or M a multiple of the array rows: plain "gemm"
    assert _gqa_binding(_gqa_res(1000, 4000), {"gemm": {"array_rows": 32, "charge_padded": False}},
                        decode)["binding"] == "gemm"
    assert _gqa_binding(_gqa_res(1000, 4000), prof, {**decode, "G": 32})["binding"] == "gemm"
    # a reduction larger than both binds
    assert _gqa_binding(_gqa_res(10, 20, red=500), prof, decode)["binding"] == "reduction depth"


def test_gemma_binding_names_the_smallest_tok_s_bound():
    res = {"bounds": {"binding": "ddr", "tok_s_bound": 2.0, "tok_s_bound_weight_stream": 3.0,
                      "tok_s_bound_macs": 50.0, "tok_s_bound_ddr": 2.0}}
    b = _gemma_binding(res, [2, 3])
    assert b["binding"] == "host DDR" and b["runner_up"]["name"] == "weight stream over HP2/HP3"
    assert b["ps"] == 500_000_000_000   # 1 / 2 tok/s


LINKS = {"a": {"src": "sip0/cube00/router", "dst": "sip0/cube01/router"},
         "b": {"src": "sip0/cube00/pe1/cpu", "dst": "sip0/cube00/router"},
         "c": {"src": "io/host", "dst": "sip0/cube00/pe1/cpu"},
         "d": {"src": "sip0/cube00/pe1/dma", "dst": "sip0/cube00/pe1/pc3"},
         "e": {"src": "sip0/cube00/pe1/cpu", "dst": "sip0/cube00/pe1/ipcq"}}


@pytest.mark.parametrize("step, cls", [
    ({"kind": "message", "link": "a"}, "UCIe"), ({"kind": "message", "link": "b"}, "NOC"),
    ({"kind": "message", "link": "c"}, "host"), ({"kind": "message", "link": "d"}, "HBM channels"),
    ({"kind": "message", "link": "e"}, "IPCQ"), ({"kind": "busy", "actor": "sip0/cube00/pe1/gemm"}, "GEMM array"),
    ({"kind": "idle", "actor": "sip0/cube00/pe1/pc3"}, "HBM channels"),
    ({"kind": "poll", "actor": "io/host"}, "DONE polls"),
    ({"kind": "busy", "actor": "sip0/cube00/pe1/cpu"}, "CPU dispatch"),
])
def test_step_classes_ahbm(step, cls):
    assert step_class(step, LINKS, {"pc", "cube", "pe"}, "ahbm") == cls


def test_step_classes_pccx():
    assert step_class({"kind": "busy", "actor": "pccx/hp2"}, {}, {"hp"}, "pccx") == "HP ports"
    assert step_class({"kind": "busy", "actor": "pccx/gemm"}, {}, {"hp"}, "pccx") == "systolic array"
    links = {"x": {"src": "pccx/ddr", "dst": "pccx/driver"}}
    assert step_class({"kind": "message", "link": "x"}, links, {"hp"}, "pccx") == "host round trips"


def _limits(emu, tmp_path, *sets):
    p = emu("run", GQA, *LLAMA_C2, *sets, "--no-bundle", "--trace", tmp_path / "t.emutrace", "--json", "--quiet",
            check=0)
    return json.loads(p.stdout)["limits"]


def test_llama_decode_is_gemm_bound_shipped_and_kv_bound_unpadded(emu, tmp_path):
    """The GQA decode at Llama shapes (512 tokens a PE: 8K at C = 2, 16K at C = 4): padded M = 8 -> 32 rows makes it GEMM-bound with the shipped
    profile; charging only the valid rows (gemm.charge_padded: false) makes the K/V stream bind."""
    lim = _limits(emu, tmp_path)
    assert lim["bound"]["binding"] == "gemm (padded rows: M = 8 of 32)"
    cp = lim["critical_path"]
    assert cp["top"] == "GEMM array"
    assert sum(v["ps"] for v in cp["classes"].values()) == cp["end_ps"]    # the steps partition [0, end]
    assert cp["walk"]["events"] > 0 and cp["walk"]["wall_s"] >= 0          # what the walk cost is recorded
    lim = _limits(emu, tmp_path, "--set", "machine.overrides.gemm.charge_padded=false")
    assert lim["bound"]["binding"] == "kv stream"
    assert lim["critical_path"]["top"] == "HBM channels"


def test_no_trace_says_why(emu, tmp_path):
    p = emu("run", "scenarios/demo/ring.yaml", "--no-bundle", "--json", "--quiet", check=0)
    lim = json.loads(p.stdout)["limits"]
    assert lim["bound"] is None and "no trace" in lim["critical_path"]["missing"]


@pytest.mark.parametrize("sets, binding", [
    ([], "weight stream over HP2/HP3"),
    (["--set", "machine.overrides.hp.beat_bytes=64"], "host DDR"),   # 4x the HP bandwidth: DDR binds
])
def test_gemma_names_the_weight_stream_and_a_4x_hp_variant_moves_it(emu, tmp_path, sets, binding):
    p = emu("run", "scenarios/pccx/gemma3n/tiny-timing.yaml", *GEMMA_1, *sets, "--no-bundle", "--json", "--quiet", check=0)
    assert json.loads(p.stdout)["limits"]["bound"]["binding"] == binding


def test_a_bound_that_names_its_binding_term_is_taken_at_its_word():
    from tools.explain.limits import binding_term
    res = {"bound_ps": 900, "bound_terms": {"sharing_ps": 600, "arrival_ps": 900, "binding": "arrival"}}
    b = binding_term(res, {}, {})
    assert b["binding"].startswith("request arrivals") and b["runner_up"]["name"].startswith("Group sharing")
    res["bound_terms"]["binding"] = "sharing"     # the workload's word wins over the larger number
    assert binding_term(res, {}, {})["binding"].startswith("Group sharing")


def test_the_line_states_the_walk_cost_on_a_large_trace():
    """The critical-path walk costs ~1 s a million events: from WALK_NOTE_EVENTS up the line says so."""
    from tools.explain.limits import WALK_NOTE_EVENTS, limits_line
    cp = {"classes": {"GEMM array": {"ps": 56, "share": 0.56}, "MATH": {"ps": 44, "share": 0.44}}}
    small = {"bound": None, "critical_path": {**cp, "walk": {"events": 5000, "wall_s": 0.01, "share_of_run": 0.01}}}
    assert "critical path: GEMM array 56 %, MATH 44 %" in limits_line(small)
    large = {"bound": None, "critical_path": {**cp, "walk": {"events": WALK_NOTE_EVENTS + 900_000, "wall_s": 2.406,
                                                             "share_of_run": 0.174}}}
    assert ("critical path (1.9 M events walked in 2.4 s, 17 % of the run's wall time): GEMM array 56 %"
            in limits_line(large))


def test_a_default_trace_removed_by_the_size_policy_is_named_as_the_reason(tmp_path, monkeypatch):
    """A bundle's default trace over the kept size is removed before the walk: the line says so (not 'no trace
    was recorded', which would be wrong)."""
    from actors import registry
    from emulator.scenario import load_scenario
    from tools.run import runner

    monkeypatch.setattr(runner, "DEFAULT_TRACE_KEEP_MB", 0.0)
    sc = load_scenario("scenarios/demo/ring.yaml", registry)
    res = runner.execute(runner.plan_run(sc, out=str(tmp_path / "b"))).res
    assert res["trace"] is None
    assert "over the size kept and removed" in res["limits"]["critical_path"]["missing"]
    assert "over the size kept" in res["limits"]["line"]


#: Llama3-70B decode at 8K, one KV head (issue 38): its bound's gemm term binds, its critical path leads with MATH
ONE_HEAD = ["--set", "workload.params.heads=1"]


def _run_8k(emu, tmp_path, *sets):
    p = emu("run", GQA, *ONE_HEAD, *sets, "--no-bundle", "--trace", tmp_path / "t.emutrace", "--json", "--quiet",
            check=0)
    return json.loads(p.stdout)


def test_the_line_leads_with_the_path_then_the_ratio_then_the_binding_term_and_says_when_they_disagree(emu,
                                                                                                       tmp_path):
    """The 8K decode: the bound's binding term is its padded GEMM cycles, the run waits on MATH most (a 4x wider
    MATH cuts the run 8.7 %, a 4x wider array nothing): the line must lead with MATH and say the gemm term is not
    what the run waits on.  With math.lanes = 256 the GEMM array leads the path and the two agree."""
    r = _run_8k(emu, tmp_path)
    lim = r["limits"]
    assert lim["leading"]["class"] == "MATH" and lim["leading"]["share"] == lim["critical_path"]["classes"]["MATH"]["share"]
    assert lim["ratio_to_bound"] == r["ratio_to_bound"] == round(r["latency_ps"] / r["bound_ps"], 4)
    assert lim["bound"]["classes"] == ["GEMM array"] and lim["agree"] is False
    line = lim["line"]
    order = [line.index(s) for s in ("critical path: MATH 40 %", "ratio to bound 2.01 (bound 1.5538us)",
                                     "binding term gemm (padded rows: M = 8 of 32) 1.024us on the GEMM array",
                                     "the bound's gemm term is not what the run waits on: the critical path leads with MATH")]
    assert order == sorted(order) and order[0] == 0, line
    r = _run_8k(emu, tmp_path, "--set", "machine.overrides.math.lanes=256")
    lim = r["limits"]
    assert lim["leading"]["class"] == "GEMM array" and lim["agree"] is True
    assert "where the critical path spends most too" in lim["line"] and "not what the run waits on" not in lim["line"]


@pytest.mark.parametrize("fidelity", ["pipeline", "stream"])
def test_a_held_fidelitys_line_says_its_path_does_not_see_the_held_engines(emu, tmp_path, fidelity):
    """At fidelity pipeline / stream the scheduler holds engines and times them itself: the walk (which follows
    messages) cannot see them and the path's classes are not the block model's although the end time is.  The line
    must say so, and the block run must not."""
    block = _run_8k(emu, tmp_path, "--set", "workload.params.fidelity=block")
    held = _run_8k(emu, tmp_path, "--set", f"workload.params.fidelity={fidelity}")
    assert held["end_time_ps"] == block["end_time_ps"]
    assert held["limits"]["critical_path"]["classes"] != block["limits"]["critical_path"]["classes"]
    assert held["limits"]["critical_path"]["fidelity"] == fidelity
    assert f"; fidelity {fidelity}: the path does not see the GEMM array" in held["limits"]["line"]
    assert "fidelity" not in block["limits"]["critical_path"] and "does not see" not in block["limits"]["line"]


def test_agreement_follows_the_declared_term_classes():
    from tools.explain.limits import TERM_CLASSES, agreement, limits_line
    b = {"binding": "reduction depth", "short": "reduction depth", "ps": 10, "bound_ps": 100,
         "runner_up": {"name": "gemm", "ps": 5}, "classes": list(TERM_CLASSES["gqa_attention"]["reduction_ps"])}
    assert agreement(b, {"class": "UCIe", "share": 0.5}) is True
    assert agreement(b, {"class": "MATH", "share": 0.5}) is False
    assert agreement({**b, "classes": []}, {"class": "MATH", "share": 0.5}) is None   # no resource's time
    assert agreement(b, None) is None
    lim = {"bound": b, "critical_path": {"missing": "no trace"}, "leading": None, "agree": None, "ratio_to_bound": 1.5}
    assert limits_line(lim) == ("critical path not computed: no trace; ratio to bound 1.50 (bound 100ps); binding term"
                                " reduction depth 10ps on the IPCQ, NOC or UCIe (next gemm 5ps)")
    # no analytic bound: the path, then the words
    assert limits_line({"bound": None, "critical_path": {"classes": {"links": {"ps": 1, "share": 1.0}}}}) == (
        "critical path: links 100 %; no analytic bound")


@pytest.mark.parametrize("sets, gemm_cycles", [
    ([], 1024),
    # 4x the columns, the kernel's tiles still 32 wide: every tile still a whole pass, the gemm term unchanged
    (["--set", "machine.overrides.gemm.array_cols=128"], 1024),
    # tiles as wide as the array: 2 KV tiles x (Q·Kᵀ 2 K steps of 64 + P·V 1 of 64) passes
    (["--set", "machine.overrides.gemm.array_cols=128", "--set", "machine.overrides.gemm.tile_n=128"], 384),
])
def test_the_gqa_bound_stays_below_the_run_with_a_wider_array(emu, tmp_path, sets, gemm_cycles):
    r = _run_8k(emu, tmp_path, *sets)
    assert r["bound_terms"]["gemm_ps"] == gemm_cycles * 1000   # clock.pe 1 GHz
    assert r["bound_ps"] <= r["latency_ps"], (r["bound_ps"], r["latency_ps"])
    assert ("bound note: the kernel's composite tiles fill gemm.tile_n = 32 of the array's 128 columns"
            in r["limits"]["line"]) == (len(sets) == 2)

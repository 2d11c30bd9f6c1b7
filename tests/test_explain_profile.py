"""``emu profile`` (tools/explain/profile.py): a tl kernel's time by source line sums to the kernel's
time on every PE, names the composite Q·Kᵀ / P·V and merge lines, and the re-run keeps the digest."""
import json

import pytest

from tools.explain.profile import folded_lines, profile_run

SCENARIO = "scenarios/ahbm/gqa/decode_sp.yaml"


@pytest.fixture(scope="module")
def prof():
    return profile_run(SCENARIO)


#: fidelity pipeline in timing mode: MATH ops leave in runs (runtime.Tl._flush), each attributed to its own line
PIPELINE = ("mode=timing", "workload.params.fidelity=pipeline")


@pytest.mark.parametrize("sets", [(), PIPELINE], ids=["block", "pipeline"])
def test_lines_sum_to_the_kernel_time_on_every_pe(prof, sets):
    if sets:
        prof = profile_run(SCENARIO, sets)
        math_lines = [r for r in prof["kernel"]["lines"] if "tl.__mul__" in r["ops"] or "tl.exp" in r["ops"]]
        assert math_lines and all(r["issue_ps"] > 0 and r["engine_ps"].get("math", 0) > 0 for r in math_lines)
    k = prof["kernel"]
    assert k["unattributed_ps"] == 0
    assert sum(r["time_ps"] for r in k["lines"]) == k["kernel_ps_sum"]
    assert sum(r["time_ps"] for r in k["critical_lines"]) == k["critical_kernel_ps"]
    # the critical PE's kernel is the launch's latency less the launch and completion flights
    assert 0 < k["critical_kernel_ps"] < prof["latency_ps"]
    for r in k["lines"]:
        assert r["time_ps"] == r["issue_ps"] + r["queue_ps"] + r["tcm_ps"] + sum(r["wait_ps"].values())


def test_the_composite_and_merge_lines_are_named(prof):
    by = {(r["line"].split(":")[0].rsplit("/", 1)[-1], r["function"], next(iter(r["ops"]))): r
          for r in prof["kernel"]["lines"]}
    qk = by[("gqa_attention.py", "scores", "tl.composite")]      # S = Q·Kᵀ
    pv = by[("merge.py", "fold_tile", "tl.composite")]           # O_j = P·V
    for r in (qk, pv):
        assert r["engine_ps"]["sched"] > 0                      # the composites' scheduler time is caused there
    assert by[("merge.py", "fold_tile", "tl.__add__")]["wait_ps"]["sched"] > 0   # O + O_j waits for P·V
    assert any(f == "lse_merge" or f == "lse_scales" for _, f, _ in by)


def test_the_digest_is_unchanged_by_the_attribution(prof, emu, tmp_path):
    p = emu("run", SCENARIO, "--no-bundle", "--json", "--quiet", check=0)
    assert json.loads(p.stdout)["digest"] == prof["digest"]


def test_folded_stacks(prof):
    lines = folded_lines(prof["kernel"]["critical_stacks"])
    assert lines and all(len(l.rsplit(" ", 1)) == 2 and l.rsplit(" ", 1)[1].isdigit() for l in lines)
    assert any(l.startswith("gqa_attention_(") and ";wait_sched " in l for l in lines)
    total = sum(int(l.rsplit(" ", 1)[1]) for l in lines)
    assert abs(total - prof["kernel"]["critical_kernel_ps"] / 1000) <= len(lines)   # ns, rounded per line


def test_profile_of_a_recorded_trace_checks_its_digest(emu, tmp_path):
    emu("run", SCENARIO, "--no-bundle", "--trace", tmp_path / "t.emutrace", "--quiet", check=0)
    p = emu("profile", tmp_path / "t.emutrace", "--folded", tmp_path / "f.txt", check=0)
    assert "same digest as recorded" in p.stdout and "unattributed 0" in p.stdout
    assert (tmp_path / "f.txt").read_text().strip()


def test_pccx_profile_by_stage_names_the_stream_bound_stage(emu):
    """Gemma 3N (tiny, one token: the per-token stage times of the scenario's 4): the stages partition the run and the critical path inside each sums to it;
    the FFN up-projection dominates and waits on the HP weight stream; the digest is the plain run's."""
    out = profile_run("scenarios/pccx/gemma3n/tiny-timing.yaml", ["workload.params.tokens=1"])
    sp = out["pccx"]["stage_path"]
    assert sum(r["time_ps"] for r in sp["stages"]) == out["end_time_ps"]
    for r in sp["stages"]:
        assert sum(r["waited_on"].values()) == r["time_ps"]
    top = sp["stages"][0]
    assert top["stage"] == "ffn_up" and next(iter(top["waited_on"])) == "HP ports"
    ops = {r["opcode"]: r for r in out["pccx"]["opcodes"]}
    assert ops["GEMV"]["engine_ps"] == max(r["engine_ps"] for r in ops.values())
    plain = emu("run", "scenarios/pccx/gemma3n/tiny-timing.yaml", "--set", "workload.params.tokens=1", "--no-bundle", "--json", "--quiet", check=0)
    assert out["digest"] == json.loads(plain.stdout)["digest"]     # the profile's traced re-run changes nothing

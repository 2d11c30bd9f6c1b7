"""Several decode requests at once (issue 23, actors/ahbm/tl/gqa_requests.py), through the real scenarios.

One request is exactly the single-request kernel run; requests on disjoint Groups each take their
single-request time; requests sharing a Group take longer, by an amount the test states against the
work bound; a delayed IPCQ link delays only the request that uses it; arrival traces with bad rows
are named by file, line and column; every request's output matches float64.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from actors import registry
from actors.ahbm.tl.gqa_requests import percentile
from emulator.scenario import load_scenario
from tools.cli import main
from tools.run.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "scenarios" / "ahbm" / "requests"
SMALL = ["mode=timing", "workload.params.context=256", "workload.params.d=32"]


def run(path, *sets):
    res, _, _ = run_scenario(load_scenario(str(path), registry, sets=list(sets)))
    assert res["status"] == "finished", res
    return res


def single(*sets):
    """The same launch by the single-request workload (``gqa_attention``)."""
    return run(REQ / "shared.yaml", "workload.kind=gqa_attention", "workload.params={C: 2, P: 8, heads: 1, G: 4, "
               "d: 32, context: 256, tile: 64, gemm: composite}", "mode=timing", *sets)


def test_one_request_is_exactly_the_single_request_run():
    one = run(REQ / "shared.yaml", *SMALL, "workload.params.requests=1")
    ref = single()
    assert (one["digest"], one["end_time_ps"]) == (ref["digest"], ref["end_time_ps"])
    assert one["step_p50_ps"] == one["first_token_p50_ps"] == ref["latency_ps"]


def test_disjoint_groups_each_take_the_single_time_and_a_shared_group_pays_for_sharing():
    ref = single()
    alone = ref["latency_ps"]
    spread = run(REQ / "spread.yaml", *SMALL)
    assert [r["step_latency_ps"] for r in spread["per_request"]] == [[alone]] * 4
    shared = run(REQ / "shared.yaml", *SMALL)
    B = shared["requests"]
    terms = ref["bound_terms"]
    work = max(terms["kv_ps"], terms["gemm_ps"])   # one request's HBM stream or GEMM cycles, per rank
    # the requests' sweeps on one PE cannot overlap each other: at least B sweeps of work, plus one launch,
    # one first access and one reduction
    floor = B * work + terms["launch_ps"] + terms["first_access_ps"] + terms["reduction_ps"]
    assert shared["makespan_ps"] >= floor
    assert shared["bound_ps"] == floor and shared["bound_terms"]["binding"] == "sharing"   # the workload's own bound
    # ... and strictly less than B runs one after the other: the next request's sweep hides part of the
    # reduction (measured: 4 x 1.475 us -> 5.3 us at context 512; here context 256)
    assert shared["makespan_ps"] < B * alone
    lat = sorted(r["first_token_ps"] for r in shared["per_request"])
    assert lat[0] == alone and all(b > a for a, b in zip(lat, lat[1:]))   # queued behind one another
    hidden = [r["hidden_fraction"] for r in shared["per_request"]]
    assert all(h > 0.5 for h in hidden[:-1]), hidden     # a later request's sweep ran under each reduction
    assert hidden[-1] < hidden[0]                         # the last one has nothing behind it


def test_a_delayed_ipcq_link_delays_only_the_request_that_uses_it():
    fault = ('faults=[{kind: delay, link: "sip0/cube00/pe*/ipcq*->*", delay: 200ns}]')
    base = run(REQ / "spread.yaml", *SMALL)
    hit = run(REQ / "spread.yaml", *SMALL, fault)
    lat = [r["first_token_ps"] for r in hit["per_request"]]
    alone = base["per_request"][0]["first_token_ps"]
    assert lat[0] > alone                         # request 0's Group holds CUBE 0
    assert lat[1:] == [alone] * 3                 # the others are isolated from it


def test_data_mode_checks_every_request_and_step():
    res = run(REQ / "trace.yaml")
    assert res["outputs_checked"] == 2 + 1 + 1 + 3   # steps of the trace's four requests, one head
    assert res["max_abs_err"] < 1e-3, res["max_abs_err"]
    assert [r["context"] for r in res["per_request"]] == [1024, 512, 2048, 256]
    assert [r["arrival_ps"] for r in res["per_request"]] == [0, 500_000, 1_000_000, 1_000_000]


@pytest.mark.parametrize("C, P", [(2, 8), (1, 1)])
def test_prefill_then_decode_requests_are_checked_and_queue_behind_each_other(C, P):
    """Ring prefill (C x P = 16: the whole context) and no-SP prefill (query blocks of T_q), each followed by a
    decode step: every output against float64; the second request's first token waits for the first's."""
    sets = [f"workload.params.C={C}", f"workload.params.P={P}", "workload.params.context=128",
            "workload.params.prefill=128" if C * P > 1 else "workload.params.prefill=32", "workload.params.steps=1",
            "workload.params.requests=2", "workload.params.d=32"]
    res = run(REQ / "shared.yaml", *sets)
    ring = C * P > 1
    assert res["outputs_checked"] == 2 * ((C * P if ring else 1) + 1)    # prefill outputs per rank, + the decode
    assert res["max_abs_err"] < 2e-3, res["max_abs_err"]
    a, b = res["per_request"]
    assert a["prefill_ps"] == a["first_token_ps"] and b["first_token_ps"] > a["first_token_ps"]
    assert res["tokens"] == 2 and res["prefill_tokens"] == (256 if ring else 64)


def test_a_ring_prefill_of_part_of_the_context_is_refused_in_the_requests_terms(capsys):
    rc = main(["run", str(REQ / "shared.yaml"), "--no-bundle", "--set", "workload.params.prefill=100"])
    err = capsys.readouterr().err
    assert rc == 2 and "--set workload.params.prefill=100: workload.params.prefill: the prefill's chunk: Ring prefill" in err, err
    assert "(request r0, prefill at context 512)" in err


def test_poisson_arrivals_are_seeded_and_the_summaries_are_observed_values():
    a = run(REQ / "poisson.yaml", "workload.params.requests=4", "workload.params.steps=1")
    b = run(REQ / "poisson.yaml", "workload.params.requests=4", "workload.params.steps=1")
    c = run(REQ / "poisson.yaml", "workload.params.requests=4", "workload.params.steps=1", "seed=2")
    arr = [r["arrival_ps"] for r in a["per_request"]]
    assert arr[0] == 0 and arr == sorted(arr) and len(set(arr)) == 4
    assert a["digest"] == b["digest"] and arr != [r["arrival_ps"] for r in c["per_request"]]
    steps = [x for r in a["per_request"] for x in r["step_latency_ps"]]
    assert a["step_p50_ps"] in steps and a["step_max_ps"] == max(steps)
    assert percentile([5, 1, 3, 2, 4], 50) == 3 and percentile([5, 1, 3, 2, 4], 99) == 5


@pytest.mark.parametrize("rows, expect", [
    ("arrival,context,prefill,steps\n0ns,1024,0,2\n5,512,0,1\n", "bad.csv:3: column 1 (arrival): expected a time"),
    ("arrival,context,prefill,steps\n0ns,abc,0,2\n", "bad.csv:2: column 2 (context): expected a whole number"),
    ("arrival,context,prefill,steps\n0ns,64,-1,2\n", "bad.csv:2: column 3 (prefill): expected a whole number >= 0"),
    ("arrival,context,prefill,steps\n0ns,64,0,0\n", "bad.csv:2: a request with neither prefill nor decode"),
    ("arrival,ctx\n", "bad.csv:1: expected the header arrival,context,prefill,steps"),
    ("arrival,context,prefill,steps\n0ns,1024\n", "bad.csv:2: expected 4 columns"),
])
def test_a_bad_arrival_trace_is_named_by_file_line_and_column(tmp_path, capsys, rows, expect):
    (tmp_path / "bad.csv").write_text(rows)
    scen = tmp_path / "s.yaml"
    scen.write_text((REQ / "trace.yaml").read_text().replace("arrivals.csv", "bad.csv"))
    assert main(["run", str(scen), "--no-bundle"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"s.yaml:9: workload.params.arrivals_file: {tmp_path}/{expect}" in err, err


def test_requests_whose_kv_does_not_fit_are_refused(capsys):
    rc = main(["run", str(REQ / "shared.yaml"), "--no-bundle", "--set", "mode=timing",
               "--set", "workload.params.requests=64", "--set", "workload.params.context=4194304"])
    err = capsys.readouterr().err
    assert rc == 2 and "workload.params.requests: 64 launches" in err and "k region" in err, err


def test_batched_kernel_one_request_is_the_single_time_and_batches_are_checked():
    one = run(REQ / "shared.yaml", *SMALL, "workload.params.requests=1", "workload.params.batching=kernel")
    assert one["makespan_ps"] == single()["latency_ps"]
    res = run(REQ / "shared.yaml", "workload.params.batching=kernel", "workload.params.steps=2")
    assert res["outputs_checked"] == 8 and res["max_abs_err"] < 1e-3, res
    assert res["batch_steps"] == 2 and res["batch_size_max"] == 4
    assert all(r["batches"] == [0, 1] for r in res["per_request"])
    # one launch serves the batch: every member of a batch step ends at the same time
    assert len({tuple(r["step_latency_ps"]) for r in res["per_request"]}) == 1
    assert all(h is not None and h > 0 for h in (r["hidden_fraction"] for r in res["per_request"][:2]))


def test_continuous_batching_launches_the_requests_active_at_each_step_start():
    res = run(REQ / "poisson.yaml", "workload.params.batching=kernel", "workload.params.requests=6")
    for r in res["per_request"]:
        assert r["launch_ps"][0] >= r["arrival_ps"]                       # not before it arrived
        assert r["batches"] == list(range(r["batches"][0], r["batches"][0] + 3))   # then every step in turn
    starts = sorted({(r["batches"][0], r["launch_ps"][0]) for r in res["per_request"]})
    for r in res["per_request"]:   # it joined the first batch step that started after its arrival
        later = [b for b, t in starts if t >= r["arrival_ps"]]
        assert r["batches"][0] == min(later)


def test_batching_refuses_what_it_does_not_batch(capsys):
    for key in ("groups=spread", "l1=ring", "prefill=512"):
        rc = main(["run", str(REQ / "shared.yaml"), "--no-bundle", "--set", "workload.params.batching=kernel",
                   "--set", f"workload.params.{key}"])
        err = capsys.readouterr().err
        assert rc == 2 and "workload.params.batching: kernel batches decode requests" in err, err


def test_the_bundle_has_the_request_table_and_plot(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["run", str(REQ / "spread.yaml"), "--set", "mode=timing", "--plots", "--out", str(out)]) == 0
    capsys.readouterr()
    rows = (out / "table.gqa-requests.csv").read_text().splitlines()
    assert rows[0].startswith("request,context,prefill,steps") and len(rows) == 5
    assert (out / "requests.png").stat().st_size > 10_000

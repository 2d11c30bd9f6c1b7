"""The seed's baseline attention kernels (seed §A) on the tl runtime.

Data mode: every rank's output matches a float64 numpy attention over the same
inputs (rtol 1e-2, atol 1e-3); timing mode gives the same virtual times; the
reduction / propagation takes n-1 steps.  Scenario files run through the
scenario loader and the runner (the ``emu run`` path).
"""
from pathlib import Path

import numpy as np
import pytest

from actors import registry
from actors.ahbm.testkit import build_workload
from actors.ahbm.tl.baseline_workload import output_of, reference_attention
from actors.ahbm.tl.workloads import WORKLOADS
from emulator.testing import run

ROOT = Path(__file__).resolve().parents[1]


async def _run(kind, params, mode="data", overrides=None, seed=1):
    w = WORKLOADS[kind]
    system, prof, p, ctx = build_workload(w, params, name=kind, mode=mode, overrides=overrides, seed=seed)
    result = await run(system)
    assert result.status == "finished", result.error
    system.ctx = ctx   # the test keeps the context next to the system it describes
    return system, result, w.check(system, prof, p, result, context=ctx), p


def _assert_matches_reference(system, p):
    ctx = system.ctx
    data = ctx.data
    n, S, d, M = p["ranks"], p["s_per_rank"], p["d"], p["rows"]
    k_all, v_all = data["k"].reshape(n * S, d), data["v"].reshape(n * S, d)
    for r in range(n):
        q = data["q"] if data["q"].ndim == 2 else data["q"][r]
        got = output_of(ctx, r)
        np.testing.assert_allclose(got, reference_attention(q, k_all, v_all), rtol=1e-2, atol=1e-3,
                                   err_msg=f"rank {r}")


CASES = [
    ("attention_decode", {"ranks": 8, "rows": 1, "d": 64, "s_per_rank": 16}),                 # seed validation
    ("attention_prefill", {"ranks": 8, "rows": 16, "d": 64, "s_per_rank": 16}),               # seed validation
    ("attention_decode", {"ranks": 4, "rows": 8, "d": 64, "s_per_rank": 512, "tile": 64}),    # beyond: tiled
    ("attention_decode", {"ranks": 4, "rows": 8, "d": 64, "s_per_rank": 256, "tile": 64, "gemm": "composite"}),
    ("attention_prefill", {"ranks": 4, "rows": 32, "d": 64, "s_per_rank": 128, "tile": 32}),  # beyond: tiled
    ("attention_decode", {"ranks": 12, "cubes": 2, "rows": 8, "d": 64, "s_per_rank": 64}),    # line over the NOC
    ("attention_prefill", {"ranks": 12, "cubes": 2, "rows": 16, "d": 64, "s_per_rank": 16}),
]


@pytest.mark.parametrize("kind,params", CASES)
async def test_baseline_matches_numpy_and_timing_mode_agrees(vclock, kind, params):
    system, result, check, p = await _run(kind, params, "data")
    _assert_matches_reference(system, p)
    assert check["max_abs_err"] < 1e-3
    tsys, tres, tcheck, _ = await _run(kind, params, "timing")
    assert tres.end_time_ps - tsys.reports["io/host"]["launch_ps"] == result.end_time_ps - system.reports["io/host"]["launch_ps"]
    assert tcheck["latency_ps"] == check["latency_ps"]
    assert tcheck["reduction_steps"] == check["reduction_steps"] == p["ranks"] - 1


@pytest.mark.parametrize("kind", ["attention_decode", "attention_prefill"])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
async def test_reduction_takes_n_minus_1_steps(vclock, kind, n):
    rows = 1 if kind == "attention_decode" else 16
    system, result, check, p = await _run(kind, {"ranks": n, "rows": rows, "d": 64, "s_per_rank": 16}, "timing")
    assert check["reduction_steps"] == n - 1
    assert check["merges_per_rank"] == [n - 1]      # every rank folds every other rank's contribution once


async def test_long_prefill_needs_scratch_scope_budget(vclock):
    """Cumulative per-tile temporaries far exceed the TCM; the peak stays well inside it."""
    system, result, check, p = await _run("attention_prefill",
                                          {"ranks": 4, "rows": 32, "d": 64, "s_per_rank": 128, "tile": 32},
                                          "timing")
    prm = system.ctx.prm
    tiles_folded = 4 * (128 // 32)
    per_tile = 32 * 32 * 4 * 4 + 32 * 64 * 4 * 3      # S, P, exp terms + O-size temporaries (lower bound)
    assert tiles_folded * per_tile > 0.5 * prm.tcm_bytes
    assert check["tcm_peak_B"] < prm.tcm_bytes // 2


async def test_ranks_beyond_the_cube_is_a_clear_build_error(vclock):
    from emulator.errors import BuildError
    with pytest.raises(BuildError, match="at most cubes x pes_per_cube = 1 x 8 = 8 ranks"):
        await _run("attention_decode", {"ranks": 9})
    with pytest.raises(BuildError, match="workload.params.cubes: 5 CUBEs"):
        await _run("attention_decode", {"ranks": 9, "cubes": 5})


@pytest.mark.parametrize("name", ["attention_decode.yaml", "attention_prefill.yaml"])
def test_scenarios_run_and_report_errors_and_tables(name, tmp_path):
    from emulator.scenario import load_scenario
    from tools.run import runner
    sc = load_scenario(str(ROOT / "scenarios" / "ahbm" / name), registry, [f"output.dir={tmp_path}"])
    out, system, result = runner.run_scenario(sc)
    assert out["status"] == "finished", out.get("error")
    assert out["max_abs_err"] < 1e-3 and out["max_rel_err"] < 1e-2
    assert out["reduction_steps"] == 7
    (table,) = out["tables"].values()
    assert table[0]["latency_ps"] == out["latency_ps"] == out["end_time_ps"]   # launched at t = 0


def test_every_attention_scenario_validates():
    from emulator.scenario import load_scenario
    for path in sorted((ROOT / "scenarios" / "ahbm").glob("attention_*.yaml")):
        sc = load_scenario(str(path), registry)
        assert sc.workload in WORKLOADS


def test_same_scenario_same_digest_across_runs():
    from emulator.clock import deterministic_scheduling
    digests = set()
    for _ in range(2):
        system, _, _, _ = build_workload(WORKLOADS["attention_prefill"], {"ranks": 4}, name="det", seed=3)
        with deterministic_scheduling():
            r = system.run()
        digests.add((r.digest, r.end_time_ps))
    assert len(digests) == 1


async def test_line_across_sips_over_ucie(vclock):
    """A rank line that leaves SIP 0 (2 x 1 CUBEs per SIP, 2 SIPs): the hop into SIP 1 crosses inter-SIP UCIe."""
    over = {"sips": 2}
    params = {"ranks": 17, "cubes": 3, "rows": 8, "d": 64, "s_per_rank": 16}
    system, result, check, p = await _run("attention_decode", params, "data", overrides=over)
    _assert_matches_reference(system, p)
    coords = system.ctx.layout.coords
    assert coords[15][:2] == (0, 1) and coords[16][:2] == (1, 0)
    ucie = system.link("sip0/cube01/router.out_E->sip1/cube00/router.in_W")
    assert ucie.messages > 0 and ucie.latency == system.ctx.prm.sip_link_latency
    tsys, tres, tcheck, _ = await _run("attention_decode", params, "timing", overrides=over)
    assert tcheck["latency_ps"] == check["latency_ps"]
    assert check["reduction_steps"] == 16

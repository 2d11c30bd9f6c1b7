"""Documented-vs-as-built numeric findings (actors/pccx/gemma3n/findings.py) and the as-built switches."""
from __future__ import annotations

import math

from actors.pccx.gemma3n.findings import cordic_rope, gelu_sigmoid_form, stale_emax
from actors.pccx.profile import load_profile


def test_stale_emax_overflows_only_as_built():
    small, big = stale_emax(4.0), stale_emax(100.0)
    assert small["nonfinite_or_zero_as_built"] == 0 and small["max_abs_err_as_built"] < 0.02
    assert math.isfinite(big["max_abs_err_documented"]) and big["max_abs_err_documented"] < 0.01
    assert big["nonfinite_or_zero_as_built"] > 0          # exp(100) overflows BF16 without the max shift


def test_gelu_sigmoid_form_error_exceeds_bf16_rounding():
    g = gelu_sigmoid_form()
    assert g["max_abs_err"] > 2 * g["bf16_rounding_alone"]


def test_unreduced_rope_phases_saturate_the_cordic():
    r = cordic_rope()
    assert r["pairs_beyond_limit"] > r["pairs"] // 2 and r["max_abs_err_unreduced"] > 1.0
    assert cordic_rope(position=1)["pairs_beyond_limit"] == 0


def test_as_built_switches_default_off():
    for name in ("pccx-v002-documented", "pccx-v002-rtl"):
        p = load_profile(name)
        assert p["sync_gemx"] is False and p["cvo"]["emax_from"] == "gemv+gemm" and p["cvo"]["tanh"] is False

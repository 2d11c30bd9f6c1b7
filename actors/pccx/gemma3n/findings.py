"""Documented-vs-as-built numeric consequences for the Gemma 3N program (reference §1.3, §9).

Each function measures one as-built effect with the emulator's own SFU numerics
(actors/pccx/numerics.py ``cvo_apply``) against exact float math, on inputs of
the shapes the E4B program feeds the unit.  The timing consequences (SYNC_OP,
100 MHz, lanes C/D, CVO bridge) are measured by running the as-built scenarios
(docs/pccx-gemma3n.md).
"""
from __future__ import annotations

import numpy as np

from actors.pccx.numerics import CORDIC_LIMIT, cvo_apply, from_bf16, gelu_tanh, to_bf16
from emulator import numerics

__all__ = ["stale_emax", "gelu_sigmoid_form", "cordic_rope", "all_findings"]


def _softmax_via_cvo(scores: np.ndarray, emax: float) -> np.ndarray:
    """The program's softmax: EXP(sub_emax) -> REDUCE_SUM -> SCALE(recip) on BF16 values."""
    s = to_bf16(scores)
    e = cvo_apply("EXP", s, emax_bits=int(to_bf16(np.float32(emax))), recip_scale=False)
    total = cvo_apply("REDUCE_SUM", e, emax_bits=None, recip_scale=False)
    return from_bf16(cvo_apply("SCALE", np.concatenate([total, e]), emax_bits=None, recip_scale=True))


def stale_emax(peak: float, n: int = 512, seed: int = 0) -> dict:
    """Softmax error when EXP subtracts a stale e_max of 0 (as built: e_max from the idle GEMM) instead of
    the scores' max (docs: GEMV findemax); scores ~ N(0, 1) rescaled so that max = ``peak``."""
    rng = np.random.default_rng(seed)
    s = rng.normal(0, 1, n).astype(np.float32)
    s = s * (peak / s.max())
    e = numerics.exp(s - s.max())
    exact = e / e.sum()
    good = _softmax_via_cvo(s, float(from_bf16(to_bf16(s.max()))))
    with np.errstate(all="ignore"):
        stale = _softmax_via_cvo(s, 0.0)
    return {"peak_score": peak, "max_abs_err_documented": float(np.abs(good - exact).max()),
            "max_abs_err_as_built": float(np.nan_to_num(np.abs(stale - exact), nan=np.inf).max()),
            "nonfinite_or_zero_as_built": int((~np.isfinite(stale)).sum() + (stale.sum() == 0) * n)}


def gelu_sigmoid_form(lo: float = -6, hi: float = 6, n: int = 4097) -> dict:
    """As-built GELU x*sigmoid(1.702x) vs the model's tanh form (gelu_pytorch_tanh)."""
    x = np.linspace(lo, hi, n).astype(np.float32)
    tanh_form = gelu_tanh(x)
    sfu = from_bf16(cvo_apply("GELU", to_bf16(x), emax_bits=None, recip_scale=False))
    err = np.abs(sfu - tanh_form)
    return {"range": [lo, hi], "max_abs_err": float(err.max()), "at_x": float(x[err.argmax()]),
            "bf16_rounding_alone": float(np.abs(from_bf16(to_bf16(tanh_form)) - tanh_form).max())}


def cordic_rope(position: int = 8191, head_dim: int = 256, theta: float = 10000.0) -> dict:
    """RoPE phases pos * theta^(-2i/d) fed to SIN unreduced: dims beyond the CORDIC's +-4 rad saturate."""
    inv = numerics.power(theta, -np.arange(0, head_dim, 2) / head_dim)
    ph = (position * inv).astype(np.float32)
    sfu = from_bf16(cvo_apply("SIN", to_bf16(ph), emax_bits=None, recip_scale=False))
    err = np.abs(sfu - numerics.sin(ph))
    return {"position": position, "pairs": int(ph.size), "pairs_beyond_limit": int((np.abs(ph) > CORDIC_LIMIT).sum()),
            "max_abs_err_unreduced": float(err.max())}


def all_findings() -> dict:
    return {"stale_emax": [stale_emax(p) for p in (4.0, 40.0, 100.0)], "gelu": gelu_sigmoid_form(),
            "cordic_rope_local": cordic_rope(), "cordic_rope_global": cordic_rope(theta=1e6)}

"""The energy metrics a sweep can name (docs/energy.md, docs/sweep.md): short names over result.json's ``energy``.

``energy_j`` (the run's joules), ``energy_per_token_j`` (per decode token; per kernel or per
request for AHBM, per program for a pccx program: the unit the run reports), ``avg_power_w``
(joules over the run's virtual time), ``tokens_per_j`` (the inverse of the per-unit energy) and
``edp_js`` (the energy-delay product, joules x virtual seconds), so that ``best: {minimize:
energy_j}`` or ``{minimize: edp_js}`` picks the most frugal configuration.
"""
from __future__ import annotations

__all__ = ["ENERGY_METRICS", "energy_metric"]


def _per_unit(en: dict):
    return next((v for k, v in en.items() if k.startswith("per_") and k.endswith("_j")), None)


def _units_per_j(en: dict):
    return next((v for k, v in en.items() if k.endswith("s_per_j")), None)


ENERGY_METRICS = {
    "energy_j": lambda en, res: en.get("total_j"),
    "energy_per_token_j": lambda en, res: _per_unit(en),
    "avg_power_w": lambda en, res: en.get("avg_power_w"),
    "tokens_per_j": lambda en, res: _units_per_j(en),
    "edp_js": lambda en, res: (en["total_j"] * res["end_time_ps"] / 1e12
                               if en.get("total_j") is not None and res.get("end_time_ps") is not None else None),
}


def energy_metric(result: dict, name: str):
    """The value of energy metric ``name`` in ``result`` (None when the run has no energy)."""
    en = result.get("energy")
    if name not in ENERGY_METRICS or not isinstance(en, dict):
        return None
    return ENERGY_METRICS[name](en, result)

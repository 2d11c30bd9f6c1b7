"""Energy from activity: Σ actions x energy per action + static power x time (docs/energy.md).

The machine-independent half of the energy model, after Accelergy's split of
*action counts* (what the architecture did) from *energy per action* (what the
technology costs).  A machine family's action map (``actors/<family>/energy.py``)
reads, **after the run**, the counters its components already keep (bytes per
link, bytes per HBM channel, MACs, element ops, busy cycles) and turns them into
:class:`Charge` rows (``count`` actions at ``unit_fj`` each) and :class:`Leak`
rows (a component's static power over the whole run).  Nothing is traced and
nothing is added to the hot path beyond counters, so a run's digest does not
depend on the energy model.

Units are exact integers (emulator/units.py): energy per action in fJ, power in
µW, time in ps.  ``count x unit_fj x 1000`` and ``power_uw x time_ps`` are both
**attojoules**, so every sum below is an exact integer and a hand computation
gives the same number to the last aJ; joules and watts are derived once, at the
end, for reporting.

Categories: ``memory`` (DRAM, SRAM, DMA), ``interconnect`` (NoC, UCIe, IPCQ,
AXI ports, host links, on-die command wires), ``compute`` (MACs, vector and
special-function ops, instruction dispatch) and ``static`` (leakage and clocking
of every component for the whole run).
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Charge", "Leak", "EnergyAccount", "account", "CATEGORIES", "AJ_PER_J", "energy_summary",
           "power_series"]

CATEGORIES = ("memory", "interconnect", "compute", "static")
DYNAMIC = CATEGORIES[:3]
AJ_PER_J = 10**18
AJ_PER_FJ = 1000


@dataclass(frozen=True)
class Charge:
    """``count`` actions of one component at ``unit_aj`` attojoules each (``coef`` names the profile key).

    An energy per action in fJ is ``unit_aj = fJ x 1000`` (:meth:`of`); an active power in µW drawn while
    busy is ``count = busy ps``, ``unit_aj = µW`` (µW x ps = aJ, :meth:`active`)."""

    component: str       # actor or link name
    cls: str             # energy class, e.g. "hbm", "noc_attach", "gemm"
    category: str        # one of DYNAMIC
    coef: str            # profile key of the coefficient, e.g. "energy.hbm.read"
    count: int           # actions, in the coefficient's unit (bits, MACs, ops, cycles, commands, busy ps)
    unit_aj: int

    @property
    def aj(self) -> int:
        return self.count * self.unit_aj

    @classmethod
    def of(cls, component: str, klass: str, category: str, coef: str, count: int, unit_fj: int) -> "Charge":
        return cls(component, klass, category, coef, count, unit_fj * AJ_PER_FJ)

    @classmethod
    def active(cls, component: str, klass: str, category: str, coef: str, busy_ps: int, power_uw: int) -> "Charge":
        return cls(component, klass, category, coef, busy_ps, power_uw)


@dataclass(frozen=True)
class Leak:
    """Static power of one component, drawn for the whole run."""

    component: str
    cls: str
    coef: str            # profile key, e.g. "energy.static.hbm_pc"
    power_uw: int


@dataclass
class EnergyAccount:
    """The exact energy of one run, in attojoules, by component, class, category and coefficient."""

    end_ps: int
    components: dict = field(default_factory=dict)   # name -> {"cls", "dynamic_aj", "static_aj"}
    classes: dict = field(default_factory=dict)      # cls -> {"category", "dynamic_aj", "static_aj", "components"}
    categories: dict = field(default_factory=dict)   # category -> aJ (static included)
    coefs: dict = field(default_factory=dict)        # coef -> {"count", "unit_fj", "aj"} (static: "power_uw")

    @property
    def total_aj(self) -> int:
        return sum(self.categories.values())

    def component_j(self, name: str) -> tuple[float, float]:
        """(dynamic J, static J) of ``name`` (0, 0 for a component with no energy)."""
        c = self.components.get(name)
        return (0.0, 0.0) if c is None else (c["dynamic_aj"] / AJ_PER_J, c["static_aj"] / AJ_PER_J)


def account(charges, leaks, end_ps: int) -> EnergyAccount:
    """Sum ``charges`` and ``leaks`` (over ``end_ps``) exactly; a category no charge names is 0."""
    acc = EnergyAccount(end_ps=end_ps, categories={c: 0 for c in CATEGORIES})
    for ch in charges:
        if ch.category not in DYNAMIC:
            raise ValueError(f"energy charge {ch.coef} of {ch.component}: category {ch.category!r} is not one of "
                             f"{', '.join(DYNAMIC)}")
        if ch.count < 0:
            raise ValueError(f"energy charge {ch.coef} of {ch.component}: negative count {ch.count}")
        aj = ch.aj
        comp = acc.components.setdefault(ch.component, {"cls": ch.cls, "dynamic_aj": 0, "static_aj": 0})
        comp["dynamic_aj"] += aj
        cl = acc.classes.setdefault(ch.cls, {"category": ch.category, "dynamic_aj": 0, "static_aj": 0,
                                              "components": set()})
        cl["dynamic_aj"] += aj
        cl["components"].add(ch.component)
        acc.categories[ch.category] += aj
        co = acc.coefs.setdefault(ch.coef, {"count": 0, "unit_aj": ch.unit_aj, "aj": 0})
        co["count"] += ch.count
        co["aj"] += aj
    for lk in leaks:
        aj = lk.power_uw * end_ps
        comp = acc.components.setdefault(lk.component, {"cls": lk.cls, "dynamic_aj": 0, "static_aj": 0})
        comp["static_aj"] += aj
        cl = acc.classes.setdefault(lk.cls, {"category": "static", "dynamic_aj": 0, "static_aj": 0,
                                             "components": set()})
        cl["static_aj"] += aj
        cl["components"].add(lk.component)
        acc.categories["static"] += aj
        co = acc.coefs.setdefault(lk.coef, {"count": 0, "power_uw": lk.power_uw, "aj": 0})
        co["count"] += 1
        co["aj"] += aj
    return acc


def _j(aj: int) -> float:
    return aj / AJ_PER_J


def energy_summary(acc: EnergyAccount, *, per: tuple | None = None, peak: dict | None = None) -> dict:
    """The ``energy`` key of result.json (docs/outputs.md): joules, average power, the split, per unit of work.

    ``per``: (unit, n) or (unit, n, what), e.g. ("token", 8, "decode tokens of this attention layer, not model
    tokens") or ("kernel", 1): adds ``per_<unit>_j``, ``<unit>s_per_j`` and ``per_unit`` (``unit``, ``count``,
    ``what``: what one unit is, so "token/J" of one attention layer is not read as tokens of the whole model).
    ``peak``: what :func:`power_series` measured (window and peak power), or None when no trace was kept.
    """
    total = acc.total_aj
    seconds = acc.end_ps / 1e12
    out = {
        "total_j": _j(total),
        "total_aj": total,
        "time_s": seconds,
        "avg_power_w": (_j(total) / seconds) if seconds else 0.0,
        "split_j": {c: _j(acc.categories[c]) for c in CATEGORIES},
        "split_pct": {c: (100.0 * acc.categories[c] / total if total else 0.0) for c in CATEGORIES},
        "by_class_j": {k: {"category": v["category"], "dynamic_j": _j(v["dynamic_aj"]), "static_j": _j(v["static_aj"]),
                           "components": len(v["components"])}
                       for k, v in sorted(acc.classes.items(), key=lambda kv: -(kv[1]["dynamic_aj"] + kv[1]["static_aj"]))},
        "actions": {k: ({"count": v["count"], "unit_aj": v["unit_aj"], "j": _j(v["aj"])} if "unit_aj" in v else
                        {"components": v["count"], "power_uw": v["power_uw"], "j": _j(v["aj"])})
                    for k, v in sorted(acc.coefs.items())},
    }
    if per is not None and per[1] > 0:
        unit, n, what = (*per, "")[:3]
        out[f"per_{unit}_j"] = _j(total) / n
        out[f"{unit}s_per_j"] = n / _j(total) if total else None
        out["per_unit"] = {"unit": unit, "count": n, "what": what}
    if peak is not None:
        out["power"] = peak
    return out


def power_series(acc: EnergyAccount, busy: dict, window_ps: int) -> dict:
    """Power over time: each component's dynamic energy spread over the windows in proportion to its busy
    time in each, its static power flat over the run.

    ``busy``: component name -> list of busy ps per window (from the trace's busy spans and link
    serialisations, tools/run/power.py).  A component with dynamic energy and no busy time (its activity
    was not traced) is spread evenly over the run.  Returns ``{"window_ps", "t_ps", "by_class_w",
    "total_w", "peak_w", "peak_at_ps"}``: the average power of each window (the last one over its own length).
    Energy is conserved: sum(power x window length) is the account's total.
    """
    end = max(acc.end_ps, 1)
    n = -(-end // window_ps)
    lengths = [min((w + 1) * window_ps, end) - w * window_ps for w in range(n)]
    cls_energy: dict[str, list[float]] = {}
    for name, comp in acc.components.items():
        row = cls_energy.setdefault(comp["cls"], [0.0] * n)
        if comp["static_aj"]:
            per_ps = comp["static_aj"] / end
            for w in range(n):
                row[w] += per_ps * lengths[w]
        dyn = comp["dynamic_aj"]
        if not dyn:
            continue
        b = busy.get(name)
        weights = b if b is not None and sum(b) > 0 else lengths
        tot = sum(weights)
        for w in range(n):
            if weights[w]:
                row[w] += dyn * weights[w] / tot
    by_class = {c: [e / AJ_PER_J / (lengths[w] / 1e12) for w, e in enumerate(row)]
                for c, row in sorted(cls_energy.items())}
    total = [sum(col) for col in zip(*by_class.values())] if by_class else [0.0] * n
    peak_i = max(range(n), key=total.__getitem__) if n else 0
    return {"window_ps": window_ps, "t_ps": [w * window_ps for w in range(n)], "by_class_w": by_class,
            "total_w": total, "peak_w": total[peak_i] if n else 0.0, "peak_at_ps": peak_i * window_ps}

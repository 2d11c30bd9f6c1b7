"""The pccx v002 action map: which counter of which component is which energy action (docs/energy.md).

Read after the run, from counters the components keep (nothing is traced for it):

==================  ===================================================  ========================  ============
component           count                                                coefficient               category
==================  ===================================================  ========================  ============
HostDDR             bytes read / written x 8 (every requester: HP, ACP,  ddr.read / ddr.write     memory
                    the host CPU)
L2 (URAM)           128-bit words read / written x 128                   l2.read / l2.write        memory
HpPort              bytes moved DDR -> weight FIFO x 8: the AXI HP        hp.bit, weight_fifo.bit   interconnect,
                    transfer, then one BRAM FIFO write + read                                      memory
Acp                 words moved (``busy_ps / word_ps``) x 128             acp.bit                   interconnect
``axil.*`` links    AXI-Lite transactions (messages)                     axil.access               interconnect
GemvLane            MACs (rows x K of every job)                         gemv.mac                  compute
MatEngine (GEMM)    MACs (N x K of every µop)                            gemm.mac                  compute
Cvo (SFU)           elements streamed                                    cvo.element               compute
Decoder             instructions decoded (its busy spans, one each)      frontend.instruction      compute
HostDriver (PS)     busy time x ``host.active`` power                    host.active               compute
==================  ===================================================  ========================  ============

Static power (``energy.static``): the PL device's leakage (one row, ``pccx/pl``, not an actor),
the PS at idle (on the host driver), the DDR4 background, and the clock power of each PL block
(it runs whether the block computes or not), for the whole run.
"""
from __future__ import annotations

from emulator.energy import Charge, Leak
from emulator.schema import Map, Quantity

from actors.pccx.gemma3n.budget import BUDGET_TABLE

__all__ = ["ENERGY_SCHEMA", "energy_inventory", "energy_per", "energy_report", "STATIC_CLASSES"]


def _E(d=""):
    return Quantity("energy", doc=d)


def _B(d=""):
    return Quantity("energy_per_bit", doc=d)


def _P(d=""):
    return Quantity("power", doc=d)


#: actor class -> static-power class (profile ``energy.static.<class>``)
STATIC_CLASSES = {"HostDriver": "ps", "HostDDR": "ddr", "L2": "l2", "HpPort": "hp", "Acp": "acp",
                  "GemvLane": "gemv_lane", "MatEngine": "gemm", "Cvo": "cvo", "Decoder": "frontend"}

ENERGY_SCHEMA = Map({
    "ddr": Map({"read": _B("per bit read from host DDR4 (device + I/O)"), "write": _B("per bit written")}),
    "l2": Map({"read": _B("per bit read from the URAM L2"), "write": _B("per bit written")}),
    "weight_fifo": Map({"bit": _B("per bit through an HP weight FIFO (BRAM write + read)")}),
    "hp": Map({"bit": _B("per bit over an AXI HP port (PS-PL interface + interconnect)")}),
    "acp": Map({"bit": _B("per bit over the ACP port")}),
    "axil": Map({"access": _E("per AXI-Lite transaction (PS GP port, SmartConnect)")}),
    "gemv": Map({"mac": _E("per GEMV lane MAC (INT4 weight x activation)")}),
    "gemm": Map({"mac": _E("per systolic-array MAC")}),
    "cvo": Map({"element": _E("per element through the SFU")}),
    "frontend": Map({"instruction": _E("per instruction decoded, scheduled and dispatched")}),
    "host": Map({"active": _P("PS CPU power above idle while a host step runs")}),
    "static": Map({**{k: _P(f"static power of each {a}") for a, k in STATIC_CLASSES.items()},
                   "pl": _P("static (leakage) power of the PL device, one row for the machine")}),
}, doc="energy per action and static power (docs/energy.md)")


def energy_inventory(system, profile: dict, end_ps: int) -> tuple[list, list]:
    """The run's :class:`Charge` and :class:`Leak` rows (the table of the module docstring)."""
    e = profile["energy"]
    C = Charge.of
    charges: list[Charge] = []
    leaks: list[Leak] = []
    for link in system.links:
        if link.name.startswith("axil.") and link.messages:
            charges.append(C(link.name, "axil", "interconnect", "energy.axil.access", link.messages,
                             e["axil"]["access"]))
    static = e["static"]
    for a in system.actors.values():
        t = type(a).__name__
        if t == "HostDDR":
            for op, n in (("read", a.rd_bytes), ("write", a.wr_bytes)):
                if n:
                    charges.append(C(a.name, "ddr", "memory", f"energy.ddr.{op}", 8 * n, e["ddr"][op]))
        elif t == "L2":
            for op, n in (("read", a.rd_words), ("write", a.wr_words)):
                if n:
                    charges.append(C(a.name, "l2", "memory", f"energy.l2.{op}", 128 * n, e["l2"][op]))
        elif t == "HpPort" and a.moved_bytes:
            charges.append(C(a.name, "hp", "interconnect", "energy.hp.bit", 8 * a.moved_bytes, e["hp"]["bit"]))
            charges.append(C(a.name, "weight_fifo", "memory", "energy.weight_fifo.bit", 8 * a.moved_bytes,
                             e["weight_fifo"]["bit"]))
        elif t == "Acp" and a.busy_ps:
            charges.append(C(a.name, "acp", "interconnect", "energy.acp.bit", 128 * (a.busy_ps // a.word_ps),
                             e["acp"]["bit"]))
        elif t == "GemvLane" and a.macs:
            charges.append(C(a.name, "gemv", "compute", "energy.gemv.mac", a.macs, e["gemv"]["mac"]))
        elif t == "MatEngine" and a.macs:
            charges.append(C(a.name, "gemm", "compute", "energy.gemm.mac", a.macs, e["gemm"]["mac"]))
        elif t == "Cvo" and a.elements:
            charges.append(C(a.name, "cvo", "compute", "energy.cvo.element", a.elements, e["cvo"]["element"]))
        elif t == "Decoder" and a.busy_spans:
            charges.append(C(a.name, "frontend", "compute", "energy.frontend.instruction", a.busy_spans,
                             e["frontend"]["instruction"]))
        elif t == "HostDriver" and a.busy_ps:
            charges.append(Charge.active(a.name, "ps", "compute", "energy.host.active", a.busy_ps,
                                         e["host"]["active"]))
        cls = STATIC_CLASSES.get(t)
        if cls is not None and static[cls]:
            leaks.append(Leak(a.name, cls, f"energy.static.{cls}", static[cls]))
    if static["pl"]:
        leaks.append(Leak("pccx/pl", "pl", "energy.static.pl", static["pl"]))
    return charges, leaks


def energy_per(params: dict, checks: dict) -> tuple[str, int, str] | None:
    """Per decode token for the gemma3n workload (a token of the whole model: every layer runs), with what
    one unit is; per program run otherwise."""
    n = checks.get("tokens")
    if isinstance(n, int) and n > 0:
        return "token", n, "tokens of the whole model"
    return "program", 1, "program runs"


def energy_report(res: dict, energy: dict) -> None:
    """The Gemma 3N budget table gets tokens per joule and the average power beside tok/s.

    The workload's check builds that table before the energy exists (the energy is summed from the
    counters once the check is over, tools/run/energy.py), so the runner hands the finished result
    here: the two rows go right under the throughput row, in ``res["budget"]`` and in the printed
    table.  Per token = the whole run's energy over the emulated tokens (``energy.per_token_j``).
    Any other pccx program has no budget table and is left as it is."""
    if "tokens_per_j" not in energy or not isinstance(res.get("budget"), list):
        return
    rows = [{"metric": "tokens per joule (tok/J)", "emulated": round(energy["tokens_per_j"], 4),
             "design_budget": None, "bound": None, "ratio_to_bound": None, "binding": None},
            {"metric": "average power (W)", "emulated": round(energy["avg_power_w"], 4),
             "design_budget": None, "bound": None, "ratio_to_bound": None, "binding": None}]
    for table in (res["budget"], (res.get("tables") or {}).get(BUDGET_TABLE)):
        if table is not None:
            at = next((i + 1 for i, r in enumerate(table) if r.get("metric") == "decode throughput (tok/s)"), 0)
            table[at:at] = [dict(r) for r in rows]

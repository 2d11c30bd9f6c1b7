"""The AHBM action map: which counter of which component is which energy action (docs/energy.md).

Read after the run, from counters the components keep (no event is traced for it):

========================  =====================================================  ==============  ============
component                 count                                                  coefficient     category
========================  =====================================================  ==============  ============
HbmChannel (per PC)       bytes read / written x 8 (``bytes_by_op``)              hbm.read/write  memory
HbmStack (per PC)         the same per channel (``pc_bytes``), charged to             hbm.read/write  memory
                          ``.../hbm/pc<i>`` as the channels would be
Tcm                       accesses = messages into ``tcm.req``; bits = bytes of   tcm.access/bit  memory
                          those links and of the ``tcm.to_*`` answers x 8
DmaEngine                 commands = its busy spans (one setup span each)         dma.command     memory
GemmEngine                MACs (``macs``: m x k x n of every GEMM)                gemm.mac        compute
MathEngine                element ops (``elements``)                              math.element    compute
PeCpu                     active cycles = ``busy_ps`` / PE clock period           cpu.cycle       compute
Router                    bits into its in-ports (every link into it) x 8         noc.router      interconnect
PE <-> router links       bits (link ``bytes`` x 8)                               noc.attach      interconnect
CUBE <-> CUBE, same SIP   bits                                                    ucie.intra_sip  interconnect
SIP <-> SIP               bits                                                    ucie.inter_sip  interconnect
IPCQ data + credit links  bits                                                    ipcq.bit        interconnect
IO die <-> router         bits                                                    io.bit          interconnect
other on-die links        bits (commands, completions)                            wire            interconnect
========================  =====================================================  ==============  ============

HBM channel request/answer links (``pc``, ``resp_*``) are not charged as wires: the HBM
per-bit figure is the whole access (array, TSV, logic-die I/O); nor are the HbmStack's.  An
HbmStack (``fidelity: pipeline``, memory.py) draws the static power of its ``pcs`` channels, one
``.../hbm/pc<i>`` row each, so its energy account is the channels' exactly.  TCM links are charged
as TCM accesses, not as wires.  Static power: every actor of a class in
``energy.static`` draws it for the whole run (the IO die's host is not the accelerator
and has none).  Link ``bytes`` are what the links charge (payload + message header,
emulator/link.py): the header is the packet header a real NoC carries too.
"""
from __future__ import annotations

from emulator.energy import Charge, Leak
from emulator.schema import Map, Quantity

__all__ = ["ENERGY_SCHEMA", "energy_inventory", "energy_per", "energy_caveat", "STATIC_CLASSES"]

_E, _B, _P = (lambda d="": Quantity("energy", doc=d)), (lambda d="": Quantity("energy_per_bit", doc=d)), \
    (lambda d="": Quantity("power", doc=d))

#: actor class -> static-power class (profile ``energy.static.<class>``)
STATIC_CLASSES = {"PeCpu": "cpu", "PeScheduler": "sched", "DmaEngine": "dma", "GemmEngine": "gemm",
                  "MathEngine": "math", "Tcm": "tcm", "Ipcq": "ipcq", "HbmChannel": "hbm_pc", "HbmPort": "hbm_port",
                  "Router": "router"}

ENERGY_SCHEMA = Map({
    "hbm": Map({"read": _B("per bit read from a pseudo-channel (array + TSV + logic-die I/O)"),
                "write": _B("per bit written")}),
    "tcm": Map({"access": _E("per TCM access (a request: decode, control)"), "bit": _B("per bit read or written")}),
    "dma": Map({"command": _E("per DMA command (descriptor decode, address generation)")}),
    "gemm": Map({"mac": _E("per MAC of the array (bf16 x bf16, fp32 accumulate)")}),
    "math": Map({"element": _E("per element op of the MATH lanes (fp32)")}),
    "cpu": Map({"cycle": _E("per active (dispatching) PE CPU cycle")}),
    "noc": Map({"router": _B("per bit through a router (buffer, crossbar, arbitration)"),
                "attach": _B("per bit on a PE <-> router link")}),
    "ucie": Map({"intra_sip": _B("per bit over a CUBE <-> CUBE UCIe link"),
                 "inter_sip": _B("per bit over a SIP <-> SIP UCIe link")}),
    "ipcq": Map({"bit": _B("per bit between neighbour PEs' IPCQs")}),
    "io": Map({"bit": _B("per bit over the host interface")}),
    "wire": _B("per bit on the other on-die links (commands, completions)"),
    "static": Map({k: _P(f"static power of each {a}") for a, k in STATIC_CLASSES.items()}),
}, doc="energy per action and static power (docs/energy.md)")


_HBM = ("HbmChannel", "HbmStack")


def _actor_type(a) -> str:
    return type(a).__name__


def _link_class(link) -> tuple[str, str] | None:
    """(energy class, coefficient key) of a link's bits, None when its bits are charged elsewhere."""
    src, dst = link.src.owner, link.dst.owner
    ts, td = _actor_type(src), _actor_type(dst)
    if ts == "Router" and td == "Router":
        return ("ucie_intra", "ucie.intra_sip") if src.sip == dst.sip else ("ucie_inter", "ucie.inter_sip")
    if "Host" in (ts, td):
        return ("io", "io.bit") if "Router" in (ts, td) else ("wire", "wire")
    if "Router" in (ts, td):
        return "noc_attach", "noc.attach"
    if ts == "Ipcq" and td == "Ipcq":
        return "ipcq", "ipcq.bit"
    if ts == "Tcm" or td == "Tcm" or ts in _HBM or td in _HBM:
        return None
    return "wire", "wire"


def energy_inventory(system, profile: dict, end_ps: int) -> tuple[list, list]:
    """The run's :class:`Charge` and :class:`Leak` rows (the table of the module docstring)."""
    e = profile["energy"]
    pe_period = None
    charges: list[Charge] = []
    leaks: list[Leak] = []
    tcm_access: dict[str, int] = {}
    tcm_bytes: dict[str, int] = {}
    router_bytes: dict[str, int] = {}
    for link in system.links:
        if not link.messages:
            continue
        src, dst = link.src.owner, link.dst.owner
        td, ts = _actor_type(dst), _actor_type(src)
        if td == "Tcm":
            tcm_access[dst.name] = tcm_access.get(dst.name, 0) + link.messages
            tcm_bytes[dst.name] = tcm_bytes.get(dst.name, 0) + link.bytes
        elif ts == "Tcm":
            tcm_bytes[src.name] = tcm_bytes.get(src.name, 0) + link.bytes
        if td == "Router":
            router_bytes[dst.name] = router_bytes.get(dst.name, 0) + link.bytes
        cls = _link_class(link)
        if cls is not None and link.bytes:
            key = cls[1]
            coef = e[key] if key == "wire" else e[key.split(".")[0]][key.split(".")[1]]
            charges.append(Charge.of(link.name, cls[0], "interconnect", f"energy.{key}", 8 * link.bytes, coef))
    for name, n in sorted(router_bytes.items()):
        charges.append(Charge.of(name, "router", "interconnect", "energy.noc.router", 8 * n, e["noc"]["router"]))
    for name in sorted(tcm_bytes):
        if tcm_access.get(name):
            charges.append(Charge.of(name, "tcm", "memory", "energy.tcm.access", tcm_access[name], e["tcm"]["access"]))
        charges.append(Charge.of(name, "tcm", "memory", "energy.tcm.bit", 8 * tcm_bytes[name], e["tcm"]["bit"]))
    static = e["static"]
    for a in system.actors.values():
        t = _actor_type(a)
        if t == "HbmChannel":
            for op in ("read", "write"):
                if a.bytes_by_op[op]:
                    charges.append(Charge.of(a.name, "hbm", "memory", f"energy.hbm.{op}", 8 * a.bytes_by_op[op],
                                          e["hbm"][op]))
        elif t == "HbmStack":
            base = a.name.rsplit("/", 1)[0]
            for i in range(a.prm.pcs):
                for op in ("read", "write"):
                    if a.pc_bytes[op][i]:
                        charges.append(Charge.of(f"{base}/pc{i}", "hbm", "memory", f"energy.hbm.{op}",
                                                 8 * a.pc_bytes[op][i], e["hbm"][op]))
                if static["hbm_pc"]:
                    leaks.append(Leak(f"{base}/pc{i}", "hbm", "energy.static.hbm_pc", static["hbm_pc"]))
        elif t == "DmaEngine" and a.busy_spans:
            charges.append(Charge.of(a.name, "dma", "memory", "energy.dma.command", a.busy_spans, e["dma"]["command"]))
        elif t == "GemmEngine" and a.macs:
            charges.append(Charge.of(a.name, "gemm", "compute", "energy.gemm.mac", a.macs, e["gemm"]["mac"]))
        elif t == "MathEngine" and a.elements:
            charges.append(Charge.of(a.name, "math", "compute", "energy.math.element", a.elements,
                                  e["math"]["element"]))
        elif t == "PeCpu" and a.busy_ps:
            if pe_period is None:
                pe_period = a.prm.pe_clk
            charges.append(Charge.of(a.name, "cpu", "compute", "energy.cpu.cycle", pe_period.cycles(a.busy_ps),
                                  e["cpu"]["cycle"]))
        cls = STATIC_CLASSES.get(t)
        if cls is not None and static[cls]:
            leaks.append(Leak(a.name, cls if cls != "hbm_pc" else "hbm", f"energy.static.{cls}", static[cls]))
    return charges, leaks


def energy_caveat(params: dict, mode: str) -> str | None:
    """What this run's energy leaves out, or None.  At ``fidelity: pipeline`` in timing mode the TCM
    accesses the engines make without a message (the GEMM batch's and held array's operand reads, the
    scheduler's block copies, the MathOps' results) are not charged: the TCM is charged per message
    (the table above).  Measured on the Llama3-70B 1K Ring prefill: TCM 1.917 -> 0.070 mJ, the run's total
    5.572 -> 3.722 mJ (-33 %); every other class equal.  Use ``fidelity: block`` for energy."""
    if params.get("fidelity") in ("pipeline", "stream") and mode == "timing":
        return (f"TCM accesses not charged at fidelity {params['fidelity']}: use block for energy, docs/gqa.md"
                " Fidelity")
    return None


#: what one unit of work is, printed beside "<unit>/J": the AHBM workloads run one attention layer (of the
#: scenario's KV heads), so a "token" here is a decode step of that layer, not a token of the whole model
#: (Llama3-70B has 80 such layers, and its FFNs, per model token)
PER_WHAT = {"token": "tokens of this attention layer, not of the whole model",
            "request": "requests through this attention layer",
            "kernel": "kernel launches: one layer's kernel, not a model token"}


def energy_per(params: dict, checks: dict) -> tuple[str, int, str]:
    """The unit energy is reported per: a decode token when the workload counts tokens (``gqa_requests``),
    else a request when it counts requests, else the kernel (one launch); with what one unit is
    (:data:`PER_WHAT`)."""
    for key, unit in (("tokens", "token"), ("requests", "request")):
        n = checks.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return unit, n, PER_WHAT[unit]
    return "kernel", 1, PER_WHAT["kernel"]

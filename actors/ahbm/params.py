"""The AHBM machine profile: schema and derived integer-picosecond parameters.

The base profile ``scenarios/machines/ahbm.yaml`` defines every parameter once,
with its source; ``ahbm-1sip/2sip/4sip`` extend it and state only what differs.
This schema therefore has no defaults (a value lives in exactly one place): it
validates a resolved profile and :class:`Params` converts it into the exact
integer quantities the engines use.
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.declare import Param
from emulator.schema import Bool, Enum, Float, Int, Map, Quantity, Str
from emulator.units import ClockDomain

from actors.ahbm.energy import ENERGY_SCHEMA

__all__ = ["Params", "PARAMS", "GEOMETRY", "declare", "PROFILE_SCHEMA", "DIRS", "OPPOSITE", "pe_name", "cube_name",
           "LIVE_FIELDS", "live_change"]

DIRS = ("N", "S", "E", "W")
OPPOSITE = {"N": "S", "S": "N", "E": "W", "W": "E"}

PROFILE_SCHEMA = Map({
    "family": Enum(["ahbm"]),
    "description": Str(default=""),
    "sips": Int(min=1, max=64, doc="SIPs, joined in a line over UCIe (kernbench2 topology.yaml ships 2)"),
    "cubes": Map({"x": Int(min=1, max=64), "y": Int(min=1, max=64)}, doc="CUBE mesh per SIP (kernbench2 topology.yaml: 4x4)"),
    "pes_per_cube": Int(min=1, max=256, doc="P (kernbench2 topology.yaml: 64 HBM pseudo-channels, 8 per PE)"),
    "pe_grid": Map({"x": Int(min=1, max=256), "y": Int(min=1, max=256)},
                   doc="PE placement inside a CUBE for IPCQ N/S/E/W neighbours (x*y = pes_per_cube)"),
    "clock": Map({"pe": Quantity("frequency"), "noc": Quantity("frequency")}),
    "hbm": Map({
        "pcs_per_pe": Int(min=1, doc="pseudo-channels per PE, a power of two"),
        "pc_bandwidth": Quantity("bandwidth"),
        "efficiency": Float(min=0.01, max=1.0),
        "access_latency": Quantity("time"),
        "burst": Quantity("size", doc="PC interleave granularity, a power of two"),
        "capacity": Quantity("size", doc="HBM bytes per PE (address space of the allocator)"),
    }),
    "dma": Map({"setup_cycles": Int(min=0),
                "outstanding": Int(min=1, doc="commands in their data phase at once (dma.py)")}),
    "gemm": Map({
        "array_rows": Int(min=1), "array_cols": Int(min=1),
        "fill_drain_cycles": Int(min=0),
        "charge_padded": Bool(doc="charge whole array passes for partial tiles"),
        "tile_m": Int(min=1), "tile_k": Int(min=1), "tile_n": Int(min=1),
    }),
    "math": Map({"lanes": Int(min=1), "fixed_cycles": Int(min=0)}),
    "tcm": Map({"size": Quantity("size")}),
    "ipcq": Map({
        "depth": Int(min=1, doc="slots per direction (credits)"),
        "fixed_overhead": Quantity("time",
                                   doc="per-message fixed time (kernbench2 IPCQ measurement: 31.1 ns at 128 B - 1.5 ns)"),
        "bandwidth": Quantity("bandwidth",
                              doc="message serialisation (kernbench2 IPCQ measurement: +1.5 ns per 128 B -> 85.33 GB/s)"),
        "credit_latency": Quantity("time"),
    }),
    "noc": Map({
        "router_cycles": Int(min=0), "link_cycles": Int(min=0),
        "attach_bandwidth": Quantity("bandwidth",
                                     doc="PE CPU / DMA <-> router links (kernbench2 topology.yaml sram_to_router_bw_gbs 128)"),
        "hbm_attach_bandwidth": Quantity("bandwidth",
                                         doc="HBM port <-> router links (kernbench2 topology.yaml hbm_to_router_bw_gbs 256)"),
        "buffer": Int(min=1, doc="packets buffered per router output"),
        "link_capacity": Int(min=1, doc="credits per NOC / UCIe link"),
        "switching": Enum(["store_and_forward", "cut_through"],
                          doc="per-hop switching of routed messages (actors/ahbm/noc.py: a per-hop alpha, as in ASTRA-sim's congestion-aware network model)"),
    }),
    "ucie": Map({
        "intra_sip": Map({"bandwidth": Quantity("bandwidth"),
                          "port_latency": Quantity("time")}),
        "inter_sip": Map({"bandwidth": Quantity("bandwidth"),
                          "latency": Quantity("time")}),
    }),
    "cpu": Map({"dispatch_cycles": Map({
        "dma": Int(min=0), "gemm": Int(min=0), "math": Int(min=0),
        "composite": Int(min=0), "ipcq": Int(min=0), "noc": Int(min=0),
    }), "command_queue_depth": Int(min=1, doc="entries of each engine's command queue (builder.py)")}),
    "io": Map({
        "launch_latency": Quantity("time"),
        "attach": Map({"sip": Int(min=0), "cube": Int(min=0)},
                      doc="the CUBE router the IO die's host interface attaches to"),
        "bandwidth": Quantity("bandwidth", doc="host interface, per direction"),
        "latency": Quantity("time", doc="host interface one-way latency"),
    }),
    "energy": ENERGY_SCHEMA,
}, check=lambda p: _check(p))


def _check(p: dict):
    out = []
    io = p["io"]["attach"]
    if io["sip"] >= p["sips"] or io["cube"] >= p["cubes"]["x"] * p["cubes"]["y"]:
        out.append((("io", "attach"), "a CUBE of the machine", f"sip {io['sip']}, cube {io['cube']}"))
    if p["pe_grid"]["x"] * p["pe_grid"]["y"] != p["pes_per_cube"]:
        out.append((("pe_grid",), f"x*y == pes_per_cube ({p['pes_per_cube']})",
                    f"{p['pe_grid']['x']}x{p['pe_grid']['y']}"))
    for key, val in (("pcs_per_pe", p["hbm"]["pcs_per_pe"]), ("burst", p["hbm"]["burst"])):
        if val & (val - 1):
            out.append((("hbm", key), "a power of two", val))
    return out


@dataclass(frozen=True)
class Params:
    """Integer machine parameters derived from a validated profile."""

    sips: int
    cx: int
    cy: int
    P: int
    gx: int
    gy: int
    pe_clk: ClockDomain
    noc_clk: ClockDomain
    pcs: int
    pc_bw_eff: int          # B/s, pc_bandwidth x efficiency
    hbm_latency: int        # ps
    burst: int
    hbm_capacity: int
    dma_setup: int          # ps
    dma_outstanding: int    # DMA commands in their data phase at once
    array_rows: int
    array_cols: int
    fill_drain: int         # cycles
    charge_padded: bool
    tile: tuple             # (TILE_M, TILE_K, TILE_N)
    lanes: int
    math_fixed: int         # cycles
    tcm_bytes: int
    ipcq_depth: int
    ipcq_overhead: int      # ps
    ipcq_bw: int
    credit_latency: int     # ps
    router_ps: int          # per-hop router latency (alpha_router)
    link_ps: int            # NOC wire latency per link
    attach_bw: int          # PE CPU / DMA <-> router links
    hbm_attach_bw: int      # HBM port <-> router links
    router_buffer: int
    link_capacity: int
    cut_through: bool       # noc.switching == cut_through
    cube_link_latency: int  # ps, intra-SIP CUBE<->CUBE (UCIe TX port + wire + RX port)
    cube_link_bw: int
    sip_link_latency: int
    sip_link_bw: int
    dispatch: dict          # op kind -> ps
    cmd_depth: int          # entries of each engine command queue
    launch_latency: int
    io_attach: tuple        # (sip, cube) of the router the host interface hangs on
    io_bw: int
    io_latency: int

    @classmethod
    def of(cls, p: dict) -> "Params":
        pe = ClockDomain(p["clock"]["pe"], "pe")
        noc = ClockDomain(p["clock"]["noc"], "noc")
        h, g, n, u = p["hbm"], p["gemm"], p["noc"], p["ucie"]
        link_ps = noc.ps(n["link_cycles"])
        return cls(
            sips=p["sips"], cx=p["cubes"]["x"], cy=p["cubes"]["y"], P=p["pes_per_cube"],
            gx=p["pe_grid"]["x"], gy=p["pe_grid"]["y"], pe_clk=pe, noc_clk=noc,
            pcs=h["pcs_per_pe"], pc_bw_eff=int(round(h["pc_bandwidth"] * h["efficiency"])),
            hbm_latency=h["access_latency"], burst=h["burst"], hbm_capacity=h["capacity"],
            dma_setup=pe.ps(p["dma"]["setup_cycles"]), dma_outstanding=p["dma"]["outstanding"],
            array_rows=g["array_rows"], array_cols=g["array_cols"], fill_drain=g["fill_drain_cycles"],
            charge_padded=g["charge_padded"], tile=(g["tile_m"], g["tile_k"], g["tile_n"]),
            lanes=p["math"]["lanes"], math_fixed=p["math"]["fixed_cycles"], tcm_bytes=p["tcm"]["size"],
            ipcq_depth=p["ipcq"]["depth"], ipcq_overhead=p["ipcq"]["fixed_overhead"],
            ipcq_bw=p["ipcq"]["bandwidth"], credit_latency=p["ipcq"]["credit_latency"],
            router_ps=noc.ps(n["router_cycles"]), link_ps=link_ps, attach_bw=n["attach_bandwidth"],
            hbm_attach_bw=n["hbm_attach_bandwidth"],
            router_buffer=n["buffer"], link_capacity=n["link_capacity"], cut_through=n["switching"] == "cut_through",
            cube_link_latency=2 * u["intra_sip"]["port_latency"] + link_ps,
            cube_link_bw=u["intra_sip"]["bandwidth"],
            sip_link_latency=u["inter_sip"]["latency"], sip_link_bw=u["inter_sip"]["bandwidth"],
            dispatch={k: pe.ps(v) for k, v in p["cpu"]["dispatch_cycles"].items()},
            cmd_depth=p["cpu"]["command_queue_depth"],
            launch_latency=p["io"]["launch_latency"],
            io_attach=(p["io"]["attach"]["sip"], p["io"]["attach"]["cube"]),
            io_bw=p["io"]["bandwidth"], io_latency=p["io"]["latency"],
        )

    # -- geometry ---------------------------------------------------------------
    @property
    def cubes(self) -> int:
        return self.cx * self.cy

    @property
    def io_coord(self) -> list:
        """NOC address of the host interface: PE index ``P`` of its CUBE (one past the PEs)."""
        return [self.io_attach[0], self.io_attach[1], self.P]

    @property
    def pes(self) -> int:
        return self.sips * self.cubes * self.P

    def cube_xy(self, cube: int) -> tuple[int, int]:
        return cube % self.cx, cube // self.cx

    def global_x(self, sip: int, cube: int) -> int:
        """SIPs join in a line along x: the machine is one (sips*cx) x cy mesh of CUBEs."""
        return sip * self.cx + cube % self.cx


def pe_name(sip: int, cube: int, pe: int) -> str:
    return f"sip{sip}/cube{cube:02d}/pe{pe}"


def cube_name(sip: int, cube: int) -> str:
    return f"sip{sip}/cube{cube:02d}"


#: What each :class:`Params` field is: profile key path(s), unit, doc (the formula for a derived one).  A
#: component declares the fields it reads with :func:`declare` (emulator/declare.py).
PARAMS = {p.name: p for p in (
    Param("sips", "sips", "count", "SIPs in the machine"),
    Param("cx", "cubes.x", "count", "CUBE columns per SIP"),
    Param("cy", "cubes.y", "count", "CUBE rows per SIP"),
    Param("P", "pes_per_cube", "count", "PEs per CUBE"),
    Param("gx", "pe_grid.x", "count", "PE grid columns inside a CUBE (IPCQ neighbours)"),
    Param("gy", "pe_grid.y", "count", "PE grid rows inside a CUBE"),
    Param("pe_clk", "clock.pe", "clock", "PE clock: cycles -> ps"),
    Param("noc_clk", "clock.noc", "clock", "NOC clock"),
    Param("pcs", "hbm.pcs_per_pe", "count", "HBM pseudo-channels per PE"),
    Param("pc_bw_eff", ("hbm.pc_bandwidth", "hbm.efficiency"), "B/s",
          "effective rate of one pseudo-channel: pc_bandwidth x efficiency"),
    Param("hbm_latency", "hbm.access_latency", "ps", "closed-page access latency of one channel request"),
    Param("burst", "hbm.burst", "B", "pseudo-channel interleave granularity"),
    Param("hbm_capacity", "hbm.capacity", "B", "HBM bytes per PE"),
    Param("dma_setup", ("dma.setup_cycles", "clock.pe"), "ps", "DMA descriptor setup: setup_cycles PE cycles"),
    Param("dma_outstanding", "dma.outstanding", "count", "DMA commands in their data phase at once"),
    Param("array_rows", "gemm.array_rows", "count", "MAC array rows R"),
    Param("array_cols", "gemm.array_cols", "count", "MAC array columns C"),
    Param("fill_drain", "gemm.fill_drain_cycles", "cycles", "array fill + drain, once per output block"),
    Param("charge_padded", "gemm.charge_padded", "bool", "charge whole array passes for partial tiles"),
    Param("tile", ("gemm.tile_m", "gemm.tile_k", "gemm.tile_n"), "elements",
          "composite tile plan (TILE_M, TILE_K, TILE_N)"),
    Param("lanes", "math.lanes", "count", "MATH fp32 lanes (1 element / lane / cycle)"),
    Param("math_fixed", "math.fixed_cycles", "cycles", "MATH per-op pipeline latency"),
    Param("tcm_bytes", "tcm.size", "B", "TCM (scratch) capacity"),
    Param("ipcq_depth", "ipcq.depth", "count", "IPCQ ring slots per direction (credits)"),
    Param("ipcq_overhead", "ipcq.fixed_overhead", "ps", "IPCQ per-message fixed time"),
    Param("ipcq_bw", "ipcq.bandwidth", "B/s", "IPCQ message serialisation rate"),
    Param("credit_latency", "ipcq.credit_latency", "ps", "IPCQ credit return"),
    Param("router_ps", ("noc.router_cycles", "clock.noc"), "ps", "router pipeline latency alpha per hop"),
    Param("link_ps", ("noc.link_cycles", "clock.noc"), "ps", "NOC wire latency per link"),
    Param("attach_bw", "noc.attach_bandwidth", "B/s", "PE CPU / DMA <-> router links"),
    Param("hbm_attach_bw", "noc.hbm_attach_bandwidth", "B/s", "HBM port <-> router links"),
    Param("router_buffer", "noc.buffer", "count", "packets buffered per router output"),
    Param("link_capacity", "noc.link_capacity", "count", "credits per NOC / UCIe link"),
    Param("cut_through", "noc.switching", "bool", "noc.switching == cut_through"),
    Param("cube_link_latency", ("ucie.intra_sip.port_latency", "noc.link_cycles"), "ps",
          "CUBE<->CUBE in a SIP: 2 x port_latency + link"),
    Param("cube_link_bw", "ucie.intra_sip.bandwidth", "B/s", "CUBE<->CUBE UCIe rate"),
    Param("sip_link_latency", "ucie.inter_sip.latency", "ps", "SIP<->SIP UCIe latency"),
    Param("sip_link_bw", "ucie.inter_sip.bandwidth", "B/s", "SIP<->SIP UCIe rate"),
    Param("dispatch", ("cpu.dispatch_cycles", "clock.pe"), "ps", "CPU dispatch time per op kind"),
    Param("cmd_depth", "cpu.command_queue_depth", "count", "entries of each engine command queue"),
    Param("launch_latency", "io.launch_latency", "ps", "IO die -> PE launch path"),
    Param("io_attach", ("io.attach.sip", "io.attach.cube"), "coord", "the CUBE router the host interface hangs on"),
    Param("io_bw", "io.bandwidth", "B/s", "host interface rate, per direction"),
    Param("io_latency", "io.latency", "ps", "host interface one-way latency"),
)}

#: a machine's geometry, read by every actor that computes NOC addresses
GEOMETRY = ("sips", "cx", "cy", "P")


def declare(*names: str) -> tuple:
    """The declarations of :class:`Params` fields ``names``, for a component's ``PARAMS``."""
    return tuple(PARAMS[n] for n in names)


#: The :class:`Params` fields a run can change at a time ``T`` (``emu fork --at T --set ...``), with the profile
#: keys they come from.  Each is read only where a service time is computed (actors/ahbm/costs.py, the HBM
#: channels' and the DMA's own reads of ``self.prm``), never at build: not by the wiring (link latencies and
#: bandwidths, queue depths), the tiling (array shape, TILE_M/K/N, TCM size) or a clock domain, which a
#: change at ``T`` could not reach.  A changed value applies to every service time computed from ``T`` on;
#: a command already in service keeps the time it was given.
LIVE_FIELDS = {
    "pc_bw_eff": "hbm.pc_bandwidth, hbm.efficiency",
    "hbm_latency": "hbm.access_latency",
    "dma_setup": "dma.setup_cycles",
    "fill_drain": "gemm.fill_drain_cycles",
    "math_fixed": "math.fixed_cycles",
    "dispatch": "cpu.dispatch_cycles.*",
}


def live_change(old_profile: dict, new_profile: dict):
    """``(changed fields, apply)`` for a change of profile at a time ``T`` of a running machine, or ValueError
    naming what cannot change mid-run.  ``apply(system)`` hands every actor the new values: its view of
    the declared parameters (emulator/declare.py ``params_for``) derived again from the new :class:`Params`."""
    old, new = Params.of(old_profile), Params.of(new_profile)
    changed = [f for f in old.__dataclass_fields__ if getattr(old, f) != getattr(new, f)]
    fixed = [f for f in changed if f not in LIVE_FIELDS]
    if fixed:
        raise ValueError(f"the change sets {', '.join(fixed)}, which the machine fixes when it is built (wiring, "
                         "tiling, clocks): it cannot change mid-run; what can: "
                         + "; ".join(LIVE_FIELDS.values()))
    if not changed:
        raise ValueError("the change leaves every machine parameter as it is")

    def apply(system) -> None:
        from emulator.declare import ParamView, params_for
        for actor in system.actors.values():
            prm = getattr(actor, "prm", None)
            if isinstance(prm, ParamView) and prm._view_source is Params:   # its declared view, derived again
                view = params_for(prm._view_cls, new)
                if view.kwargs() != prm.kwargs():
                    actor.prm = view
            elif prm == old:
                actor.prm = new

    return changed, apply

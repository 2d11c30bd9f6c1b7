"""The AHBM machine profile: schema and derived integer-picosecond parameters.

The base profile ``scenarios/machines/ahbm.yaml`` defines every parameter once,
with its source; ``ahbm-1sip/2sip/4sip`` extend it and state only what differs.
This schema therefore has no defaults (a value lives in exactly one place): it
validates a resolved profile and :class:`Params` converts it into the exact
integer quantities the engines use.
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.schema import Bool, Enum, Float, Int, Map, Quantity, Str
from emulator.units import ClockDomain

__all__ = ["Params", "PROFILE_SCHEMA", "DIRS", "OPPOSITE", "pe_name", "cube_name"]

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

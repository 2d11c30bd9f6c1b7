"""The pccx machine builder.

``build_machine(system, profile, steps, ddr_init)`` wires the whole NPU around a
host driver that runs ``steps`` (see actors/pccx/driver.py)::

    driver --axil--> axil_cmd --cmd FIFO(8)--> decoder --> scheduler --> dispatcher --> acp / gemv / gemm
       |  <--axil-- axil_stat <-- status of every unit          \\--> cvo
       +--DataMover cmds--> hp0..hp3 --weight FIFOs(4096x128b)--> gemm (gemm.hp_ports: HP0, HP1)
                                                             \\--> gemv/lane0..3 (gemv.lane_ports; a port
                                                                  feeding several lanes goes through gemv/wsw<p>;
                                                                  gemv.head_parallel: every port reaches every lane)
    gemv (front) --job/result--> gemv/lane0..3
    ddr <-- hp0..3, acp        l2 <-- acp (port A); gemm > gemv > cvo (port B)

Every link except the AXI-Lite ones, the dispatcher pipeline and the DDR reply
is latency- and bandwidth-free: transfer times are busy spans of the actor that
owns the resource (documented in each module), so timing and data mode agree.
"""
from __future__ import annotations

from actors.pccx.compute import Cvo, MatEngine
from actors.pccx.driver import HostDriver
from actors.pccx.frontend import AxilCmdIn, AxilStatOut, Decoder, GlobalScheduler
from actors.pccx.gemv import GemvFront, GemvLane, WeightSwitch
from actors.pccx.memory import Acp, HostDDR, HpPort, L2, MemDispatcher
from actors.pccx.profile import clocks
from emulator.declare import params_for
from emulator.errors import BuildError

__all__ = ["build_machine"]


def build_machine(system, profile: dict, steps, ddr_init: dict | None = None, where=None,
                  host_ddr: bool = False) -> dict:
    """Add every pccx actor and link to ``system``; returns the actors by short name.

    ``steps``: the driver's program (any iterable); ``where(seq)``: names the program place of
    instruction ``seq`` in the driver's halt log; ``host_ddr``: the driver gets a DDR port (its host
    compute steps read and write host DDR, e.g. the MEMCPY staging area).  The units are added, then
    the control path (AXI-Lite, FIFOs, decoder, scheduler, status) and the memory path (HP ports, DDR,
    weight FIFOs, L2) wired, in that order (actor and link ids, hence digests, follow it)."""
    gemv_ports = _check_ports(profile)
    a = _add_units(system, profile, steps, ddr_init, where, host_ddr, gemv_ports)
    _wire_control(system.connect, a, profile)
    _wire_memory(system.connect, a, profile, host_ddr)
    return a


def _check_ports(profile: dict) -> list[int]:
    """The HP ports the GEMV lanes use, after checking that the profile's port assignments fit."""
    nports = profile["hp"]["ports"]
    g, m = profile["gemv"], profile["gemm"]
    lane_ports = g["lane_ports"]
    if len(lane_ports) != g["lanes"]:
        raise BuildError(f"profile gemv.lane_ports: {len(lane_ports)} entries for {g['lanes']} lanes (gemv.lanes)")
    gemv_ports = sorted({p for p in lane_ports if p is not None})
    for unit, ports in (("gemv.lane_ports", gemv_ports), ("gemm.hp_ports", m["hp_ports"])):
        for p in ports:
            if p >= nports:
                raise BuildError(f"profile {unit}: port {p} does not exist ({nports} HP ports)")
    if set(gemv_ports) & set(m["hp_ports"]):
        raise BuildError("profile: gemv.lane_ports and gemm.hp_ports must not share a port")
    return gemv_ports


def _fed(profile: dict, gemv_ports: list[int]) -> dict[int, list[int]]:
    """Which lanes each GEMV port reaches: its own lanes; with head parallelism every wired lane (gemv.py)."""
    g = profile["gemv"]
    lane_ports = g["lane_ports"]
    wired = [i for i, p in enumerate(lane_ports) if p is not None]
    return {p: (wired if g["head_parallel"] else [i for i, q in enumerate(lane_ports) if q == p]) for p in gemv_ports}


def _add_units(system, profile: dict, steps, ddr_init, where, host_ddr: bool, gemv_ports: list[int]) -> dict:
    data = system.mode == "data"
    nports = profile["hp"]["ports"]
    g = profile["gemv"]
    lane_ports = g["lane_ports"]
    a = {}
    add = lambda key, actor: a.setdefault(key, system.add(actor))  # noqa: E731
    kw = lambda cls: params_for(cls, profile).kwargs()   # noqa: E731  the parameters cls declares (emulator/declare.py)
    add("driver", HostDriver("pccx/driver", steps=steps, where=where, host_ddr=host_ddr, **kw(HostDriver)))
    add("cmd", AxilCmdIn("pccx/axil_cmd"))
    add("stat", AxilStatOut("pccx/axil_stat", **kw(AxilStatOut)))
    add("dec", Decoder("pccx/decoder", **kw(Decoder)))
    add("sch", GlobalScheduler("pccx/scheduler", **kw(GlobalScheduler)))
    add("disp", MemDispatcher("pccx/dispatcher", **kw(MemDispatcher)))
    add("ddr", HostDDR("pccx/ddr", requesters=[f"hp{p}" for p in range(nports)] + ["acp"] + (["host"] if host_ddr else []),
                       data_mode=data, init=ddr_init, **kw(HostDDR)))
    add("l2", L2("pccx/l2", data_mode=data, **kw(L2)))
    for p in range(nports):
        add(f"hp{p}", HpPort(f"pccx/hp{p}", **kw(HpPort)))
    add("acp", Acp("pccx/acp", **kw(Acp)))
    add("gemv", GemvFront("pccx/gemv", data_mode=data, **kw(GemvFront)))
    fed = _fed(profile, gemv_ports)
    for i, p in enumerate(lane_ports):
        inputs = [q for q in gemv_ports if i in fed[q]] if p is not None else []
        add(f"lane{i}", GemvLane(f"pccx/gemv/lane{i}", index=i, inputs=inputs, data_mode=data, **kw(GemvLane)))
    for p, lanes in fed.items():
        if len(lanes) > 1:
            add(f"wsw{p}", WeightSwitch(f"pccx/gemv/wsw{p}", port=p, lanes=lanes))
    add("gemm", MatEngine("pccx/gemm", op="GEMM", lanes=1, data_mode=data, **kw(MatEngine)))
    add("cvo", Cvo("pccx/cvo", data_mode=data, **kw(Cvo)))

    return a


def _wire_control(c, a: dict, profile: dict) -> None:
    """AXI-Lite, the command FIFO, decoder -> scheduler -> dispatcher, the SFU FIFO, status and e_max paths."""
    tc, _ = clocks(profile)
    cvo = profile["cvo"]
    lat = profile["axil"]["latency"]
    big = 4096
    c(a["driver"].axil_w, a["cmd"].w, capacity=1, latency=lat, name="axil.aw")
    c(a["driver"].axil_r, a["stat"].rd, capacity=1, latency=lat, name="axil.ar")
    c(a["stat"].data, a["driver"].axil_rd, capacity=1, latency=lat, name="axil.r")
    c(a["stat"].irq, a["driver"].irq, capacity=64, name="irq")
    c(a["cmd"].fifo, a["dec"].inp, capacity=profile["axil"]["cmd_fifo_depth"], name="cmd_fifo")
    for src in ("cmd", "dec", "sch"):
        c(a[src].status, a["stat"].ev, capacity=big, name=f"status.{src}")
    c(a["dec"].out, a["sch"].inp, capacity=1, name="decoded")
    depth = profile["uop_fifo_depth"]
    c(a["sch"].mem, a["disp"].inp, capacity=depth, name="uop.mem")
    c(a["sch"].cvo, a["cvo"].uop, capacity=depth, name="uop.cvo")
    if cvo["gemv_fifo_words"]:
        # direct GEMV->SFU FIFO (pccx docs' overlap rule 2): results + notices, claims, credit returns
        # (depth and credits: module docs of GemvFront and Cvo)
        c(a["gemv"].sfu, a["cvo"].fifo, capacity=1, name="gemv.sfu_fifo")
        c(a["sch"].fifo_claim, a["gemv"].claims, capacity=big, name="sfu_fifo.claim")
        c(a["cvo"].credit, a["gemv"].credit, capacity=big, name="sfu_fifo.credit")
        c(a["cvo"].retired, a["gemv"].cvo_done, capacity=big, name="sfu_fifo.cvo_done")
    pipe = (profile["dispatcher"]["len_lookup_cycles"] - 1) * tc
    c(a["disp"].acp, a["acp"].job, capacity=depth, latency=pipe, name="uop.acp")
    c(a["disp"].gemv, a["gemv"].uop, capacity=depth, latency=pipe, name="uop.gemv")
    c(a["disp"].gemm, a["gemm"].uop, capacity=depth, latency=pipe, name="uop.gemm")
    for src in ("disp", "acp", "gemv", "gemm", "cvo"):
        c(a[src].status, a["sch"].done, capacity=big, name=f"done.{src}")
    for src in ("gemv", "gemm"):
        c(a[src].emax, a["cvo"].emax_in, capacity=big, name=f"emax.{src}")


def _wire_memory(c, a: dict, profile: dict, host_ddr: bool) -> None:
    """HP ports <-> DDR, the weight FIFOs to the GEMM and the GEMV lanes, the ACP, the host's DDR port, L2."""
    hp, m, g = profile["hp"], profile["gemm"], profile["gemv"]
    nports = hp["ports"]
    big = 4096
    fed = _fed(profile, sorted({p for p in g["lane_ports"] if p is not None}))
    ddr_lat = profile["ddr"]["latency"]
    fifo_bursts = max(1, hp["fifo_words"] // hp["burst_beats"])
    if fifo_bursts % hp["chunk_bursts"]:
        raise BuildError(f"profile hp.chunk_bursts: {hp['chunk_bursts']} does not divide the weight FIFO's "
                         f"{fifo_bursts} bursts (hp.fifo_words / hp.burst_beats)")
    fifo_bursts //= hp["chunk_bursts"]   # the FIFO link's capacity in messages (chunks)
    for p in range(nports):
        c(a["driver"].hp[p], a[f"hp{p}"].cmd, capacity=hp["dm_cmd_depth"], name=f"dm.hp{p}")
        c(a[f"hp{p}"].ddr_req, a["ddr"].req[f"hp{p}"], capacity=big, name=f"ddr.req.hp{p}")
        c(a["ddr"].resp[f"hp{p}"], a[f"hp{p}"].ddr_resp, capacity=big, latency=ddr_lat, name=f"ddr.resp.hp{p}")
    for i, p in enumerate(m["hp_ports"]):
        c(a[f"hp{p}"].fifo, a["gemm"].w[i], capacity=fifo_bursts, name=f"wfifo{p}.gemm")
    for p, lanes in fed.items():
        if len(lanes) == 1:
            c(a[f"hp{p}"].fifo, a[f"lane{lanes[0]}"].w[p], capacity=fifo_bursts, name=f"wfifo{p}.gemv.lane{lanes[0]}")
        else:   # the switch's output links hold one burst each (an AXIS register slice, assumption)
            c(a[f"hp{p}"].fifo, a[f"wsw{p}"].inp, capacity=fifo_bursts, name=f"wfifo{p}.gemv.wsw{p}")
            for i in lanes:
                c(a[f"wsw{p}"].out[i], a[f"lane{i}"].w[p], capacity=1, name=f"gemv.wsw{p}.lane{i}")
    for i in range(g["lanes"]):
        c(a["gemv"].job[i], a[f"lane{i}"].job, capacity=1, name=f"gemv.job.lane{i}")
        c(a[f"lane{i}"].res, a["gemv"].res[i], capacity=1, name=f"gemv.res.lane{i}")
    c(a["acp"].ddr_req, a["ddr"].req["acp"], capacity=big, name="ddr.req.acp")
    c(a["ddr"].resp["acp"], a["acp"].ddr_resp, capacity=big, latency=ddr_lat, name="ddr.resp.acp")
    if host_ddr:
        c(a["driver"].ddr_req, a["ddr"].req["host"], capacity=big, name="ddr.req.host")
        c(a["ddr"].resp["host"], a["driver"].ddr_resp, capacity=big, latency=ddr_lat, name="ddr.resp.host")
    for unit in ("acp", "gemv", "gemm", "cvo"):
        c(a[unit].l2_req, a["l2"].req[unit], capacity=big, name=f"l2.req.{unit}")
        c(a["l2"].resp[unit], a[unit].l2_resp, capacity=big, name=f"l2.resp.{unit}")

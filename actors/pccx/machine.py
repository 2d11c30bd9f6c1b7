"""The pccx v002 machine family: profile schema, machine builder, workloads.

``build_machine(system, profile, steps, ddr_init)`` wires the whole NPU around a
host driver that runs ``steps`` (see actors/pccx/driver.py)::

    driver --axil--> axil_cmd --cmd FIFO(8)--> decoder --> scheduler --> dispatcher --> acp / gemv / gemm
       |  <--axil-- axil_stat <-- status of every unit          \\--> cvo
       +--DataMover cmds--> hp0..hp3 --weight FIFOs(4096x128b)--> gemm (gemm.hp_ports: HP0, HP1)
                                                             \\--> gemv/lane0..3 (gemv.lane_ports; a port
                                                                  feeding several lanes goes through gemv/wsw<p>)
    gemv (front) --job/result--> gemv/lane0..3
    ddr <-- hp0..3, acp        l2 <-- acp (port A); gemm > gemv > cvo (port B)

Every link except the AXI-Lite ones, the dispatcher pipeline and the DDR reply
is latency- and bandwidth-free: transfer times are busy spans of the actor that
owns the resource (documented in each module), so timing and data mode agree.

Workloads: ``program`` — the hand-written overlap program of actors/pccx/program.py;
``asm`` — a ``.pasm`` text program (actors/pccx/asmprog.py).
"""
from __future__ import annotations

from actors.pccx.compute import Cvo, MatEngine
from actors.pccx.driver import HostDriver
from actors.pccx.frontend import AxilCmdIn, AxilStatOut, Decoder, GlobalScheduler
from actors.pccx.gemv import GemvFront, GemvLane, WeightSwitch
from actors.pccx.memory import Acp, HostDDR, HpPort, L2, MemDispatcher
from actors.registry import Workload
from emulator.errors import BuildError
from emulator.schema import Bool, Enum, Int, List, Map, OneOf, Quantity, Spec, Str
from emulator.units import ClockDomain
from protocols import pccx_isa as isa
from protocols.pccx_isa import CVO_FUNCS, OPCODES

__all__ = ["PROFILE_SCHEMA", "WORKLOADS", "build_machine", "clocks", "load_profile", "latency_table"]


class _Null(Spec):
    """YAML ``null`` (an unwired GEMV lane in ``gemv.lane_ports``)."""

    expected = "null"

    def check(self, value, path, ctx):
        if value is not None:
            ctx.fail(path, self.expected, value)
        return None


PROFILE_SCHEMA = Map({
    "family": Enum(["pccx"]),
    "description": Str(default=""),
    "errors": Enum(["strict", "rtl"], doc="strict: error interrupt + halted driver; rtl: silently dropped"),
    "clocks": Map({"core": Quantity("frequency"), "axi": Quantity("frequency")}),
    "axil": Map({"latency": Quantity("time", doc="one AXI-Lite access, each way"),
                 "cmd_fifo_depth": Int(min=1, default=8)}),
    "decoder_cycles": Int(min=1, default=1),
    "scheduler_cycles": Int(min=1, default=1),
    "uop_fifo_depth": Int(min=1, default=2),
    "sync_gemx": Bool(default=False, doc="as built: the Global Scheduler forces SYNC_OP on GEMM/GEMV µops, so "
                      "issue waits for their retirement (reference §1.2); false = GEMV/GEMM issue async"),
    "dispatcher": Map({"len_lookup_cycles": Int(min=1, default=7), "memset_cycles": Int(min=1, default=1)}),
    "status": Map({"done_on": List(Enum(list(OPCODES)), default=["MEMSET", "CVO", "GEMM"])}),
    "ddr": Map({"bandwidth": Quantity("bandwidth"), "latency": Quantity("time"),
                "model_size": Quantity("size", default="16MiB", doc="bytes of host DDR modelled")}),
    "hp": Map({"ports": Int(min=1, default=4), "beat_bytes": Int(min=1, default=16),
               "burst_beats": Int(min=1, default=16), "fifo_words": Int(min=1, default=4096),
               "outstanding": Int(min=1, default=4), "dm_cmd_depth": Int(min=1, default=8),
               "chunk_bursts": Int(min=1, default=1, doc="bursts per DDR read / FIFO message (speed; a divisor of "
                                   "fifo_words / burst_beats); 1 = burst-level streaming")}),
    "acp": Map({"burst_words": Int(min=1, default=16), "cycles_per_word": Int(min=1, default=1),
                "outstanding": Int(min=1, default=4)}),
    "l2": Map({"words": Int(min=1, default=114688), "read_latency_cycles": Int(min=0, default=3)}),
    "gemv": Map({"lanes": Int(min=1, default=4), "macs_per_lane": Int(min=1), "pipeline_cycles": Int(min=0),
                 "lane_ports": List(OneOf(Int(min=0), _Null()), min_len=1,
                                    doc="per lane: the HP port whose weight FIFO feeds it, or null (no weights)")}),
    "gemm": Map({"macs_per_cycle": Int(min=1), "fill_cycles": Int(min=0), "rows": Int(min=1, default=32),
                 "hp_ports": List(Int(min=0), min_len=1, default=[0, 1])}),
    "cvo": Map({"max_length": Int(min=1, default=2048), "read_cycles_per_word": Int(min=1),
                "write_cycles_per_element": Int(min=0), "output_register_cycles": Int(min=0, default=1),
                "reduce_cycles_per_element": Int(min=0, default=1),
                "emax_from": Enum(["gemv+gemm", "gemm"], default="gemv+gemm",
                                  doc="source of the CVO's e_max: GEMV/GEMM findemax (docs) or only the GEMM "
                                      "normaliser (as-built top, reference §1.3: stale in decode)"),
                "gelu_form": Enum(["sigmoid", "tanh"], default="sigmoid",
                                  doc="GELU of the SFU: the RTL's x*sigmoid(1.702x) (reference §1.3) or, what-if, "
                                      "the model's tanh form"),
                "gemv_fifo_words": Int(min=0, default=0, doc="seed §3.2 rule 2: depth (L2 words) of a direct "
                                       "GEMV->SFU result FIFO; 0 = none (the RTL and the pccx docs have no such "
                                       "path: the program polls DONE between a GEMV and the CVO reading its output)"),
                "tanh": Bool(default=False, doc="give the SFU a TANH function (code 0x8, not in the real CVO, "
                             "reference §1.3): what-if option, latency from latency.TANH"),
                "latency": Map({**{f: Int(min=0) for f in CVO_FUNCS},
                                "TANH": Int(min=0, default=12, doc="ASSUMPTION: as GELU (same sigmoid-class pipeline)")})}),
    "host": Map({"element_time": Quantity("time", default="1ns", doc="host CPU time per element of an "
                                          "element-wise step (ASSUMPTION: Cortex-A53 NEON, memory-bound)"),
                 "call_overhead": Quantity("time", default="2us", doc="fixed cost of one host compute step "
                                           "(ASSUMPTION: DMA-buffer cache maintenance + dispatch)")}, default={}),
    "driver": Map({"poll_interval": Quantity("time"),
                   "poll_max_interval": Quantity("time", default="0s", doc="poll backoff cap (0 or poll_interval: "
                                                 "fixed period; ASSUMPTION: uca_sync-style doubling)"),
                   "wait_timeout": Quantity("time", default="10ms", doc="a DONE wait longer than this halts the driver")}),
})


def load_profile(name: str = "pccx-v002-rtl", overrides: dict | None = None) -> dict:
    """A validated profile from scenarios/machines/<name>.yaml with ``overrides`` merged (for tests and tools)."""
    from emulator.scenario import load_profile as load

    return load(name, PROFILE_SCHEMA, overrides)


def clocks(profile: dict) -> tuple[int, int]:
    """(core cycle ps, AXI cycle ps)."""
    return ClockDomain(profile["clocks"]["core"], "core").ps(1), ClockDomain(profile["clocks"]["axi"], "axi").ps(1)


def build_machine(system, profile: dict, steps, ddr_init: dict | None = None, where=None,
                  host_ddr: bool = False) -> dict:
    """Add every pccx actor and link to ``system``; returns the actors by short name.

    ``steps``: the driver's program (any iterable); ``where(seq)``: names the program place of
    instruction ``seq`` in the driver's halt log; ``host_ddr``: the driver gets a DDR port (its host
    compute steps read and write host DDR, e.g. the MEMCPY staging area)."""
    tc, taxi = clocks(profile)
    data = system.mode == "data"
    strict = profile["errors"] == "strict"
    hp, cvo = profile["hp"], profile["cvo"]
    nports = hp["ports"]
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
    a = {}
    add = lambda key, actor: a.setdefault(key, system.add(actor))  # noqa: E731
    add("driver", HostDriver("pccx/driver", steps=steps, poll_interval=profile["driver"]["poll_interval"],
                             hp_ports=nports, wait_timeout=profile["driver"]["wait_timeout"], where=where,
                             poll_max_interval=profile["driver"]["poll_max_interval"], host_ddr=host_ddr))
    add("cmd", AxilCmdIn("pccx/axil_cmd"))
    add("stat", AxilStatOut("pccx/axil_stat", done_on=profile["status"]["done_on"]))
    ext = frozenset([isa.CVO_EXT_FUNCS["TANH"]] if cvo["tanh"] else [])
    add("dec", Decoder("pccx/decoder", cycle_ps=profile["decoder_cycles"] * tc, strict=strict, cvo_ext=ext))
    add("sch", GlobalScheduler("pccx/scheduler", cycle_ps=profile["scheduler_cycles"] * tc, strict=strict,
                               sync_gemx=profile["sync_gemx"], gemv_fifo=cvo["gemv_fifo_words"] > 0,
                               l2_words=profile["l2"]["words"], cvo_max=cvo["max_length"]))
    add("disp", MemDispatcher("pccx/dispatcher", cycle_ps=tc, len_lookup_cycles=profile["dispatcher"]["len_lookup_cycles"],
                              memset_cycles=profile["dispatcher"]["memset_cycles"], strict=strict,
                              l2_words=profile["l2"]["words"], gemm_rows=profile["gemm"]["rows"]))
    add("ddr", HostDDR("pccx/ddr", requesters=[f"hp{p}" for p in range(nports)] + ["acp"] + (["host"] if host_ddr else []),
                       bandwidth=profile["ddr"]["bandwidth"], size=profile["ddr"]["model_size"], data_mode=data,
                       init=ddr_init))
    add("l2", L2("pccx/l2", words=profile["l2"]["words"], cycle_ps=tc, data_mode=data))
    for p in range(nports):
        add(f"hp{p}", HpPort(f"pccx/hp{p}", burst_bytes=hp["burst_beats"] * hp["beat_bytes"],
                             beat_bytes=hp["beat_bytes"], beat_ps=taxi, outstanding=hp["outstanding"],
                             chunk_bursts=hp["chunk_bursts"]))
    add("acp", Acp("pccx/acp", burst_words=profile["acp"]["burst_words"], word_ps=profile["acp"]["cycles_per_word"] * tc,
                   read_latency_ps=profile["l2"]["read_latency_cycles"] * tc, outstanding=profile["acp"]["outstanding"]))
    add("gemv", GemvFront("pccx/gemv", cycle_ps=tc, lanes=g["lanes"], emax_out=cvo["emax_from"] != "gemm",
                          sfu_fifo_words=cvo["gemv_fifo_words"],
                          read_latency_cycles=profile["l2"]["read_latency_cycles"], data_mode=data))
    for i, p in enumerate(lane_ports):
        add(f"lane{i}", GemvLane(f"pccx/gemv/lane{i}", index=i, cycle_ps=tc, macs_per_lane=g["macs_per_lane"],
                                 pipeline_cycles=g["pipeline_cycles"],
                                 burst_bytes=hp["burst_beats"] * hp["beat_bytes"] * hp["chunk_bursts"],
                                 beat_bytes=hp["beat_bytes"], wired=p is not None, data_mode=data))
    fed = {p: [i for i, q in enumerate(lane_ports) if q == p] for p in gemv_ports}
    for p, lanes in fed.items():
        if len(lanes) > 1:
            add(f"wsw{p}", WeightSwitch(f"pccx/gemv/wsw{p}", port=p, lanes=lanes))
    add("gemm", MatEngine("pccx/gemm", op="GEMM", cycle_ps=tc, weight_ports=len(m["hp_ports"]), lanes=1,
                          macs_per_lane=m["macs_per_cycle"], fill_cycles=m["fill_cycles"],
                          read_latency_cycles=profile["l2"]["read_latency_cycles"], data_mode=data))
    add("cvo", Cvo("pccx/cvo", cycle_ps=tc, cfg=cvo, data_mode=data))

    c = system.connect
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
        # seed §3.2 rule 2: one GEMV result at a time (the SFU input stage keeps the newest, module doc of Cvo)
        c(a["gemv"].sfu, a["cvo"].fifo, capacity=1, name="gemv.sfu_fifo")
    pipe = (profile["dispatcher"]["len_lookup_cycles"] - 1) * tc
    c(a["disp"].acp, a["acp"].job, capacity=depth, latency=pipe, name="uop.acp")
    c(a["disp"].gemv, a["gemv"].uop, capacity=depth, latency=pipe, name="uop.gemv")
    c(a["disp"].gemm, a["gemm"].uop, capacity=depth, latency=pipe, name="uop.gemm")
    for src in ("disp", "acp", "gemv", "gemm", "cvo"):
        c(a[src].status, a["sch"].done, capacity=big, name=f"done.{src}")
    for src in ("gemv", "gemm"):
        c(a[src].emax, a["cvo"].emax_in, capacity=big, name=f"emax.{src}")
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
            c(a[f"hp{p}"].fifo, a[f"lane{lanes[0]}"].w, capacity=fifo_bursts, name=f"wfifo{p}.gemv.lane{lanes[0]}")
        else:   # the switch's output links hold one burst each (an AXIS register slice, assumption)
            c(a[f"hp{p}"].fifo, a[f"wsw{p}"].inp, capacity=fifo_bursts, name=f"wfifo{p}.gemv.wsw{p}")
            for i in lanes:
                c(a[f"wsw{p}"].out[i], a[f"lane{i}"].w, capacity=1, name=f"gemv.wsw{p}.lane{i}")
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
    return a


def _num(x: float):
    return int(x) if float(x).is_integer() else f"{x:.1f}"


def latency_table(system, profile: dict) -> list[dict]:
    """Per-opcode engine latency (µop arrival at its engine/dispatcher -> retirement)."""
    tc, _ = clocks(profile)
    stat = system.actors["pccx/axil_stat"]
    rows = []
    for op in OPCODES:
        lat = [r["end"] - r["start"] for r in stat.records if r["kind"] == "retire" and r["op"] == op]
        if not lat:
            continue
        cyc = [x / tc for x in lat]
        rows.append({"op": op, "count": len(lat), "min_cycles": _num(min(cyc)), "mean_cycles": _num(sum(cyc) / len(cyc)),
                     "max_cycles": _num(max(cyc)), "mean_ns": f"{sum(lat) / len(lat) / 1000:.1f}"})
    dropped = [r for r in stat.records if r["kind"] != "retire"]
    if dropped:
        rows.append({"op": "dropped/error", "count": len(dropped), "min_cycles": None, "mean_cycles": None,
                     "max_cycles": None, "mean_ns": None})
    return rows


from actors.pccx import asmprog as _asm  # noqa: E402  (the workloads use build_machine)
from actors.pccx import program as _program  # noqa: E402
from actors.pccx.gemma3n import workload as _gemma3n  # noqa: E402

WORKLOADS = {
    "program": Workload("program", "hand-written program using every opcode: MEMCPY in, MEMSET shapes, GEMVs with "
                        "HP-streamed INT4 weights (prefetch overlap), GEMM, CVO softmax, MEMCPY out",
                        _program.PARAMS, _program.build, _program.check),
    "asm": Workload("asm", "run a hand-written .pasm text program (emu pccx disasm text + driver directives)",
                    _asm.PARAMS, _asm.build, _asm.check),
    "gemma3n": Workload("gemma3n", "Gemma 3N decode tokens compiled from a model config (actors/pccx/gemma3n): "
                        "driver token loop, KV ring, weight prefetch; budget report", _gemma3n.PARAMS,
                        _gemma3n.build, _gemma3n.check),
}

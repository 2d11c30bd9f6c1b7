"""The pccx v002 machine profile: its schema (``PROFILE_SCHEMA``, defaults and docs of every key),
``load_profile``, the clock periods and the parameters several units read (``PARAMS``, emulator/declare.py).  Profiles: scenarios/machines/pccx-v002-{documented,rtl}.yaml."""
from __future__ import annotations

from emulator.declare import Param
from emulator.schema import Bool, Enum, Int, List, Map, OneOf, Quantity, Spec, Str
from emulator.units import ClockDomain
from protocols.pccx_isa import CVO_FUNCS, OPCODES

from actors.pccx.energy import ENERGY_SCHEMA

__all__ = ["PROFILE_SCHEMA", "PARAMS", "declare", "load_profile", "clocks"]


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
                      "issue waits for their retirement (pccx-v002 RTL: global scheduler); false = GEMV/GEMM issue async"),
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
                                    doc="per lane: the HP port whose weight FIFO feeds it, or null (no weights)"),
                 "head_parallel": Bool(default=False, doc="parallel_lane bit 4 selects head parallelism: each lane on "
                                       "its own activation (a query head), one weight stream multicast to the lanes "
                                       "through a GEMV-port x lane interconnect (pccx docs gemv_core.rst §4; not in "
                                       "the RTL, whose lanes share one fmap LUT)")}),
    "gemm": Map({"macs_per_cycle": Int(min=1), "fill_cycles": Int(min=0), "rows": Int(min=1, default=32),
                 "hp_ports": List(Int(min=0), min_len=1, default=[0, 1])}),
    "cvo": Map({"max_length": Int(min=1, default=2048), "read_cycles_per_word": Int(min=1),
                "write_cycles_per_element": Int(min=0), "output_register_cycles": Int(min=0, default=1),
                "reduce_cycles_per_element": Int(min=0, default=1),
                "emax_from": Enum(["gemv+gemm", "gemm"], default="gemv+gemm",
                                  doc="source of the CVO's e_max: GEMV/GEMM findemax (docs) or only the GEMM "
                                      "normaliser (as-built top, pccx-v002 RTL top: stale in decode)"),
                "gelu_form": Enum(["sigmoid", "tanh"], default="sigmoid",
                                  doc="GELU of the SFU: the RTL's x*sigmoid(1.702x) (pccx-v002 RTL SFU) or, what-if, "
                                      "the model's tanh form"),
                "gemv_fifo_words": Int(min=0, default=0, doc="depth (L2 words) of the direct GEMV->SFU result FIFO of the "
                                       "pccx docs' Gemma 3N pipeline (overlap rule 2; claimed results, credit "
                                       "back-pressure on the GEMV; a GEMV also waits for the in-flight CVOs "
                                       "writing its activation); 0 = none, as in the RTL top: the program "
                                       "polls DONE between a GEMV and a CVO that depend on each other"),
                "tanh": Bool(default=False, doc="give the SFU a TANH function (code 0x8, not in the real CVO, "
                             "of the pccx-v002 RTL): what-if option, latency from latency.TANH"),
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
    "energy": ENERGY_SCHEMA,
})


def load_profile(name: str = "pccx-v002-rtl", overrides: dict | None = None) -> dict:
    """A validated profile from scenarios/machines/<name>.yaml with ``overrides`` merged (for tests and tools)."""
    from emulator.scenario import load_profile as load

    return load(name, PROFILE_SCHEMA, overrides)


def clocks(profile: dict) -> tuple[int, int]:
    """(core cycle ps, AXI cycle ps)."""
    return ClockDomain(profile["clocks"]["core"], "core").ps(1), ClockDomain(profile["clocks"]["axi"], "axi").ps(1)



#: Parameters read by several pccx units, with how each is computed from the profile; a unit declares them with
#: :func:`declare` and states its own ``Param``s next to them.
PARAMS = {p.name: p for p in (
    Param("cycle_ps", "clocks.core", "ps", "core clock period", lambda p: clocks(p)[0]),
    Param("strict", "errors", "bool", "errors == strict: a bad instruction raises the error interrupt",
          lambda p: p["errors"] == "strict"),
    Param("l2_words", "l2.words", "words", "L2 size in 128-bit words"),
    Param("read_latency_cycles", "l2.read_latency_cycles", "cycles", "L2 read latency"),
)}


def declare(*names: str) -> tuple:
    """The shared declarations ``names`` (:data:`PARAMS`), for a unit's ``PARAMS``."""
    return tuple(PARAMS[n] for n in names)

"""The ``gemma3n`` workload: Gemma 3N decode tokens on the pccx machine, from the compiled instruction stream.

``build`` compiles the config (actors/pccx/gemma3n/compiler.py) and hands the
driver a generator: setup (``pccx_open``, shape MEMSETs, ``pccx_kv_init``,
``pccx_start``), then per token the compiled steps (token id, embedding row,
layer instructions pushed async, polls, logits back, host sampling).  Token
``t`` is compiled when the driver reaches it, so the KV ring's valid range is
the driver's state at that moment.  ``context`` = positions already in the ring
(the prompt is assumed prefilled through the same decode path, token by token;
those tokens are not emulated — only the ``tokens`` decode steps after them).

Data mode: the compiler draws seeded INT4 weights (actors/pccx/gemma3n/hostmath.py),
the prompt runs token by token through the decode path, then greedy decoding;
``check`` returns the token ids; the logits stay on the context's HostMath for tests.

``check`` returns the budget report: tok/s, per-layer and per-stage time,
utilisations, the HP bytes split into weights and KV (and the KV bytes into the
read-once figure and its overheads), bandwidths beside the seed §6 budget, the
bounds from weights + KV read once and the one that binds, the seed's budget
row by row (actors/pccx/gemma3n/budget.py), the GEMV ports' idle time per stage,
the rule 1-3 overlap figures, and on the rtl profile the instructions the
machine dropped.
"""
from __future__ import annotations

import bisect
from collections import defaultdict

from actors.pccx.builder import build_machine
from actors.pccx.gemma3n.budget import BUDGET_TABLE, bounds, hp_idle_per_stage, design_budget
from actors.pccx.gemma3n.compiler import STAGES, CompileError, Compiler
from actors.pccx.gemma3n.config import MODELS_DIR, load_config
from actors.registry import workload_file
from actors.pccx.gemma3n.phases import stage_time
from emulator.errors import BuildError
from emulator.schema import Bool, Enum, Float, Int, List, Map, Str
from protocols import pccx_isa as isa

__all__ = ["PARAMS", "build", "check", "Context"]

PARAMS = Map({
    "model": Str(default="tiny", doc="config stem in scenarios/pccx/gemma3n/models/ or a YAML path"),
    "model_set": Map({}, open=True, default={}, doc="overrides deep-merged into the config (e.g. kv: {dtype: int8})"),
    "tokens": Int(min=1, default=1, doc="decode tokens emulated"),
    "context": Int(min=0, default=0, doc="positions already in the KV ring before the first emulated token"),
    "prefetch": Bool(default=True, doc="pccx Gemma 3N pipeline, overlap rule 1 on (stream of GEMV n+1 issued at GEMV n's push) or off"),
    "ple_overlap": Bool(default=True, doc="pccx Gemma 3N pipeline, overlap rule 3 on (layer i's PLE injection rides on layer i+1's AltUp "
                        "router: its GEMVs run under the router's host work, its host math shares the router's "
                        "round trips) or off (PLE injection serialised after the AltUp correction)"),
    "corrupt": Map({"seq": Int(min=0, doc="instruction number (push order) to corrupt"),
                    "kind": Enum(["opcode", "reserved_bits", "address"])}, default={"seq": 0, "kind": "opcode"},
                   required=False, doc="error-path test: the driver pushes a corrupted word at instruction seq"),
    "corrupt_enabled": Bool(default=False),
    "prompt": List(Int(min=0), default=[1, 2, 3], doc="data mode: prompt token ids (then sampled tokens)"),
    "sampling": Map({"mode": Enum(["greedy", "top_p"], default="greedy"),
                     "top_p": Float(min=0, max=1, default=0.9),
                     "repetition_penalty": Float(min=1, default=1.15)}, default={},
                    doc="data mode: host sampling (top_p: seeded by the scenario seed)"),
})


def corrupt_word(word: int, kind: str) -> int:
    """A corrupted copy of ``word``: reserved opcode 0xF, reserved bit 0 set (every layout but MEMCPY has
    reserved low bits; MEMCPY's bit 0 is ``async``, so bit 2 of the GEMV/CVO reserved field is used via
    opcode-specific positions), or an L2 address field at its maximum (>= 114,688 words)."""
    op = word >> 60
    if kind == "opcode":
        return (0xF << 60) | (word & ((1 << 60) - 1))
    if kind == "reserved_bits":
        bit = {0: 20, 1: 20, 3: 0, 4: 1}.get(op)
        if bit is None:   # MEMCPY has no reserved bits: corrupt the opcode field instead
            return (0x9 << 60) | (word & ((1 << 60) - 1))
        return word | (1 << bit)
    # address: GEMV/GEMM dest_reg [59:43], MEMCPY dest/src, CVO: length beyond the SFU's FIFO
    if op in (0, 1):
        return word | (0x1FFFF << 43)
    if op == 2:
        return word | (0x1FFFF << 41) | (0x1FFFF << 24)
    return word | (0xFFFF << 6)


class Context:
    """What ``build`` hands ``check``: the compiler (layouts, tags, counts) and the run's parameters."""

    def __init__(self, compiler: Compiler, params: dict):
        self.compiler = compiler
        self.params = params
        self.progress = (0, 0)       # (driver waits looked at, layer_done polls among them): progress()


def build(system, profile: dict, p: dict) -> Context:
    data = system.mode == "data"
    if data and p["context"]:
        raise BuildError("workload gemma3n: data mode runs the prompt through the decode path: context must be 0")
    model = p["model"]
    if "/" in model or not (MODELS_DIR / f"{model}.yaml").is_file():   # a path: under the scenario's input roots
        model = str(workload_file(model, system, "workload.params.model", "model config"))
    try:
        c = load_config(model, p["model_set"])
        comp = Compiler(c, profile, prefetch=p["prefetch"], ple_overlap=p["ple_overlap"], data=data,
                        seed=system.seed, prompt=p["prompt"],
                        sampling=p["sampling"])
    except CompileError as e:
        raise BuildError(f"workload gemma3n: {e}") from None
    if comp.ddr.top > profile["ddr"]["model_size"]:
        raise BuildError(f"workload gemma3n: the program lays out {comp.ddr.top} bytes of host DDR, profile "
                         f"ddr.model_size is {profile['ddr']['model_size']} (set machine.overrides.ddr.model_size)")
    for _ in range(p["context"]):
        comp.ring.append()

    def steps():
        yield from comp.setup()
        for t in range(p["context"], p["context"] + p["tokens"]):
            yield from comp.token(t)

    def corrupted(inner):
        seq = 0
        for st in inner:
            if st[0] == "push":
                if seq == p["corrupt"]["seq"]:
                    st = ("push", corrupt_word(st[1], p["corrupt"]["kind"]))
                seq += 1
            yield st

    program = corrupted(steps()) if p["corrupt_enabled"] else steps()
    build_machine(system, profile, program, comp.ddr_init if data else None, where=comp.describe, host_ddr=True)
    return Context(comp, p)


def _busy(spans, t0, t1) -> int:
    return sum(max(0, min(e, t1) - max(s, t0)) for s, e, *_ in spans)


def prefetch_overlap(system, comp: Compiler) -> dict:
    """Rule-1 overlap: per weight stream, the HP transfer time spent *before* its GEMV µop reached the
    GEMV unit (hidden behind earlier work: GEMVs, CVO ops, round trips, polls).  Per layer and total, ps.

    The remainder of a stream's transfer runs while its GEMV waits for weights: that part is on the
    critical path whether or not the stream was prefetched."""
    stat = system.actors["pccx/axil_stat"]
    start = {r["seq"]: r["start"] for r in stat.records if r["kind"] == "retire" and r["op"] == "GEMV"}
    xfer: dict[int, list] = defaultdict(list)
    for n, a in system.actors.items():
        if n.startswith("pccx/hp"):
            for (s, e, st) in a.spans:
                xfer[st].append((s, e))
    hidden: list[tuple[int, int, int]] = []   # (start, end, layer) of transfer before its GEMV started
    busy: list[tuple[int, int]] = []
    for st, spans in xfer.items():
        if st >= len(comp.stream_seq) or comp.stream_seq[st] not in start:
            continue
        g0 = start[comp.stream_seq[st]]
        layer = comp.stream_where[st][1]
        hidden += [(s, min(e, g0), layer) for s, e in spans if s < g0]
        busy += spans
    # time, not port-time: the union of the intervals (two ports transfer at once)
    per_layer: dict[int, int] = defaultdict(int)
    total, end = 0, -1
    for s, e, layer in sorted(hidden):
        s = max(s, end)
        if e > s:
            per_layer[layer] += e - s
            total += e - s
            end = e
    transfer, end = 0, -1
    for s, e in sorted(busy):
        s = max(s, end)
        if e > s:
            transfer += e - s
            end = e
    return {"total_ps": total, "transfer_ps": transfer, "per_layer_ps": dict(per_layer)}


def sfu_overlap(system, comp: Compiler) -> dict:
    """Rule-2 figures: the SFU's busy time (CVO retire spans) while a GEMV runs (GEMV retire spans), per
    layer of the CVO and total, ps; with the direct FIFO (``cvo.gemv_fifo_words``) also the CVOs fed from
    it and the time the GEMV unit waited for FIFO credits (actors/pccx/gemv.py)."""
    stat = system.actors["pccx/axil_stat"]
    ret = [r for r in stat.records if r["kind"] == "retire"]
    gemv: list[list[int]] = []
    for s, e in sorted((r["start"], r["end"]) for r in ret if r["op"] == "GEMV"):
        if gemv and s <= gemv[-1][1]:
            gemv[-1][1] = max(gemv[-1][1], e)
        else:
            gemv.append([s, e])
    starts = [g[0] for g in gemv]
    per_layer: dict[int, int] = defaultdict(int)
    for r in ret:
        if r["op"] != "CVO" or not 0 <= r["seq"] < len(comp.where):
            continue
        i = max(0, bisect.bisect_right(starts, r["start"]) - 1)
        while i < len(gemv) and gemv[i][0] < r["end"]:
            per_layer[comp.where[r["seq"]][1]] += max(0, min(r["end"], gemv[i][1]) - max(r["start"], gemv[i][0]))
            i += 1
    rep = system.reports
    return {"total_ps": sum(per_layer.values()), "per_layer_ps": dict(per_layer),
            "fifo_hits": rep.get("pccx/cvo", {}).get("fifo_hits_by_func", {}),
            "entries": rep.get("pccx/gemv", {}).get("sfu_fifo_entries", 0),
            "stall_ps": rep.get("pccx/gemv", {}).get("sfu_fifo_stall_ps", 0)}


def ple_overlap(system, comp: Compiler) -> dict:
    """Rule-3 overlap: per layer, the engine time of its PLE-injection GEMVs (retire spans: the PLE gate and
    projection) that ran while the host computed (driver host spans), ps; ``exposed``: the rest of it.

    Serialised (``ple_overlap: false``) the driver polls DONE right after each PLE GEMV, so nothing runs
    under host work and the figure is 0; overlapped, the PLE gate GEMV runs under the next layer's router
    norm.  Also the PLE engine time left exposed (not under host work)."""
    driver = system.actors["pccx/driver"]
    stat = system.actors["pccx/axil_stat"]
    host = sorted((s, e) for s, e, _lab in driver.host_spans)
    hidden: dict[int, int] = defaultdict(int)
    exposed: dict[int, int] = defaultdict(int)
    for r in stat.records:
        if (r["kind"] != "retire" or r["op"] != "GEMV" or not 0 <= r["seq"] < len(comp.where)
                or comp.where[r["seq"]][2] != "ple_inject"):
            continue
        layer = comp.where[r["seq"]][1]
        h = _busy(host, r["start"], r["end"])      # host spans do not overlap one another (one driver)
        hidden[layer] += h
        exposed[layer] += r["end"] - r["start"] - h
    # the window where rule 3 acts: from the end of layer i's AltUp-correction host step to the end of layer
    # i+1's prediction host step (serialised it holds layer i's PLE injection + layer i+1's router and
    # prediction; overlapped the same work, interleaved).  Outside the windows both orders are identical.
    nl = comp.c["num_layers"]
    corr = [e for s, e, lab in driver.host_spans if lab == "altup_correct:altup_correct"]
    pred = [e for s, e, lab in driver.host_spans if lab.startswith("altup_predict:") and lab.endswith("predict+input_norm")]
    window: dict[int, int] = defaultdict(int)
    for k, end in enumerate(corr):
        if k % nl + 1 < nl and k + 1 < len(pred):
            window[k % nl] += pred[k + 1] - end
    return {"total_ps": sum(hidden.values()), "exposed_ps": sum(exposed.values()), "per_layer_ps": dict(hidden),
            "window_ps": sum(window.values()), "window_per_layer_ps": dict(window)}


def _machine_errors(driver, stat, comp: Compiler) -> dict:
    """The driver's halt and, on the rtl profile, the instructions the machine dropped silently
    (a later error may stem from them), each named by its compiler location."""
    out: dict = {}
    if driver.halted:
        out["error"] = (f"pccx/driver halted at t={driver.halted['at_ps']} ps: {driver.halted['text']} "
                        f"[{driver.halted.get('instruction')}; {driver.halted.get('where')}]")
    dropped = [{"instruction": r["seq"], "where": comp.describe(r["seq"]),
                "word": isa.disasm_word(driver.words[r["seq"]]) if r["seq"] < len(driver.words) else None,
                "text": r["text"]} for r in stat.records if r["kind"] == "drop" and 0 <= r["seq"] < len(comp.where)]
    if dropped:
        out["dropped_instructions"] = dropped
    return out


def _token_window(driver) -> tuple[list[int], list[int]]:
    """Token boundaries: the host's embed step starts a token, its sample step ends it."""
    starts = [s for s, e, lab in driver.host_spans if lab.startswith("embed:")]
    ends = [e for s, e, lab in driver.host_spans if lab.startswith("sample:")]
    return starts, ends


def _per_layer_us(driver, t0: int) -> list[float]:
    """The last token's time per layer: between consecutive layer_done polls, the first from the token start."""
    per_layer, prev = [], t0
    for w in (w["at_ps"] for w in driver.waits if w["label"].endswith("layer_done")):
        if w >= t0:
            per_layer.append(round((w - prev) / 1e6, 3))
            prev = w
    return per_layer


def _stage_rows(driver, stat, comp: Compiler, ntok: int) -> list[dict]:
    """Per compiler stage and per token: instructions, engine busy time (retire spans), host time, HP bytes."""
    stage_engine, stage_ops, stage_host = defaultdict(int), defaultdict(int), defaultdict(int)
    for r in stat.records:
        if r["kind"] == "retire" and 0 <= r["seq"] < len(comp.where):
            st = comp.where[r["seq"]][2]
            stage_engine[st] += r["end"] - r["start"]
            stage_ops[st] += 1
    for s, e, lab in driver.host_spans:
        stage_host[lab.split(":")[0]] += e - s
    rows = []
    for st in STAGES:
        if stage_ops.get(st) or stage_host.get(st):
            n_ins = sum(v for (s2, _), v in comp.counts.items() if s2 == st)
            rows.append({"stage": st, "instructions": round(n_ins / (1 if st == "setup" else ntok), 1),
                         "engine_busy_us": round(stage_engine[st] / 1e6 / ntok, 3),
                         "host_us": round(stage_host[st] / 1e6 / ntok, 3),
                         "hp_MB": round(comp.stream_bytes[st] / 1e6 / max(1, ntok), 3)})
    return rows


def _utilisation(system, driver, stat, t0: int, t1: int) -> dict:
    """Busy fraction of each HP port, GEMV lane, the SFU, the systolic array and the host over [t0, t1)."""
    span = t1 - t0
    util = {}
    for n, a in system.actors.items():
        if (n.startswith("pccx/hp") and a.spans) or n.startswith("pccx/gemv/lane"):
            util[n] = round(_busy(a.spans, t0, t1) / span, 4)
    cvo = sum(r["end"] - r["start"] for r in stat.records if r["kind"] == "retire" and r["op"] == "CVO")
    util["pccx/cvo (SFU)"] = round(cvo / span, 4)
    util["pccx/gemm (systolic array)"] = round(_busy(system.actors["pccx/gemm"].spans, t0, t1) / span, 4)
    util["host CPU"] = round(sum(e - s for s, e, _ in driver.host_spans if s >= t0) / span, 4)
    return util


def _budget_rows(comp: Compiler, b: dict, tok_per_s: float, tok_ps: float, ntok: int) -> list[dict]:
    """Throughput and the HP / weight / KV / L2 bandwidths beside the plan's budget and the bounds."""
    gbps = lambda nbytes: round(nbytes * 1e3 / tok_ps, 3)   # noqa: E731  bytes per token -> GB/s
    return [
        {"metric": "decode throughput (tok/s)", "emulated": tok_per_s, "design_budget": 20,
         "bound": b["tok_s_bound"], "ratio_to_bound": round(tok_per_s / b["tok_s_bound"], 4),
         "binding": b["binding"]},
        {"metric": "HP2/HP3 stream, weights + KV (GB/s)", "emulated": gbps(b["hp_bytes_per_token"]),
         "design_budget": None, "bound": b["hp_gemv_bandwidth_GBps"],
         "ratio_to_bound": round(gbps(b["hp_bytes_per_token"]) / b["hp_gemv_bandwidth_GBps"], 4)},
        {"metric": "weight stream, weights only (GB/s)", "emulated": gbps(b["weight_bytes_per_token"]),
         "design_budget": 3, "bound": None, "ratio_to_bound": None},
        {"metric": "KV read (GB/s)", "emulated": gbps(b["kv_bytes_per_token"]), "design_budget": 6,
         "bound": None, "ratio_to_bound": None},
        {"metric": "L2 activation traffic (GB/s)", "emulated": gbps(comp.l2_bytes / ntok),
         "design_budget": 1.6, "bound": None, "ratio_to_bound": None},
    ]


def _overlap_figures(system, comp: Compiler, ntok: int) -> dict:
    """Overlap rules 1-3 (weight prefetch, PLE injection, SFU FIFO) in microseconds, totals and per layer."""
    per_layer = lambda d: {k: round(v / 1e6 / ntok, 3) for k, v in sorted(d.items())}   # noqa: E731
    ov, po, so = prefetch_overlap(system, comp), ple_overlap(system, comp), sfu_overlap(system, comp)
    return {
        "prefetch_overlap_us": round(ov["total_ps"] / 1e6, 3),
        "weight_transfer_us": round(ov["transfer_ps"] / 1e6, 3),
        "prefetch_overlap_per_layer_us": per_layer(ov["per_layer_ps"]),
        "ple_overlap_us": round(po["total_ps"] / 1e6, 3),
        "ple_exposed_us": round(po["exposed_ps"] / 1e6, 3),
        "ple_overlap_per_layer_us": per_layer(po["per_layer_ps"]),
        "ple_window_ps": po["window_ps"],
        "ple_window_per_layer_us": per_layer(po["window_per_layer_ps"]),
        "sfu_fifo_hits": so["fifo_hits"],
        "sfu_fifo_entries": so["entries"],
        "sfu_fifo_stall_us": round(so["stall_ps"] / 1e6, 3),
        "sfu_gemv_overlap_us": round(so["total_ps"] / 1e6, 3),
        "sfu_gemv_overlap_per_layer_us": per_layer(so["per_layer_ps"]),
    }


def check(system, profile: dict, p: dict, result, context: Context) -> dict:
    comp = context.compiler
    driver = system.actors["pccx/driver"]
    stat = system.actors["pccx/axil_stat"]
    out = _machine_errors(driver, stat, comp)
    if result.status != "finished" or driver.halted:
        return out
    starts, ends = _token_window(driver)
    ntok = len(ends)
    tok_ps = (ends[-1] - starts[0]) / ntok
    out["tokens"] = ntok
    out["token_time_us"] = round(tok_ps / 1e6, 3)
    out["tok_per_s"] = round(1e12 / tok_ps, 3)
    out["per_layer_us_last_token"] = _per_layer_us(driver, starts[-1])
    rows = _stage_rows(driver, stat, comp, ntok)
    st_time = stage_time(stat.records, driver.host_spans, comp.where, starts[0], ends[-1])   # where the time sits
    for row in rows:   # per-token stage time (actors/pccx/gemma3n/phases.py)
        row["time_us"] = round(st_time.get(row["stage"], 0) / 1e6 / ntok, 3)
        row["time_share"] = f"{100 * st_time.get(row['stage'], 0) / max(1, ends[-1] - starts[0]):.1f} %"
    out["stage_time_us"] = {k: round(v / 1e6 / ntok, 3) for k, v in sorted(st_time.items(), key=lambda kv: -kv[1])}
    util = _utilisation(system, driver, stat, starts[0], ends[-1])
    b = bounds(comp, profile, ntok)   # bytes, bandwidths and bounds (actors/pccx/gemma3n/budget.py)
    out["budget"] = _budget_rows(comp, b, out["tok_per_s"], tok_ps, ntok)
    out["bounds"] = b
    out["design_budget"] = design_budget(comp, profile, b, out["tok_per_s"], tok_ps, ntok)
    out["hp_idle_per_stage_us"] = hp_idle_per_stage(system, comp, starts[0], ends[-1], ntok)
    out["l2_words_used"] = comp.l2.used_words()
    out["kv_slots_attended"] = comp.attended_ranges()
    out.update(_overlap_figures(system, comp, ntok))
    out["instructions_per_token"] = round(len(comp.where) / ntok)
    out["polls_per_token"] = round(len(driver.waits) / ntok, 1)
    if comp.data:
        out["token_ids"] = comp.hm.tokens[1:] + [comp.next_token]
        out["greedy_tokens"] = [int(l.argmax()) for l in comp.hm.logits]
    out["kv_ring"] = {"max_tokens": comp.ring.max_tokens, "written": comp.ring.written, "sink": comp.ring.sink,
                      "attended": comp.ring.attended()}
    out["tables"] = {"gemma3n per-stage (per token)": rows,
                     "utilisation (emulated tokens)": [{"unit": k, "busy": v} for k, v in util.items()],
                     BUDGET_TABLE: out["budget"],
                     "the design document's budget (pccx Gemma 3N execution page §6) row by row": out["design_budget"]}
    return out


def progress(system, context: Context):
    """Layers done out of ``tokens x layers`` (the progress line): the driver's finished per-layer DONE polls.
    Read from the progress thread: only the new entries of the driver's wait list are looked at each time."""
    driver = system.actors["pccx/driver"]
    seen, done = context.progress
    waits = driver.waits
    n = len(waits)
    for w in waits[seen:n]:
        done += w["label"].endswith(".layer_done")
    context.progress = (n, done)
    return done, context.params["tokens"] * context.compiler.c["num_layers"], "layers"

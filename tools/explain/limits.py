"""What limits a run: where its critical path spends the time, how loose its analytic bound is, and the bound's
binding term.

Two answers, one line (``emu run`` prints it as ``limits``; ``result.json`` holds ``limits``,
docs/outputs.md "What limits it").  **The line leads with the run**, not with the bound: the critical path's
classes, largest first (``leading``: what the run waits on most), then ``ratio to bound`` (the run's time over
the bound's, :func:`ratio_to_bound`), then the bound's binding term with its time and the resource classes it
counts (:data:`TERM_CLASSES`, a declared table).  A bound term can bind the bound without limiting the run: the
Llama3-70B 8K decode's bound is its padded GEMM cycles while its critical path spends most in MATH, and
widening the MATH engine, not the array, is what shortens it.  So when the binding term's classes do not hold
the path's leading class (``agree: false``) the line says so in words ("the bound's gemm term is not what the
run waits on: the critical path leads with MATH"); a note the bound gives of itself (``bound_terms.note``: the
GQA bound's tiling, kernels/gqa_bound.py) ends the line.

* **the binding term** of the workload's own lower bound, named.  The bound is the one the
  workload reports (nothing is recomputed here):

  - GQA attention (``bound_terms``, actors/ahbm/kernels/gqa_bound.py):
    ``bound = launch + first_access + max(kv, gemm) + reduction``; the binding term is the
    largest summand, with ``max(kv, gemm)`` counted as whichever of the two is larger (the
    other is the ``runner_up`` with its slack).  ``gemm`` is named ``gemm (padded rows)``
    when the profile charges whole array passes (``gemm.charge_padded: true``) and the
    GEMMs' row count ``M`` is not a multiple of ``gemm.array_rows`` (decode: ``M = G``;
    one-rank prefill: ``M = G x T_q``; ring prefill: ``M = G x q_tile``), i.e. the term is
    inflated by padding;
  - Gemma 3N on pccx (``bounds``, actors/pccx/gemma3n/budget.py): the smallest of the three
    tok/s bounds (weight + KV bytes over the GEMV HP ports, GEMV MACs over the lanes, the same
    bytes over host DDR), named ``weight stream over HP2/HP3`` (the ports the compiler
    streams on), ``GEMV MACs`` or ``host DDR``;
  - many GQA requests (``gqa_requests``): the bound names its binding term itself
    (``bound_terms.binding``: ``sharing``, the launches in turn on a CUBE Group's PEs, or
    ``arrival``, each request's launches in turn after it arrives); another workload that reports
    ``bound_ps`` with ``bound_terms`` gets its largest ``*_ps`` term;
  - any other workload has no analytic bound: ``bound`` is None and the line gives the critical
    path's classes and says ``no analytic bound``.

* **critical-path shares per resource class**: the run's critical path (tools/trace/summary.py,
  walked backwards from the last event through busy spans, own waits, message flights and
  polls) with every step put into one resource class (:func:`step_class`, tables below);
  each class's time over the run's end time.  The steps partition ``[0, end]``, so the shares
  sum to 100 %.  Needs the run's trace (a bundle's default trace or ``--trace``); without one
  the part says why.

**What it costs.**  The walk reads the run's whole trace back (tools/trace/compact.py's numpy
columns, 25 bytes an event) and indexes it: about 1 s a million events on one core (a Llama3-70B
ring prefill of 1.9 M events: 1.2 s reading, 0.9 s walking, +110 MiB, against a 13 s run).  It is
kept on every run with a trace, because the line is the point, and its cost is reported:
``critical_path.walk`` in result.json (``events``, ``wall_s``) on every run, and on the printed line
from :data:`WALK_NOTE_EVENTS` events up (``critical path (1.9 M events walked in 2.1 s, 16 % of the
run's wall time)``), where it is more than a few per cent of the run.  A run that does not want it
records no trace (``--no-bundle``, or ``trace.enabled: false``: the trace's writing costs more).
"""
from __future__ import annotations

import time

from emulator.units import format_time
from tools.trace.summary import component_kind, critical_path, end_time, kind_stems, missing_parts
from tools.trace.compact import compact

#: from this many trace events up, the printed line says what the critical-path walk cost (module docstring)
WALK_NOTE_EVENTS = 1_000_000

__all__ = ["run_limits", "binding_term", "path_classes", "classified_steps", "step_class", "limits_line", "leading",
           "ratio_to_bound", "agreement", "CLASSES", "TERM_CLASSES"]

#: the AHBM fidelities (workload.params.fidelity, actors/ahbm/pipeline.py) whose critical path is not the block
#: model's, and why: an engine the scheduler holds or a batch runs in closed form sends no message per step, so
#: the walk (which follows messages) puts its time on the scheduler that waited for it and on the CPU's DONE
#: polls.  The end time is the block model's; the classes are not (the Llama3-70B 8K decode, one head: block
#: MATH 40 %, GEMM array 27 %, CPU dispatch 11 %, HBM channels 11 %; pipeline DONE polls 26 %, CPU dispatch 20 %,
#: MATH 18 %, HBM channels 12 %; stream DONE polls 29 %, scheduler 22 %, CPU dispatch 20 %, MATH 19 %), so the
#: line says so
HIDDEN_BY_FIDELITY = {
    "pipeline": "the path does not see the GEMM array the scheduler holds or batches, nor the MATH ops sent in "
                "runs: their time shows as scheduler and DONE polls (fidelity block walks them, same end time)",
    "stream": "the path does not see the GEMM array, DMA engine and HBM channels the scheduler holds, nor the MATH "
              "ops sent in runs: their time shows as scheduler and DONE polls (fidelity block walks them, same end "
              "time)",
}

#: resource class -> what it covers (docs/outputs.md has the same table)
CLASSES = {
    "HBM channels": "AHBM HBM pseudo-channels (pc*) and the PE's HBM port: busy serving bursts, idle = access latency",
    "DMA": "AHBM DMA engines: descriptor setup, striping over the pseudo-channels",
    "GEMM array": "AHBM GEMM engine (the R x C MAC array): core cycles and fill/drain",
    "scheduler": "AHBM PE scheduler: sequencing a composite command's DMA/GEMM/epilogue steps",
    "MATH": "AHBM MATH engine (vector lanes): softmax, merges, casts",
    "TCM": "AHBM TCM accesses (reads, writes, frees)",
    "CPU dispatch": "AHBM PE CPU: per-op issue cost (cpu.dispatch_cycles) and its own fills",
    "IPCQ": "AHBM inter-PE queues (Level-2 reduction hops)",
    "NOC": "AHBM CUBE NOC: routers and PE attach links",
    "UCIe": "AHBM CUBE-to-CUBE / SIP-to-SIP UCIe links (router to router flights)",
    "host": "AHBM IO-die host: launch and completion messages",
    "HP ports": "pccx AXI HP ports and weight switches: the weight / KV stream",
    "DDR": "pccx host DDR",
    "L2": "pccx L2 activation memory",
    "GEMV lanes": "pccx GEMV front and lanes",
    "SFU": "pccx CVO (softmax / norm / activation unit)",
    "systolic array": "pccx MAT engine",
    "control": "pccx instruction decoder, global scheduler, memory dispatcher",
    "host round trips": "pccx host driver work and its AXI-Lite / ACP round trips",
    "ring nodes": "demo ring: the nodes' busy time (and own waits)",
    "reduce PEs": "demo reduce: the PEs' busy time (and own waits)",
    "links": "demo: message flights (link latency and serialisation)",
    "DONE polls": "a poller waiting for its next poll to see the news (summary.py rule 2b)",
}

_AHBM = {"pc": "HBM channels", "stack": "HBM channels", "port": "HBM channels", "dma": "DMA", "gemm": "GEMM array",
         "sched": "scheduler", "math": "MATH", "tcm": "TCM", "cpu": "CPU dispatch", "ipcq": "IPCQ", "router": "NOC", "host": "host"}
_PCCX = {"hp": "HP ports", "wsw": "HP ports", "ddr": "DDR", "l2": "L2", "lane": "GEMV lanes", "gemv": "GEMV lanes",
         "cvo": "SFU", "gemm": "systolic array", "decoder": "control", "scheduler": "control",
         "dispatcher": "control", "driver": "host round trips", "axil_cmd": "host round trips",
         "axil_stat": "host round trips", "acp": "host round trips"}
_DEMO = {"n": "ring nodes", "pe": "reduce PEs", "cube": "reduce PEs"}
FAMILY_CLASSES = {"ahbm": _AHBM, "pccx": _PCCX, "demo": _DEMO}


def _kind_class(kind: str, table: dict) -> str:
    if kind.startswith("out_") and "router" in table:   # a router output's occupancy track (noc.PortLoad)
        return "NOC"
    return table.get(kind, kind)


def step_class(step: dict, links: dict, stems: set, family: str) -> str:
    """The resource class of one critical-path step (module docstring).

    Busy / idle / start steps: the class of the actor's component kind (an unknown kind is
    its own class, so the demo family's ``worker`` is ``worker``).  Poll steps: ``DONE polls``.
    Message flights: ``host`` / ``host round trips`` if either end is the host side, ``UCIe``
    for router-to-router, ``NOC`` if either end is a router, ``IPCQ`` if either end is an IPCQ,
    else the receiver's class.
    """
    table = FAMILY_CLASSES.get(family, {})
    if step["kind"] == "poll":
        return "DONE polls"
    if step["kind"] != "message":
        return _kind_class(component_kind(step["actor"], stems), table)
    l = links.get(step["link"])
    if l is None:
        return "?"
    a, b = (_kind_class(component_kind(x, stems), table) for x in (l["src"], l["dst"]))
    for side in ("host", "host round trips"):
        if side in (a, b):
            return side
    if a == b == "NOC":
        return "UCIe"
    for cls in ("NOC", "IPCQ"):
        if cls in (a, b):
            return cls
    return "links" if family == "demo" else b


def classified_steps(trace, family: str) -> tuple[list[dict], int]:
    """The critical path's steps of non-zero length, each with its resource ``class``; and the end time."""
    ct = compact(trace)
    steps = critical_path(ct)
    links = {l["name"]: l for l in ct.links}
    stems = kind_stems(ct.actors)
    out = [{**s, "class": step_class(s, links, stems, family)} for s in steps if s["end_ps"] > s["start_ps"]]
    return out, end_time(ct)


def path_classes(trace, family: str) -> dict:
    """``{"classes": {class: {"ps", "share"}}, "top", "end_ps", "steps"}`` of ``trace``'s critical path,
    largest first; ``{"missing": why}`` when the trace cannot give one (recorded with filters)."""
    ct = compact(trace)
    missing = missing_parts(ct).get("critical_path")
    if missing:
        return {"missing": missing}
    steps, end = classified_steps(ct, family)
    acc: dict[str, int] = {}
    for s in steps:
        acc[s["class"]] = acc.get(s["class"], 0) + s["end_ps"] - s["start_ps"]
    order = sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))
    return {"classes": {c: {"ps": ps, "share": round(ps / end, 4) if end else 0.0} for c, ps in order},
            "top": order[0][0] if order else None, "end_ps": end, "steps": len(steps), "events": len(ct.k)}


_GQA_NAMES = {"launch_ps": "launch", "first_access_ps": "first access", "kv_ps": "kv stream", "gemm_ps": "gemm",
              "reduction_ps": "reduction depth"}

#: bound term -> the resource classes (:data:`CLASSES`) whose time it counts, per bound (module docstring): the
#: line compares them with the class the critical path spends most in.  ``()``: a term that is no resource's time
#: (a request's arrival), so there is nothing to compare.
TERM_CLASSES = {
    "gqa_attention": {"launch_ps": ("host",), "first_access_ps": ("DMA", "HBM channels"), "kv_ps": ("HBM channels",),
                      "gemm_ps": ("GEMM array",), "reduction_ps": ("IPCQ", "NOC", "UCIe")},
    "gemma3n": {"weight_stream": ("HP ports",), "macs": ("GEMV lanes",), "ddr": ("DDR",)},
    "gqa_requests": {"sharing_ps": ("HBM channels", "GEMM array"), "arrival_ps": ()},
}


def _gqa_rows(params: dict, res: dict) -> int:
    """The GEMMs' row count M of the GQA kernel (gqa_workload._bound: decode G, prefill G x T_q, ring G x q_tile)."""
    G = params.get("G", 1)
    if params.get("case") == "decode":
        return G
    if params.get("C", 1) * params.get("P", 1) == 1:
        return G * params.get("T_q", 1)
    return G * (res.get("ring_q_tile") or 1)


def _gqa_binding(res: dict, profile: dict, params: dict) -> dict:
    t = res["bound_terms"]
    bound = res["bound_ps"]
    pair = ("gemm_ps", "kv_ps") if t["gemm_ps"] >= t["kv_ps"] else ("kv_ps", "gemm_ps")
    summands = {k: t[k] for k in ("launch_ps", "first_access_ps", pair[0], "reduction_ps")}
    key = max(summands, key=lambda k: (summands[k], k == pair[0]))
    g = profile.get("gemm", {})
    M, R = _gqa_rows(params, res), g.get("array_rows", 1)
    names = dict(_GQA_NAMES)
    if g.get("charge_padded") and M % R:
        names["gemm_ps"] = f"gemm (padded rows: M = {M} of {-(-M // R) * R})"
    out = {"binding": names[key], "term": key, "short": _GQA_NAMES[key], "ps": t[key], "bound_ps": bound,
           "share_of_bound": round(t[key] / bound, 4) if bound else None,
           "runner_up": {"term": pair[1], "name": names[pair[1]], "ps": t[pair[1]]},
           "terms": {names[k]: t[k] for k in _GQA_NAMES}, "classes": list(TERM_CLASSES["gqa_attention"][key]),
           "source": "bound_terms (actors/ahbm/kernels/gqa_bound.py)"}
    if t.get("note"):   # what the bound says of itself (gqa_bound.tiling_note: tiles narrower than the array)
        out["note"] = t["note"]
    return out


def _gemma_binding(res: dict, ports: list | None) -> dict:
    b = res["bounds"]
    hp = "/".join(f"HP{p}" for p in ports) if ports else "the GEMV HP ports"
    names = {"weight_stream": f"weight stream over {hp}", "macs": "GEMV MACs", "ddr": "host DDR"}
    tok = {k: b[f"tok_s_bound_{k}"] for k in names}
    per_tok = {names[k]: round(1e12 / v) if v else None for k, v in tok.items()}   # ps a token needs at least
    key = b["binding"]
    others = sorted((k for k in names if k != key), key=lambda k: tok[k])
    return {"binding": names[key], "term": key, "short": {"weight_stream": "weight stream"}.get(key, names[key]),
            "ps": per_tok[names[key]], "tok_s_bound": b["tok_s_bound"],
            "runner_up": {"term": others[0], "name": names[others[0]], "ps": per_tok[names[others[0]]]},
            "terms": per_tok, "classes": list(TERM_CLASSES["gemma3n"][key]),
            "source": "bounds (actors/pccx/gemma3n/budget.py), ps per token"}


#: gqa_requests (actors/ahbm/tl/gqa_requests.py work_bound): its two bounds' names
_REQUEST_NAMES = {"sharing": "Group sharing (launches in turn on a CUBE Group's PEs)",
                  "arrival": "request arrivals (each request's launches in turn after it arrives)"}


def _named_binding(res: dict, workload: str) -> dict:
    """A bound that names its binding term itself (``bound_terms.binding``: gqa_requests), or else the largest
    ``*_ps`` term; its classes from :data:`TERM_CLASSES` under ``workload`` (none for a workload not there)."""
    t = res["bound_terms"]
    terms = {k[:-3]: v for k, v in t.items() if k.endswith("_ps") and isinstance(v, (int, float))}
    key = t.get("binding") if t.get("binding") in terms else max(terms, key=terms.get)
    names = {k: _REQUEST_NAMES.get(k, k.replace("_", " ")) for k in terms}
    others = sorted((k for k in terms if k != key), key=lambda k: -terms[k])
    out = {"binding": names[key], "term": f"{key}_ps", "short": key.replace("_", " "), "ps": terms[key],
           "bound_ps": res["bound_ps"], "share_of_bound": round(terms[key] / res["bound_ps"], 4),
           "terms": {names[k]: v for k, v in terms.items()},
           "classes": list(TERM_CLASSES.get(workload, {}).get(f"{key}_ps", ())), "source": "bound_terms"}
    out["runner_up"] = ({"term": f"{others[0]}_ps", "name": names[others[0]], "ps": terms[others[0]]}
                        if others else {"term": None, "name": "none", "ps": 0})
    return out


def binding_term(res: dict, profile: dict, params: dict, context=None, workload: str = "") -> dict | None:
    """The bound's binding term (module docstring); None for a workload without an analytic bound."""
    t = res.get("bound_terms")
    if isinstance(t, dict) and res.get("bound_ps"):
        if {"kv_ps", "gemm_ps", "launch_ps", "first_access_ps", "reduction_ps"} <= t.keys():
            return _gqa_binding(res, profile, params)
        if any(k.endswith("_ps") for k in t):
            return _named_binding(res, workload)
    if isinstance(res.get("bounds"), dict) and "binding" in res["bounds"]:
        comp = getattr(context, "compiler", None)
        return _gemma_binding(res, list(getattr(comp, "ports", []) or []))
    return None


def ratio_to_bound(res: dict, bound: dict | None) -> float | None:
    """How loose the bound is: the run's time over the bound's.  The workload's own ``ratio_to_bound`` (GQA:
    latency / bound; many requests: the last request's end / bound; None when it has none, an unfinished
    run); a per-token bound (Gemma 3N): a token's
    time over the bound's, ``tok_s_bound / tok_per_s``; else end time / ``bound_ps``."""
    if not bound:
        return None
    if "ratio_to_bound" in res:   # the workload's own, None for a run it did not see finish (its partial metrics)
        r = res["ratio_to_bound"]
        return r if isinstance(r, (int, float)) and not isinstance(r, bool) else None
    if "tok_s_bound" in bound:
        return round(bound["tok_s_bound"] / res["tok_per_s"], 4) if res.get("tok_per_s") else None
    end = res.get("end_time_ps")
    return round(end / bound["bound_ps"], 4) if end and bound.get("bound_ps") else None


def leading(cp: dict) -> dict | None:
    """The class the critical path spends most in, ``{"class", "share"}``; None without a path."""
    classes = cp.get("classes") or {}
    if not classes:
        return None
    cls, v = next(iter(classes.items()))
    return {"class": cls, "share": v["share"]}


def agreement(bound: dict | None, lead: dict | None) -> bool | None:
    """Whether the bound's binding term is about the class the critical path leads with (:data:`TERM_CLASSES`);
    None when there is nothing to compare (no bound, no path, or a term that is no resource's time)."""
    if not bound or not lead or not bound.get("classes"):
        return None
    return lead["class"] in bound["classes"]


def _path_part(cp: dict) -> str:
    if "classes" not in cp:
        return f"critical path not computed: {cp.get('missing', 'no trace')}"
    top = list(cp["classes"].items())[:4]
    walk, cost = cp.get("walk") or {}, ""
    if walk.get("events", 0) >= WALK_NOTE_EVENTS:
        share = f", {100 * walk['share_of_run']:.0f} % of the run's wall time" if walk.get("share_of_run") else ""
        cost = f" ({walk['events'] / 1e6:.1f} M events walked in {walk['wall_s']:.1f} s{share})"
    return f"critical path{cost}: " + ", ".join(f"{c} {100 * v['share']:.0f} %" for c, v in top)


def limits_line(lim: dict) -> str:
    """The one printed line, what the run waits on first (docs/explain.md "What limits it"): the critical path's
    classes, largest first; how loose the bound is; the bound's binding term with its time and classes; and,
    when the two disagree, a sentence that says so:
    ``critical path: MATH 40 %, GEMM array 27 %, ...; ratio to bound 2.01 (bound 1.5538us); binding term gemm
    (...) 1.024us on the GEMM array (next kv stream 320ns); the bound's gemm term is not what the run waits on:
    the critical path leads with MATH``."""
    cp = lim.get("critical_path") or {}
    parts = [_path_part(cp)]
    if cp.get("fidelity"):
        parts.append(f"fidelity {cp['fidelity']}: {HIDDEN_BY_FIDELITY[cp['fidelity']]}")
    b = lim.get("bound")
    if not b:
        parts.append("no analytic bound")
        return "; ".join(parts)
    per_token = "bound_ps" not in b
    ratio = lim.get("ratio_to_bound")
    of = f"{format_time(b['ps'])} a token" if per_token else format_time(b["bound_ps"])
    parts.append(f"ratio to bound {ratio:.2f} (bound {of})" if ratio is not None else f"bound {of}")
    cls = b.get("classes") or []
    where = f" on the {', '.join(cls[:-1])} or {cls[-1]}" if len(cls) > 1 else f" on the {cls[0]}" if cls else ""
    agree = lim.get("agree")
    also = ", where the critical path spends most too" if agree else ""
    parts.append(f"binding term {b['binding']} {format_time(b['ps'])}{'' if not per_token else ' a token'}{where}"
                 f" (next {b['runner_up']['name']} {format_time(b['runner_up']['ps'])}){also}")
    if agree is False:
        parts.append(f"the bound's {b.get('short', b['binding'])} term is not what the run waits on: the critical "
                     f"path leads with {lim['leading']['class']}")
    if b.get("note"):
        parts.append(f"bound note: {b['note']}")
    return "; ".join(parts)


def run_limits(scenario, res: dict, trace_path: str | None, context=None, *, trace_dropped: bool = False) -> dict:
    """The ``limits`` entry of result.json for one run (module docstring); ``trace_dropped``: the run recorded its
    default trace and the size policy removed it (tools/run/runner.py), so there is none to walk."""
    out: dict = {"bound": binding_term(res, scenario.profile, scenario.params, context, scenario.workload)}
    if trace_path:
        try:
            t0 = time.perf_counter()
            cp = out["critical_path"] = path_classes(trace_path, scenario.family)
            fidelity = (scenario.params or {}).get("fidelity")
            if fidelity in HIDDEN_BY_FIDELITY and "classes" in cp:
                cp["fidelity"] = fidelity
            if "classes" in cp:   # what the walk cost (module docstring): host time, not part of the digest
                wall = time.perf_counter() - t0
                run_wall = res.get("wall_s") or 0
                cp["walk"] = {"events": cp.pop("events"), "wall_s": round(wall, 3),
                              "share_of_run": round(wall / run_wall, 3) if run_wall else None}
        except (OSError, ValueError) as e:   # a trace cut short (the run was stopped): say so, not fail
            out["critical_path"] = {"missing": f"the trace cannot be read ({e})"}
    elif trace_dropped:
        out["critical_path"] = {"missing": "the default trace was over the size kept and removed (--set "
                                           "trace.enabled=true keeps it, and the walk then costs ~1 s a million events)"}
    else:
        out["critical_path"] = {"missing": "no trace was recorded (--no-bundle without --trace, or "
                                           "trace.enabled: false)"}
    out["leading"] = leading(out["critical_path"])
    out["ratio_to_bound"] = ratio_to_bound(res, out["bound"])
    out["agree"] = agreement(out["bound"], out["leading"])
    out["line"] = limits_line(out)
    return out

"""Workload ``gqa_requests``: several decode requests of the GQA kernel at once on the AHBM machine.

Issue 23 / the seed's concurrency claims (ADR-0060 §4.3, §5.3: "reduction latency is hidden when
batched by other concurrent decode tokens").  ``requests`` = B requests, each with its own context
length, its own KV cache per rank, its own query and its own output at its Group root, run the
unchanged ``gqa_attention`` kernel (kernels/gqa_attention.py), one launch per request and decode
step on every PE of the request's Groups.

How a PE runs several requests (the decision the issue asks for): **launches queued on the PE's
CPU**.  The host (host.py, ``RequestPlan``) sends a request's launches when it arrives and each of
its next decode steps when the step before has completed (closed loop per request: a token needs
the previous one's output); a PE's CPU runs the launches it has in the order they reached it, one
at a time (cpu.py).  So a leaf PE that has sent its partial starts the next request's sweep while
that partial is still being merged up the tree: the overlap of one request's reduction with other
requests' sweeps emerges from the messages (every engine, TCM, HBM channel, IPCQ and NOC link is
shared), nothing is scheduled by formula.  Every PE sees the launches in one global order (the
host sends all launches of a step without yielding), so two requests on overlapping PEs never wait
on each other in a cycle.  Not modelled: a kernel that interleaves requests *inside* one launch
(the seed's batched-decode kernel would sweep request after request itself).

Placement (seed §2.2): request ``r``'s ``request_id`` (``first_request_id + r``) rotates its ranks,
``start_cube = id mod C``, ``start_pe = (id div C) mod P``, exactly as in ``gqa_attention``.
Groups (``groups``): ``shared`` (default) -- every request's head ``h`` on Group ``h``, so requests
share the PEs; ``spread`` -- request ``r``'s head ``h`` on Group ``(r x heads + h) mod Groups``, so with
enough Groups requests run on disjoint PEs.

HBM per PE: each launch (request, step) has its own slot in the Q, O, K and V regions of
``gqa_attention``'s layout (gqa_workload.ADDR): slot ``j`` at ``base + j x stride`` with strides the
per-rank sizes rounded up to 4 KiB.  A decode step's K is pre-transposed per KV tile (seed §B.2), and
the last tile grows with the context, so each step gets its own copy of the cache (assumption: the
copy costs no emulated time; the bytes each step reads are those of its context).

Arrivals (``arrival``): ``batch`` -- all at time 0; ``poisson`` -- exponential inter-arrival times of
mean ``mean_interval`` from the scenario seed (inverse transform with emulator.numerics.log, so no
CPU's libm enters); ``trace`` -- ``arrivals_file``, a CSV (docs/requests.md) with a header and one row
per request: ``arrival`` (a time with its unit, e.g. ``2us``), ``context``, ``steps``.
Times are relative to the launch time (after any timed loads).

Results: per request its arrival, first-token time (arrival to the end of its first step) and per
step its latency (launch to the last KernelDone of the step); p50 / p90 / p99 / max of the step
latencies and of the first-token times; throughput (decode tokens of this attention layer per second,
over the makespan, and per SIP used); ``hidden_fraction`` per request: the share of its reduction
(from the earliest partial of a step to its root's store, the kernel's ``partial_done_ps`` /
``root_done_ps`` reports) during which a PE of the machine was sweeping another request (that
launch's start to its ``partial_done_ps``), averaged over its steps.  Data mode: every (request,
step) output against the float64 reference.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from actors.ahbm.builder import build_machine
from actors.ahbm.host import RequestPlan
from actors.ahbm.kernels.gqa_attention import decode_tiles
from actors.ahbm.kernels.gqa_index import coords_of_rank, reduce_tree, root_of
from actors.ahbm.params import Params, pe_name
from actors.ahbm.placement import Placement
from actors.ahbm.tl.gqa_workload import ADDR, PARAMS as GQA_PARAMS, KERNEL, MiB, gqa_layout, reference_gqa
from actors.ahbm.tl.launcher import kernel_launches
from actors.registry import HOST_DATA_BYTES, Workload, format_bytes
from emulator import numerics
from emulator.errors import BuildError
from emulator.schema import Enum, Int, List, Map, Quantity, Str, read_text
from emulator.units import UnitError, format_time, parse_time

__all__ = ["PARAMS", "WORKLOAD", "Request", "arrivals", "percentile"]

_OWN = {k: v for k, v in GQA_PARAMS.fields.items() if k not in ("request_id",)}
PARAMS = Map({
    **_OWN,
    "case": Enum(["decode"], default="decode", doc="decode requests (prefill requests: not yet)"),
    "requests": Int(min=1, default=1, doc="B: the number of requests"),
    "contexts": List(Int(min=1), default=[], doc="per-request context lengths, cycled over the requests; "
                                                  "[] = `context` for every request"),
    "steps": Int(min=1, default=1, doc="decode steps (tokens) per request, each at a context one longer"),
    "arrival": Enum(["batch", "poisson", "trace"], default="batch",
                    doc="batch: all at 0; poisson: seeded exponential gaps of mean_interval; trace: arrivals_file"),
    "mean_interval": Quantity("time", default="1us", doc="poisson: mean time between two arrivals"),
    "arrivals_file": Str(default="", doc="trace: CSV of arrival,context,steps (docs/requests.md); relative to the "
                                         "scenario file"),
    "groups": Enum(["shared", "spread"], default="shared",
                   doc="shared: head h of every request on Group h; spread: request r's head h on Group "
                       "(r*heads + h) mod Groups"),
    "first_request_id": Int(min=0, default=0, doc="request_id of the first request (the rotation of §2.2)"),
})

ALIGN = 4096
K = "workload.params.arrivals_file"


@dataclass
class Request:
    """One request as the arrival process gives it."""
    name: str
    arrival_ps: int
    context: int
    steps: int


def percentile(values: list, q: float) -> int | None:
    """The ``q``-th percentile by the nearest-rank rule (no interpolation): an observed value."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def _trace_rows(path, p) -> list[Request]:
    """Rows of an arrival trace, every problem named by file, line and column."""
    text = read_text(str(path), what="a CSV arrival trace")
    rows = list(csv.reader(text.splitlines()))
    want = ["arrival", "context", "steps"]
    if not rows or [c.strip() for c in rows[0]] != want:
        raise BuildError(f"{K}: {path}:1: expected the header {','.join(want)}, found "
                         f"{','.join(rows[0]) if rows else 'an empty file'}")
    out = []
    for line, row in enumerate(rows[1:], 2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 3:
            raise BuildError(f"{K}: {path}:{line}: expected 3 columns (arrival,context,steps), found {len(row)}")
        try:
            t = parse_time(row[0].strip())
        except UnitError as e:
            raise BuildError(f"{K}: {path}:{line}: column 1 (arrival): {e}") from None
        vals = []
        for col, name in ((2, "context"), (3, "steps")):
            v = row[col - 1].strip()
            if not v.isdigit() or int(v) < 1:
                raise BuildError(f"{K}: {path}:{line}: column {col} ({name}): expected a whole number >= 1, found {v!r}")
            vals.append(int(v))
        out.append(Request(f"r{len(out)}", t, *vals))
    if not out:
        raise BuildError(f"{K}: {path}: no request rows")
    return out


def _resolve(path: str, system) -> Path:
    """The trace file: absolute, or relative to the scenario file or the working directory."""
    q = Path(path)
    scen = (system.scenario or {}).get("file")
    cands = ([q] if q.is_absolute() else []) + ([Path(scen).resolve().parent / q] if scen else []) + [Path.cwd() / q]
    for c in cands:
        if c.is_file():
            return c
    raise BuildError(f"{K}: {path!r} not found (looked in "
                     + ", ".join(dict.fromkeys(str(c.parent) for c in cands)) + ")")


def arrivals(p: dict, rng, system=None) -> list[Request]:
    """The requests of ``p`` in request order: arrival times by the ``arrival`` process (module docstring)."""
    if p["arrival"] == "trace":
        if not p["arrivals_file"]:
            raise BuildError(f"{K}: arrival: trace needs a CSV file, found none")
        return _trace_rows(_resolve(p["arrivals_file"], system), p)
    ctxs = p["contexts"] or [p["context"]]
    n = p["requests"]
    if p["arrival"] == "batch":
        times = [0] * n
    else:   # poisson: gaps -mean * ln(1 - u), u uniform in [0, 1) from the seed (exact doubles)
        u = rng.random(n)
        gaps = -float(p["mean_interval"]) * numerics.log(1.0 - u)
        times = [int(x) for x in np.cumsum(np.round(gaps))]
        times = [0] + times[:-1]      # the first request arrives at 0
    return [Request(f"r{i}", times[i], ctxs[i % len(ctxs)], p["steps"]) for i in range(n)]


def _strides(p, requests: list[Request], R: int) -> dict:
    """Per-launch slot size of each HBM region (module docstring): the largest request's need, 4 KiB aligned."""
    G, d = p["G"], p["d"]
    keys = max(-(-(r.context + r.steps - 1) // R) for r in requests)
    up = lambda n: -(-n // ALIGN) * ALIGN   # noqa: E731
    return {"q": up(G * d * 2), "o": up(G * (2 * d + 2) * 4), "k": up(keys * d * 2), "v": up(keys * d * 2)}


def _check_room(prm, p, strides: dict, launches: int) -> None:
    room = {"q": ADDR["o"] - ADDR["q"], "o": ADDR["k"] - ADDR["o"], "k": ADDR["v"] - ADDR["k"],
            "v": prm.hbm_capacity // 2 - ADDR["v"]}
    for name in ("q", "o", "k", "v"):
        if strides[name] * launches > room[name]:
            raise BuildError(f"workload.params.requests: {launches} launches (requests x steps) need "
                             f"{format_bytes(strides[name] * launches)} of each PE's {name} region, which holds "
                             f"{format_bytes(room[name])}")


@dataclass
class _Launch:
    """One (request, step): its parameters, layout and HBM slot."""
    req: int
    step: int
    slot: int
    params: dict
    layout: object
    groups: list          # the Group index of each head


@dataclass
class Context:
    prm: Params
    machine: object
    requests: list
    launches: list
    placement: Placement
    data: dict | None
    params: dict
    strides: dict


def _plan(prm, p, requests: list[Request]):
    R = p["C"] * p["P"]
    launches = []
    for r, req in enumerate(requests):
        if req.context < R:
            raise BuildError(f"workload.params.contexts: request {req.name}: at least one key per rank "
                             f"(C x P = {R}), found {req.context}")
        for s in range(req.steps):
            ps = {**{k: v for k, v in p.items() if k in GQA_PARAMS.fields}, "context": req.context + s,
                  "request_id": p["first_request_id"] + r}
            lay = gqa_layout(prm, ps)
            avail = prm.sips * lay.info["group"].groups_per_sip
            groups = [((r * p["heads"] + h) % avail if p["groups"] == "spread" else h) for h in range(p["heads"])]
            launches.append(_Launch(r, s, len(launches), ps, lay, groups))
    return launches


def _coords(prm, ln: _Launch) -> list:
    """The PEs of a launch: every PE used (P of them) of every CUBE of its heads' Groups."""
    g = ln.layout.info["group"]
    out = []
    for grp in ln.groups:
        sip, cubes = g.cubes_of_head(grp)
        out += [(sip, c, pe) for c in cubes for pe in (range(prm.P) if ln.params["P"] > 1 else [0])]
    return out


def _args(launch: _Launch, strides: dict, coord) -> dict:
    args = dict(launch.layout.args_of(coord))
    j = launch.slot
    args.update(q_ptr=ADDR["q"] + j * strides["q"], o_ptr=ADDR["o"] + j * strides["o"],
                k_ptr=ADDR["k"] + j * strides["k"], v_ptr=ADDR["v"] + j * strides["v"])
    return args


def build(system, profile: dict, p: dict) -> Context:
    prm = Params.of(profile)
    requests = arrivals(p, system.rng("requests/arrivals"), system)
    launches = _plan(prm, p, requests)
    strides = _strides(p, requests, p["C"] * p["P"])
    _check_room(prm, p, strides, len(launches))
    if system.mode == "data":
        host = sum(p["heads"] * (p["G"] * r.steps * p["d"] + 2 * (r.context + r.steps) * p["d"]) * 2 for r in requests)
        if host > HOST_DATA_BYTES:
            raise BuildError(f"workload.params.requests: data-mode inputs of at most {format_bytes(HOST_DATA_BYTES)} "
                             f"in host memory, found {format_bytes(host)} needed")
    plans = []
    for r, req in enumerate(requests):
        steps = []
        for ln in (x for x in launches if x.req == r):
            coords = _coords(prm, ln)
            steps.append(kernel_launches(KERNEL, coords, lambda c, ln=ln: _args(ln, strides, c), ln.layout.grid_of,
                                         ln.layout.num_programs))
        plans.append(RequestPlan(req.name, req.arrival_ps, steps))
    machine = build_machine(system, profile, requests=plans)
    place = Placement(machine, system.mode == "data")
    data = None
    if system.mode == "data":
        data = _inputs(system.rng("attention/inputs"), p, requests)
        _place(place, p, launches, data, strides)
    return Context(prm, machine, requests, launches, place, data, dict(p), strides)


def _inputs(rng, p, requests) -> dict:
    G, d = p["G"], p["d"]
    out = {}
    for r, req in enumerate(requests):
        S = req.context + req.steps - 1
        for h in range(p["heads"]):
            q = rng.standard_normal((G, req.steps, d)).astype(np.float32).astype(np.float16)
            k = rng.standard_normal((S, d)).astype(np.float32).astype(np.float16)
            v = rng.standard_normal((S, d)).astype(np.float32).astype(np.float16)
            out[(r, h)] = (q, k, v)
    return out


def _rank_coord(ln: _Launch, prm, h: int, rank: int) -> tuple:
    p = ln.params
    sip, cubes = ln.layout.info["group"].cubes_of_head(ln.groups[h])
    sc, sp = p["request_id"] % p["C"], (p["request_id"] // p["C"]) % p["P"]
    gc, pe = coords_of_rank(rank, sc, sp, p["C"], p["P"])
    return sip, cubes[gc], pe if p["P"] > 1 else 0


def _place(place, p, launches, data, strides) -> None:
    """Each launch's K (transposed per tile), V and q in its slot on every rank (seed §2.1 placement)."""
    d, R = p["d"], p["C"] * p["P"]
    prm = place.m.prm
    for ln in launches:
        S = ln.params["context"]
        j = ln.slot
        for h in range(p["heads"]):
            q, k, v = data[(ln.req, h)]
            for rank in range(R):
                c = _rank_coord(ln, prm, h, rank)
                kl, vl = k[:S][rank::R], v[:S][rank::R]
                kbase = ADDR["k"] + j * strides["k"]
                for s0, n in decode_tiles(len(kl), p["tile"]):
                    place.write(c, kbase + s0 * d * 2, np.ascontiguousarray(kl[s0:s0 + n].T).tobytes())
                place.write(c, ADDR["v"] + j * strides["v"], np.ascontiguousarray(vl).tobytes())
                place.write(c, ADDR["q"] + j * strides["q"], np.ascontiguousarray(q[:, ln.step, :]).tobytes())


def _root(ln: _Launch, prm, h: int) -> tuple:
    """The Group root of head ``h`` of a launch: the Level-1 root CUBE's Level-2 root PE (gqa_workload)."""
    p, g = ln.params, ln.layout.info["group"]
    sip, cubes = g.cubes_of_head(ln.groups[h])
    w, hh = g.shape
    cube = cubes[root_of(reduce_tree(p["l1"], w, hh))] if p["C"] > 1 else cubes[0]
    pe = root_of(reduce_tree(p["l2"], prm.gx, prm.gy)) if p["P"] > 1 else 0
    return sip, cube, pe


def _errors(ctx: Context) -> tuple[float, float, int]:
    """Worst absolute / relative error of every (request, step, head) output against float64, and the count."""
    G, d = ctx.params["G"], ctx.params["d"]
    worst_abs = worst_rel = 0.0
    n = 0
    for ln in ctx.launches:
        S = ln.params["context"]
        for h in range(ctx.params["heads"]):
            q, k, v = ctx.data[(ln.req, h)]
            ref = reference_gqa(q[:, ln.step, :], k[:S], v[:S], [S - 1] * G)
            c = _root(ln, ctx.prm, h)
            raw = ctx.placement.read(c, ADDR["o"] + ln.slot * ctx.strides["o"], G * d * 4)
            got = np.frombuffer(raw, "<f4").reshape(G, d).astype(np.float64)
            err = np.abs(got - ref)
            worst_abs = max(worst_abs, float(err.max()))
            worst_rel = max(worst_rel, float((err / np.maximum(np.abs(ref), 1e-3)).max()))
            n += 1
    return worst_abs, worst_rel, n


def _launch_reports(system, log: list) -> dict:
    """``{(request, step, pe): that launch's kernel reports}``: a PE's launches ran in their start order, and
    its CPU keeps one report dict per launch in that order (kernel_registry.run_kernel)."""
    per_pe: dict[str, list] = {}
    for r, req in enumerate(log):
        for s, step in enumerate(req["steps"]):
            for pe, info in step["pes"].items():
                per_pe.setdefault(pe, []).append((info["start_ps"], r, s))
    out = {}
    for pe, runs in per_pe.items():
        reps = system.reports.get(f"{pe}/cpu", {}).get("launches", [])
        for k, (_, r, s) in enumerate(sorted(runs)):
            out[(r, s, pe)] = reps[k] if k < len(reps) else {}
    return out


def _overlap(a: int, b: int, spans: list) -> int:
    """Length of ``[a, b)`` covered by the union of ``spans`` [(start, end)]."""
    covered, cur = 0, a
    for s, e in sorted(spans):
        s, e = max(s, cur), min(e, b)
        if e > s:
            covered += e - s
            cur = e
    return covered


def _hidden(log: list, reports: dict, t0: int) -> list:
    """Per request: the mean over its steps of the share of its reduction window during which some PE was
    sweeping another request (module docstring); None for a request that reduces nothing (one rank)."""
    sweeps = []   # (start, end, request) of every launch's sweep, absolute ps
    for r, req in enumerate(log):
        for s, step in enumerate(req["steps"]):
            for pe, info in step["pes"].items():
                end = reports.get((r, s, pe), {}).get("partial_done_ps")
                if end is not None:
                    sweeps.append((t0 + info["start_ps"], end, r))
    out = []
    for r, req in enumerate(log):
        fracs = []
        for s, step in enumerate(req["steps"]):
            reps = [reports.get((r, s, pe), {}) for pe in step["pes"]]
            roots = [x["root_done_ps"] for x in reps if "root_done_ps" in x]
            parts = [x["partial_done_ps"] for x in reps if "partial_done_ps" in x]
            if not roots or not parts:
                continue
            a, b = min(parts), max(roots)
            if b > a:
                fracs.append(_overlap(a, b, [(x, y) for x, y, q in sweeps if q != r]) / (b - a))
        out.append(round(sum(fracs) / len(fracs), 4) if fracs else None)
    return out


def check(system, profile: dict, p: dict, result, context: Context = None) -> dict:
    if context is None:
        return {}
    host = system.reports.get("io/host", {})
    if result.status != "finished":
        t0 = host.get("launch_ps")
        return {"latency_ps": None, "latency_at_least_ps": None if t0 is None else max(0, result.end_time_ps - t0)}
    log, t0 = host["requests"], host["launch_ps"]
    reports = _launch_reports(system, log)
    hidden = _hidden(log, reports, t0)
    rows, step_lat, first = [], [], []
    for r, req in enumerate(log):
        lat = [st["done_ps"] - st["launch_ps"] for st in req["steps"]]
        ft = req["steps"][0]["done_ps"] - req["arrival_ps"]
        step_lat += lat
        first.append(ft)
        rq = context.requests[r]
        rows.append({"request": req["request"], "context": rq.context, "steps": rq.steps,
                     "arrival": format_time(req["arrival_ps"]), "first_token": format_time(ft),
                     "step_p50": format_time(percentile(lat, 50)), "step_max": format_time(max(lat)),
                     "done": format_time(req["steps"][-1]["done_ps"]),
                     "hidden": "" if hidden[r] is None else hidden[r]})
    makespan = max(req["steps"][-1]["done_ps"] for req in log) - min(req["arrival_ps"] for req in log)
    tokens = sum(len(req["steps"]) for req in log)
    sips = len({c[0] for ln in context.launches for c in _coords(context.prm, ln)})
    known = [h for h in hidden if h is not None]
    out = {"latency_ps": host["kernel_latency_ps"], "requests": len(log), "tokens": tokens,
           "makespan_ps": makespan,
           "tokens_per_s": round(tokens * 1e12 / makespan), "tokens_per_s_per_sip": round(tokens * 1e12 / makespan / sips),
           "step_p50_ps": percentile(step_lat, 50), "step_p90_ps": percentile(step_lat, 90),
           "step_p99_ps": percentile(step_lat, 99), "step_max_ps": max(step_lat),
           "first_token_p50_ps": percentile(first, 50), "first_token_p99_ps": percentile(first, 99),
           "first_token_max_ps": max(first),
           "hidden_fraction_mean": round(sum(known) / len(known), 4) if known else None,
           "per_request": [{"request": req["request"], "arrival_ps": req["arrival_ps"],
                            "context": context.requests[r].context, "first_token_ps": first[r],
                            "step_latency_ps": [st["done_ps"] - st["launch_ps"] for st in req["steps"]],
                            "hidden_fraction": hidden[r]} for r, req in enumerate(log)]}
    if system.mode == "data":
        out["max_abs_err"], out["max_rel_err"], out["outputs_checked"] = _errors(context)
    ft = lambda k: format_time(out[k])   # noqa: E731
    summary = {"requests": len(log), "tokens": tokens, "makespan": ft("makespan_ps"),
               "tok/s": out["tokens_per_s"], "step p50": ft("step_p50_ps"), "step p90": ft("step_p90_ps"),
               "step p99": ft("step_p99_ps"), "step max": ft("step_max_ps"), "first p50": ft("first_token_p50_ps"),
               "first p99": ft("first_token_p99_ps"), "hidden": "" if out["hidden_fraction_mean"] is None
               else out["hidden_fraction_mean"]}
    out["tables"] = {"gqa requests": rows, "gqa requests, all": [summary]}
    return out


WORKLOAD = Workload("gqa_requests", "several decode requests of the GQA kernel at once (arrivals, per-request latency)",
                    PARAMS, build, check)

"""Workload ``gqa_requests``: several GQA attention requests at once on the AHBM machine (docs/requests.md).

Issue 23 / the seed's concurrency claims (ADR-0060 §4.3, §5.3: "reduction latency is hidden when
batched by other concurrent decode tokens").  ``requests`` = B requests, each with its own context
length, its own KV cache per rank, its own query and its own output at its Group root; a request
prefills its prompt first (``prefill`` tokens: one ``gqa_attention`` prefill launch) and then runs
its decode steps.

How a PE runs several requests (``batching``):

* ``queued`` (default): one launch of the unchanged ``gqa_attention`` kernel per request and step on
  every PE of the request's Groups.  The host (host.py, ``RequestPlan``) sends a request's first
  launch when it arrives and each next step when the step before has completed (closed loop per
  request: a token needs the previous one's output); a PE's CPU runs its launches in the order they
  reached it, one at a time (cpu.py).  A leaf PE that has sent its partial starts the next
  request's sweep while that partial is still merged up the tree: the overlap emerges from the
  messages (every engine, TCM, HBM channel, IPCQ and NOC link is shared), nothing is scheduled by
  formula.  Every PE sees the launches in one global order (the host sends all launches of a step
  without yielding), so two requests on overlapping PEs never wait on each other in a cycle.
* ``kernel``: continuous batching (host.py ``BatchPlan``): each batch step launches the requests
  active at its start, one launch per PE sweeping all of them (kernels/gqa_batched.py); decode
  requests on shared Groups over the tree topologies only.

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
per request: ``arrival`` (a time with its unit, e.g. ``2us``), ``context``, ``prefill``, ``steps``.
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
from types import SimpleNamespace

import numpy as np

from actors.ahbm.builder import build_machine
from actors.ahbm.host import BatchPlan, RequestPlan
from actors.ahbm.kernels.gqa_batched import gqa_batched_decode
from actors.ahbm.kernels.gqa_index import GroupLayout
from actors.ahbm.params import Params, pe_name
from actors.ahbm.placement import Placement
from actors.ahbm.tl.gqa_workload import (ADDR, PARAMS as GQA_PARAMS, KERNEL, gqa_inputs, gqa_layout, gqa_outputs,
                                         gqa_place, gqa_reference)
from actors.ahbm.tl.gqa_workload import _bound as launch_bound   # one launch's bound terms (kernels/gqa_bound.py)
from actors.ahbm.tl.kernel_workload import KernelLayout
from actors.ahbm.tl.kernel_registry import register_kernel
from actors.ahbm.tl.launcher import kernel_launches
from actors.registry import HOST_DATA_BYTES, Workload, format_bytes, workload_file
from emulator import numerics
from emulator.errors import BuildError
from emulator.schema import QUOTE_CHARS, Enum, Int, List, Map, Quantity, Str, quote, read_text
from emulator.units import UnitError, format_time, parse_time

__all__ = ["PARAMS", "WORKLOAD", "Request", "arrivals", "percentile"]

_OWN = {k: v for k, v in GQA_PARAMS.fields.items() if k not in ("request_id", "case", "chunk")}
PARAMS = Map({
    **_OWN,
    "requests": Int(min=1, default=1, doc="B: the number of requests"),
    "contexts": List(Int(min=1), default=[], doc="per-request context lengths, cycled over the requests; "
                                                  "[] = `context` for every request"),
    "prefill": Int(min=0, default=0, doc="prompt tokens each request prefills first (0: none; Ring, C x P > 1: the "
                                         "whole context)"),
    "steps": Int(min=0, default=1, doc="decode steps (tokens) per request, each at a context one longer"),
    "arrival": Enum(["batch", "poisson", "trace"], default="batch",
                    doc="batch: all at 0; poisson: seeded exponential gaps of mean_interval; trace: arrivals_file"),
    "mean_interval": Quantity("time", default="1us", doc="poisson: mean time between two arrivals"),
    "arrivals_file": Str(default="", doc="trace: CSV of arrival,context,prefill,steps (docs/requests.md); relative "
                                         "to the scenario file"),
    "groups": Enum(["shared", "spread"], default="shared",
                   doc="shared: head h of every request on Group h; spread: request r's head h on Group "
                       "(r*heads + h) mod Groups"),
    "first_request_id": Int(min=0, default=0, doc="request_id of the first request (the rotation of §2.2)"),
    "batching": Enum(["queued", "kernel"], default="queued",
                     doc="queued: one launch per request and step, queued on the PE CPUs; kernel: continuous "
                         "batching, one launch per batch step sweeps every active request, then reduces them "
                         "(kernels/gqa_batched.py)"),
})

ALIGN = 4096
BATCHED = register_kernel(gqa_batched_decode, "gqa_batched_decode")
_REQ_ARGS = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "counter", "start_cube", "start_pe")
K = "workload.params.arrivals_file"


@dataclass
class Request:
    """One request as the arrival process gives it."""
    name: str
    arrival_ps: int
    context: int
    steps: int
    prefill: int = 0


def percentile(values: list, q: float) -> int | None:
    """The ``q``-th percentile by the nearest-rank rule (no interpolation): an observed value."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def _trace_rows(path) -> list[Request]:
    """Rows of an arrival trace, every problem named by file, line and column."""
    text = read_text(str(path), what="a CSV arrival trace")
    rows = list(csv.reader(text.splitlines()))
    want = ["arrival", "context", "prefill", "steps"]
    if not rows or [c.strip() for c in rows[0]] != want:   # quoted: the first wrong column, never the line
        head = [c.strip() for c in rows[0]] if rows else []
        bad = next((i for i, c in enumerate(head) if i >= len(want) or c != want[i]), len(head))
        raise BuildError(f"{K}: {path}:1: expected the header {','.join(want)}, found "
                         + ("an empty file" if not rows else f"{quote(head[bad])} in column {bad + 1}"
                            if bad < len(head) else f"{len(head)} column(s)"))
    out = []
    for line, row in enumerate(rows[1:], 2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 4:
            raise BuildError(f"{K}: {path}:{line}: expected 4 columns ({','.join(want)}), found {len(row)}")
        try:
            t = parse_time(row[0].strip())
        except UnitError as e:
            why = e if len(row[0]) <= QUOTE_CHARS else f"expected a time like 10ns, found {quote(row[0].strip())}"
            raise BuildError(f"{K}: {path}:{line}: column 1 (arrival): {why}") from None
        vals = []
        for col, name, low in ((2, "context", 1), (3, "prefill", 0), (4, "steps", 0)):
            v = row[col - 1].strip()
            if not v.isdigit() or int(v) < low:
                raise BuildError(f"{K}: {path}:{line}: column {col} ({name}): expected a whole number >= {low}, "
                                 f"found {quote(v)}")
            vals.append(int(v))
        if vals[1] == vals[2] == 0:
            raise BuildError(f"{K}: {path}:{line}: a request with neither prefill nor decode steps")
        out.append(Request(f"r{len(out)}", t, vals[0], vals[2], vals[1]))
    if not out:
        raise BuildError(f"{K}: {path}: no request rows")
    return out


def arrivals(p: dict, rng, system=None) -> list[Request]:
    """The requests of ``p`` in request order: arrival times by the ``arrival`` process (module docstring)."""
    if p["arrival"] == "trace":
        if not p["arrivals_file"]:
            raise BuildError(f"{K}: arrival: trace needs a CSV file, found none")
        return _trace_rows(workload_file(p["arrivals_file"], system, K, "arrival trace"))
    ctxs = p["contexts"] or [p["context"]]
    n = p["requests"]
    if p["arrival"] == "batch":
        times = [0] * n
    else:   # poisson: gaps -mean * ln(1 - u), u uniform in [0, 1) from the seed (exact doubles)
        u = rng.random(n)
        gaps = -float(p["mean_interval"]) * numerics.log(1.0 - u)
        times = [int(x) for x in np.cumsum(np.round(gaps))]
        times = [0] + times[:-1]      # the first request arrives at 0
    if p["prefill"] == p["steps"] == 0:
        raise BuildError("workload.params.steps: a request needs a prefill or at least one decode step, found "
                         "prefill 0 and steps 0")
    return [Request(f"r{i}", times[i], ctxs[i % len(ctxs)], p["steps"], p["prefill"]) for i in range(n)]


REGIONS = ("q", "o", "k", "v")


def _needs(p: dict) -> dict:
    """Bytes per rank of each HBM region for one launch of parameters ``p`` (gqa_workload's limits)."""
    G, d, S, R = p["G"], p["d"], p["context"], p["C"] * p["P"]
    if p["case"] == "decode":
        rows, keys, stage = G, -(-S // R), G * (d + 2) * 4      # the chunked ring's staging after O
    elif R == 1:
        rows, keys, stage = G * p["chunk"], S, 0
    else:
        rows, keys, stage = G * (S // R), S // R, G * (S // R) * (d + 2) * 4   # worst case: Ring state in HBM
    return {"q": rows * d * 2, "o": rows * d * 4 + stage, "k": keys * d * 2, "v": keys * d * 2}


def _strides(launches: list) -> dict:
    """Slot size of each region: the largest launch's need, rounded up to 4 KiB (module docstring)."""
    up = lambda n: -(-n // ALIGN) * ALIGN   # noqa: E731
    return {r: up(max(_needs(ln.params)[r] for ln in launches)) for r in REGIONS}


def _check_room(prm, strides: dict, launches: int) -> None:
    room = {"q": ADDR["o"] - ADDR["q"], "o": ADDR["k"] - ADDR["o"], "k": ADDR["v"] - ADDR["k"],
            "v": prm.hbm_capacity // 2 - ADDR["v"]}
    for name in REGIONS:
        if strides[name] * launches > room[name]:
            raise BuildError(f"workload.params.requests: {launches} launches (requests x steps) need "
                             f"{format_bytes(strides[name] * launches)} of each PE's {name} region, which holds "
                             f"{format_bytes(room[name])}")


class _Groups:
    """A GroupLayout whose head ``h`` sits on Group ``groups[h]`` (the ``groups`` policy); the rest delegated."""

    def __init__(self, real, groups: list):
        self.real, self.groups = real, groups

    def cubes_of_head(self, h: int):
        return self.real.cubes_of_head(self.groups[h])

    def __getattr__(self, name):
        return getattr(self.real, name)


class _SlotPlacement:
    """The placement as gqa_workload's ``gqa_place`` sees it: every region address moved to this launch's slot."""

    def __init__(self, place, offsets: dict):
        self.m, self.place, self.offsets = place.m, place, offsets

    def shift(self, addr: int) -> int:
        region = max((r for r in REGIONS if addr >= ADDR[r]), key=lambda r: ADDR[r])
        return addr + self.offsets[region]

    def write(self, coord, addr: int, blob: bytes) -> None:
        self.place.write(coord, self.shift(addr), blob)


@dataclass
class _Launch:
    """One (request, step): its parameters, layout (heads on the policy's Groups) and HBM slot."""
    req: int
    step: int
    slot: int
    params: dict
    layout: KernelLayout
    kind: str


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

    def offsets(self, ln: _Launch) -> dict:
        return {r: ln.slot * self.strides[r] for r in REGIONS}


def _layout(prm, ps: dict, groups: list, name: str) -> KernelLayout:
    try:
        lay = gqa_layout(prm, ps)
    except BuildError as e:
        text = str(e).replace("workload.params.chunk:", "workload.params.prefill: the prefill's chunk:")
        raise BuildError(f"{text} (request {name}, {ps['case']} at context {ps['context']})") from None
    g = _Groups(lay.info["group"], groups)
    coords = []
    for h in range(len(groups)):
        sip, cubes = g.cubes_of_head(h)
        coords += [(sip, c, pe) for c in cubes for pe in (range(prm.P) if ps["P"] > 1 else [0])]
    return KernelLayout(coords, lay.args_of, lay.grid_of, lay.num_programs, {**lay.info, "group": g})


def _plan(prm, p, requests: list[Request]) -> list[_Launch]:
    """Every request's launches in request order: its prefill (if any), then its decode steps."""
    base = {k: v for k, v in p.items() if k in GQA_PARAMS.fields}
    base["chunk"] = GQA_PARAMS.fields["chunk"].default   # a decode launch carries gqa_attention's default
    try:
        avail = prm.sips * GroupLayout(prm.cx, prm.cy, p["C"]).groups_per_sip
    except ValueError:
        avail = 1          # a C the mesh cannot hold: gqa_layout names it below
    launches = []
    for r, req in enumerate(requests):
        groups = [((r * p["heads"] + h) % avail if p["groups"] == "spread" else h) for h in range(p["heads"])]
        rid = p["first_request_id"] + r
        todo = []
        if req.prefill:
            todo.append(("prefill", {"case": "prefill", "context": req.context, "chunk": req.prefill}))
        first = req.context + (1 if req.prefill else 0)   # the decode token after a prefill is one more
        todo += [("decode", {"case": "decode", "context": first + s}) for s in range(req.steps)]
        for step, (kind, extra) in enumerate(todo):
            ps = {**base, **extra, "request_id": rid}
            launches.append(_Launch(r, step, len(launches), ps, _layout(prm, ps, groups, req.name), kind))
    return launches


def _args(ln: _Launch, offsets: dict, coord) -> dict:
    args = dict(ln.layout.args_of(coord))
    for r in REGIONS:
        args[f"{r}_ptr"] = args[f"{r}_ptr"] + offsets[r]
    return args


def _view(ctx: Context, ln: _Launch):
    """What gqa_workload's outputs / reference hooks read of a context, for one launch."""
    return SimpleNamespace(params=ln.params, prm=ctx.prm, layout=ln.layout,
                           data=None if ctx.data is None else ctx.data[ln.slot])


def build(system, profile: dict, p: dict) -> Context:
    prm = Params.of(profile)
    requests = arrivals(p, system.rng("requests/arrivals"), system)
    launches = _plan(prm, p, requests)
    strides = _strides(launches)
    _check_room(prm, strides, len(launches))
    ctx = Context(prm, None, requests, launches, None, None, dict(p), strides)
    if system.mode == "data":
        host = sum(p["heads"] * (_needs(ln.params)["q"] + _needs(ln.params)["k"] * p["C"] * p["P"] * 2)
                   for ln in launches)
        if host > HOST_DATA_BYTES:
            raise BuildError(f"workload.params.requests: data-mode inputs of at most {format_bytes(HOST_DATA_BYTES)} "
                             f"in host memory, found {format_bytes(host)} needed")
    if p["batching"] == "kernel":
        ctx.machine = build_machine(system, profile, batches=_batch_plan(ctx), batch_pes=launches[0].layout.coords,
                                    fidelity=p["fidelity"])
    else:
        plans = []
        for r, req in enumerate(requests):
            steps = [kernel_launches(KERNEL, ln.layout.coords, lambda c, ln=ln: _args(ln, ctx.offsets(ln), c),
                                     ln.layout.grid_of, ln.layout.num_programs) for ln in launches if ln.req == r]
            plans.append(RequestPlan(req.name, req.arrival_ps, steps))
        ctx.machine = build_machine(system, profile, requests=plans, fidelity=p["fidelity"])
    ctx.placement = Placement(ctx.machine, system.mode == "data")
    if system.mode == "data":
        rng = system.rng("attention/inputs")
        ctx.data = {ln.slot: gqa_inputs(rng, ln.layout, ln.params) for ln in launches}
        for ln in launches:
            gqa_place(_SlotPlacement(ctx.placement, ctx.offsets(ln)), ln.layout, ctx.data[ln.slot], ln.params)
    return ctx


def _batch_plan(ctx: Context) -> BatchPlan:
    """Continuous batching (host.py BatchPlan): a batch step's launch on every PE of the shared Groups carries
    each member's pointers (its slot), counter and rotation, and the arguments common to all (kernels/gqa_batched)."""
    p = ctx.params
    bad = [(k, v) for k, v in (("groups", p["groups"]), ("l2", p["l2"]), ("l1", p["l1"])) if v in ("spread", "ring")]
    if bad or p["prefill"]:
        what = f"{bad[0][0]}: {bad[0][1]}" if bad else f"prefill: {p['prefill']}"
        raise BuildError(f"workload.params.batching: kernel batches decode requests on shared Groups over the tree "
                         f"topologies, found {what}")
    by_step = {(ln.req, ln.step): ln for ln in ctx.launches}
    first = ctx.launches[0]
    coords = first.layout.coords

    def launches(members: list) -> dict:
        c0 = coords[0]
        common = {k: v for k, v in first.layout.args_of(c0).items() if k in ("G", "d", "tile", "scale", "C", "P",
                                                                             "gemm", "l2", "l1")}
        reqs = []
        for r, s in members:
            ln = by_step[(r, s)]
            a = _args(ln, ctx.offsets(ln), c0)
            reqs.append({k: a[k] for k in _REQ_ARGS})
        msgs = kernel_launches(BATCHED, coords, lambda c: {**common, "reqs": reqs}, first.layout.grid_of,
                               first.layout.num_programs)
        return {pe_name(*c): m for c, m in msgs.items()}

    return BatchPlan([r.name for r in ctx.requests], [r.arrival_ps for r in ctx.requests],
                     [r.steps for r in ctx.requests], launches)


def _errors(ctx: Context) -> tuple[float, float, int]:
    """Worst absolute / relative error of every launch's outputs against float64, and how many were checked."""
    worst_abs = worst_rel = 0.0
    n = 0
    for ln in ctx.launches:
        view = _view(ctx, ln)
        refs = gqa_reference(view)
        for o in gqa_outputs(view):
            size = int(np.prod(o.shape)) * 4
            raw = ctx.placement.read(o.coord, o.addr + ctx.offsets(ln)["o"], size)
            got = np.frombuffer(raw, "<f4").reshape(o.shape).astype(np.float64)
            err = np.abs(got - refs[o.name])
            worst_abs = max(worst_abs, float(err.max()))
            worst_rel = max(worst_rel, float((err / np.maximum(np.abs(refs[o.name]), 1e-3)).max()))
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


def work_bound(ctx: Context) -> dict:
    """A lower bound on the makespan from the launches' own bounds (kernels/gqa_bound.py terms).

    * Sharing: the launches on one CUBE Group run one after the other on each of its PEs, so the Group is
      busy for at least ``sum(max(kv_ps, gemm_ps))`` over them (each launch's HBM stream or GEMM cycles of its
      busiest rank), plus one launch latency, one first access and the smallest reduction;
    * arrival: a request ends no earlier than its arrival plus the bounds of its launches in turn.
    ``bound_ps`` is the larger; ``binding`` says which."""
    per_group: dict = {}
    fixed = []
    chain: dict = {}
    for ln in ctx.launches:
        t = launch_bound(_view(ctx, ln))
        work = max(t["kv_ps"], t["gemm_ps"])
        for h in range(ctx.params["heads"]):
            sip, cubes = ln.layout.info["group"].cubes_of_head(h)
            g = (sip, tuple(cubes))
            per_group[g] = per_group.get(g, 0) + work
        fixed.append(t["launch_ps"] + t["first_access_ps"] + t["reduction_ps"])
        chain[ln.req] = chain.get(ln.req, ctx.requests[ln.req].arrival_ps) + t["bound_ps"]
    sharing = max(per_group.values()) + min(fixed)
    arrival = max(chain.values())
    return {"bound_ps": max(sharing, arrival), "sharing_ps": sharing, "arrival_ps": arrival,
            "binding": "sharing" if sharing >= arrival else "arrival"}


def _pct(values: list) -> dict:
    return {"p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99),
            "max": max(values) if values else None}


def _hidden_batched(system, host: dict, t0: int, n: int) -> list:
    """``_hidden`` for batch launches: in batch ``k`` member ``i``'s reduction window runs from its earliest
    partial to its root's store (the kernel's ``batch_partial_done_ps`` / ``batch_root_done_ps``); another
    member ``j``'s sweep on a PE runs from the end of member ``j - 1``'s sweep (or the launch's start) to the
    end of its own."""
    seen: dict[str, int] = {}
    fracs: list[list] = [[] for _ in range(n)]
    for batch in host["batches"]:
        reps = {}
        for pe, info in batch["pes"].items():
            k = seen.get(pe, 0)
            seen[pe] = k + 1
            launches = system.reports.get(f"{pe}/cpu", {}).get("launches", [])
            reps[pe] = (t0 + info["start_ps"], launches[k] if k < len(launches) else {})
        sweeps = []   # (start, end, member)
        for start, rep in reps.values():
            prev = start
            for j, end in enumerate(rep.get("batch_partial_done_ps", [])):
                sweeps.append((prev, end, j))
                prev = end
        for i, (r, _) in enumerate(batch["members"]):
            parts = [rep["batch_partial_done_ps"][i] for _, rep in reps.values() if "batch_partial_done_ps" in rep]
            roots = [rep["batch_root_done_ps"][i] for _, rep in reps.values()
                     if rep.get("batch_root_done_ps") and rep["batch_root_done_ps"][i] is not None]
            if parts and roots and max(roots) > min(parts):
                a, b = min(parts), max(roots)
                fracs[r].append(_overlap(a, b, [(x, y) for x, y, j in sweeps if j != i]) / (b - a))
    return [round(sum(f) / len(f), 4) if f else None for f in fracs]


def check(system, profile: dict, p: dict, result, context: Context = None) -> dict:
    if context is None:
        return {}
    host = system.reports.get("io/host", {})
    if result.status != "finished":
        t0 = host.get("launch_ps")
        return {"latency_ps": None, "latency_at_least_ps": None if t0 is None else max(0, result.end_time_ps - t0)}
    log, t0 = host["requests"], host["launch_ps"]
    if p["batching"] == "kernel":
        hidden = _hidden_batched(system, host, t0, len(log))
    else:
        hidden = _hidden(log, _launch_reports(system, log), t0)
    kinds = {(ln.req, ln.step): ln.kind for ln in context.launches}
    rows, per_request, step_lat, first, prefill = [], [], [], [], []
    for r, req in enumerate(log):
        rq = context.requests[r]
        lat = [st["done_ps"] - st["launch_ps"] for st in req["steps"]]
        dec = [x for s, x in enumerate(lat) if kinds[(r, s)] == "decode"]
        pre = [x for s, x in enumerate(lat) if kinds[(r, s)] == "prefill"]
        ft = req["steps"][0]["done_ps"] - req["arrival_ps"]   # the end of its first launch: prefill or first step
        step_lat += dec
        prefill += pre
        first.append(ft)
        rows.append({"request": req["request"], "context": rq.context, "prefill": rq.prefill, "steps": rq.steps,
                     "arrival": format_time(req["arrival_ps"]), "first_token": format_time(ft),
                     "step_p50": format_time(percentile(dec, 50)) if dec else "",
                     "step_max": format_time(max(dec)) if dec else "",
                     "done": format_time(req["steps"][-1]["done_ps"]), "hidden": "" if hidden[r] is None else hidden[r]})
        per_request.append({"request": req["request"], "arrival_ps": req["arrival_ps"], "context": rq.context,
                            "prefill": rq.prefill, "first_token_ps": ft, "prefill_ps": pre[0] if pre else None,
                            "step_latency_ps": dec, "done_ps": req["steps"][-1]["done_ps"],
                            "hidden_fraction": hidden[r]})
    makespan = max(req["steps"][-1]["done_ps"] for req in log) - min(req["arrival_ps"] for req in log)
    tokens = len(step_lat)
    sips = len({c[0] for ln in context.launches for c in ln.layout.coords})
    known = [h for h in hidden if h is not None]
    out = {"latency_ps": host["kernel_latency_ps"], "requests": len(log), "tokens": tokens,
           "prefill_tokens": sum(rq.prefill for rq in context.requests), "makespan_ps": makespan,
           "tokens_per_s": round(tokens * 1e12 / makespan), "tokens_per_s_per_sip": round(tokens * 1e12 / makespan / sips)}
    for name, vals in (("step", step_lat), ("first_token", first), ("prefill", prefill)):
        if vals:
            out.update({f"{name}_{k}_ps": v for k, v in _pct(vals).items()})
    out["hidden_fraction_mean"] = round(sum(known) / len(known), 4) if known else None
    b = work_bound(context)
    out["bound_ps"] = b["bound_ps"]
    out["ratio_to_bound"] = round((makespan + min(req["arrival_ps"] for req in log)) / b["bound_ps"], 4)
    out["bound_terms"] = {k: v for k, v in b.items() if k != "bound_ps"}
    if p["batching"] == "kernel":   # continuous batching: which batch step served each of a request's steps
        out["batch_steps"] = len(host["batches"])
        out["batch_size_max"] = max(len(b["members"]) for b in host["batches"])
        for r, req in enumerate(log):
            per_request[r]["batches"] = [st["batch"] for st in req["steps"]]
            per_request[r]["launch_ps"] = [st["launch_ps"] for st in req["steps"]]
    out["per_request"] = per_request
    if system.mode == "data":
        out["max_abs_err"], out["max_rel_err"], out["outputs_checked"] = _errors(context)
    ft = lambda k: format_time(out[k]) if k in out else ""   # noqa: E731
    summary = {"requests": len(log), "tokens": tokens, "makespan": ft("makespan_ps"), "tok/s": out["tokens_per_s"],
               "step p50": ft("step_p50_ps"), "step p90": ft("step_p90_ps"), "step p99": ft("step_p99_ps"),
               "step max": ft("step_max_ps"), "first p50": ft("first_token_p50_ps"),
               "first p99": ft("first_token_p99_ps"),
               "bound": ft("bound_ps"), "ratio": out["ratio_to_bound"],
               "hidden": "" if out["hidden_fraction_mean"] is None else out["hidden_fraction_mean"]}
    out["tables"] = {"gqa requests": rows, "gqa requests, all": [summary]}
    return out


WORKLOAD = Workload("gqa_requests", "several GQA attention requests at once: arrivals, prefill and decode steps, "
                    "per-request latency",
                    PARAMS, build, check)

"""The demo machine: a token ring and a 2-level reduce-to-root of (m, l, O) partials.

It exists so the engine is usable and measurable before the real machines:
the same structure as the AHBM reduction of the first seed (§4: a PE tree
inside each CUBE, then a centre-root row-then-column CUBE-mesh reduce), with
simple documented service times.

Service times (assumptions of this demo, parameters in the scenario):

* a ring node spends ``service`` per token before forwarding it;
* a reduce PE spends ``produce`` computing its partial at the start of each
  round, then ``merge`` per child partial it folds in (log-sum-exp merge of
  seed §4: ``m = max(ma, mb); l = la*e^(ma-m) + lb*e^(mb-m); O = Oa*e^(ma-m) + Ob*e^(mb-m)``);
* links: ``latency + bytes/bandwidth`` (emulator/link.py).

Topology of the reduce (seed §4.1-4.2): inside a CUBE the P PEs form a binary
heap tree (parent of PE p is (p-1)//2, root PE 0, depth ceil(log2 P)); the CUBE
roots then reduce over the CUBE mesh to the centre CUBE ``root`` along rows
first (toward the root's column), then along that column.  Every parent merges
children in *arrival order* (one fan-in port), so the reduction is data-driven.
"""
from __future__ import annotations

import math

import numpy as np

from actors.registry import HOST_DATA_BYTES, Workload, format_bytes
from emulator import numerics
from emulator.actor import Actor
from emulator.declare import In, Out, Param, params_for
from emulator.schema import Enum, Int, List, Map, Quantity, Str
from protocols.codec import TensorDesc
from protocols.demo import Partial, Token

LINK = Map({
    "latency": Quantity("time", doc="flight time after serialisation"),
    "bandwidth": Quantity("bandwidth", doc="serialisation rate"),
    "capacity": Int(min=1, default=2, doc="credits: messages in flight or waiting at the receiver"),
})

PROFILE_SCHEMA = Map({
    "family": Enum(["demo"]),
    "description": Str(default=""),
    "cubes_x": Int(min=1, max=64, default=4),
    "cubes_y": Int(min=1, max=64, default=4),
    "pes_per_cube": Int(min=1, max=256, default=8),
    "pe_link": LINK,
    "mesh_link": LINK,
})


# --------------------------------------------------------------------------- ring
class RingNode(Actor):
    """Forwards tokens round the ring; injects its initial tokens first."""

    PORTS = (In("in", Token, doc="tokens from the previous node"), Out("out", Token, doc="tokens to the next node"))
    PARAMS = (Param("service", "workload.params.service", "ps", "busy time per token"),)

    def __init__(self, name: str, *, initial: list[Token], arrivals: int, service: int):
        super().__init__(name)
        self.inp = self.in_port("in")
        self.out = self.out_port("out")
        self.initial = initial
        self.arrivals = arrivals
        self.service = service

    async def run(self) -> None:
        for tok in self.initial:
            await self.out.send(tok)
        absorbed = 0
        for _ in range(self.arrivals):
            tok = await self.inp.recv()
            if self.service:
                await self.busy(self.service, "forward")
            if tok.hops > 1:
                await self.out.send(Token(tok.token, tok.hops - 1))
            else:
                absorbed += 1
        if absorbed:
            self.report("absorbed", absorbed)

    def describe(self) -> dict:
        return {**super().describe(), "service_ps": self.service, "arrivals": self.arrivals}


RING_PARAMS = Map({
    "nodes": Int(min=2, max=100_000, default=64),
    "tokens": Int(min=1, default=1, doc="tokens in flight, spread evenly (1 = sparse, nodes = dense)"),
    "hops": Int(min=1, default=1000, doc="hops each token makes"),
    "service": Quantity("time", default="0ns", doc="busy time per token per node"),
})


def ring_plan(nodes: int, tokens: int, hops: int) -> tuple[dict[int, list[Token]], list[int]]:
    """Initial tokens per node and how many tokens each node will receive."""
    starts: dict[int, list[Token]] = {}
    arrivals = [0] * nodes
    for k in range(tokens):
        s = k * nodes // tokens
        starts.setdefault(s, []).append(Token(k, hops))
        full, rest = divmod(hops, nodes)
        for i in range(nodes):
            arrivals[i] += full
        for h in range(rest):
            arrivals[(s + 1 + h) % nodes] += 1
    return starts, arrivals


def build_ring(system, profile: dict, p: dict) -> None:
    starts, arrivals = ring_plan(p["nodes"], p["tokens"], p["hops"])
    nodes = [system.add(RingNode(f"ring/n{i}", initial=starts.get(i, []), arrivals=arrivals[i],
                                 **params_for(RingNode, p).kwargs())) for i in range(p["nodes"])]
    link = profile["pe_link"]
    for i, node in enumerate(nodes):
        system.connect(node.out, nodes[(i + 1) % len(nodes)].inp, capacity=link["capacity"],
                       latency=link["latency"], bandwidth=link["bandwidth"])


# --------------------------------------------------------------------------- reduce
def merge(a, b):
    """Log-sum-exp merge of two (m, l, O) partials (seed §4), in float32 (exp: ``emulator.numerics``).

    Both scale factors in one ``numerics.exp`` call: its cost on G = 8 values is its two dozen numpy calls,
    not the values, and it works value by value (the same bits either way)."""
    ma, la, Oa = a
    mb, lb, Ob = b
    m = np.maximum(ma, mb)
    sa, sb = numerics.exp(np.stack((ma - m, mb - m))).astype(np.float32)
    return m, la * sa + lb * sb, Oa * sa[:, None] + Ob * sb[:, None]


def partial_inputs(system_seed: int, pe: str, rnd: int, G: int, d: int):
    """The (m, l, O) a PE produces in round ``rnd``: drawn from its named seeded stream."""
    from emulator.rng import stream

    rng = stream(system_seed, f"{pe}/partial/{rnd}")
    m = rng.normal(0.0, 2.0, G).astype(np.float32)
    l = rng.uniform(1.0, 4.0, G).astype(np.float32)
    O = rng.normal(0.0, 1.0, (G, d)).astype(np.float32)
    return m, l, O


def reference(seed: int, pes: list[str], rnd: int, G: int, d: int) -> np.ndarray:
    """Normalised attention output of one round, merged in float64 (the numpy reference)."""
    parts = [tuple(x.astype(np.float64) for x in partial_inputs(seed, pe, rnd, G, d)) for pe in pes]
    m = np.max([p[0] for p in parts], axis=0)
    l = sum(p[1] * numerics.exp(p[0] - m) for p in parts)
    O = sum(p[2] * numerics.exp(p[0] - m)[:, None] for p in parts)
    return O / l[:, None]


class ReducePE(Actor):
    """One rank of the reduce: produce, fold children as they arrive, pass up."""

    PORTS = (In("in", Partial, doc="children's partials, in arrival order (one fan-in port)"),
             Out("up", Partial, doc="this subtree's partial, to the parent (not on the root)"))
    PARAMS = (Param("rounds", "workload.params.rounds", "count", "reduce rounds"),
              Param("period", "workload.params.period", "ps", "a new round starts every period"),
              Param("produce", "workload.params.produce", "ps", "time to compute the PE's partial"),
              Param("merge", "workload.params.merge", "ps", "time to fold one child partial"),
              Param("G", "workload.params.G", "count", "rows of m, l, O"),
              Param("d", "workload.params.d", "count", "head dimension"))

    def __init__(self, name: str, *, children: int, is_root: bool, total: int, p: dict, mode: str):
        super().__init__(name)
        self.inp = self.in_port("in")
        self.out = None if is_root else self.out_port("up")
        self.children = children
        self.is_root = is_root
        self.total = total
        self.p = p
        self.mode = mode
        self.early: dict[int, list[Partial]] = {}

    def _produce(self, rnd: int) -> Partial:
        G, d = self.p.G, self.p.d
        if self.mode == "data":
            m, l, O = partial_inputs(self.system.seed, self.name, rnd, G, d)
        else:
            m, l, O = TensorDesc.of((G,), "f4"), TensorDesc.of((G,), "f4"), TensorDesc.of((G, d), "f4")
        return Partial(rnd, 1, m, l, O)

    async def _next_child(self, rnd: int) -> Partial:
        early = self.early.get(rnd)
        if early:
            return early.pop(0)
        while True:
            msg = await self.inp.recv()
            if msg.round == rnd:
                return msg
            if msg.round < rnd:
                raise RuntimeError(f"{self.name}: late partial of round {msg.round} during round {rnd}")
            self.early.setdefault(msg.round, []).append(msg)

    async def run(self) -> None:
        p = self.p
        for rnd in range(p.rounds):
            start = rnd * p.period
            acc = self._produce(rnd)
            await self.busy(p.produce, "produce", start=start)
            for _ in range(self.children):
                child = await self._next_child(rnd)
                await self.busy(p.merge, "merge")
                if self.mode == "data":
                    m, l, O = merge((acc.m, acc.l, acc.O), (child.m, child.l, child.O))
                    acc = Partial(rnd, acc.count + child.count, m, l, O)
                else:
                    acc = Partial(rnd, acc.count + child.count, acc.m, acc.l, acc.O)
            if self.is_root:
                if acc.count != self.total:
                    raise RuntimeError(f"round {rnd}: root merged {acc.count} partials, expected {self.total}")
                latency = self.now - start
                self.mark("round_done", [rnd, latency])
                self.report("round_latency_ps", self.system.reports.get(self.name, {}).get(
                    "round_latency_ps", []) + [latency])
                if self.mode == "data":
                    self.report("output", acc.O / acc.l[:, None])
            else:
                await self.out.send(acc)

    def describe(self) -> dict:
        return {**super().describe(), "children": self.children, "root": self.is_root}


REDUCE_PARAMS = Map({
    "rounds": Int(min=1, default=4),
    "period": Quantity("time", default="5us", doc="a new round starts every period"),
    "produce": Quantity("time", default="100ns", doc="time to compute a PE's partial"),
    "merge": Quantity("time", default="8ns", doc="time to fold one child partial"),
    "G": Int(min=1, default=8, doc="rows of m, l, O (query heads folded in M)"),
    "d": Int(min=1, default=128, doc="head dimension"),
    "root": List(Int(min=0), min_len=2, max_len=2, default=[1, 1], doc="centre CUBE [x, y] of the mesh reduce"),
})


def cube_name(x: int, y: int, cx: int) -> str:
    return f"cube{y * cx + x:02d}"


def mesh_parent(x: int, y: int, root: tuple[int, int]) -> tuple[int, int] | None:
    """Row-then-column toward the centre root (seed §4.2)."""
    rx, ry = root
    if x != rx:
        return (x + (1 if rx > x else -1), y)
    if y != ry:
        return (x, y + (1 if ry > y else -1))
    return None


def reduce_topology(cx: int, cy: int, P: int, root: tuple[int, int]):
    """``{pe_name: parent_name or None}`` and the set of mesh edges, for the 2-level tree."""
    parent: dict[str, str | None] = {}
    mesh_edges = set()
    for y in range(cy):
        for x in range(cx):
            cube = cube_name(x, y, cx)
            for pe in range(P):
                parent[f"{cube}/pe{pe}"] = f"{cube}/pe{(pe - 1) // 2}" if pe else None
            up = mesh_parent(x, y, root)
            if up is not None:
                parent[f"{cube}/pe0"] = f"{cube_name(*up, cx)}/pe0"
                mesh_edges.add(f"{cube}/pe0")
    return parent, mesh_edges


def build_reduce(system, profile: dict, p: dict) -> None:
    cx, cy, P = profile["cubes_x"], profile["cubes_y"], profile["pes_per_cube"]
    root = tuple(p["root"])
    if len(root) != 2 or not (0 <= root[0] < cx and 0 <= root[1] < cy):
        from emulator.errors import BuildError
        raise BuildError(f"workload.params.root: expected [x, y] inside the {cx}x{cy} mesh, found {list(root)}")
    parent, mesh_edges = reduce_topology(cx, cy, P, root)
    children = {name: 0 for name in parent}
    for name, up in parent.items():
        if up is not None:
            children[up] += 1
    total = len(parent)
    pes = {name: system.add(ReducePE(name, children=children[name], is_root=parent[name] is None, total=total,
                                     p=params_for(ReducePE, p), mode=system.mode)) for name in parent}
    for name, up in parent.items():
        if up is None:
            continue
        link = profile["mesh_link"] if name in mesh_edges else profile["pe_link"]
        system.connect(pes[name].out, pes[up].inp, capacity=link["capacity"], latency=link["latency"],
                       bandwidth=link["bandwidth"])


def check_reduce(system, profile: dict, p: dict, result) -> dict:
    """Compare the root's last-round output with the float64 numpy reference."""
    if system.mode != "data" or result.status != "finished":
        return {}
    root = next(a for a in system.actors.values() if isinstance(a, ReducePE) and a.is_root)
    out = system.reports[root.name].pop("output")
    ref = reference(system.seed, list(system.actors), p["rounds"] - 1, p["G"], p["d"])
    err = np.abs(out.astype(np.float64) - ref)
    return {"max_abs_err": float(err.max()), "max_rel_err": float((err / np.maximum(np.abs(ref), 1e-6)).max())}


def limits_reduce(profile: dict, p: dict, mode: str) -> list:
    """A data-mode reduce holds one (m, l, O) float32 partial per PE: refuse what the host cannot hold."""
    pes = profile["cubes_x"] * profile["cubes_y"] * profile["pes_per_cube"]
    need = pes * p["G"] * (p["d"] + 2) * 4
    if mode == "data" and need > HOST_DATA_BYTES:
        return [("G", f"partials of at most {format_bytes(HOST_DATA_BYTES)} in host memory",
                 f"{format_bytes(need)} needed ({pes} PEs x G={p['G']} x (d+2)={p['d'] + 2} x 4 B)")]
    return []


WORKLOADS = {
    "ring": Workload("ring", "tokens travel round a ring of nodes", RING_PARAMS, build_ring),
    "reduce": Workload("reduce", "2-level reduce-to-root of (m, l, O) partials: PE tree, then centre-root CUBE mesh",
                       REDUCE_PARAMS, build_reduce, check_reduce, limits_reduce),
}

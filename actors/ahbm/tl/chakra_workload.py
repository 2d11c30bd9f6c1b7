"""Workload ``chakra``: run a Chakra execution graph (one ET file per rank) on the AHBM machine.

Why: Chakra ETs are how the distributed-ML field exchanges workloads (PyTorch execution traces
converted by the Chakra tools, ASTRA-sim inputs, and this emulator's own ``emu trace chakra``); this
runs one on the machine's real engines.

The graph is ``graph: PREFIX.0.et`` with ranks 1, 2, ... in ``PREFIX.1.et``, ... (ASTRA-sim's naming).
Rank r runs on the PE ``ranks[r]`` (``[sip, cube, pe]``); without ``ranks``, on the PE each file's
metadata names (``pe``, written by ``emu trace chakra``) when every file names one, else on the r-th
PE in the machine's order (SIP, then CUBE, then PE).  Each rank is a ``tl`` kernel
(actors/ahbm/kernels/chakra_replay.py) that issues its nodes in a topological order:

* the steps of one composite (nodes with the same ``composite`` number, as ``emu trace chakra`` marks
  the DMA / GEMM / MATH commands the PE scheduler issued for one ``tl.composite``): that composite
  again, ``composite_mkn``, ``composite_dtype``, ``composite_epilogue``, ``composite_operands`` (each of
  A, B, C in the TCM or streamed from / to HBM), issued where its first step was.  A dependency on
  the composite's last step (the latest to end) waits for the whole composite; one on another step is
  not waited for: a replay can only wait for whole composites, and such an edge is the scheduler
  reporting one composite while it already ran steps of the next;
* ``COMP_NODE``: a GEMM when it has ``m``, ``k``, ``n`` attributes (fp16 operands in the TCM, on the
  composite scheduler), a MATH command when it has ``op`` (one of the MATH engine's ops) over
  ``elements`` (else ``num_ops``) fp32 values from ``srcs`` (default 1) sources; ``is_cpu_op`` nodes are
  not run (their dependants inherit their dependencies);
* ``MEM_LOAD_NODE`` / ``MEM_STORE_NODE``: a DMA of ``shape`` / ``dtype`` when given, else of
  ``tensor_size`` bytes as fp16, between the PE's own HBM and its TCM;
* ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: ``comm_size`` bytes (fp32 if a multiple of 4, else fp16) to /
  from rank ``comm_src`` / ``comm_dst``: over the IPCQ when the two PEs are neighbours, else as a
  CUBE-NOC packet (XY routed, over UCIe between SIPs).  Every receive must have a send with the same
  ``comm_src``, ``comm_dst``, ``comm_tag`` and ``comm_size``, and the other way round;
* ``COMM_COLL_NODE``: over all ranks, decomposed into messages (``comm_type``, ``comm_size``; ``root``
  attribute, default 0): ``REDUCE`` a binomial tree to the root, each receive followed by a MATH ``add``
  (rounds = ceil(log2 ranks)); ``BROADCAST`` the reverse tree from the root; ``ALL_REDUCE`` a reduce to
  rank 0 then a broadcast from it; ``BARRIER`` an all-reduce of 4 bytes.  Every rank must list the
  same collectives in the same order.

Bad graphs are refused before the run with the file, the node and what is wrong: a malformed file, a
dependency on a missing node, a cycle, an unmatched receive or send, a collective the ranks disagree
on, a rank map that does not fit the machine.
"""
from __future__ import annotations

import heapq
import math
import os
import re

from actors.ahbm.costs import MATH_OPS
from actors.ahbm.builder import pe_neighbours
from actors.ahbm.kernels.chakra_replay import chakra_replay
from actors.ahbm.params import pe_name
from actors.ahbm.tl.kernel_registry import register_kernel
from actors.ahbm.tl.kernel_workload import KernelHooks, KernelLayout, kernel_workload
from actors.registry import Workload, workload_file
from emulator.errors import BuildError
from emulator.schema import Int, List, Map, Str
from protocols.chakra.io import EtFileError, attrs_of, pb, read_et

__all__ = ["PARAMS", "WORKLOAD", "load_graph", "rank_files"]

KERNEL = register_kernel(chakra_replay, "chakra_replay")

PARAMS = Map({
    "graph": Str(doc="the rank-0 Chakra ET file PREFIX.0.et; rank r is PREFIX.r.et (ASTRA-sim's naming)"),
    "ranks": List(List(Int(min=0), min_len=3, max_len=3), default=[],
                  doc="rank r -> [sip, cube, pe]; [] = the PE each file's metadata names (emu trace chakra), else "
                      "the r-th PE in machine order"),
})

_COLL = {"REDUCE", "BROADCAST", "ALL_REDUCE", "BARRIER"}
_PE_NAME = re.compile(r"^sip(\d+)/cube(\d+)/pe(\d+)$")
KEY = "workload.params"


def rank_files(path: str) -> list[str]:
    """``PREFIX.0.et``, ``PREFIX.1.et``, ... that exist, from the rank-0 file ``path``."""
    if not path.endswith(".0.et"):
        raise BuildError(f"{KEY}.graph: {path!r} is not a rank-0 Chakra ET file (expected PREFIX.0.et; the other "
                         "ranks are PREFIX.1.et, PREFIX.2.et, ...)")
    prefix = path[:-len(".0.et")]
    files, r = [], 0
    while os.path.isfile(f"{prefix}.{r}.et"):
        files.append(f"{prefix}.{r}.et")
        r += 1
    return files


def _machine_pes(prm) -> list[tuple]:
    return [(s, c, p) for s in range(prm.sips) for c in range(prm.cubes) for p in range(prm.P)]


def _rank_map(prm, p: dict, metas: list, files: list) -> list[tuple]:
    pes = set(_machine_pes(prm))
    where = f"{prm.sips} SIP(s) x {prm.cubes} CUBEs x {prm.P} PEs"
    if p["ranks"]:
        coords = [tuple(c) for c in p["ranks"]]
        if len(coords) != len(files):
            raise BuildError(f"{KEY}.ranks: the graph has {len(files)} ranks ({os.path.basename(files[0])} ..), "
                             f"the map gives {len(coords)} PEs")
        for i, c in enumerate(coords):
            if c not in pes:
                raise BuildError(f"{KEY}.ranks[{i}]: no PE {list(c)} in this machine ({where})")
            if c in coords[:i]:
                raise BuildError(f"{KEY}.ranks[{i}]: PE {list(c)} already runs rank {coords.index(c)}")
        return coords
    named = [_PE_NAME.match(str(attrs_of(m).get("pe", ""))) for m in metas]
    if all(named):
        coords = [tuple(int(x) for x in m.groups()) for m in named]
        for r, c in enumerate(coords):
            if c not in pes:
                raise BuildError(f"{KEY}.graph: {os.path.basename(files[r])} names PE {pe_name(*c)}, not in this "
                                 f"machine ({where}); map the ranks with {KEY}.ranks")
        return coords
    order = _machine_pes(prm)
    if len(files) > len(order):
        raise BuildError(f"{KEY}.graph: {len(files)} ranks, the machine has {len(order)} PEs ({where})")
    return order[:len(files)]


def _peer(prm, me: tuple, other: tuple):
    """An IPCQ direction when ``other`` is ``me``'s neighbour, else the NOC address ``[sip, cube, pe]``."""
    if me[:2] == other[:2]:
        for d, q in pe_neighbours(prm, me[2]).items():
            if q == other[2]:
                return d
    return list(other)


def _message(size: int, where: str):
    if size <= 0:
        raise BuildError(f"{where}: comm_size must be positive, found {size}")
    if size % 4 == 0:
        return [size // 4], "<f4"
    if size % 2 == 0:
        return [size // 2], "<f2"
    raise BuildError(f"{where}: comm_size {size} B is not a whole number of fp16 values")


class _Rank:
    """One rank's nodes, parsed and checked."""

    def __init__(self, r: int, path: str, nodes):
        self.r, self.path, self.name = r, path, os.path.basename(path)
        self.nodes = {}
        for n in nodes:
            if n.id in self.nodes:
                raise BuildError(f"{KEY}.graph: {self.name}: node id {n.id} appears twice")
            self.nodes[n.id] = n
        self.attrs = {i: attrs_of(n) for i, n in self.nodes.items()}
        for n in nodes:
            for d in (*n.data_deps, *n.ctrl_deps):
                if d not in self.nodes:
                    raise BuildError(f"{KEY}.graph: {self.name}: node {n.id} ({n.name!r}) depends on node {d}, "
                                     "which the file does not have")

    def where(self, i: int) -> str:
        return f"{KEY}.graph: {self.name}: node {i} ({self.nodes[i].name!r}, {pb.NodeType.Name(self.nodes[i].type)})"

    def order(self) -> list[int]:
        """A topological order, earliest recorded start first (``start_ps``, else 0), then id; a cycle is an error."""
        deps = {i: set(n.data_deps) | set(n.ctrl_deps) for i, n in self.nodes.items()}
        kids: dict = {i: [] for i in self.nodes}
        for i, ds in deps.items():
            for d in ds:
                kids[d].append(i)
        left = {i: len(ds) for i, ds in deps.items()}
        prio = {i: (int(self.attrs[i].get("start_ps") or 0), i) for i in self.nodes}
        ready = [prio[i] for i, k in left.items() if k == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            _, i = heapq.heappop(ready)
            out.append(i)
            for c in kids[i]:
                left[c] -= 1
                if left[c] == 0:
                    heapq.heappush(ready, prio[c])
        if len(out) != len(self.nodes):
            stuck = sorted(i for i, k in left.items() if k > 0)
            raise BuildError(f"{KEY}.graph: {self.name}: the dependencies have a cycle (nodes "
                             f"{', '.join(map(str, stuck[:8]))}{' ...' if len(stuck) > 8 else ''} wait on one another)")
        return out

    def comm(self, i: int) -> tuple:
        a = self.attrs[i]
        missing = [k for k in ("comm_src", "comm_dst", "comm_tag", "comm_size") if a.get(k) is None]
        if missing:
            raise BuildError(f"{self.where(i)}: needs {', '.join(missing)}")
        return int(a["comm_src"]), int(a["comm_dst"]), int(a["comm_tag"]), int(a["comm_size"])


def _check_pairs(ranks: list[_Rank]) -> None:
    """Every receive has its send (same src, dst, tag, size) and every send its receive."""
    sends, recvs = {}, {}
    for rk in ranks:
        for i, n in rk.nodes.items():
            if n.type not in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                continue
            src, dst, tag, size = key = rk.comm(i)
            own, peer = (src, dst) if n.type == pb.COMM_SEND_NODE else (dst, src)
            if own != rk.r:
                side = "comm_src" if n.type == pb.COMM_SEND_NODE else "comm_dst"
                raise BuildError(f"{rk.where(i)}: {side} is {own}, but this file is rank {rk.r}")
            if not 0 <= peer < len(ranks) or peer == rk.r:
                raise BuildError(f"{rk.where(i)}: peer rank {peer} is not another rank of this graph "
                                 f"(ranks 0-{len(ranks) - 1})")
            (sends if n.type == pb.COMM_SEND_NODE else recvs).setdefault(key, []).append((rk, i))
    for key, rs in recvs.items():
        if len(sends.get(key, ())) < len(rs):
            rk, i = rs[len(sends.get(key, ()))]
            raise BuildError(f"{rk.where(i)}: no COMM_SEND_NODE in {ranks[key[0]].name} matches this receive "
                             f"(comm_src {key[0]}, comm_dst {key[1]}, comm_tag {key[2]}, comm_size {key[3]})")
    for key, ss in sends.items():
        if len(recvs.get(key, ())) < len(ss):
            rk, i = ss[len(recvs.get(key, ()))]
            raise BuildError(f"{rk.where(i)}: no COMM_RECV_NODE in {ranks[key[1]].name} matches this send "
                             f"(comm_src {key[0]}, comm_dst {key[1]}, comm_tag {key[2]}, comm_size {key[3]})")


def _collective_steps(kind: str, size: int, root: int, r: int, R: int) -> list[tuple]:
    """Rank ``r``'s part of a collective over ranks 0..R-1: ``[(op, peer rank | None, bytes)]``, op in
    send / recv / add, in order (module docstring)."""
    if kind == "BARRIER":
        kind, size = "ALL_REDUCE", 4
    if kind == "ALL_REDUCE":
        return _collective_steps("REDUCE", size, 0, r, R) + _collective_steps("BROADCAST", size, 0, r, R)
    v = (r - root) % R
    rounds = math.ceil(math.log2(R)) if R > 1 else 0
    real = lambda u: (u + root) % R                       # noqa: E731
    out = []
    if kind == "REDUCE":
        for j in range(rounds):
            step = 1 << j
            if v % (2 * step) == step:
                out.append(("send", real(v - step), size))
                break
            if v % (2 * step) == 0 and v + step < R:
                out += [("recv", real(v + step), size), ("add", None, size)]
    else:                                                 # BROADCAST
        for j in reversed(range(rounds)):
            step = 1 << j
            if v % (2 * step) == 0 and v + step < R:
                out.append(("send", real(v + step), size))
            elif v % (2 * step) == step:
                out.append(("recv", real(v - step), size))
    return out


def _collectives(ranks: list[_Rank], orders: list[list[int]]) -> list[list[tuple]]:
    """Per rank, its COMM_COLL_NODEs in order as ``(node id, type name, size, root)``; the ranks must agree."""
    per = []
    for rk, order in zip(ranks, orders):
        got = []
        for i in order:
            if rk.nodes[i].type != pb.COMM_COLL_NODE:
                continue
            a = rk.attrs[i]
            if a.get("comm_type") is None or (a.get("comm_size") is None and a.get("comm_type") != pb.BARRIER):
                raise BuildError(f"{rk.where(i)}: needs comm_type and comm_size")
            kind = pb.CollectiveCommType.Name(int(a["comm_type"])) if int(a["comm_type"]) in \
                pb.CollectiveCommType.values() else str(a["comm_type"])
            if kind not in _COLL:
                raise BuildError(f"{rk.where(i)}: collective {kind} is not decomposed here (supported: "
                                 f"{', '.join(sorted(_COLL))})")
            root = int(a.get("root") or 0)
            if not 0 <= root < len(ranks):
                raise BuildError(f"{rk.where(i)}: root {root} is not a rank (0-{len(ranks) - 1})")
            got.append((i, kind, int(a.get("comm_size") or 4), root))
        per.append(got)
    first = [c[1:] for c in per[0]]
    for rk, got in zip(ranks, per):
        if [c[1:] for c in got] != first:
            raise BuildError(f"{KEY}.graph: {rk.name}: its collectives {[c[1:] for c in got]} differ from "
                             f"{ranks[0].name}'s {first} (every rank must list the same ones in the same order)")
    return per


def _ops(prm, rk: _Rank, order: list[int], coords: list[tuple], colls: list) -> tuple[list, int]:
    """The kernel's op list for one rank (kernels/chakra_replay.py) and its message count."""
    me = coords[rk.r]
    alias: dict = {}                                  # a node not run -> the keys its dependants wait on instead
    coll = {c[0]: c for c in colls}
    ops, next_key, messages = [], max(rk.nodes, default=0) + 1, 0

    def deps_of(n) -> list:
        out = []
        for d in dict.fromkeys((*n.data_deps, *n.ctrl_deps)):
            out.extend(alias.get(d, [d]))
        return list(dict.fromkeys(out))

    groups: dict = {}                                 # composite number -> its nodes' ids
    for i in order:
        if rk.attrs[i].get("composite") is not None:
            groups.setdefault(rk.attrs[i]["composite"], []).append(i)
    for i in order:
        n, a = rk.nodes[i], rk.attrs[i]
        g = a.get("composite")
        if g is not None:
            members = groups[g]
            if i == members[0]:                       # the composite, issued where its first step was
                key, next_key = next_key, next_key + 1
                inside = set(members)
                # the steps' outside dependencies; one on a node issued after this point (a later step
                # waited for it) is not waited for: the composite, like the original's, is already issued
                deps = [d for j in members for d in deps_of(rk.nodes[j]) if d not in inside]
                ops.append([key, "composite", list(dict.fromkeys(deps)), *_composite(rk, i)])
                last = max(members, key=lambda j: (int(rk.attrs[j].get("start_ps") or 0) +
                                                   int(rk.attrs[j].get("duration_ps") or 0), j))
                for j in members:
                    alias[j] = [key] if j == last else []
            continue
        deps = deps_of(n)
        t = n.type
        if t == pb.COMP_NODE:
            if a.get("is_cpu_op"):
                alias[i] = deps
                continue
            if all(a.get(k) for k in ("m", "k", "n")):
                ops.append([i, "gemm", deps, int(a["m"]), int(a["k"]), int(a["n"])])
            elif a.get("op") in MATH_OPS:
                el = int(a.get("elements") or a.get("num_ops") or 0)
                if el <= 0:
                    raise BuildError(f"{rk.where(i)}: a MATH node needs elements or num_ops > 0")
                ops.append([i, "math", deps, a["op"], el, int(a.get("srcs") or 1)])
            else:
                raise BuildError(f"{rk.where(i)}: a COMP_NODE runs as a GEMM (attributes m, k, n) or a MATH op "
                                 f"(attribute op: one of {', '.join(sorted(MATH_OPS))}); found {sorted(a)}")
        elif t in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE):
            if a.get("shape") and a.get("dtype"):
                shape, dtype = [int(x) for x in a["shape"]], a["dtype"]
            elif a.get("tensor_size"):
                shape, dtype = [-(-int(a["tensor_size"]) // 2)], "<f2"
            else:
                raise BuildError(f"{rk.where(i)}: a memory node needs tensor_size (bytes) or shape and dtype")
            ops.append([i, "load" if t == pb.MEM_LOAD_NODE else "store", deps, shape, dtype])
        elif t in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            src, dst, _tag, size = rk.comm(i)
            shape, dtype = _message(size, rk.where(i))
            other = coords[dst if t == pb.COMM_SEND_NODE else src]
            ops.append([i, "send" if t == pb.COMM_SEND_NODE else "recv", deps, _peer(prm, me, other), shape, dtype])
            messages += t == pb.COMM_SEND_NODE
        elif t == pb.COMM_COLL_NODE:
            _, kind, size, root = coll[i]
            shape, dtype = _message(size, rk.where(i))
            last = deps
            for op, peer, _ in _collective_steps(kind, size, root, rk.r, len(coords)):
                key, next_key = next_key, next_key + 1
                if op == "add":
                    ops.append([key, "math", last, "add", shape[0], 2])
                else:
                    ops.append([key, op, last, _peer(prm, me, coords[peer]), shape, dtype])
                    messages += op == "send"
                last = [key]
            alias[i] = last
        else:
            raise BuildError(f"{rk.where(i)}: node type {pb.NodeType.Name(t)} is not run (expected COMP, MEM_LOAD, "
                             "MEM_STORE, COMM_SEND, COMM_RECV or COMM_COLL)")
    return ops, messages


def _composite(rk: _Rank, i: int) -> list:
    """``m k n dtype epilogue operands`` of the composite node ``i`` belongs to (its ``composite_*`` attributes)."""
    a = rk.attrs[i]
    mkn, ops = a.get("composite_mkn") or [], a.get("composite_operands") or []
    if len(mkn) != 3 or len(ops) != 3 or not all(o in ("tcm", "hbm") for o in ops):
        raise BuildError(f"{rk.where(i)}: composite {a['composite']} needs composite_mkn [m, k, n] and "
                         "composite_operands [a, b, c] each 'tcm' or 'hbm'")
    steps = []
    for step in a.get("composite_epilogue") or []:
        op, _, x = str(step).partition(":")
        try:
            steps.append([op, float(x or 0.0)])
        except ValueError:
            raise BuildError(f"{rk.where(i)}: composite epilogue step {step!r} is not OP:SCALAR") from None
    return [int(mkn[0]), int(mkn[1]), int(mkn[2]), a.get("composite_dtype") or "<f2", steps, list(ops)]


def load_graph(prm, p: dict) -> dict:
    """The checked graph of ``p["graph"]`` (a resolved path): ``coords`` per rank, ``ops`` per coord, counts."""
    files = rank_files(p["graph"])
    metas, ranks = [], []
    for r, f in enumerate(files):
        try:
            meta, nodes = read_et(f)
        except EtFileError as e:
            raise BuildError(f"{KEY}.graph: {e}") from None
        metas.append(meta)
        ranks.append(_Rank(r, f, nodes))
    coords = _rank_map(prm, p, metas, files)
    orders = [rk.order() for rk in ranks]
    _check_pairs(ranks)
    colls = _collectives(ranks, orders)
    ops, messages = {}, 0
    for rk, order, cl in zip(ranks, orders, colls):
        ops[coords[rk.r]], m = _ops(prm, rk, order, coords, cl)
        messages += m
    return {"coords": coords, "ops": ops, "messages": messages, "nodes": sum(len(rk.nodes) for rk in ranks),
            "files": files}


def _layout(prm, p) -> KernelLayout:
    g = load_graph(prm, p)
    store = prm.hbm_capacity // 2
    return KernelLayout(g["coords"], lambda c: {"ops": g["ops"][c], "store_addr": store},
                        lambda c: (c[2], c[1], c[0]), (prm.P, prm.cubes, prm.sips), info=g)


def _metrics(ctx, system, out) -> dict:
    g = ctx.layout.info
    return {"graph_ranks": len(g["coords"]), "graph_nodes": g["nodes"], "graph_messages": g["messages"]}


HOOKS = KernelHooks("chakra", "a Chakra execution graph (one ET file per rank) on the PEs, node by node",
                    PARAMS, KERNEL, _layout, lambda rng, lay, p: {}, lambda place, lay, data, p: None,
                    lambda ctx: [], lambda ctx: {}, metrics=_metrics)
_BASE = kernel_workload(HOOKS)


def _build(system, profile: dict, p: dict):
    """The generic kernel build, with ``graph`` resolved like any workload file (scenario dir, cwd, repo)."""
    path = workload_file(p["graph"], system, f"{KEY}.graph", "Chakra ET file")
    return _BASE.build(system, profile, {**p, "graph": str(path)})


WORKLOAD = Workload(_BASE.name, _BASE.summary, _BASE.params, _build, _BASE.check, _BASE.limits, _BASE.progress)

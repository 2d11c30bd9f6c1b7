"""Export a run as Chakra execution traces: one ET file per AHBM PE (rank), for ASTRA-sim and the Chakra tools.

Why from the trace and not from the kernel: the trace is what the machine *did* -- each engine
command with its real start and end, and which completions each dispatcher had seen before it
issued the next command -- so the graph carries the run's own dependencies and durations, for any
workload, without re-running it.

What becomes a node (docs/trace-format.md "Chakra execution traces" has the full mapping):

* every command an engine of a PE took on its ``cmd`` port -- GEMM and MATH commands are
  ``COMP_NODE`` (``num_ops``, ``tensor_size``), DMA loads / stores ``MEM_LOAD_NODE`` /
  ``MEM_STORE_NODE`` (``tensor_size`` = bytes moved), IPCQ sends / receives ``COMM_SEND_NODE`` /
  ``COMM_RECV_NODE``; a node lasts from the engine's take of the command to its completion message;
* every CUBE-NOC packet a PE's CPU sent (``COMM_SEND_NODE``) or took (``COMM_RECV_NODE``).

Dependencies are happens-before through the PE's own messages.  Each actor of a PE (CPU,
scheduler, engines) carries a *frontier*: the latest node of each engine whose completion it has
seen, directly or through the messages it took.  A message carries its sender's frontier; a
command's node depends on (``data_deps``) the frontier its command carried, minus the entries
another of those dependencies already implies.  A node also follows (``ctrl_deps``) the previous
node of its own engine when that one had ended before it started.  Across PEs the only edges are
the send / receive pairs (same ``comm_src``, ``comm_dst``, ``comm_tag``, ``comm_size``): the k-th
IPCQ send towards a neighbour is that neighbour's k-th receive from this side (an IPCQ is a FIFO per
direction); a NOC packet pairs by its id.  Every edge points back in time, so each graph is acyclic.

CPU busy spans (command dispatch, fills) are not nodes: they appear as the gaps between nodes'
start times, and a replay re-creates them by dispatching the nodes (the ``chakra`` workload).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

import protocols.ahbm  # noqa: F401 -- registers the AHBM records for decode
import protocols.ahbm_tl  # noqa: F401
from emulator.trace import SEND, TAKE, TraceStream
from protocols.chakra.io import attr, pb, write_et
from protocols.codec import ProtocolError, decode

__all__ = ["ChakraExportError", "ExportStats", "export_chakra", "trace_path", "pe_of", "SCHEMA_VERSION",
           "et_name"]

#: the Chakra schema version the files declare (GlobalMetadata.version: the schema's own, as its generator writes)
SCHEMA_VERSION = "1.0.0"

#: the PE engines whose commands become nodes, and the actors whose messages carry frontiers
_ENGINES = ("gemm", "math", "dma", "ipcq")
_CARRIERS = frozenset(("cpu", "sched") + _ENGINES)
_PE = re.compile(r"^(.*?/pe\d+)/([a-z]+)$")


class ChakraExportError(ValueError):
    """The trace cannot be exported (names the file and what is missing)."""


def pe_of(actor: str) -> tuple[str, str] | None:
    """``("sip0/cube01/pe3", "gemm")`` for a PE component actor, else ``None``."""
    m = _PE.match(actor)
    return (m.group(1), m.group(2)) if m else None


def et_name(rank: int) -> str:
    """The ET file of ``rank``: ``chakra.<rank>.et`` (the ``prefix.<rank>.et`` ASTRA-sim reads)."""
    return f"chakra.{rank}.et"


def trace_path(path: str) -> str:
    """The trace of ``path``: the file itself, or a bundle directory's ``trace.emutrace``."""
    if os.path.isdir(path):
        inner = os.path.join(path, "trace.emutrace")
        if not os.path.exists(inner):
            raise ChakraExportError(f"{path}: a directory without trace.emutrace (run with --out DIR to record one)")
        return inner
    if not os.path.exists(path):
        raise ChakraExportError(f"{path}: no such trace file or bundle")
    return path


@dataclass
class _Node:
    gid: int                      # creation order, global
    pe: str
    engine: str                   # the frontier key: an engine actor, or "<pe>/noc"
    type: int
    name: str
    start: int
    end: int | None = None
    deps: list = field(default_factory=list)     # data deps (gids)
    ctrl: list = field(default_factory=list)     # ctrl deps (gids)
    frontier: dict = field(default_factory=dict)  # what this node depended on: engine -> gid
    attrs: dict = field(default_factory=dict)     # name -> (value, kind)
    cmd: object = None
    comm: dict | None = None                      # send / recv: peer pe, side key, size


@dataclass
class ExportStats:
    """What an export wrote: rank -> PE, per-rank node counts by type, the files."""

    out: str
    ranks: list                      # PE name of each rank
    counts: list                     # per rank: {type name: n}
    files: list
    bytes: int
    unmatched: int
    end_ps: int

    def text(self) -> str:
        total = {}
        for c in self.counts:
            for k, v in c.items():
                total[k] = total.get(k, 0) + v
        kinds = ", ".join(f"{v} {k}" for k, v in sorted(total.items()))
        return (f"wrote {len(self.files)} Chakra ET files ({self.bytes / 1e3:.1f} kB) to {self.out}: "
                f"ranks 0-{len(self.ranks) - 1} = {self.ranks[0]} .. {self.ranks[-1]}; nodes: {kinds}")


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _tensor_bytes(t) -> int:
    """Bytes of a message's tensor: an ndarray (data mode) or a TensorDesc (timing mode)."""
    return int(t.nbytes)


class _Exporter:
    def __init__(self, path: str):
        self.path = path
        self.stream = TraceStream(path, payloads=True)
        h = self.stream.header
        rec = ((h.get("scenario_resolved") or {}).get("trace") or {})
        if rec.get("payloads") is False:
            raise ChakraExportError(f"{path}: recorded with trace.payloads: false; the Chakra export reads the "
                                    "engine commands' payloads (shapes, bytes): record with payloads on")
        for key in ("kinds", "actors", "links"):
            if rec.get(key):
                raise ChakraExportError(f"{path}: recorded with trace.{key}={rec[key]}; the Chakra export needs "
                                        "every PE event (record without trace filters)")
        self.actors = h["actors"]
        self.links = h["links"]
        self.nodes: list[_Node] = []
        self.known: dict[str, dict] = {}          # actor -> frontier
        self.carried: dict = {}                   # (link, seq) -> frontier
        self.payload: dict = {}                   # (link, seq) -> decoded message (cmd / noc_in links)
        self.pending: dict = {}                   # (engine actor, cmd id) -> node
        self.last_on: dict = {}                   # engine -> last node
        self.dtypes: dict = {}                    # (pe, buf) -> dtype
        self.noc: dict = {}                       # packet id -> [send node, recv node]
        self.ipcq_tx: dict = {}                   # (ipcq actor, dir) -> peer ipcq actor
        self.open: dict = {}                      # scheduler actor -> [(number, CompositeCmd)] taken, not done
        self.owner: dict = {}                     # (scheduler, buffer) -> the composite number that last wrote it
        self.a_slot: dict = {}                    # composite number -> the A buffer its GEMMs read
        self.composites = 0
        self._classify()

    # -- links ---------------------------------------------------------------------------------
    def _classify(self):
        """Per link: what it is for the export (cmd / done / carry / noc_out / noc_in / None)."""
        self.role, self.carry = [], []
        for l in self.links:
            s, d = pe_of(l["src"]), pe_of(l["dst"])
            same = s is not None and d is not None and s[0] == d[0]
            self.carry.append(same and s[1] in _CARRIERS and d[1] in _CARRIERS)
            role = None
            if same and d[1] in _ENGINES and l["dst_port"] == "cmd":
                role = "cmd"
            elif same and s[1] in _ENGINES and d[1] in ("cpu", "sched") and l["dst_port"] in ("done", "ipcq_resp"):
                role = "done"
            elif same and d[1] == "sched" and l["dst_port"] == "cmd":
                role = "composite"
            elif same and s[1] == "sched" and d[1] == "cpu" and l["dst_port"] == "done":
                role = "sched_done"
            elif s is not None and s[1] == "cpu" and l["src_port"] == "noc_out":
                role = "noc_out"
            elif d is not None and d[1] == "cpu" and l["dst_port"] == "noc_in":
                role = "noc_in"
            elif s is not None and s[1] == "ipcq" and l["src_port"].startswith("tx_") and d is not None:
                self.ipcq_tx[(l["src"], l["src_port"][3:])] = l["dst"]
            self.role.append(role)

    def _decode(self, payload, link: int):
        try:
            return decode(payload)
        except ProtocolError as e:
            raise ChakraExportError(f"{self.path}: link {self.links[link]['name']}: {e}") from None

    # -- frontiers -----------------------------------------------------------------------------
    def _merge(self, actor: str, fr: dict):
        k = self.known.setdefault(actor, {})
        for e, g in fr.items():
            if k.get(e, -1) < g:
                k[e] = g

    def _new(self, pe: str, engine: str, typ: int, name: str, t: int, fr: dict) -> _Node:
        n = _Node(len(self.nodes), pe, engine, typ, name, t)
        n.frontier = dict(fr)
        deps = sorted(g for e, g in fr.items() if e != engine)
        n.deps = [d for d in deps
                  if not any(self.nodes[o].frontier.get(self.nodes[d].engine, -1) >= d for o in deps if o != d)]
        self.nodes.append(n)
        return n

    def _complete(self, n: _Node, t: int, start: int | None = None):
        """``n`` ended at ``t`` (started at ``start`` when the engine reports it: a queued command starts
        after its take); it follows the engine's previous node if that one had ended by then."""
        n.end = t
        if start is not None:
            n.start = start
        prev = self.last_on.get(n.engine)
        if prev is not None and prev.end <= n.start and prev.gid not in n.deps:
            n.ctrl = [prev.gid]
        self.last_on[n.engine] = n
        k = self.known.setdefault(n.engine if "/noc" not in n.engine else n.pe + "/cpu", {})
        k[n.engine] = n.gid

    # -- events --------------------------------------------------------------------------------
    def run(self):
        role, carry, links = self.role, self.carry, self.links
        for ev in self.stream:
            k = ev[0]
            if k == SEND:
                _, t, li, seq, nbytes, payload = ev
                r = role[li]
                if r is None and not carry[li]:
                    continue
                if payload is None:
                    raise ChakraExportError(f"{self.path}: a message on {links[li]['name']} has no payload "
                                            "(recorded with payloads off?)")
                if r == "done":
                    self._done(li, t, self._decode(payload, li))
                elif r == "sched_done":
                    done = self._decode(payload, li)
                    opened = self.open.get(links[li]["src"], [])
                    ids = [c.id for _, c in opened]
                    if done.id in ids:
                        del opened[ids.index(done.id)]
                elif r == "cmd" or r == "noc_in" or r == "composite":
                    self.payload[(li, seq)] = self._decode(payload, li)
                elif r == "noc_out":
                    self._noc(li, t, self._decode(payload, li), 0)
                if carry[li]:
                    self.carried[(li, seq)] = dict(self.known.get(links[li]["src"], ()))
            elif k == TAKE:
                _, t, li, seq, _depth = ev
                fr = self.carried.pop((li, seq), None)
                r = role[li]
                if r == "cmd":
                    self._cmd(li, t, self.payload.pop((li, seq)), fr or {})
                elif r == "noc_in":
                    self._noc(li, t, self.payload.pop((li, seq)), 1)
                elif r == "composite":
                    self.composites += 1
                    self.open.setdefault(links[li]["dst"], []).append((self.composites, self.payload.pop((li, seq))))
                if fr:
                    self._merge(links[li]["dst"], fr)
        self.end_ps = int(self.stream.footer.get("end_time_ps", 0))

    def _cmd(self, li: int, t: int, cmd, fr: dict):
        eng = self.links[li]["dst"]
        pe, kind = pe_of(eng)
        name = type(cmd).__name__
        if kind == "gemm" and name == "GemmCmd":
            n = self._new(pe, eng, pb.COMP_NODE, f"gemm {cmd.m}x{cmd.k}x{cmd.n}", t, fr)
            ins = [_nbytes((cmd.m, cmd.k), self.dtypes.get((pe, cmd.a), "<f2")),
                   _nbytes((cmd.k, cmd.n), self.dtypes.get((pe, cmd.b), "<f2"))]
            out = _nbytes((cmd.m, cmd.n), cmd.out_dtype or "<f4")
            n.attrs.update(num_ops=(2 * cmd.m * cmd.k * cmd.n, "int64_val"), tensor_size=(sum(ins) + out, "uint64_val"),
                           op=("gemm", "string_val"), m=(cmd.m, "int64_val"), k=(cmd.k, "int64_val"),
                           n=(cmd.n, "int64_val"), out_dtype=(cmd.out_dtype, "string_val"))
            if cmd.out:
                self.dtypes[(pe, cmd.out)] = cmd.out_dtype
        elif kind == "math" and name == "MathCmd":
            n = self._new(pe, eng, pb.COMP_NODE, f"math {cmd.op}", t, fr)
            n.attrs.update(op=(cmd.op, "string_val"), srcs=(len(cmd.srcs), "int64_val"),
                           out_dtype=(cmd.out_dtype, "string_val"))
            self.dtypes[(pe, cmd.out)] = cmd.out_dtype
        elif kind == "dma" and name in ("DmaCmd", "DmaGather"):
            typ = pb.MEM_LOAD_NODE if cmd.op == "load" else pb.MEM_STORE_NODE
            n = self._new(pe, eng, typ, f"dma {cmd.op}", t, fr)
            n.attrs.update(op=(cmd.op, "string_val"))
            if name == "DmaCmd" and cmd.buf:
                self.dtypes[(pe, cmd.buf)] = cmd.dtype
                n.attrs.update(shape=(list(cmd.shape), "int64_list"), dtype=(cmd.dtype, "string_val"))
        elif kind == "ipcq" and name == "IpcqCmd":
            typ = pb.COMM_SEND_NODE if cmd.op == "send" else pb.COMM_RECV_NODE
            n = self._new(pe, eng, typ, f"ipcq {cmd.op} {cmd.dir}", t, fr)
            n.comm = {"via": "ipcq", "dir": cmd.dir, "size": None}   # the receive's response gives the size (_done)
            n.attrs.update(dir=(cmd.dir, "string_val"))
        else:
            raise ChakraExportError(f"{self.path}: {eng} took a {name} command, which the Chakra export does not "
                                    f"map (known: GemmCmd, MathCmd, DmaCmd, DmaGather, IpcqCmd; the pipeline "
                                    f"fidelity's batches are not exported)")
        n.cmd = cmd
        sched = self.links[li]["src"]
        if pe_of(sched)[1] == "sched" and self.open.get(sched):
            g, c = self._composite_of(sched, kind, cmd)
            n.attrs.update(composite=(g, "int64_val"), composite_mkn=([c.m, c.k, c.n], "int64_list"),
                           composite_dtype=(c.dtype, "string_val"),
                           composite_epilogue=([f"{op}:{x!r}" for op, x in c.epilogue], "string_list"),
                           composite_operands=(["tcm" if c.a_buf else "hbm", "tcm" if c.b_buf else "hbm",
                                                "tcm" if c.c_buf else "hbm"], "string_list"))
        key = (eng, self.links[li]["src"], cmd.id)          # ids are per dispatcher (the CPU, the scheduler)
        if key in self.pending:
            raise ChakraExportError(f"{self.path}: {eng} took command id {cmd.id} from {key[1]} twice before "
                                    "completing it")
        self.pending[key] = n

    def _composite_of(self, sched: str, kind: str, cmd) -> tuple:
        """The composite a scheduler step belongs to.  The scheduler takes the next composite ahead while the
        current one computes (scheduler.py), so "the one it took last" is not it: a DMA belongs to the open
        composite whose operand or result range holds its address, a GEMM to the oldest open composite whose A
        slot (the scheduler's copy of A, one per composite in flight) it reads, a MATH epilogue step to the
        composite whose GEMM last wrote its source; else the oldest open one."""
        opened = self.open[sched]
        g = None
        if kind == "dma":
            addr = cmd.addr
            for num, c in opened:
                size = np.dtype(c.dtype).itemsize
                ranges = ((c.a_addr, c.m * c.k), (c.b_addr, c.k * c.n)) if cmd.op == "load" else ((c.c_addr, c.m * c.n),)
                if any(lo <= addr < lo + n * size for lo, n in ranges):
                    g = num
                    break
            bufs_out = []
        elif kind == "gemm":                   # each composite's GEMMs read its own A slot (sched/a0, a1, ...)
            for num, _ in opened:
                slot = self.a_slot.setdefault(num, cmd.a)
                if slot == cmd.a:
                    g = num
                    break
            bufs_out = [cmd.out]
        else:
            g = next((self.owner[(sched, b)] for b in cmd.srcs if (sched, b) in self.owner), None)
            bufs_out = [cmd.out]
        found = next((x for x in opened if x[0] == g), opened[0])
        for b in bufs_out:
            if b:
                self.owner[(sched, b)] = found[0]
        return found

    def _done(self, li: int, t: int, msg):
        eng = self.links[li]["src"]
        n = self.pending.pop((eng, self.links[li]["dst"], msg.id), None)
        if n is None:
            return                                   # a completion of a command taken before? (not a node)
        name = type(msg).__name__
        self._complete(n, t, msg.start if name == "Done" else None)
        if name == "Done":
            info = msg.info or {}
            if "bytes" in info:
                n.attrs.update(tensor_size=(int(info["bytes"]), "uint64_val"), remote=(bool(info.get("remote")), "bool_val"))
                n.name += f" {int(info['bytes'])}B"
            if "elements" in info:
                el = int(info["elements"])
                size = el * np.dtype(n.attrs["out_dtype"][0] or "<f4").itemsize * (1 + n.attrs["srcs"][0])
                n.attrs.update(num_ops=(el, "int64_val"), tensor_size=(size, "uint64_val"), elements=(el, "int64_val"))
                n.name += f" {el}"
        elif name == "IpcqResp" and n.type == pb.COMM_RECV_NODE and msg.desc:
            shape, dtype = msg.desc
            n.comm["size"] = _nbytes(shape, dtype)
            self.dtypes[(n.pe, n.cmd.buf)] = dtype

    def _noc(self, li: int, t: int, pkt, side: int):
        """A NOC packet a PE CPU sent (``side`` 0: at its SEND) or took (1: at its TAKE): an instant node."""
        cpu = self.links[li]["src" if side == 0 else "dst"]
        pe = pe_of(cpu)[0]
        typ, what = (pb.COMM_SEND_NODE, f"noc send {pkt.dst}") if side == 0 else (pb.COMM_RECV_NODE, f"noc recv {pkt.src}")
        n = self._new(pe, pe + "/noc", typ, what, t, self.known.get(cpu, {}))
        n.comm = {"via": "noc", "size": _tensor_bytes(pkt.payload.t), "pkt": pkt.id}
        self._complete(n, t)
        self.noc.setdefault((tuple(pkt.src), pkt.id), [None, None])[side] = n

    # -- pairing and output --------------------------------------------------------------------
    def pairs(self) -> list[tuple[_Node, _Node]]:
        """(send, recv) pairs: IPCQ by FIFO order per direction, NOC by packet id."""
        out = [(s, r) for s, r in self.noc.values() if s is not None and r is not None]
        by_side: dict = {}
        for n in self.nodes:                    # creation order = command take order
            if n.comm and n.comm["via"] == "ipcq":
                by_side.setdefault((n.engine, n.comm["dir"], n.type), []).append(n)
        for (eng, d, typ), sends in by_side.items():
            if typ != pb.COMM_SEND_NODE:
                continue
            peer = self.ipcq_tx.get((eng, d))
            back = next((l["dst_port"][3:] for l in self.links
                         if l["src"] == eng and l["src_port"] == "tx_" + d), None)
            recvs = by_side.get((peer, back, pb.COMM_RECV_NODE), [])
            out.extend(zip(sends, recvs))
        return out


def export_chakra(path: str, out_dir: str) -> ExportStats:
    """Write ``out_dir/chakra.<rank>.et`` for each PE that ran a command in trace (or bundle) ``path``."""
    path = trace_path(path)
    ex = _Exporter(path)
    ex.run()
    open_nodes = [n for n in ex.nodes if n.end is None]
    if open_nodes:
        n = open_nodes[0]
        raise ChakraExportError(f"{path}: {len(open_nodes)} command(s) never completed (first: {n.name} on "
                                f"{n.engine} at {n.start} ps): the run did not finish; export a finished run")
    order = {a: i for i, a in enumerate(ex.actors)}
    pes = sorted({n.pe for n in ex.nodes}, key=lambda p: order.get(p + "/cpu", len(order)))
    if not pes:
        raise ChakraExportError(f"{path}: no AHBM PE engine commands in this trace (the Chakra export maps AHBM PE "
                                "engines: GEMM, MATH, DMA, IPCQ, NOC)")
    rank = {p: r for r, p in enumerate(pes)}
    pairs = ex.pairs()
    tags: dict = {}
    for s, r in sorted(pairs, key=lambda sr: sr[0].start):
        key = (s.pe, r.pe)
        tag = tags[key] = tags.get(key, -1) + 1
        size = r.comm["size"] if r.comm["size"] is not None else s.comm["size"]
        for n, src, dst in ((s, s.pe, r.pe), (r, s.pe, r.pe)):
            n.attrs.update(comm_src=(rank[src], "int32_val"), comm_dst=(rank[dst], "int32_val"),
                           comm_tag=(tag, "int32_val"), comm_size=(int(size), "int64_val"),
                           via=(n.comm["via"], "string_val"))
    matched = {id(n) for sr in pairs for n in sr}
    unmatched = sum(1 for n in ex.nodes if n.comm and id(n) not in matched)
    for n in ex.nodes:
        if n.comm and id(n) not in matched:
            n.attrs.update(comm_size=(int(n.comm["size"] or 0), "int64_val"), via=(n.comm["via"], "string_val"))
    os.makedirs(out_dir, exist_ok=True)
    local: dict = {}
    per_pe: dict = {p: [] for p in pes}
    for n in ex.nodes:
        local[n.gid] = len(per_pe[n.pe])
        per_pe[n.pe].append(n)
    scenario = ex.stream.header.get("scenario") or ""
    files, counts, size = [], [], 0
    for p in pes:
        meta = pb.GlobalMetadata(version=SCHEMA_VERSION)
        meta.attr.extend([attr("source", "accel-emulator emu trace chakra"), attr("scenario", str(scenario)),
                          attr("pe", p), attr("rank", rank[p]), attr("ranks", len(pes)),
                          attr("time_unit", "ps: start_ps / duration_ps attributes; *_micros fields rounded")])
        out, c = [], {}
        for n in per_pe[p]:
            dur = n.end - n.start
            node = pb.Node(id=local[n.gid], name=n.name, type=n.type,
                           data_deps=[local[d] for d in n.deps], ctrl_deps=[local[d] for d in n.ctrl],
                           start_time_micros=n.start // 1_000_000, duration_micros=round(dur / 1_000_000))
            node.attr.extend([attr("is_cpu_op", False), attr("start_ps", n.start, "uint64_val"),
                              attr("duration_ps", dur, "uint64_val"),
                              attr("engine", n.engine.rsplit("/", 1)[-1])])
            node.attr.extend(attr(k, v, kind) for k, (v, kind) in n.attrs.items())
            out.append(node)
            tname = pb.NodeType.Name(n.type)
            c[tname] = c.get(tname, 0) + 1
        f = os.path.join(out_dir, et_name(rank[p]))
        size += write_et(f, meta, out)
        files.append(f)
        counts.append(c)
    return ExportStats(out_dir, pes, counts, files, size, unmatched, ex.end_ps)

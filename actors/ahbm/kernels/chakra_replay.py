"""Run one rank of a Chakra execution graph on a PE: each node as the ``tl`` op of its engine.

Why a kernel and not a script of timings: every node goes through the PE's real engines (GEMM via the
composite scheduler, MATH, DMA, IPCQ, NOC) as a Trio task, so engine queues, overlap and message
flight emerge as in any kernel; only the order and the dependencies come from the graph.

``ops`` is the rank's list, in a topological order, built by actors/ahbm/tl/chakra_workload.py:
``[key, kind, deps, *args]`` with kind

* ``composite m k n dtype epilogue [a, b, c]`` -- one ``tl.composite("gemm")`` as the original kernel
  issued it: each operand in the TCM (``tcm``) or streamed by the scheduler from HBM (``hbm``);
* ``gemm m k n`` -- a non-blocking ``tl.composite("gemm")`` of TCM operands (fp16 ``[m, k] @ [k, n]``);
* ``math op elements srcs`` -- a non-blocking MATH command on ``srcs`` fp32 vectors of ``elements``;
* ``load shape dtype`` / ``store shape dtype`` -- a DMA between this PE's HBM and its TCM;
* ``send peer shape dtype`` / ``recv peer shape dtype`` -- an IPCQ message (``peer`` a direction) or a
  NOC packet (``peer`` = ``[sip, cube, pe]``).

Before issuing a node the kernel waits for its dependencies that ran on another engine (an engine runs
its commands in order, so a dependency on the same engine needs no wait, as when the original kernel
queued them back to back).  Operands are one TCM tensor per shape, filled by the CPU before the first
node (a fill between two dependent nodes would delay the second);
results live until their last dependant is issued and they are complete (``tl.scratch_scope`` frees
them then, without a wait); results nothing depends on live to the kernel's end (a scope's end would
wait for them: a receive no node reads would block the CPU until its message came).
"""
from __future__ import annotations

__all__ = ["chakra_replay", "ENGINE_OF", "operand_shapes"]

#: the engine each kind runs on: a dependency on the same engine is ordered by the engine's FIFO
ENGINE_OF = {"composite": "sched", "gemm": "sched", "math": "math", "load": "dma", "store": "dma", "send": "ipcq", "recv": "ipcq"}


def chakra_replay(ops, store_addr=0, *, tl):
    """Issue ``ops`` (module docstring) in order; the kernel's end waits for what is still in flight."""
    operands: dict = {}            # (shape, dtype) -> the TCM tensor every op of that shape reads
    live: dict = {}                # key -> result handle still awaited by a later op
    leaves: list = []              # results nothing waits for: kept, so no scope's end waits for them
    engine: dict = {}              # key -> the engine it ran on
    remaining: dict = {}
    for op in ops:
        for d in op[2]:
            remaining[d] = remaining.get(d, 0) + 1
    for shape, dtype in operand_shapes(ops):   # filled up front: no fill lands between two dependent nodes
        _operand(tl, operands, shape, dtype)
    for op in ops:
        with tl.scratch_scope():
            _issue(tl, op, operands, live, leaves, engine, remaining, store_addr)


def operand_shapes(ops) -> list:
    """The ``(shape, dtype)`` of every TCM operand ``ops`` read, in first-use order."""
    out = {}
    for _key, kind, _deps, *args in ops:
        if kind == "composite":
            m, k, n, dtype, _epi, (a, b, _c) = args
            if a == "tcm":
                out[((m, k), dtype)] = None
            if b == "tcm":
                out[((k, n), dtype)] = None
        elif kind == "gemm":
            m, k, n = args
            out[((m, k), "<f2")] = out[((k, n), "<f2")] = None
        elif kind == "math":
            out[((args[1],), "<f4")] = None
        elif kind in ("store", "send"):
            out[(tuple(args[-2]), args[-1])] = None
    return list(out)


def _operand(tl, operands: dict, shape, dtype: str):
    key = (tuple(shape), dtype)
    if key not in operands:
        operands[key] = tl.zeros(key[0], dtype)
    return operands[key]


def _issue(tl, op, operands, live, leaves, engine, remaining, store_addr) -> None:
    key, kind, deps, *args = op
    mine = "noc" if kind in ("send", "recv") and not isinstance(args[0], str) else ENGINE_OF[kind]
    for d in deps:
        remaining[d] -= 1
        h = live.get(d)
        if h is None:
            continue
        if engine[d] != mine:
            tl.wait(h)
        if remaining[d] == 0 and h.pending is None:      # done and needed no more: freed at the scope's end
            del live[d]
    if kind == "composite":
        m, k, n, dtype, epilogue, (a, b, c) = args
        ta = _operand(tl, operands, (m, k), dtype) if a == "tcm" else tl.ref(0, (m, k), dtype)
        tb = _operand(tl, operands, (k, n), dtype) if b == "tcm" else tl.ref(0, (k, n), dtype)
        out = tl.composite("gemm", a=ta, b=tb, epilogue=[tuple(e) for e in epilogue], dtype=dtype,
                           out="tcm" if c == "tcm" else "hbm")
    elif kind == "gemm":
        m, k, n = args
        out = tl.composite("gemm", a=_operand(tl, operands, (m, k), "<f2"), b=_operand(tl, operands, (k, n), "<f2"))
    elif kind == "math":
        name, elements, srcs = args
        x = _operand(tl, operands, (elements,), "<f4")
        out = tl.math(name, *[x] * max(1, srcs), scalar=1.0 if name == "scale" else 0.0)
    elif kind == "load":
        shape, dtype = args
        out = tl.load(0, shape, dtype)
    elif kind == "store":
        shape, dtype = args
        tl.store(store_addr, _operand(tl, operands, shape, dtype))
        out = None
    elif kind == "send":
        peer, shape, dtype = args
        tl.send(peer, _operand(tl, operands, shape, dtype))
        out = None
    else:                                                   # recv
        peer, shape, dtype = args
        out = tl.recv_async(peer, shape, dtype)
    engine[key] = mine
    if out is not None:
        if remaining.get(key):
            live[key] = out
        else:
            leaves.append(out)

"""The ``tl`` object a kernel receives: synchronous Triton-like calls turned into engine commands.

A kernel is a plain Python function ``kernel(**args, tl=tl)`` run by the PE CPU
(cpu.py) inside its Trio task; each ``tl`` call awaits the PE's engines through
``greenback.await_`` (DESIGN.md §4), so the kernel reads like the seed:

    q = tl.load(q_ptr, (M, d))                                   # lazy: returns at once
    S = tl.composite("gemm", a=q, b=tl.ref(k_ptr, (d, T)))        # non-blocking, PE scheduler
    m = tl.maximum(m, tl.max(S, axis=-1))                         # MATH commands
    tl.send("E", m)                                               # IPCQ
    with tl.scratch_scope(): ...                                  # per-tile TCM recycling

Ordering (the "auto-wait at first use" of seed ADR-0062): a command that reads a
handle still being produced waits for its producer unless both run on the same
engine (every engine is FIFO, so a chain of MATH ops streams without a CPU stall).
Blocking calls: ``dot``, ``send``, ``recv``, ``trans``, ``wait``.  Asynchronous:
``load``, ``store``, ``composite``, ``recv_async`` and every MATH op.  The kernel's
end waits for everything still outstanding.

CPU cost model (seed §9 item 6 / ADR-0064): each call first charges the CPU the
dispatch cost of its kind from the profile's ``cpu.dispatch_cycles``
(costs.dispatch_ps): ``dma`` (load, store, and the implicit load of an HBM
result), ``gemm`` (dot), ``math`` (operators, max/sum/exp/maximum, softmax per
MATH command, trans, full), ``composite`` (descriptor push to the scheduler),
``ipcq`` (send, recv to a neighbour), ``noc`` (send, recv to a CUBE-NOC peer).  All-zero ``dispatch_cycles`` reproduces the seed's
baseline assumption (``dispatch_cycles=0``).  Python control flow is free.

Composites follow the engine contract of protocols.ahbm.CompositeCmd: each of A,
B, C is in HBM or in the TCM (seed §B.3).  A TCM operand (``P`` of ``P @ V``, a
``tl.load``-ed ``q``, a received K/V block) is read in place by the scheduler,
cast first to the composite's dtype by one MATH ``cast`` if it differs; an HBM
``tl.ref`` operand (K/V in the cache) is streamed by the scheduler's DMAs.  The
result is a TCM tensor in the current arena (``out="tcm"``, default) or, with
``out="hbm"``, an HBM scratch area (upper half of the PE's HBM, bump-allocated,
burst aligned) DMA-loaded into the TCM at its first MATH use.
"""
from __future__ import annotations

import functools
import math
import types

import greenlet
import numpy as np

from protocols.codec import TensorDesc
from actors.ahbm.costs import MATH_OPS, math_ps
from actors.ahbm.scheduler import EPILOGUE_OPS
from actors.ahbm.tl.errors import KernelError, user_site
from actors.ahbm.tl.handles import TensorHandle, dtype_info, nbytes
from actors.ahbm.tl.scratch import Arena, ScratchScope, scheduler_reserve

__all__ = ["Tl"]

F32 = "<f4"
_DIRS = ("N", "S", "E", "W")


def _await(coro):
    """Run backend coroutine ``coro`` to its end from the kernel's synchronous code.

    Most backend calls (a command pushed into a queue with room, a wait for a command already
    completed, a posted TCM free) finish without suspending: the first step is taken here and, if
    it returns, nothing else happens.  A coroutine that suspends is stepped on through the CPU
    task's greenback portal (:func:`_through_portal`), exactly as ``greenback.await_(coro)`` steps
    it, in this same greenlet, so the order of events, and the trace, are the same either way."""
    try:
        trap = coro.send(None)
    except StopIteration as done:
        return done.value
    return _through_portal(coro, trap)


def _through_portal(coro, trap):
    """Step ``coro`` on from its first yield ``trap`` through the task's greenback portal.

    This is the loop of ``greenback.await_`` without its per-call lookups (which task runs, its
    portal in a weak dictionary, whether ``coro`` is a coroutine: 4-5 % of an AHBM decode's CPU,
    issue #13): run_kernel enters the portal before the kernel starts, so the kernel runs in the
    greenlet greenback made for the task and the portal is that greenlet's parent.  greenback's
    portal protocol (greenback 1.x, tests/test_tl_runtime.py pins it): the kernel's greenlet
    switches to the portal with ``(trap, this greenlet)``; the portal yields the trap to Trio and
    switches back with Trio's answer as an ``outcome``, which is sent (or thrown) into ``coro``."""
    this = greenlet.getcurrent()
    portal = this.parent
    if portal is None:      # the task's root greenlet: no portal was entered (greenback.await_'s own check)
        abort = getattr(trap, "abort_func", None)
        if abort is not None:
            abort(lambda: None)     # undo the wait ``coro`` registered, as a cancellation would
        coro.close()
        raise RuntimeError("a tl call that waits ran outside a kernel: its Trio task has no greenback portal"
                           " (kernels run through actors/ahbm/tl/kernel_registry.run_kernel)")
    while True:
        answer = portal.switch((trap, this))
        try:
            trap = answer.send(coro)
        except StopIteration as done:
            return done.value


@functools.lru_cache(maxsize=1024)
def _broadcast(shapes: tuple) -> tuple:
    """``np.broadcast_shapes`` remembered per operand shapes (a kernel repeats a few); raises ValueError."""
    return tuple(np.broadcast_shapes(*shapes))


async def _in_turn(first, then):
    """Await coroutine ``first``, then coroutine ``then``; the result of ``then``."""
    try:
        await first
    except BaseException:
        then.close()                            # never started: no "never awaited" warning
        raise
    return await then


#: completions a PE's CPU keeps before the tl runtime first lets it drop the ones no handle needs (_forget)
FORGET_MIN = 1024


class Tl:
    """The kernel-side API of one launch on one PE (see the module docstring)."""

    @property
    def prm(self):
        """The machine parameters, the PE CPU's own (read there each time: a fork may change them mid-run,
        actors/ahbm/params.py ``live_change``)."""
        return self.be.prm

    def __init__(self, backend, *, program_id=(0, 0), num_programs=(1, 1)):
        self.be = backend
        self.data = backend.mode == "data"
        self._pid = tuple(program_id)
        self._nprog = tuple(num_programs)
        self.capacity = self.prm.tcm_bytes - scheduler_reserve(self.prm)
        self.used = 0
        self.reported: dict = {}   # this launch's tl.report values (report)
        self.peak = 0
        self.root = Arena(None, "kernel")
        self.arena = self.root
        self.nbuf = 0
        burst = self.prm.burst
        self.hbm_next = self.prm.hbm_capacity // 2
        self.hbm_end = self.prm.hbm_capacity
        self._burst = burst
        self.outstanding: list[int] = []
        self.counts: dict[str, int] = {}
        self._forget_at = FORGET_MIN      # completions kept before the next _forget
        self._math_op = bool(getattr(backend, "math_op", False))
        self._run: list = []    # MATH ops held back to go as one MathRun (fidelity pipeline): [id, op, elements]

    # -- helpers ------------------------------------------------------------------
    def site(self) -> str:
        return user_site(2)

    def error(self, msg: str) -> KernelError:
        return KernelError(self.be.pe, msg, user_site(2))

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def _flush(self) -> None:
        """Send the MATH ops held back (:meth:`_math`) before anything else reaches an engine, waits or reads the
        clock: they cost the CPU the same dispatch time and leave at the same times as one by one
        (PeCpu.math_run), so nothing the kernel does later sees a difference but the messages."""
        run = self._run
        if run:
            self._run = []
            _await(self.be.math_run(run[0][0], [[op, el] for _, op, el in run]))

    def _dispatch(self, kind: str) -> None:
        if self._run:
            self._flush()
        self._count(kind)
        _await(self.be.dispatch(kind))

    def _dispatch_then(self, kind: str, issue):
        """Charge the dispatch of ``kind``, then run backend coroutine ``issue``: one trip through
        the portal instead of two (the same backend calls in the same order as ``_dispatch`` then
        ``_await(issue)``)."""
        if self._run:
            self._flush()
        self._count(kind)
        return _await(_in_turn(self.be.dispatch(kind), issue))

    def _fits(self, shape, dtype) -> bool:
        """Whether :meth:`_new_buf` of ``shape``/``dtype`` succeeds; if not, callers take the step-by-step
        path so that its error comes after the dispatch, as it always did."""
        try:
            return self.used + nbytes(shape, dtype) <= self.capacity
        except Exception:
            return False

    def _new_buf(self, shape, dtype, **kw) -> TensorHandle:
        size = nbytes(shape, dtype)
        if self.used + size > self.capacity:
            raise self.error(
                f"TCM overflow: a {tuple(shape)} {np.dtype(dtype).str} tensor ({size} B) does not fit;"
                f" {self.used} of {self.capacity} B in use (TCM {self.prm.tcm_bytes} B minus"
                f" {scheduler_reserve(self.prm)} B of scheduler buffers). Wrap per-tile temporaries in"
                f" `with tl.scratch_scope():` so they are recycled")
        self.used += size
        self.peak = max(self.peak, self.used)
        self.nbuf += 1
        h = TensorHandle(self, shape, dtype, buf=f"tl/t{self.nbuf}", arena=self.arena, **kw)
        self.arena.handles.append(h)
        return h

    def _hbm_alloc(self, size: int) -> int:
        a = self.hbm_next
        end = a + -(-size // self._burst) * self._burst
        if end > self.hbm_end:
            raise self.error(f"HBM scratch exhausted ({self.hbm_end - self.prm.hbm_capacity // 2} B)")
        self.hbm_next = end
        return a

    def _live(self, h: TensorHandle, what: str) -> TensorHandle:
        if not isinstance(h, TensorHandle):
            raise self.error(f"{what}: expected a TensorHandle, found {type(h).__name__}")
        if h.rt is not self:
            raise self.error(f"{what}: the handle belongs to another kernel launch")
        if h.dead:
            raise self.error(f"{what}: tensor {h.shape} used after {h.dead}")
        return h

    def _settle(self, h: TensorHandle) -> None:
        """Wait for the command producing ``h``."""
        if self._run:
            self._flush()
        if h.pending is not None:
            info = _await(self.be.wait(h.pending))
            h.pending = None
            h.engine = None
            if h.check is not None:
                # a receive's completion says what arrived (IpcqResp.desc, or the CPU's own NOC
                # delivery): checked without reading the TCM back
                want_shape, want_dtype = h.check
                h.check = None
                got_shape, got_dtype = tuple(info["shape"]), info["dtype"]
                if got_shape != want_shape or got_dtype != want_dtype:
                    raise self.error(f"recv expected a {want_shape} {want_dtype} tensor, the neighbour sent"
                                     f" {got_shape} {got_dtype}")

    def _tcm(self, h: TensorHandle, engine: str, what: str) -> str:
        """Make ``h`` readable by a command on ``engine``: its TCM buffer name."""
        self._live(h, what)
        if h.buf is None:
            # HBM-resident (ref or composite result): lazy DMA load into the TCM
            if h.pending is not None and h.engine != "dma":
                self._settle(h)
            self._dispatch("dma")
            t = self._new_buf(h.shape, h.dtype)
            rows, row_bytes = self._rows(h.shape, h.dtype)
            cid = _await(self.be.dma("load", h.addr, rows, row_bytes, row_bytes, t.buf, list(h.shape), h.dtype))
            h.buf, h.arena = t.buf, t.arena
            t.arena.handles.remove(t)
            t.arena.handles.append(h)
            h.pending, h.engine = cid, "dma"
            self.outstanding.append(cid)
        if h.pending is not None and h.engine != engine:
            self._settle(h)
        if h.desc and engine != "math":
            # fidelity pipeline: the MATH engine wrote no descriptor (MathOp); an engine that reads the TCM
            # finds it there, written once the op is done (as the MATH engine's write was)
            h.desc = False
            _await(self.be.tcm_write(h.buf, TensorDesc.of(h.shape, h.dtype)))
        return h.buf

    @staticmethod
    def _read_by(cid: int, engine: str, *hs) -> None:
        """Record that command ``cid`` on ``engine`` reads ``hs`` (its buffers are freed only after it)."""
        for h in hs:
            if h.readers is None:
                h.readers = {}
            h.readers[engine] = cid   # engines are FIFO: the last reader per engine is enough

    @staticmethod
    def _rows(shape, dtype):
        if len(shape) == 0:
            return 1, np.dtype(dtype).itemsize
        rows = shape[0] if len(shape) > 1 else 1
        return rows, nbytes(shape, dtype) // rows

    def _release(self, handles, why: str) -> None:
        """Free ``handles`` once every command producing or reading them is done.  The TCM buffers go in
        one access after the waits (the CPU's allocator releases the scope at once; memory.py): no
        allocation happens in between, so the TCM never holds less than the runtime counts."""
        bufs = []
        if self._run:
            self._flush()
        for h in handles:
            if h.dead is not None:
                continue
            waits = [h.pending] + list((h.readers or {}).values())
            for cid in waits:
                if cid is not None:
                    _await(self.be.wait(cid))
            h.pending = None
            if h.buf is not None and h.arena is not None:
                bufs.append(h.buf)
                self.used -= h.nbytes
                if h in h.arena.handles:
                    h.arena.handles.remove(h)
            h.arena = None
            h.dead = why
        if bufs:
            _await(self.be.tcm_free_all(bufs))
        completed = getattr(self.be, "completed", None)
        if completed is not None and len(completed) > self._forget_at:
            self._forget()

    def _forget(self) -> None:
        """Let the backend drop the completion info no live handle can ask for (PeCpu.forget): the pending
        and reader commands of every handle of the open scopes are kept, the outstanding list loses the
        completed ones (the kernel's end waits for the rest).  Exact: waiting for a completed command
        returns at once either way.  Run at a scope's end once the kept completions doubled."""
        done = self.be.completed
        below = self.be.forgotten_below
        now = self.be.now
        self.outstanding = [c for c in self.outstanding if (c not in done or done[c]["end"] > now) and c >= below]
        keep = set(self.outstanding)
        arena = self.arena
        while arena is not None:
            for h in arena.handles:
                if h.pending is not None:
                    keep.add(h.pending)
                if h.readers:
                    keep.update(h.readers.values())
            arena = arena.parent
        self.be.forget(keep)
        self._forget_at = max(FORGET_MIN, 2 * len(self.be.completed))

    def _push_arena(self, site: str) -> Arena:
        self.arena = Arena(self.arena, site)
        return self.arena

    def _pop_arena(self, arena: Arena) -> None:
        if self.arena is not arena:
            raise self.error("scratch scopes closed out of order")
        self.arena = arena.parent

    # -- geometry, time, reports --------------------------------------------------
    def program_id(self, axis: int) -> int:
        """``axis`` 0: this PE's index in its CUBE, 1: its CUBE index in its SIP (seed TL;DR), 2: its SIP
        (as the launch's ``program_id`` says; a grid of fewer axes reads 0 beyond them)."""
        if axis not in (0, 1, 2):
            raise self.error(f"program_id axis must be 0 (PE), 1 (CUBE) or 2 (SIP), found {axis!r}")
        return self._pid[axis] if axis < len(self._pid) else 0

    def num_programs(self, axis: int) -> int:
        if axis not in (0, 1, 2):
            raise self.error(f"num_programs axis must be 0, 1 or 2, found {axis!r}")
        return self._nprog[axis] if axis < len(self._nprog) else 1

    def now(self) -> int:
        """Current virtual time in ps (for measurements inside kernels)."""
        if self._run:
            self._flush()
        return self.be.now

    def report(self, key: str, value) -> None:
        """Publish ``key`` in the PE CPU's report, and in this launch's own :attr:`reported` (a PE that
        runs several launches, e.g. several requests, keeps one dict per launch: kernel_registry.py)."""
        self.reported[key] = value
        self.be.report(key, value)

    def scratch_scope(self) -> ScratchScope:
        return ScratchScope(self)

    # -- memory -------------------------------------------------------------------
    def ref(self, ptr: int, shape, dtype: str = "<f2") -> TensorHandle:
        """A tensor in this PE's HBM at byte address ``ptr`` (row-major): an operand for composites."""
        if int(ptr) < 0 or int(ptr) + nbytes(shape, dtype) > self.prm.hbm_capacity:
            raise self.error(f"ref {tuple(shape)} at {int(ptr):#x} lies outside this PE's HBM")
        return TensorHandle(self, shape, dtype, addr=int(ptr))

    def load(self, ptr: int, shape, dtype: str = "<f2") -> TensorHandle:
        """Lazy HBM -> TCM load (seed ADR-0062): issues the DMA and returns; waits at first use."""
        h = self.ref(ptr, shape, dtype)
        self._tcm(h, "dma", "load")
        return h

    def load_parts(self, ptr: int, parts) -> list[TensorHandle]:
        """HBM -> TCM load of tensors stored back to back at ``ptr``, ``parts = [(shape, dtype), ...]``, in one
        scatter-gather DMA (protocols.ahbm.DmaGather: one dispatch, one setup, one access per pseudo-channel,
        dma.py) instead of one per tensor.  Asynchronous like :meth:`load`: one handle per part, in order,
        each waiting at first use for the whole transfer."""
        specs = [(tuple(int(n) for n in shape), dtype_info(dtype)[0]) for shape, dtype in parts]
        if not specs:
            raise self.error("load_parts needs at least one part")
        total = sum(nbytes(shape, dtype) for shape, dtype in specs)
        if int(ptr) < 0 or int(ptr) + total > self.prm.hbm_capacity:
            raise self.error(f"load_parts of {total} B at {int(ptr):#x} lies outside this PE's HBM")
        self._dispatch("dma")
        hs = [self._new_buf(shape, dtype) for shape, dtype in specs]
        cid = _await(self.be.dma_gather("load", int(ptr), [[h.buf, list(h.shape), h.dtype] for h in hs]))
        for h in hs:
            h.pending, h.engine = cid, "dma"
        self.outstanding.append(cid)
        return hs

    def store_parts(self, ptr: int, xs) -> None:
        """TCM -> HBM store of ``xs`` back to back at ``ptr`` in one scatter-gather DMA (:meth:`load_parts`'
        counterpart; asynchronous, the kernel's end waits for it).  Waits for every part's producer first."""
        xs = [self._live(x, "store_parts") for x in xs]
        if not xs:
            raise self.error("store_parts needs at least one tensor")
        total = sum(x.nbytes for x in xs)
        if int(ptr) < 0 or int(ptr) + total > self.prm.hbm_capacity:
            raise self.error(f"store_parts of {total} B at {int(ptr):#x} lies outside this PE's HBM")
        bufs = [self._tcm(x, "dma", "store_parts") for x in xs]
        self._dispatch("dma")
        cid = _await(self.be.dma_gather("store", int(ptr), [[b, list(x.shape), x.dtype] for b, x in zip(bufs, xs)]))
        self._read_by(cid, "dma", *xs)
        self.outstanding.append(cid)

    def store(self, ptr: int, x: TensorHandle, dtype: str | None = None) -> None:
        """TCM -> HBM store (asynchronous; the kernel's end waits for it)."""
        x = self._live(x, "store")
        if dtype is not None and np.dtype(dtype).str != x.dtype:
            x = self._math("cast", [x], x.shape, out_dtype=dtype)
        if int(ptr) < 0 or int(ptr) + x.nbytes > self.prm.hbm_capacity:
            raise self.error(f"store of {x.shape} at {int(ptr):#x} lies outside this PE's HBM")
        buf = self._tcm(x, "dma", "store")
        self._dispatch("dma")
        rows, row_bytes = self._rows(x.shape, x.dtype)
        cid = _await(self.be.dma("store", int(ptr), rows, row_bytes, row_bytes, buf, list(x.shape), x.dtype))
        self._read_by(cid, "dma", x)
        self.outstanding.append(cid)

    def full(self, shape, value: float, dtype: str = F32) -> TensorHandle:
        """A new TCM tensor filled with ``value``, written by the CPU (memset at the MATH lane rate:
        ``math_ps("copy", elements)``, assumption)."""
        shape = tuple(int(s) for s in shape)
        self._dispatch("math")
        h = self._new_buf(shape, dtype)
        n = int(np.prod(shape)) if shape else 1
        _await(self.be.cpu_busy(math_ps("copy", n, self.prm), f"fill {n}"))
        data = np.full(shape, value, dtype=np.dtype(dtype)) if self.data else TensorDesc.of(shape, dtype)
        _await(self.be.tcm_write(h.buf, data))
        return h

    def zeros(self, shape, dtype: str = F32) -> TensorHandle:
        return self.full(shape, 0.0, dtype)

    def causal_mask(self, rows: int, cols: int, *, q0: int, q_period: int, k0: int, k_step: int = 1) -> TensorHandle:
        """The additive causal mask of a boundary tile (seed §3, §5.4), written by the CPU like :meth:`full`.

        Row ``r`` is query position ``q0 + r % q_period`` (G query heads folded into M, ``q_period = T_q``);
        column ``c`` is key position ``k0 + c * k_step``; the entry is 0 where ``key <= query`` and -inf
        elsewhere.  Cost: ``math_ps("copy", rows * cols)`` (as a fill; assumption)."""
        shape = (int(rows), int(cols))
        self._dispatch("math")
        h = self._new_buf(shape, F32)
        _await(self.be.cpu_busy(math_ps("copy", shape[0] * shape[1], self.prm), f"mask {shape[0]}x{shape[1]}"))
        if self.data:
            q = q0 + np.arange(shape[0]) % q_period
            k = k0 + np.arange(shape[1]) * k_step
            data = np.where(k[None, :] <= q[:, None], 0.0, -np.inf).astype(np.float32)
        else:
            data = TensorDesc.of(shape, F32)
        _await(self.be.tcm_write(h.buf, data))
        return h

    def wait(self, *hs: TensorHandle):
        """Block until each handle's data is ready (recv_async, load, composite)."""
        for h in hs:
            self._live(h, "wait")
            self._settle(h)
        return hs[0] if len(hs) == 1 else hs

    def wait_any(self, *hs: TensorHandle) -> int:
        """Block until one of ``hs`` is ready; the index of the first to have arrived (arrival order:
        earliest completion time, then argument order).  Used by data-driven reductions (seed §4.3)."""
        if not hs:
            raise self.error("wait_any needs at least one handle")
        if self._run:
            self._flush()
        for h in hs:
            self._live(h, "wait_any")
        ready = [i for i, h in enumerate(hs) if h.pending is None]
        if ready:
            return ready[0]
        i = _await(self.be.wait_any([h.pending for h in hs]))
        self._settle(hs[i])
        return i

    # -- GEMM ---------------------------------------------------------------------
    def dot(self, a: TensorHandle, b: TensorHandle) -> TensorHandle:
        """Blocking GEMM on the PE's GEMM engine: ``a[m, k] @ b[k, n]`` -> fp32 ``[m, n]``."""
        self._live(a, "dot")
        self._live(b, "dot")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise self.error(f"dot: shape mismatch {a.shape} @ {b.shape}")
        m, k = a.shape
        n = b.shape[1]
        ba = self._tcm(a, "gemm", "dot")
        bb = self._tcm(b, "gemm", "dot")
        self._dispatch("gemm")
        out = self._new_buf((m, n), F32)
        cid = _await(self.be.gemm(ba, bb, out.buf, m, k, n))
        self._read_by(cid, "gemm", a, b)
        _await(self.be.wait(cid))
        return out

    def _operand(self, h: TensorHandle, dtype: str, what: str):
        """Where composite operand ``h`` is read from: ``(hbm_addr, "")`` for an HBM-only tensor (a
        ``tl.ref``, streamed by the scheduler's DMAs) or ``(0, tcm_buf)`` for one in the TCM (read there
        by the scheduler, no DMA; seed §B.3), cast to ``dtype`` first by one MATH ``cast`` if needed.
        Also returns the handle the scheduler reads (None for HBM)."""
        self._live(h, what)
        if h.buf is None and h.dtype == dtype:
            if h.pending is not None and h.engine != "sched":
                self._settle(h)
            return h.addr, "", None
        x = h if h.dtype == dtype else self._math("cast", [h], h.shape, out_dtype=dtype)
        return 0, self._tcm(x, "sched", what), x

    def composite(self, op: str = "gemm", a: TensorHandle = None, b=None, *, epilogue=(), dtype: str | None = None,
                  out: str = "tcm"):
        """A non-blocking command (seed §0 ``CompositeCmd``): returns a handle at once.

        ``op="gemm"``: ``epilogue(a @ b)`` on the PE scheduler, which tiles it and streams
        per-tile operand reads -> GEMM -> result writes (actors/ahbm/scheduler.py); ``epilogue``
        is a list of ``(op, scalar)`` steps among the scheduler's EPILOGUE_OPS.  ``dtype`` is the
        GEMM's element type (default: the operands' HBM dtype).  An operand in the TCM (a
        ``tl.load``, a MATH result, a received block) is read there; an HBM ``tl.ref`` is streamed
        by DMA (module docstring).  ``out="tcm"`` (default, seed §B.3: the composite's output in
        the current scratch scope): the result is a TCM tensor, fp32 like :meth:`dot`;
        ``out="hbm"``: the result is written to an HBM scratch area (dtype ``dtype``) and is
        DMA-loaded into the TCM at its first MATH use.  ``op`` = a MATH op name (exp, scale,
        add, ...): that MATH command, issued without waiting.
        """
        if op != "gemm":
            if op not in MATH_OPS:
                raise self.error(f"composite op {op!r}: expected 'gemm' or a MATH op ({', '.join(sorted(MATH_OPS))})")
            srcs = [x for x in (a, b) if x is not None]
            scalar = float(dict(epilogue).get("scale", 0.0)) if op == "scale" else 0.0
            shapes = [self._live(x, "composite").shape for x in srcs]
            return self._math(op, srcs, self._result_shape(op, shapes), scalar=scalar, kind="composite")
        if a is None or b is None:
            raise self.error("composite('gemm') needs a= and b=")
        if out not in ("tcm", "hbm"):
            raise self.error(f"composite out={out!r}: expected 'tcm' or 'hbm'")
        self._live(a, "composite")
        self._live(b, "composite")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise self.error(f"composite gemm: shape mismatch {a.shape} @ {b.shape}")
        if dtype is None:
            dtype = next((x.dtype for x in (b, a) if x.addr is not None), "<f2")
        dtype = np.dtype(dtype).str
        steps = []
        for step in epilogue:
            name, scalar = (step, 0.0) if isinstance(step, str) else (step[0], float(step[1]) if len(step) > 1 else 0.0)
            if name not in EPILOGUE_OPS:
                raise self.error(f"composite epilogue step {name!r}: supported {', '.join(EPILOGUE_OPS)}")
            steps.append([name, scalar])
        a_addr, a_buf, a_read = self._operand(a, dtype, "composite a")
        b_addr, b_buf, b_read = self._operand(b, dtype, "composite b")
        m, k = a.shape
        n = b.shape[1]
        if out == "tcm":
            res = self._new_buf((m, n), F32)
            c_addr, c_buf, c_dtype = 0, res.buf, F32
        else:
            c_addr, c_buf, c_dtype = self._hbm_alloc(nbytes((m, n), dtype)), "", ""
        self._dispatch("composite")
        cid = _await(self.be.composite(a_addr, b_addr, c_addr, m, k, n, dtype, steps, a_buf=a_buf, b_buf=b_buf,
                                       c_buf=c_buf, c_dtype=c_dtype))
        self.outstanding.append(cid)
        self._read_by(cid, "sched", *[x for x in (a_read, b_read) if x is not None])
        if out == "tcm":
            res.pending, res.engine = cid, "sched"
            # fidelity pipeline: the scheduler writes no result descriptor (one GemmBatch, or the held array's
            # block stream: scheduler._run_pipeline, _block); _tcm writes it for another engine
            res.desc = self._math_op
            return res
        return TensorHandle(self, (m, n), dtype, addr=c_addr, pending=cid, engine="sched")

    # -- MATH -----------------------------------------------------------------------
    def _result_shape(self, op: str, shapes) -> tuple:
        if op in ("rowmax", "rowsum"):
            if not shapes[0]:
                raise self.error(f"{op} of a scalar")
            return tuple(shapes[0][:-1]) + (1,)
        try:
            return _broadcast(tuple(tuple(s) for s in shapes))
        except ValueError:
            raise self.error(f"{op}: shape mismatch {' vs '.join(str(s) for s in shapes)}"
                             " (shapes must be equal or broadcastable)") from None

    def _math(self, op: str, srcs, shape, *, scalar: float = 0.0, out_dtype: str = F32, kind: str = "math"):
        bufs = [self._tcm(x, "math", op) for x in srcs]
        if not self._fits(shape, out_dtype):
            self._dispatch(kind)
            self._new_buf(shape, out_dtype)     # raises the overflow error
        out = self._new_buf(shape, out_dtype)
        if self._math_op and kind == "math":   # fidelity pipeline, timing mode: held back for a MathRun (_flush)
            self._count(kind)
            cid = self.be.reserve_id()
            self._run.append([cid, op, max(map(math.prod, [x.shape for x in srcs]))])
            out.desc = True
            self._read_by(cid, "math", *srcs)
            out.pending, out.engine = cid, "math"
            self.outstanding.append(cid)
            return out
        if self._math_op:   # fidelity pipeline, timing mode: the shapes go with the command (PeCpu.math)
            cid = self._dispatch_then(kind, self.be.math(op, bufs, out.buf, float(scalar), dtype_info(out_dtype)[0],
                                                         ([x.shape for x in srcs], shape)))
            out.desc = True
        else:
            cid = self._dispatch_then(kind, self.be.math(op, bufs, out.buf, float(scalar), dtype_info(out_dtype)[0]))
        self._read_by(cid, "math", *srcs)
        out.pending, out.engine = cid, "math"
        self.outstanding.append(cid)
        return out

    def _const(self, value: float) -> TensorHandle:
        return self.full((1,), float(value))

    def _binary(self, op: str, x, y) -> TensorHandle:
        xs = type(x) is TensorHandle or isinstance(x, TensorHandle)
        ys = type(y) is TensorHandle or isinstance(y, TensorHandle)
        if xs and ys:        # the common case: two handles (the checks below, in one step)
            self._live(x, op)
            self._live(y, op)
            return self._math(op, [x, y], self._result_shape(op, [x.shape, y.shape]))
        if not xs and not ys:
            raise self.error(f"{op}: needs at least one TensorHandle")
        for v in (x, y):
            if not isinstance(v, (TensorHandle, int, float, np.floating, np.integer)):
                raise self.error(f"{op}: unsupported operand {type(v).__name__}")
        if xs and not ys and op in ("mul", "div"):
            s = float(y)
            if op == "div":
                if s == 0:
                    raise self.error("division by the constant 0")
                s = 1.0 / s
            return self._math("scale", [self._live(x, op)], x.shape, scalar=s)
        if ys and not xs and op == "mul":
            return self._math("scale", [self._live(y, op)], y.shape, scalar=float(x))
        if not xs:
            x = self._const(x)
        if not ys:
            y = self._const(y)
        self._live(x, op)
        self._live(y, op)
        return self._math(op, [x, y], self._result_shape(op, [x.shape, y.shape]))

    def _axis(self, x: TensorHandle, axis, what: str) -> None:
        self._live(x, what)
        if axis not in (-1, x.ndim - 1, None) or x.ndim == 0:
            raise self.error(f"{what}: only the last axis is supported (row reductions of the MATH engine),"
                             f" found axis={axis!r} for shape {x.shape}")

    def math(self, op: str, *srcs: TensorHandle, scalar: float = 0.0, out_dtype: str = F32) -> TensorHandle:
        """One MATH command by its engine name (``costs.MATH_OPS``: exp, rowmax, add, cast, ...), non-blocking,
        dispatched as a MATH op: for code that replays ops by name (kernels/chakra_replay.py)."""
        if op not in MATH_OPS:
            raise self.error(f"math op {op!r}: expected one of {', '.join(sorted(MATH_OPS))}")
        if not srcs:
            raise self.error(f"math {op}: needs at least one source tensor")
        shapes = [self._live(x, op).shape for x in srcs]
        return self._math(op, list(srcs), self._result_shape(op, shapes), scalar=float(scalar), out_dtype=out_dtype)

    def max(self, x: TensorHandle, axis: int = -1) -> TensorHandle:
        """Row max over the last axis, keepdims: ``[..., n] -> [..., 1]``."""
        self._axis(x, axis, "max")
        return self._math("rowmax", [x], self._result_shape("rowmax", [x.shape]))

    def sum(self, x: TensorHandle, axis: int = -1) -> TensorHandle:
        """Row sum over the last axis, keepdims: ``[..., n] -> [..., 1]``."""
        self._axis(x, axis, "sum")
        return self._math("rowsum", [x], self._result_shape("rowsum", [x.shape]))

    def exp(self, x: TensorHandle) -> TensorHandle:
        return self._math("exp", [self._live(x, "exp")], x.shape)

    def maximum(self, a: TensorHandle, b: TensorHandle) -> TensorHandle:
        return self._binary("maximum", a, b)

    def softmax(self, x: TensorHandle, axis: int = -1) -> TensorHandle:
        """Row softmax: rowmax, sub, exp, rowsum, div (five MATH commands)."""
        self._axis(x, axis, "softmax")
        e = self.exp(x - self.max(x))
        return e / self.sum(e)

    def broadcast(self, x: TensorHandle, shape) -> TensorHandle:
        """``x`` broadcast to ``shape`` (seed ADR-0061): a zero tensor of ``shape`` plus ``x`` (MATH add)."""
        self._live(x, "broadcast")
        shape = tuple(int(s) for s in shape)
        if self._result_shape("broadcast", [x.shape, shape]) != shape:
            raise self.error(f"broadcast: {x.shape} does not broadcast to {shape}")
        return self._binary("add", self.zeros(shape), x)

    def trans(self, x: TensorHandle) -> TensorHandle:
        """A real 2-D transpose (data mode moves the elements), done by the CPU through its TCM
        port in one pass at the MATH lane rate: ``math_ps("copy", elements)`` (assumption: the
        MATH engine of actors/ahbm/mathunit.py has no transpose op)."""
        self._live(x, "trans")
        if x.ndim != 2:
            raise self.error(f"trans: expected a 2-D tensor, found shape {x.shape}")
        buf = self._tcm(x, "cpu", "trans")
        self._dispatch("math")
        out = self._new_buf((x.shape[1], x.shape[0]), x.dtype)
        n = x.shape[0] * x.shape[1]
        _await(self.be.cpu_busy(math_ps("copy", n, self.prm), f"transpose {x.shape[0]}x{x.shape[1]}"))
        data = _await(self.be.tcm_read(buf))
        t = np.ascontiguousarray(np.asarray(data).T) if self.data else TensorDesc.of(out.shape, x.dtype)
        _await(self.be.tcm_write(out.buf, t))
        return out

    # -- IPCQ and NOC ---------------------------------------------------------------
    def _peer(self, d, what: str):
        """``"N"|"S"|"E"|"W"`` (an IPCQ neighbour) or ``[sip, cube, pe]`` (a peer over the CUBE NOC)."""
        if isinstance(d, (list, tuple)):
            prm = self.prm
            if len(d) != 3 or not all(isinstance(x, int) for x in d):
                raise self.error(f"{what}: a NOC peer is [sip, cube, pe], found {d!r}")
            s, c, p = d
            if not (0 <= s < prm.sips and 0 <= c < prm.cubes and 0 <= p < prm.P):
                raise self.error(f"{what}: no PE {list(d)} in this machine ({prm.sips} SIP(s), {prm.cubes} CUBEs,"
                                 f" {prm.P} PEs per CUBE)")
            if list(d) == list(self.be.coord):
                raise self.error(f"{what}: {list(d)} is this PE itself")
            if not self.be.has_noc:
                raise self.error(f"{what}: this PE is not attached to a CUBE NOC router")
            return tuple(d)
        if d not in _DIRS:
            raise self.error(f"{what}: direction must be one of N, S, E, W or a NOC peer [sip, cube, pe],"
                             f" found {d!r}")
        if d not in self.be.dirs:
            raise self.error(f"{what}: no IPCQ neighbour in direction {d!r} (this PE has:"
                             f" {', '.join(self.be.dirs) or 'none'})")
        return d

    def send(self, d, x: TensorHandle) -> None:
        """Push ``x`` to the IPCQ neighbour in direction ``d`` (returns once it is on the wire; blocks
        on credits) or, for ``d = [sip, cube, pe]``, as a packet over the CUBE NOC (XY routed)."""
        peer = self._peer(d, "send")
        if isinstance(peer, tuple):
            buf = self._tcm(x, "cpu", "send")
            self._dispatch("noc")
            _await(self.be.noc_send(peer, buf))
            return
        buf = self._tcm(x, "ipcq", "send")
        cid = self._dispatch_then("ipcq", self._send_wait(peer, buf))
        self._read_by(cid, "ipcq", x)

    async def _send_wait(self, peer: str, buf: str) -> int:
        cid = await self.be.ipcq("send", peer, buf)
        await self.be.wait(cid)
        return cid

    def recv_async(self, d, shape, dtype: str = F32) -> TensorHandle:
        """Post a receive from direction ``d`` (or NOC peer ``[sip, cube, pe]``); returns a handle at
        once (``tl.wait`` or its first use waits)."""
        peer = self._peer(d, "recv")
        shape = tuple(int(s) for s in shape)
        noc = isinstance(peer, tuple)
        kind = "noc" if noc else "ipcq"
        if not self._fits(shape, dtype):
            self._dispatch(kind)
            self._new_buf(shape, dtype)         # raises the overflow error
        h = self._new_buf(shape, dtype)
        cid = self._dispatch_then(kind, self.be.noc_recv(peer, h.buf) if noc else self.be.ipcq("recv", peer, h.buf))
        h.pending, h.engine = cid, "noc" if noc else "ipcq"
        h.check = (shape, np.dtype(dtype).str)
        self.outstanding.append(cid)
        return h

    def recv(self, d, shape, dtype: str = F32) -> TensorHandle:
        """Blocking receive of a ``shape``/``dtype`` tensor from direction ``d`` (or a NOC peer)."""
        h = self.recv_async(d, shape, dtype)
        self._settle(h)
        return h

    # -- end of the kernel ----------------------------------------------------------
    def finish(self) -> dict:
        """The kernel returned: wait for every outstanding command, then free its TCM buffers."""
        if self._run:
            self._flush()
        for cid in self.outstanding:
            _await(self.be.wait(cid))
        self.outstanding.clear()
        arena = self.arena
        while arena is not None:
            self._release(list(arena.handles), "the kernel ended")
            arena = arena.parent
        return {"ops": dict(sorted(self.counts.items())), "tcm_peak_B": self.peak, "tcm_budget_B": self.capacity}

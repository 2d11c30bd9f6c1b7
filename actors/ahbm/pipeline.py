"""``fidelity: pipeline``: a composite's GEMM timings from the engines' formulas (docs/gqa.md "Fidelity").

At the default fidelity (``block``) the PE scheduler streams a composite block by
block (scheduler.py): per K step it copies the step's A and B blocks into its
operand buffers (posted TCM accesses, no time), sends one GemmCmd, waits for the
previous step's Done, and finishes a finished output tile (epilogue MATH ops,
then the block placed into the TCM result).  When A, B and C are all in the TCM
(the seed's ``S = q·Kᵀ`` and ``O = P·V`` of a Ring prefill), none of those
hand-offs crosses a modelled resource but the GEMM array and the MATH engine:
the TCM takes no time and the copies none.  The timings they produce follow from
the engines' cost formulas and the scheduler's loop alone:

* ``send_0`` = when the composite reaches the engine (see the continuation below);
  ``send_{s+1} = max(send_s, E_{s-1})`` (iteration s+1 of the scheduler's loop
  starts once it has closed step s-1), ``E_{-1}`` none for a composite that
  reaches an idle scheduler;
* GEMM s starts at ``max(send_s, start_{s-1} + core_{s-1})`` (the engine is a FIFO
  pipeline, gemm.py) and is done at ``start_s + core_s`` (a K step that names no
  output) or ``start_s + fill_drain + core_s`` (the last K step of its tile);
* ``E_s`` = ``max(send_{s+1}, done_s)`` (the scheduler waits for GEMM s in iteration
  s+1), plus, after the last K step of a tile with an epilogue, the epilogue ops
  (costs.math_ps each, back to back, not before the MATH engine finished the
  previous tile's: ``epi_at`` is when the first starts).

A composite taken ahead by the block scheduler (it reached the scheduler before
the previous composite's last loop iteration ended, ``T_A = send_{last+1}``)
continues the same recurrence (``send_0' = T_A``, ``E_{-1}' = E_last``); one
arriving later starts cold at ``max(arrival, E_last)``.  The GEMM engine runs
this (gemm.py ``GemmBatch``), the MATH engine runs the epilogue ops at their
``epi_at`` times FIFO with its other commands (mathunit.py ``MathBatch``).

A composite with an operand in HBM (the decode's and the no-SP prefill's K/V
tiles) keeps the block stream's DMAs, panels, epilogue commands and their issue
times (scheduler.py ``_block``): the DMA engine and the HBM channels are shared
with the PE CPU and the HBM port, so their contention stays modelled where it
happens.  What goes is the GEMM engine's part of the hand-offs: the scheduler
holds the array for the run (protocols.ahbm.GemmHold) and times each step with
the engine's own formulas (:class:`HeldArray`), the MATH epilogue goes as a
``MathOp`` (shapes in the command, no TCM access), and the TCM block copies
(no time in timing mode) are left out.

What it does not model (the coarser part, measured in docs/gqa.md): the
epilogue is assumed to start on an idle MATH engine when the GEMM engine
computes the next steps' issue times (the MATH engine itself still serves it
after commands queued before it, and the composite completes when both are
done), and a command reaching the MATH engine while it waits for the next
epilogue tile waits for that tile.
"""
from __future__ import annotations

from functools import lru_cache

from actors.ahbm.costs import gemm_occupancy_ps, gemm_ps
from actors.ahbm.hbm_access import channel_bursts, channel_bytes, check_block
from actors.ahbm.tiles import plan
from emulator.schema import Enum

__all__ = ["Schedule", "schedule", "plan_cached", "HeldArray", "HeldDma", "FIDELITY", "FIDELITIES"]

FIDELITIES = ("block", "pipeline", "stream")

#: the workload key (tl kernel workloads: gqa_attention, the baseline attention kernels)
FIDELITY = Enum(list(FIDELITIES), default="block",
                doc="block: the PE scheduler streams composites block by block (every shipped digest); pipeline:"
                    " a TCM-resident composite is one GEMM batch + one epilogue batch timed by the engines'"
                    " formulas, one with an HBM operand keeps its DMAs but times its GEMM steps itself on the"
                    " held array (actors/ahbm/pipeline.py; end-time error in docs/gqa.md \"Fidelity\"); stream: pipeline,"
                    " and the scheduler also times such a composite's loads and stores itself on its PE's held DMA"
                    " engine and HBM stack (another client's access waits for the run's end; error in docs/gqa.md)")


@lru_cache(maxsize=256)
def plan_cached(m: int, k: int, n: int, tile: tuple) -> tuple:
    """tiles.plan, remembered (a kernel repeats a few composite shapes); a tuple of frozen Steps."""
    return tuple(plan(m, k, n, tile))


class Schedule:
    """The outcome of one composite: merged array spans, epilogue start per tile, the loop's state."""
    __slots__ = ("spans", "epi_at", "t_a", "e_last", "free", "mfree", "core_ps", "macs", "done_last", "first_start")

    def __init__(self):
        self.spans: list[list[int]] = []   # [start, end] of back-to-back core cycles
        self.epi_at: list[int] = []        # per output tile with an epilogue: when its first op may start
        self.t_a = self.e_last = self.free = self.mfree = self.core_ps = self.macs = 0
        self.done_last = self.first_start = 0


def _cost(tm: int, tk: int, tn: int, last: bool, prm) -> tuple[int, int]:
    return gemm_occupancy_ps(tm, tk, tn, prm), (gemm_ps(tm, tk, tn, prm) if last else 0)


def schedule(steps, prm, epi_ps: list, send0: int, e_prev: int | None, free0: int, mfree0: int) -> Schedule:
    """The recurrence of the module docstring over ``steps`` (tiles.Step), the engine free at ``free0``."""
    out = Schedule()
    spans = out.spans
    send, e_m1, free, mfree = send0, e_prev, free0, mfree0
    cache: dict = {}
    done = 0
    first = True
    for s in steps:
        key = (s.tm, s.tk, s.tn, s.last)
        c = cache.get(key)
        if c is None:
            c = cache[key] = _cost(s.tm, s.tk, s.tn, s.last, prm)
        core, full = c
        start = send if send > free else free
        if first:
            out.first_start, first = start, False
        end = start + core
        if spans and spans[-1][1] == start:
            spans[-1][1] = end
        else:
            spans.append([start, end])
        free = end
        out.core_ps += core
        out.macs += s.tm * s.tk * s.tn
        done = start + full if s.last else end
        nxt = send if e_m1 is None or e_m1 <= send else e_m1          # send_{s+1}
        e = nxt if nxt > done else done                                 # iteration s+1 has waited for GEMM s
        if s.last and epi_ps:
            out.epi_at.append(e)
            e = (e if e > mfree else mfree) + epi_ps[s.tile]
            mfree = e
        send, e_m1 = nxt, e
    out.t_a, out.e_last, out.free, out.mfree = send, e_m1, free, mfree
    out.done_last = done
    return out


class HeldArray:
    """The GEMM engine's timing (gemm.py), run by the PE scheduler while it holds the array (GemmHold).

    Step i, sent at ``a_i``, starts at ``start_i = max(a_i, x_{i-1})`` (``x_{-1}`` = ``free0``, when the
    engine took the hold); its core cycles end at ``x_i = start_i + core_i`` (costs.gemm_occupancy_ps); it
    completes at ``c_i = x_i`` (a K step that names no output: the partial block stays in the array) or
    ``start_i + gemm_ps`` (fill_drain + core, the last K step of its block); its ``Done`` leaves at
    ``d_i = max(c_i, d_{i-1})`` (completions in command order, ``d_{-1}`` = ``deliv0``, the engine's last
    queued completion at the hold), after a drain span ``[max(x_i, d_{i-1}), c_i]`` when that is not
    empty.  These are the engine's own busy spans; it records them at the release."""

    __slots__ = ("prm", "free", "deliv", "spans", "macs", "core_ps", "_cost")

    def __init__(self, prm, free0: int, deliv0: int):
        self.prm = prm
        self.free, self.deliv = free0, deliv0
        self.spans: list[list] = []
        self.macs = self.core_ps = 0
        self._cost: dict = {}

    def issue(self, now: int, m: int, k: int, n: int, out: bool) -> int:
        """Step ``[m, k] @ [k, n]`` sent at ``now``: when its ``Done`` would leave the engine."""
        key = (m, k, n)
        c = self._cost.get(key)
        if c is None:
            c = self._cost[key] = (gemm_occupancy_ps(m, k, n, self.prm), gemm_ps(m, k, n, self.prm),
                                   f"gemm {m}x{k}x{n}")
        core, full, label = c
        start = now if now > self.free else self.free
        x = start + core
        done = start + full if out else x
        d0 = x if x > self.deliv else self.deliv
        self.spans.append([start, x, label])
        if done > d0:
            self.spans.append([d0, done, "drain"])
        if done > self.deliv:
            self.deliv = done
        self.free = x
        self.macs += m * k * n
        self.core_ps += core
        return self.deliv


class HeldDma:
    """The DMA engine's and the HBM stack's timing (dma.py, memory.HbmStack), run by the PE scheduler while it holds
    them (``fidelity: stream``, protocols.ahbm.DmaHold).

    Command k sent at ``a_k`` (every link between the scheduler, the DMA engine and the stack has no latency):
    its setup starts at ``s_k = max(a_k, e_{k-1}, a slot)`` (``e`` the end of a setup, ``e_{-1}`` when the engine
    took the hold; a slot: fewer than ``dma.outstanding`` data phases still running, else the earliest of them
    ends first) and ends at ``e_k = s_k + dma.setup``; its access reaches the stack at ``e_k`` and channel ``pc``
    holding ``b > 0`` of its bytes (costs.stripe) has its burst from ``max(e_k + access_latency, free_pc)`` for
    ``pc_occupancy_ps(b)``; its data phase, and its ``Done``, end with the last burst (``e_k + access_latency``
    for none: the stack's answer time).  The scheduler's blocks go into no TCM buffer (scheduler.PeScheduler._into)
    and a store's TCM read takes no time, so nothing else is added: these are the formulas the engine and the
    stack apply to the same commands, and only another client's access during the run is timed differently
    (it waits for the release, then meets the channels as the run left them)."""

    __slots__ = ("prm", "setup_end", "running", "free", "pc_busy", "pc_bursts", "pc_bytes", "spans", "stack_spans",
                 "loads", "moved")

    def __init__(self, prm, free0: int, pc_free: list):
        n = prm.pcs
        self.prm = prm
        self.setup_end = free0
        self.running: list[int] = []          # data-phase ends of the commands still running
        self.free = list(pc_free)             # each channel's end of its last burst
        self.pc_busy, self.pc_bursts = [0] * n, [0] * n
        self.pc_bytes = {"read": [0] * n, "write": [0] * n}
        self.spans: list[list] = []           # the engine's setup spans
        self.stack_spans: list[list] = []     # the stack's: one per access, its last burst
        self.loads: list[list] = []
        self.moved = 0

    def issue(self, now: int, op: str, addr: int, rows: int, row_bytes: int, pitch: int) -> int:
        """A ``load`` or ``store`` of the 2-D block sent at ``now``: when its ``Done`` leaves the engine."""
        prm = self.prm
        check_block(prm, "DMA", addr, rows, row_bytes, pitch)
        s = now if now > self.setup_end else self.setup_end
        running = self.running
        if running:
            running[:] = [d for d in running if d > s]
            if len(running) >= prm.dma_outstanding:
                running.sort()
                first = running.pop(0)
                s = first if first > s else s
        e = s + prm.dma_setup
        self.setup_end = e
        self.spans.append([s, e, f"setup {op}"])
        rw = "write" if op == "store" else "read"
        done, last, total, _, _ = channel_bursts(prm, channel_bytes(prm, addr, rows, row_bytes, pitch),
                                                 e + prm.hbm_latency, self.free, self.pc_busy, self.pc_bursts,
                                                 self.pc_bytes[rw])
        self.stack_spans.append([last, done, f"{rw} {total}B"])
        if op == "load":
            self.loads.append([addr, rows * row_bytes])
        self.moved += rows * row_bytes
        running.append(done)
        return done

    def stack_release(self) -> list:
        """The stack's part of the release (protocols.ahbm.HbmHold's fields after ``release``)."""
        return [self.pc_busy, self.pc_bursts, self.pc_bytes["read"], self.pc_bytes["write"], self.free,
                self.stack_spans]

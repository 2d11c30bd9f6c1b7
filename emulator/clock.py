"""The virtual clock: integer picoseconds, advanced inside Trio's run loop.

Design (reference/engine-perf.md, "hook" clock): :class:`VirtualClock` is a
``trio.abc.Clock`` whose :meth:`~VirtualClock.deadline_to_sleep_time` is where
virtual time moves.  Trio calls it only when no task is runnable.  The clock then
pops the earliest time slot of its own heap of ``(time, seq, task)`` entries (or
jumps to the earliest Trio deadline, whichever is first), reschedules every task
due at that instant in ``seq`` order, and tells Trio not to sleep.  There is no
keeper task and no ``MockClock``: one virtual time step costs one pass of Trio's
loop (~5 µs measured, against 24-33 µs for ``MockClock`` autojump).

Trio's own time unit inside an emulated run *is the picosecond*:
``trio.sleep(1000)`` sleeps 1 ns of virtual time, and ``trio.move_on_after`` /
``trio.fail_after`` work on virtual time too.  Those are for watchdogs only:
Trio orders equal deadlines by memory address, so model events must wait
through :func:`sleep_until` / :func:`sleep`, which are ordered by
``(time, seq)`` and therefore reproducible.

When nothing is runnable, no heap entry and no Trio deadline is pending, the
clock calls ``on_idle``; when the next event lies beyond ``limit`` it stops
time at the limit and calls ``on_limit`` (the :class:`~emulator.system.System` turns that into a
deadlock report).  Trio's ``wait_all_tasks_blocked`` waiters are served before
time advances, as with ``MockClock``.

Trio internals relied upon (tested in ``tests/test_trio_internals.py``):
the run loop calls ``deadline_to_sleep_time`` only with an empty run queue,
``runner.reschedule`` may be called from inside it, and the module-level
``trio._core._run._r`` drives the batch-order randomisation that
:func:`deterministic_scheduling` pins.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import math
from typing import Callable

import trio
from trio._core import _instrumentation as _trio_instr
from trio._core import _run as _trio_run

__all__ = ["VirtualClock", "sleep_until", "sleep", "now", "current_clock", "deterministic_scheduling"]

_INF = math.inf
_REACT = 1 << 62  # heap-key offset: ordinary wake-ups sort after deliveries at the same time


class VirtualClock(trio.abc.Clock):
    """Integer-picosecond virtual time for one ``trio.run``."""

    def __init__(self) -> None:
        self.now: int = 0
        self.steps: int = 0  # number of distinct time steps taken
        self._heap: list[list] = []
        self._seq = itertools.count()
        self._reschedule: Callable | None = None
        self._runner = None
        #: called when the whole system is idle; return True if it scheduled something
        self.on_idle: Callable[[], bool] | None = None
        #: called once per time step with the new time (progress display)
        self.on_step: Callable[[int], None] | None = None
        #: virtual time limit: when the next event lies beyond it, time stops at
        #: the limit and ``on_limit`` is called (return True if it scheduled something)
        self.limit: float = _INF
        self.on_limit: Callable[[], bool] | None = None

    # -- trio.abc.Clock -------------------------------------------------------
    def start_clock(self) -> None:
        self._runner = _trio_run.GLOBAL_RUN_CONTEXT.runner
        self._reschedule = self._runner.reschedule
        if type(self._runner.instruments) is _trio_instr.Instruments:
            self._runner.instruments = _FastInstruments(self._runner.instruments)

    def current_time(self) -> int:
        return self.now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        runner = self._runner
        if runner.waiting_for_idle:
            # Let wait_all_tasks_blocked() waiters run before time moves (they
            # are woken by Trio's loop when this timeout's cushion expires).
            return _INF
        heap = self._heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
        t = heap[0][0] if heap else _INF
        if heap and len(heap[0]) == 4 and deadline == _INF and not any(
                e[2] is not None and len(e) == 3 for e in heap):
            # only weak wake-ups (fault timers) remain: the system itself is idle
            if self.on_idle is not None and self.on_idle():
                return 0
        from_heap = t <= deadline
        if not from_heap:
            t = math.ceil(deadline) if deadline != _INF else _INF
        if t == _INF:
            if self.on_idle is not None and self.on_idle():
                return 0
            return _INF
        if t > self.limit:
            if self.now < self.limit:
                self.now = self.limit
            if self.on_limit is not None and self.on_limit():
                return 0
            return _INF
        if t > self.now:
            self.now = t
            self.steps += 1
            if self.on_step is not None:
                self.on_step(t)
        if from_heap:
            reschedule = self._reschedule
            while heap and heap[0][0] == t:
                entry = heapq.heappop(heap)
                task = entry[2]
                if task is not None:
                    entry[2] = None
                    reschedule(task)
        return 0

    # -- the engine's own timed waits ----------------------------------------
    def schedule(self, t: int, task) -> list:
        """Reschedule ``task`` (parked in ``wait_task_rescheduled``) at virtual time ``t``.

        Returns the heap entry; set ``entry[2] = None`` to cancel it.  Entries
        at the same time run in the order they were scheduled.
        """
        entry = [t, next(self._seq) + _REACT, task]
        heapq.heappush(self._heap, entry)
        return entry

    def schedule_delivery(self, t: int, task) -> list:
        """Like :meth:`schedule`, for a link delivering messages at ``t``.

        Deliveries due at an instant run before every other wake-up of that
        instant (the heap key puts them first), so actors reacting at ``t`` see
        every message that arrives at ``t`` -- the "update before evaluate" rule
        of event-driven hardware simulators.  It also lets receivers free link
        credits before their neighbours send, so a dense pipeline does not block
        senders for zero time.
        """
        entry = [t, next(self._seq), task]
        heapq.heappush(self._heap, entry)
        return entry

    def pending(self) -> int:
        """Number of live timed wake-ups."""
        return sum(1 for e in self._heap if e[2] is not None)


class _FastInstruments(dict):
    """A dict-backed stand-in for Trio's ``Instruments`` (same methods, same data).

    Trio checks ``"hook" in runner.instruments`` about 8 times per message
    hop; ``Instruments`` is a ``UserDict``, so each check is a Python-level
    call.  As a real ``dict`` the check runs in C: measured ~8 % more messages
    per second on the sparse ring.  ``add_instrument``/``remove_instrument``/
    ``call`` are Trio's own functions, which reach the mapping through
    ``self.data``.
    """

    __slots__ = ()

    def __init__(self, original):
        super().__init__(original.data)

    @property
    def data(self):
        return self

    add_instrument = _trio_instr.Instruments.add_instrument
    remove_instrument = _trio_instr.Instruments.remove_instrument
    call = _trio_instr.Instruments.call


def current_clock() -> VirtualClock:
    clock = _trio_run.GLOBAL_RUN_CONTEXT.runner.clock
    if not isinstance(clock, VirtualClock):
        raise RuntimeError("not running on an emulator VirtualClock (use emulator.run or System.run)")
    return clock


def now() -> int:
    """Current virtual time in picoseconds."""
    return _trio_run.GLOBAL_RUN_CONTEXT.runner.clock.now


@trio.lowlevel.enable_ki_protection
async def sleep_until(t: int, *, weak: bool = False) -> None:
    """Park the current task until virtual time ``t`` (ps), FIFO among equal times.

    ``t`` equal to now parks until every task runnable at this instant has run
    and the clock comes back to this time slot: a deterministic "yield".

    A ``weak`` wake-up (used by fault timers) does not keep the system busy:
    when only weak wake-ups are pending, the clock reports the system idle
    first (a deadlock is reported when progress stopped, not when the timer
    would fire).
    """
    clock = _trio_run.GLOBAL_RUN_CONTEXT.runner.clock
    if t < clock.now:
        raise ValueError(f"sleep_until({t}) is in the past (now={clock.now})")
    entry = clock.schedule(t, trio.lowlevel.current_task())
    if weak:
        entry.append(True)

    def abort(_raise_cancel):
        entry[2] = None
        return trio.lowlevel.Abort.SUCCEEDED

    await trio.lowlevel.wait_task_rescheduled(abort)


async def sleep(duration: int) -> None:
    """Sleep ``duration`` picoseconds of virtual time (an integer >= 0)."""
    clock = _trio_run.GLOBAL_RUN_CONTEXT.runner.clock
    await sleep_until(clock.now + duration)


class _FifoRandom:
    """Stand-in for Trio's scheduler RNG that makes every run batch FIFO.

    Trio reverses each batch when ``random() < 0.5`` and then pops from the end,
    so always reversing runs tasks in the order they were rescheduled.
    """

    def random(self) -> float:
        return 0.0

    def shuffle(self, seq) -> None:
        return None

    def uniform(self, a, b):
        return a


@contextlib.contextmanager
def deterministic_scheduling():
    """Pin Trio's run-batch order to FIFO for the duration of the block.

    Trio shuffles each batch of runnable tasks with a module-level RNG seeded
    from the OS (engine-perf.md §5: 18 of 18 unseeded runs gave distinct event
    orders).  Every emulator run goes through this context manager.
    """
    saved_r = _trio_run._r
    saved_flag = getattr(_trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", False)
    _trio_run._r = _FifoRandom()
    _trio_run._ALLOW_DETERMINISTIC_SCHEDULING = False
    try:
        yield
    finally:
        _trio_run._r = saved_r
        _trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved_flag

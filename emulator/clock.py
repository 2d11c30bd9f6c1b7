"""The virtual clock: integer picoseconds, advanced inside Trio's run loop.

Design (reference/engine-perf.md, "hook" clock): :class:`VirtualClock` is a
``trio.abc.Clock`` whose :meth:`~VirtualClock.deadline_to_sleep_time` is where
virtual time moves.  Trio calls it only when no task is runnable.  The clock then
takes the earliest instant of its own timed wake-ups (or jumps to the earliest
Trio deadline, whichever is first), reschedules every task due at that instant in
the order they were scheduled (link deliveries first), and tells Trio not to
sleep.  The wake-ups wait in one bucket per instant, only the instants in a heap
(:meth:`VirtualClock.schedule`).  There is no
keeper task and no ``MockClock``: one virtual time step costs one pass of Trio's
loop (~5 µs measured, against 24-33 µs for ``MockClock`` autojump).

Trio's own time unit inside an emulated run *is the picosecond*:
``trio.sleep(1000)`` sleeps 1 ns of virtual time, and ``trio.move_on_after`` /
``trio.fail_after`` work on virtual time too.  Those are for watchdogs only:
Trio orders equal deadlines by memory address, so model events must wait
through :func:`sleep_until` / :func:`sleep`, which are ordered by time, then
scheduling order, and therefore reproducible.

When nothing is runnable, no timed wake-up and no Trio deadline is pending, the
clock calls ``on_idle``; when the next event lies beyond ``limit`` it stops
time at the limit and calls ``on_limit`` (the :class:`~emulator.system.System` turns that into a
deadlock report).  Trio's ``wait_all_tasks_blocked`` waiters are served before
time advances, as with ``MockClock``.

Hot-path park and wake (:func:`park`, :meth:`VirtualClock.wake`): every
engine wait (a timed sleep, a port receive, a link's delivery wait, a sender
waiting for a credit) parks through one generator trap that yields a
``WaitTaskRescheduled`` object cached per task, with one abort function per
task that reads what to undo from ``task.custom_sleep_data`` (public Trio API
for exactly this).  ``trio.lowlevel.wait_task_rescheduled`` allocates that
object, a closure and an ``outcome.Value`` on every wait and goes through
``runner.reschedule``'s checks on every wake; on this machine the cached path
saves about a fifth of a message hop (issue #13, experiment (a)).  The fast
wake sends the woken value itself (None or a tuple) into the parked coroutine
instead of an ``outcome.Value`` (Trio's own reschedules, e.g. a cancellation,
still send outcomes, which :func:`park` unwraps).  Without the internals (or with ``EMU_SAFE_PARK=1``) the same
functions fall back to ``wait_task_rescheduled`` / ``trio.lowlevel.reschedule``.

I/O polling: Trio polls epoll once per pass of its loop, even when it will not
sleep.  :class:`_PacedIO` stands in for the run's I/O manager and makes a
zero-timeout poll only every ``IO_POLL_PASSES`` passes or when ``IO_POLL_WALL_S``
of wall time has passed since the last one, whichever comes first; a poll that
may sleep (timeout > 0) is always made.  So the wall-clock guard, Ctrl-C and the
progress display (which reach the run through Trio's wake-up socket) react
within about a millisecond of wall time whatever the event rate.

Trio internals relied upon (tested in ``tests/test_trio_internals.py``):
the run loop calls ``deadline_to_sleep_time`` only with an empty run queue,
``runner.reschedule`` may be called from inside it, the module-level
``trio._core._run._r`` drives the batch-order randomisation that
:func:`deterministic_scheduling` pins, the run loop accepts any
``WaitTaskRescheduled`` instance as a park message, a task is made runnable by
setting ``_next_send_fn``/``_next_send``/``_abort_func``/``custom_sleep_data``
and appending it to ``runner.runq`` (what ``Runner.reschedule`` does), and the
driver calls ``runner.io_manager.get_events`` / ``process_events`` once per pass, and the loop
reaches cancel-scope deadlines through ``runner.deadlines`` (``add``, ``remove``, ``next_deadline``,
``expire``; :class:`_IdleDeadlines` stands in while there are none).
"""
from __future__ import annotations

import contextlib
import functools
import heapq
import math
import os
import time
import types
from typing import Callable

import trio
from outcome import Value
from trio._core import _instrumentation as _trio_instr
from trio._core import _run as _trio_run

from emulator.trace import CHUNK

__all__ = ["VirtualClock", "sleep_until", "sleep", "now", "current_clock", "deterministic_scheduling",
           "park", "FAST_PARK", "DIRECT_DELIVERY"]

#: zero-timeout I/O polls are made at least every this many loop passes ...
IO_POLL_PASSES = 64
#: ... and at least every this much wall time (seconds)
IO_POLL_WALL_S = 0.001


def _fast_park_available() -> bool:
    """Whether the Trio internals of the fast park/wake path are present (see module docstring)."""
    if os.environ.get("EMU_SAFE_PARK"):
        return False
    wtr = getattr(_trio_run, "WaitTaskRescheduled", None)
    slots = {a.name for a in getattr(_trio_run.Task, "__attrs_attrs__", ())}
    runner_fields = {a.name for a in getattr(_trio_run.Runner, "__attrs_attrs__", ())}
    return (wtr is not None and {"_next_send_fn", "_next_send", "_abort_func", "custom_sleep_data"} <= slots
            and {"runq", "instruments", "is_guest", "io_manager"} <= runner_fields)


#: True when the hot path uses the cached trap and direct wake (else Trio's public API)
FAST_PARK = _fast_park_available()

#: links deliver inside the clock, without a task step (``EMU_LINK_TASK_STEPS=1``: the link tasks deliver)
DIRECT_DELIVERY = FAST_PARK and not os.environ.get("EMU_LINK_TASK_STEPS")

_INF = math.inf


class VirtualClock(trio.abc.Clock):
    """Integer-picosecond virtual time for one ``trio.run``."""

    def __init__(self) -> None:
        self.now: int = 0
        self.fast = FAST_PARK
        #: links deliver inside the clock (:meth:`_run_instant`); set in ``start_clock`` on the fast path
        self.direct = False
        self.deliveries_here = 0   # link wake-ups done by _run_instant instead of the link's task
        self.ended_parked = 0      # tasks ended by end_parked at the end of the run
        self._woken: list = []
        self._defer = _deferred(self._woken)
        self._traps: dict = {}   # task -> its cached WaitTaskRescheduled (fast path)
        self.steps: int = 0  # number of distinct time steps taken
        #: the timed wake-ups, one bucket per instant (see :meth:`schedule`): ``_buckets[t]`` is
        #: ``(deliveries, reactions)``, two lists of entries in scheduling order, and ``_times`` a
        #: heap of the instants that have a bucket
        self._buckets: dict[int, tuple[list, list]] = {}
        self._times: list[int] = []
        self._reschedule: Callable | None = None
        self._runner = None
        #: called when the whole system is idle; return True if it scheduled something
        self.on_idle: Callable[[], bool] | None = None
        #: called once per time step with the new time (progress display)
        self.on_step: Callable[[int], None] | None = None
        #: the recorder's event buffer and its flush: flushed at a time step once it holds CHUNK events
        self.events: list | None = None
        self.flush: Callable[[], None] | None = None
        #: virtual time limit: when the next event lies beyond it, time stops at
        #: the limit and ``on_limit`` is called (return True if it scheduled something)
        self.limit: float = _INF
        self.on_limit: Callable[[], bool] | None = None
        #: an OverflowError raised by the clock's own work (a trace flush, a delivery): the run
        #: stops as at the limit and the supervisor raises it (:meth:`deadline_to_sleep_time`)
        self.overflow: OverflowError | None = None

    # -- trio.abc.Clock -------------------------------------------------------
    def start_clock(self) -> None:
        runner = self._runner = _trio_run.GLOBAL_RUN_CONTEXT.runner
        if type(runner.instruments) is _trio_instr.Instruments:
            runner.instruments = _FastInstruments(runner.instruments)
        if self.fast and runner.is_guest:
            self.fast = False
        if self.fast:
            self.wake = self._make_fast_wake(runner)
            self.direct = DIRECT_DELIVERY
            if not isinstance(runner.io_manager, _PacedIO):
                runner.io_manager = _PacedIO(runner.io_manager)
            if type(runner.deadlines) is _trio_run.Deadlines and not runner.deadlines._heap:
                runner.deadlines = _IdleDeadlines(runner)
            # Trio asks the time once per loop pass: a C-level call instead of a Python frame
            self.current_time = functools.partial(getattr, self, "now")
        else:
            self.wake = _safe_wake
        self._reschedule = self.wake

    @staticmethod
    def _make_fast_wake(runner):
        runq_append = runner.runq.append
        instruments = runner.instruments

        def wake(task, value=None) -> None:
            """Make ``task`` (parked in :func:`park`) runnable; :func:`park` returns ``value`` (None or a tuple).

            What ``Runner.reschedule`` does, minus its asserts and the guest-mode
            check, and with the value sent as it is rather than as an outcome.
            """
            task._next_send_fn = task.coro.send
            task._next_send = value
            task._abort_func = None
            task.custom_sleep_data = None
            runq_append(task)
            if "task_scheduled" in instruments:
                instruments.call("task_scheduled", task)

        return wake

    #: ``wake(task, value=None)``: make a task parked in :func:`park` runnable; park returns
    #: ``value`` (None or a tuple).  Bound in ``start_clock``; the public-API version until then.
    def wake(self, task, value=None) -> None:
        _safe_wake(task, value)

    def end_parked(self, tasks, entry_codes) -> int:
        """End each of ``tasks`` parked in :func:`park` whose coroutine runs one of ``entry_codes``.

        For the end of a decided run (emulator/system.py): the task's registration
        is undone as a cancellation's abort would (clock entry disarmed, port
        waiter or link wait dropped), and :func:`park` raises :class:`RunOver`
        in it, which its guard (the code object it runs) catches.  Trio's
        cancellation of ~10 k parked tasks costs a cancel-status walk, a
        ``Cancelled`` with its reason and an outcome per task; this costs a wake.
        Tasks parked elsewhere (Trio primitives, nurseries) are left to the
        cancellation that follows.  Returns how many it ended (fast path only).
        """
        if not self.fast:
            return 0
        traps = self._traps
        wake = self.wake
        n = 0
        for task in tasks:
            trap = traps.get(task)
            if trap is not None and task._abort_func is trap.abort_func and task.coro.cr_code in entry_codes:
                _abort_data(task)
                wake(task, _END)
                n += 1
        self.ended_parked += n
        return n

    def current_time(self) -> int:
        return self.now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        """Advance virtual time to the next event and wake what is due (see the module docstring).

        This runs inside Trio's loop, outside every task: an exception here would
        abandon the run (``TrioInternalError``, tasks never finished).  The one a
        model can cause here is an ``OverflowError`` -- a product of in-range
        parameters past int64 reaching the trace recorder's msgpack packing in a
        flush or an in-clock delivery.  It is kept in :attr:`overflow` and the run
        stops as at the time limit, so the supervisor task raises it and Trio
        unwinds every task normally.

        The common case comes first: the earliest instant's first entry is live
        and not weak, it lies before any Trio deadline and within the time limit
        (what the general path below would conclude for it, in fewer steps).
        """
        try:
            times = self._times
            if times and self.direct and not self._runner.waiting_for_idle:
                t = times[0]
                if t < deadline and t <= self.limit:
                    deliveries, reactions = self._buckets[t]
                    first = deliveries[0] if deliveries else reactions[0]
                    if first[1] is not None and first[2] is not True:
                        if t > self.now:
                            self._advance(t)
                        self._run_instant(t)
                        return 0
            runner = self._runner
            if runner.waiting_for_idle:
                # Let wait_all_tasks_blocked() waiters run before time moves (they
                # are woken by Trio's loop when this timeout's cushion expires).
                return _INF
            first = self._first_live()      # the earliest live entry (earlier dead buckets dropped)
            t = first[0] if first is not None else _INF
            if first is not None and first[2] is True and deadline == _INF and not any(
                    e[1] is not None and e[2] is not True
                    for bucket in self._buckets.values() for entries in bucket for e in entries):
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
                self._advance(t)
            if from_heap:
                if self.direct and t < deadline:
                    self._run_instant(t)
                    return 0
                reschedule = self._reschedule
                for entries in self._take(t):
                    for entry in entries:
                        task = entry[1]
                        if task is not None:
                            entry[1] = None
                            reschedule(task)
            return 0
        except OverflowError as e:
            self.overflow = e
            self.limit = self.now
            if self.on_limit is not None and self.on_limit():
                return 0
            return _INF

    def _advance(self, t: int) -> None:
        """Move virtual time on to ``t`` (a new time step): a full trace buffer is flushed, the progress
        display told."""
        self.now = t
        self.steps += 1
        events = self.events
        if events is not None and len(events) >= CHUNK:
            self.flush()
        if self.on_step is not None:
            self.on_step(t)

    def _run_instant(self, t: int) -> None:
        """Wake everything due at ``t``; links deliver here, without a task step of their own.

        What the link tasks would do when rescheduled (:meth:`emulator.link.Link.deliver_due`)
        is done right here, before any task of the instant runs, and the tasks
        their deliveries wake are made runnable *after* the tasks due at ``t``.
        That is the order Trio would run them in: the link tasks run first in
        the batch (their bucket's list comes first), and what they wake runs in the
        next batch, after the rest of this one (the proof, step by step, is in
        tests/test_direct_delivery.py's docstring).  All or nothing per instant: if one due link
        cannot deliver here (a message to decode, whose error the link task must
        report), every task is rescheduled as usual.  Only on the fast path and
        when no Trio deadline falls on ``t`` (its cancellations would come
        between the two batches).
        """
        heapq.heappop(self._times)      # self._take(t), inlined
        deliveries, reactions = self._buckets.pop(t)
        wake = self.wake
        links = []   # the links whose deliveries are due (a delivery entry carries its link)
        tasks = []   # every task due at t, in order: the link tasks first
        direct = True
        for entry in deliveries:
            task = entry[1]
            if task is not None:
                entry[1] = None
                link = entry[2]
                links.append(link)
                tasks.append(task)
                if link.task is not task or (link.undecoded and not link.can_deliver_here(t)):
                    direct = False
        if not links:
            for entry in reactions:
                task = entry[1]
                if task is not None:
                    entry[1] = None
                    wake(task)
            return
        # every entry due at t has fired before a delivery runs: a receiver whose co-scheduled
        # wake-up is among them takes its message from ``waiter.got`` in its turn (link.py)
        for entry in reactions:
            task = entry[1]
            if task is not None:
                entry[1] = None
                tasks.append(task)
        if not direct:
            for task in tasks:
                wake(task)
            return
        n = len(links)
        self.deliveries_here += n
        self.wake = self._defer
        try:
            for link in links:
                link.deliver_due(t)
        finally:
            self.wake = wake
        for i in range(n, len(tasks)):
            wake(tasks[i])
        woken = self._woken
        if woken:
            for task, value in woken:
                wake(task, value)
            woken.clear()
        events = self.events   # bounded memory even when virtual time stands still
        if events is not None and len(events) >= CHUNK:
            self.flush()

    def _first_live(self):
        """The earliest live entry, dropping the earlier buckets that hold only cancelled ones; or None."""
        times, buckets = self._times, self._buckets
        while times:
            deliveries, reactions = buckets[times[0]]
            for entry in deliveries:
                if entry[1] is not None:
                    return entry
            for entry in reactions:
                if entry[1] is not None:
                    return entry
            del buckets[heapq.heappop(times)]
        return None

    def _take(self, t: int) -> tuple[list, list]:
        """Remove and return the bucket of instant ``t`` (the earliest one)."""
        heapq.heappop(self._times)
        return self._buckets.pop(t)

    # -- the engine's own timed waits ----------------------------------------
    def schedule(self, t: int, task) -> list:
        """Reschedule ``task`` (parked in :func:`park`) at virtual time ``t``.

        Returns the entry ``[t, task, tag]``; set ``entry[1] = None`` to
        cancel it.  Entries at the same time run in the order they were scheduled,
        after the deliveries of that time (:meth:`schedule_delivery`): each instant
        has a bucket of two lists (deliveries, the rest), and only the instants are
        kept in a heap (a heap of entries compared ``(t, sequence)`` lists on every
        push and pop; most entries of a machine run are due at the current
        instant).  ``tag`` is None, True for a weak wake-up (:func:`sleep_until`)
        or the link of a delivery.
        """
        entry = [t, task, None]
        bucket = self._buckets.get(t)
        if bucket is None:
            bucket = self._buckets[t] = ([], [])
            heapq.heappush(self._times, t)
        bucket[1].append(entry)
        return entry

    def schedule_delivery(self, t: int, task, link) -> list:
        """Like :meth:`schedule`, for ``link`` (whose task is ``task``) delivering messages at ``t``.

        Deliveries due at an instant run before every other wake-up of that
        instant (the first list of its bucket), so actors reacting at ``t`` see
        every message that arrives at ``t`` -- the "update before evaluate" rule
        of event-driven hardware simulators.  It also lets receivers free link
        credits before their neighbours send, so a dense pipeline does not block
        senders for zero time.  (``Link._accept`` inlines this; keep the two alike.)
        """
        entry = [t, task, link]
        bucket = self._buckets.get(t)
        if bucket is None:
            bucket = self._buckets[t] = ([], [])
            heapq.heappush(self._times, t)
        bucket[0].append(entry)
        return entry

    def pending(self) -> int:
        """Number of live timed wake-ups."""
        return sum(1 for bucket in self._buckets.values() for entries in bucket for e in entries
                   if e[1] is not None)


def _deferred(woken: list):
    """A stand-in ``wake`` that only notes whom to wake (:meth:`VirtualClock._run_instant`)."""
    def wake(task, value=None) -> None:
        woken.append((task, value))

    return wake


class _PacedIO:
    """Stands in for the run's I/O manager: zero-timeout polls only now and then (module docstring)."""

    def __init__(self, real):
        self._real = real
        self._real_get = real.get_events
        self._real_process = real.process_events
        self._passes = 0
        self._last = time.perf_counter()
        self.polls = 0
        self.skipped = 0

    def get_events(self, timeout):
        if timeout == 0:
            passes = self._passes = self._passes + 1
            # the wall clock is read every 8th pass only (a pass takes at least a few µs)
            if passes < IO_POLL_PASSES and (passes & 7 or time.perf_counter() - self._last < IO_POLL_WALL_S):
                self.skipped += 1
                return ()
        self._passes = 0
        self.polls += 1
        events = self._real_get(timeout)
        self._last = time.perf_counter()
        return events

    def process_events(self, events) -> None:
        if events:
            self._real_process(events)

    def __getattr__(self, name):
        return getattr(self._real, name)


class _IdleDeadlines:
    """Stands in for the run's ``Deadlines`` while no cancel scope has a deadline (the normal case).

    Trio asks it for the next deadline and to expire the due ones on every pass
    of its loop: two Python calls that find an empty heap.  Here both are C
    calls with the same answers (infinity; nothing expired).  The first deadline
    a cancel scope sets (``move_on_after``, ``fail_after``, ``trio.sleep``) puts
    the real ``Deadlines`` back, for the rest of the run, and is added to it.
    """

    __slots__ = ("_runner", "_real")
    next_deadline = math.inf.__float__              # () -> inf
    expire = frozenset().__contains__               # (now) -> False

    def __init__(self, runner):
        self._runner = runner
        self._real = runner.deadlines

    def add(self, deadline: float, cancel_scope) -> None:
        self._runner.deadlines = self._real
        self._real.add(deadline, cancel_scope)

    def remove(self, deadline: float, cancel_scope) -> None:   # only after an add, which restored the real one
        self._real.remove(deadline, cancel_scope)


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


# -- park / wake ------------------------------------------------------------------
def _abort_data(task) -> None:
    """Undo what a parked task registered: a clock entry (a list) or an object's wait."""
    data = task.custom_sleep_data
    task.custom_sleep_data = None
    if type(data) is list:
        data[1] = None
    elif data is not None:
        data.abort_wait(task)


def _aborter(task):
    """The abort function of a park of ``task``: undo its registration (:func:`_abort_data`)."""
    def abort(_raise_cancel):
        _abort_data(task)
        return trio.lowlevel.Abort.SUCCEEDED

    return abort


class RunOver(BaseException):
    """Raised in a task parked in :func:`park` that :meth:`VirtualClock.end_parked` ends (the run is decided)."""


class _End:
    """Sent into a parked task by :meth:`VirtualClock.end_parked`: :func:`park` unwraps it, which raises."""

    __slots__ = ()

    def unwrap(self):
        raise RunOver


_END = _End()


def forget_task() -> None:
    """The current task is about to return: drop its cached trap (:func:`_fast_park`), or every finished
    sub-task (a DMA command's data phase, ...) stays alive through the cache (issue 22: 33 k finished
    tasks, their coroutines and contexts, held mid-run at an 8K Ring prefill)."""
    clock = getattr(_trio_run.GLOBAL_RUN_CONTEXT.runner, "clock", None)
    traps = getattr(clock, "_traps", None)
    if traps:
        traps.pop(_trio_run.GLOBAL_RUN_CONTEXT.task, None)


def _make_trap(task):
    return _trio_run.WaitTaskRescheduled(_aborter(task))


@types.coroutine
def _fast_park(data):
    task = _trio_run.GLOBAL_RUN_CONTEXT.task
    traps = _trio_run.GLOBAL_RUN_CONTEXT.runner.clock._traps
    trap = traps.get(task)
    if trap is None:
        trap = traps[task] = _make_trap(task)
    task.custom_sleep_data = data
    result = yield trap
    if result is None or type(result) is tuple:
        return result          # sent as it is by the fast wake
    return result.unwrap()     # an outcome from Trio (a cancellation) or the public-API wake


async def _safe_park(data):
    task = trio.lowlevel.current_task()
    task.custom_sleep_data = data
    return await trio.lowlevel.wait_task_rescheduled(_aborter(task))


def _safe_wake(task, value=None) -> None:
    trio.lowlevel.reschedule(task, Value(value))


#: ``await park(data)``: park the current task until :meth:`VirtualClock.wake`
#: wakes it; returns the woken value.  ``data`` says what to undo if the task
#: is cancelled while parked: a clock entry (list, disarmed) or an object
#: with ``abort_wait(task)``.  Callers must be KI-protected (enable_ki_protection).
park = _fast_park if FAST_PARK else _safe_park


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
    entry = clock.schedule(t, _trio_run.GLOBAL_RUN_CONTEXT.task)
    if weak:
        entry[2] = True
    await park(entry)


async def sleep(duration: int) -> None:
    """Sleep ``duration`` picoseconds of virtual time (an integer >= 0)."""
    clock = _trio_run.GLOBAL_RUN_CONTEXT.runner.clock
    await sleep_until(clock.now + duration)


class _FifoRandom:
    """Stand-in for Trio's scheduler RNG that makes every run batch FIFO.

    Trio reverses each batch when ``random() < 0.5`` and then pops from the end,
    so always reversing runs tasks in the order they were rescheduled.
    """

    #: ``random()`` is ``float()``, i.e. 0.0: a C call (Trio calls it once per loop pass)
    random = float

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

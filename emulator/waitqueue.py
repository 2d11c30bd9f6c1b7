"""A FIFO of tasks waiting for a condition: Trio's ``ParkingLot`` on the virtual clock's park/wake.

Actors' internal queues (a router's input-to-output buffer, a DMA's free
slots, an HBM channel's arrivals) wait on one of these.  Waiting and waking
are the same as with ``trio.lowlevel.ParkingLot`` -- FIFO, one wake appends the
task to Trio's run queue exactly as ``trio.lowlevel.reschedule`` does -- so
event order and digests are unchanged.  The difference is the end of a run: a
task parked here is parked in :func:`emulator.clock.park`, so
:meth:`VirtualClock.end_parked` ends it with a wake instead of a Trio
cancellation (issue #13: ~6.4 k such tasks on the idle 4-SIP machine).

:meth:`WaitQueue.start_at_first_unpark` goes further for a sub-task that only
waits here until it has work: it is started at the first unpark instead of at
the run's start, with the same event order (the proof is in its docstring).
Most such tasks of a large machine (HBM channel buses, router outputs) never
get work in a run, and are then never spawned, stepped or ended.
"""
from __future__ import annotations

from collections import deque

from trio._core._run import GLOBAL_RUN_CONTEXT
from trio.lowlevel import enable_ki_protection

from emulator.clock import park

__all__ = ["WaitQueue"]


class WaitQueue:
    """Tasks parked until another task calls :meth:`unpark` (first parked, first woken)."""

    __slots__ = ("_tasks", "_start")

    def __init__(self):
        self._tasks: deque = deque()
        self._start = None   # (Subtasks, fn, args): a sub-task to start at the first unpark

    def start_at_first_unpark(self, group, fn, *args) -> None:
        """Start ``fn(*args)`` in ``group`` (an actor's :meth:`~emulator.actor.Actor.subtasks`) at this
        queue's first :meth:`unpark` instead of now.

        Call it where ``group.start_soon(fn, *args)`` would be, for a sub-task whose first step only
        parks here (``while not work: await queue.park()``, nothing read that could change, nothing
        emitted), when every unpark is made by a task that was woken or started after this call (the
        caller itself after it parks, or a sibling it starts after this call).  Then the events are the
        same as with ``start_soon``: Trio's run queue is FIFO here (``deterministic_scheduling``), so
        the eagerly started task would have run its first step and parked before any unpark, and the
        first unpark would have appended it to the run queue exactly where the spawn appends the new
        task now; later unparks find it parked or already runnable, as before.  A run that never
        unparks never spawns it (at the end of the run there is nothing to end).
        """
        self._start = (group, fn, args)

    def __len__(self) -> int:
        return len(self._tasks)

    @enable_ki_protection
    async def park(self) -> None:
        """Wait until :meth:`unpark` or :meth:`unpark_all` wakes this task."""
        self._tasks.append(GLOBAL_RUN_CONTEXT.task)
        await park(self)

    def abort_wait(self, task) -> None:
        """The parked ``task`` was cancelled (or the run ended): forget it."""
        self._tasks.remove(task)

    def unpark(self) -> None:
        """Wake the longest-parked task, if any."""
        if self._tasks:
            GLOBAL_RUN_CONTEXT.runner.clock.wake(self._tasks.popleft())
        elif self._start is not None:
            self._spawn()

    def _spawn(self) -> None:
        group, fn, args = self._start
        self._start = None
        group.start_soon(fn, *args)

    def unpark_all(self) -> None:
        """Wake every parked task, in the order they parked."""
        tasks, wake = self._tasks, GLOBAL_RUN_CONTEXT.runner.clock.wake
        while tasks:
            wake(tasks.popleft())
        if self._start is not None:
            self._spawn()

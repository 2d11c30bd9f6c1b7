"""A FIFO of tasks waiting for a condition: Trio's ``ParkingLot`` on the virtual clock's park/wake.

Actors' internal queues (a router's input-to-output buffer, a DMA's free
slots, an HBM channel's arrivals) wait on one of these.  Waiting and waking
are the same as with ``trio.lowlevel.ParkingLot`` -- FIFO, one wake appends the
task to Trio's run queue exactly as ``trio.lowlevel.reschedule`` does -- so
event order and digests are unchanged.  The difference is the end of a run: a
task parked here is parked in :func:`emulator.clock.park`, so
:meth:`VirtualClock.end_parked` ends it with a wake instead of a Trio
cancellation (issue #13: ~6.4 k such tasks on the idle 4-SIP machine).
"""
from __future__ import annotations

from collections import deque

from trio._core._run import GLOBAL_RUN_CONTEXT
from trio.lowlevel import enable_ki_protection

from emulator.clock import park

__all__ = ["WaitQueue"]


class WaitQueue:
    """Tasks parked until another task calls :meth:`unpark` (first parked, first woken)."""

    __slots__ = ("_tasks",)

    def __init__(self):
        self._tasks: deque = deque()

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

    def unpark_all(self) -> None:
        """Wake every parked task, in the order they parked."""
        tasks, wake = self._tasks, GLOBAL_RUN_CONTEXT.runner.clock.wake
        while tasks:
            wake(tasks.popleft())

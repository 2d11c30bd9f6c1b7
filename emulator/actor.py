"""The actor base class: one Trio task per hardware component instance.

An actor has a hierarchical name given by its place in the machine
(``sip0/cube05/pe3/dma``), named in- and out-ports, and private state.  It
never touches another actor: the machine builder wires its ports to links, and
everything else is messages.  Subclasses implement :meth:`Actor.run`.

Time inside an actor: :meth:`busy` charges a service time (recorded as a busy
span in the trace; fault hooks may stretch or stall it), :meth:`sleep` waits
without being busy.  Both are integer picoseconds on the virtual clock.

Sub-tasks: an actor that needs concurrent tasks (a router's inputs and
outputs, a DMA's answer readers) opens ``async with self.subtasks() as n`` — one
rule for their errors: the first real error of any sub-task is raised as a plain
exception (:func:`emulator.errors.first_error`), so the run's error report names
the actor and the cause, not an exception group.

``PORTS`` and ``PARAMS`` declare the class's ports (with the messages they carry)
and the parameters it reads (emulator/declare.py); a build checks the ports an
actor creates against them and ``emu explain`` prints them.

``daemon = True`` marks a server (router, engine, memory) that runs forever;
the run is finished when every non-daemon actor has returned.  A server that
names its request port in ``starts_on`` is started by its first request.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import trio

import numpy as np
from trio._core._run import GLOBAL_RUN_CONTEXT
from trio.lowlevel import enable_ki_protection

from emulator import clock as _clock
from emulator.errors import first_error
from emulator.link import InPort, OutPort, select
from emulator.rng import stream
from emulator.trace import BUSY, MARK

__all__ = ["Actor", "Subtasks", "SUBTASK_CODE"]


class Actor:
    """Base class of every modelled component."""

    daemon: bool = False
    #: a server (``daemon``) whose :meth:`run` begins by receiving on this in-port (declared
    #: ``idle``), with nothing before that receive that another actor, the clock or the trace can
    #: see: its task is started by the first message sent to that port instead of at the start of
    #: the run (``System._start_on_first_message``; most engines of a large machine get no work)
    starts_on: str | None = None
    #: the ports and the parameters the class declares (emulator/declare.py: ``In`` / ``Out``, ``Param``)
    PORTS: tuple = ()
    PARAMS: tuple = ()
    #: the attributes a state snapshot shows (``emu run --stop-at``, emulator/snapshot.py): the one hook a
    #: component declares to be inspectable; :meth:`state` may add computed values
    STATE: tuple = ()
    #: list this component in a snapshot even at rest (a memory's occupancy matters when nobody accesses it)
    STATE_AT_REST: bool = False

    def __init__(self, name: str):
        if not name or any(c in name for c in " \t\n"):
            raise ValueError(f"bad actor name {name!r}: non-empty, no whitespace")
        self.name = name
        self.inputs: dict[str, InPort] = {}
        self.outputs: dict[str, OutPort] = {}
        self.system = None
        self.id: int = -1
        self.blocked: dict = {}   # task -> (order, port) while waiting for a credit (emulator.link.waits_of)
        self.busy_ps = 0
        self.busy_spans = 0
        self.busy_until = -1      # the end and label of the latest busy span (a snapshot's "busy until")
        self.busy_label = ""
        self.finished_at: int | None = None
        self.killed = False
        self.cancel_scope = None
        self.faults: list = []   # objects with on_busy(actor, t, duration, label) -> (duration, label) (emulator/faults.py)
        self._emit = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # -- ports ----------------------------------------------------------------
    def in_port(self, name: str, *, idle: bool = False) -> InPort:
        """The in-port ``name`` (created on first use).

        ``idle=True`` marks a request queue: a task waiting on it has nothing
        to do, so a deadlock report counts it instead of listing it.
        """
        port = self.inputs.get(name)
        if port is None:
            port = self.inputs[name] = InPort(self, name, idle)
        return port

    def out_port(self, name: str) -> OutPort:
        port = self.outputs.get(name)
        if port is None:
            port = self.outputs[name] = OutPort(self, name)
        return port

    # -- time -----------------------------------------------------------------
    @property
    def now(self) -> int:
        return self.system.clock.now

    async def sleep(self, duration: int) -> None:
        """Wait ``duration`` ps without being busy."""
        await _clock.sleep_until(self.system.clock.now + duration)

    async def sleep_until(self, t: int) -> None:
        await _clock.sleep_until(t)

    @enable_ki_protection
    async def busy(self, duration: int, label: str = "busy", *, start: int | None = None) -> None:
        """Be busy for ``duration`` ps (a service time): a busy span in the trace.

        ``start`` (>= now) begins the span later, idle until then, in one
        wake-up.  Fault hooks (slow, stall) may lengthen it; the trace shows the
        span as actually taken.
        """
        clock = self.system.clock
        t = clock.now
        if start is not None and start > t:
            t = start
        if self.faults:
            for fault in self.faults:
                duration, label = fault.on_busy(self, t, duration, label)
        end = t + duration
        if duration < 0:
            raise ValueError(f"{self.name}: busy({duration}) is negative")
        self.busy_ps += duration
        self.busy_spans += 1
        self.busy_until = end
        self.busy_label = label
        self._emit((BUSY, t, self.id, end, label))
        # sleep_until inlined: one coroutine frame fewer per service time
        await _clock.park(clock.schedule(end, GLOBAL_RUN_CONTEXT.task))

    def record_spans(self, spans) -> None:
        """Record busy spans ``[[start, end, label], ...]`` another component timed for this one (the PE scheduler
        holding an engine, actors/ahbm/hold.py), each by :meth:`record_busy`, whose fault hooks never act here:
        a held engine refuses faults."""
        for t0, t1, label in spans:
            self.record_busy(t0, t1 - t0, label)

    def record_busy(self, start: int, duration: int, label: str = "busy") -> int:
        """Record the busy span that starts at ``start`` without waiting; its end.

        For an actor that computes several service times in closed form and covers them with one wait of its
        own (one wake-up instead of one per span): the same fault hooks (slow, stall: the span may end
        later), bookkeeping and trace record as :meth:`busy`, emitted when called."""
        if self.faults:
            for fault in self.faults:
                duration, label = fault.on_busy(self, start, duration, label)
        if duration < 0:
            raise ValueError(f"{self.name}: busy({duration}) is negative")
        self.busy_ps += duration
        self.busy_spans += 1
        end = start + duration
        if end > self.busy_until:
            self.busy_until, self.busy_label = end, label
        self._emit((BUSY, start, self.id, end, label))
        return end

    # -- messages -------------------------------------------------------------
    def select(self, *ports: InPort):
        """Receive from whichever of ``ports`` delivers first: ``await self.select(...)`` -> ``(port, message)``.

        (It returns the engine's ``select`` coroutine itself: no coroutine of its own around it.)"""
        return select(*ports)

    # -- randomness and results ------------------------------------------------
    @asynccontextmanager
    async def subtasks(self):
        """A Trio nursery for this actor's concurrent sub-tasks (see the module docstring).

        Leaves when the body and every sub-task have returned; an error in any of
        them cancels the others and is raised plain (first non-cancellation leaf).
        Each sub-task runs under :func:`_quiet_subtask`, so the end of a decided
        run ends it with a wake, like the actor itself (:meth:`VirtualClock.end_parked`);
        the body then does not go on past the ``async with``."""
        group = Subtasks()
        try:
            async with trio.open_nursery() as group.nursery:
                try:
                    yield group
                except _clock.RunOver:   # the body was ended (not raised through the nursery: no exception group)
                    group.over = True
        except BaseExceptionGroup as eg:
            raise first_error(eg) from None
        if group.over:
            raise _clock.RunOver

    def rng(self, name: str = "") -> np.random.Generator:
        """This actor's seeded random stream (``name`` picks a sub-stream)."""
        return stream(self.system.seed, f"{self.name}/{name}" if name else self.name)

    def report(self, key: str, value: Any) -> None:
        """Publish a result of the workload (shown in ``emu run`` output and result.json)."""
        self.system.reports.setdefault(self.name, {})[key] = value

    def mark(self, name: str, value: Any = None) -> None:
        """Put an annotation in the trace (msgpack-able ``value``)."""
        self._emit((MARK, self.system.clock.now, self.id, name, value))

    def detach(self) -> None:
        """Take this actor out of the system it was built in, with its state, to add it to another.

        Its ports forget their links and queued messages, its engine counters and fault hooks are
        reset; its model state (what the constructor and the builder set up) is kept.  Used by
        ``emu trace replay`` to run one actor of a machine alone against recorded inputs.
        """
        self.system = None
        self.id = -1
        self.faults = []
        self.blocked = {}
        self.busy_ps = self.busy_spans = 0
        self.busy_until, self.busy_label = -1, ""
        self.finished_at = None
        self.killed = False
        self.cancel_scope = None
        self._emit = None
        for p in self.inputs.values():
            p.detach()
        for p in self.outputs.values():
            p.detach()

    def replay_blocker(self) -> str | None:
        """Why this actor cannot be replayed alone against recorded messages, or ``None`` (it can).

        An actor whose behaviour depends on more than its messages and parameters (it models its
        links' serialisation itself, say) overrides this; ``emu trace replay`` refuses it up front
        with this reason.
        """
        return None

    def state(self) -> dict:
        """This component's own state for a snapshot: the attributes named in ``STATE`` (summarised:
        emulator/snapshot.py ``value_summary``); override to add computed values (a memory's occupancy)."""
        from emulator.snapshot import value_summary

        return {name: value_summary(getattr(self, name, None)) for name in self.STATE}

    def describe(self) -> dict:
        """Parameters shown by ``emu explain`` (override to add model parameters)."""
        return {"type": type(self).__name__, "daemon": self.daemon,
                "inputs": sorted(self.inputs), "outputs": sorted(self.outputs)}

    async def run(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}.run")


class Subtasks:
    """What :meth:`Actor.subtasks` yields: a nursery's ``start_soon`` with each sub-task guarded."""

    __slots__ = ("nursery", "over")

    def __init__(self):
        self.nursery = None
        self.over = False   # a sub-task was ended by the end of the run (RunOver)

    def start_soon(self, fn, *args, name=None) -> None:
        # name=fn: the task name Trio would give fn itself
        self.nursery.start_soon(_quiet_subtask, self, fn, *args, name=fn if name is None else name)

    def __getattr__(self, attr):
        return getattr(self.nursery, attr)   # the rest of the nursery (cancel_scope, start, ...) as it is


async def _quiet_subtask(group: Subtasks, fn, *args) -> None:
    """Run one sub-task; :class:`~emulator.clock.RunOver` (the run is decided) ends it quietly."""
    try:
        await fn(*args)
    except _clock.RunOver:
        group.over = True
    finally:
        _clock.forget_task()


#: the coroutine code of a guarded sub-task (one :meth:`VirtualClock.end_parked` may end)
SUBTASK_CODE = _quiet_subtask.__code__

"""A built machine: actors, links, the run loop, deadlock reports and the run result.

A machine builder creates a :class:`System`, adds actors and connects their
ports; :meth:`System.run` then runs it on a fresh :class:`VirtualClock` under
deterministic scheduling and returns a :class:`RunResult`.  Inside an existing
Trio run on a ``VirtualClock`` (tests), ``await system.run_async()`` does the same.

A run ends in exactly one of these ways (``RunResult.status``):

* ``finished``: every non-daemon actor returned (or, with none, the system went idle);
* ``deadlock``: nothing runnable, no timed wake-up pending, workload not
  finished.  ``RunResult.deadlock`` lists every blocked actor, the port and
  direction it waits on, its peers and the queue occupancy;
* ``time-limit``: the next event lies beyond ``until``;
* ``wall-timeout``: the optional wall-clock guard fired;
* ``killed``: nothing was left to run because workload actors were killed by a
  fault (the workload did not complete);
* ``error``: an actor or link raised (``RunResult.error`` names it);
* ``interrupted``: stopped from outside (Ctrl-C, SIGTERM: :meth:`System.request_stop`,
  wired to signals by :class:`emulator.interrupt.StopSwitch`); the result is partial
  (virtual time reached, events and messages so far) and the trace still gets its footer.

The supervisor task parks until one of these happens; the clock's idle hook,
the actor wrappers and :meth:`System.request_stop` wake it.  Nothing polls.

``run(footer=False)`` leaves the trace footer to :meth:`System.finish_trace`, so
that a caller that decides the final status after the run (a workload check
turning ``finished`` into ``error``) writes that one status in the footer.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable

import trio
from outcome import Value
from trio._core import _run as _trio_run
from trio.lowlevel import Abort, current_task, current_trio_token, reschedule, wait_task_rescheduled

from emulator.actor import SUBTASK_CODE, Actor
from emulator.clock import RunOver, VirtualClock, current_clock, deterministic_scheduling
from emulator.errors import ActorError, BuildError, EmulatorError
from emulator.faults import fault_summary, killer
from emulator.interrupt import RunStopped
from emulator.link import InPort, Link, OutPort, waits_of
from emulator.rng import stream
from emulator.trace import DONE, ERROR, Recorder, TraceOptions
from emulator.units import format_time

__all__ = ["System", "RunResult", "DeadlockReport", "BlockedActor", "versions", "LAZY_LINK_TASKS", "LAZY_ACTOR_START",
           "building"]

#: start each link's task on its first message (else all at the start of the run);
#: needs Trio's ``Runner.spawn_impl`` (tests/test_trio_internals.py)
LAZY_LINK_TASKS = hasattr(_trio_run.Runner, "spawn_impl") and not os.environ.get("EMU_EAGER_LINKS")

#: start a server that declares ``Actor.starts_on`` at its first message (else at the start of the
#: run, like every other actor); rides on the lazy link tasks, whose first-message hook starts it
LAZY_ACTOR_START = LAZY_LINK_TASKS and not os.environ.get("EMU_EAGER_ACTORS")

#: the last virtual time a run may reach: a run that would pass it ends with status ``time-limit``
HORIZON_PS = 2**62

#: a failing run lists at most this many errors of its failing instant, and counts the rest
MAX_LISTED_ERRORS = 20


@contextmanager
def building():
    """Pause Python's cyclic GC while a machine is built, then freeze what was built.

    A large machine is ~0.5 M long-lived objects (the 4-SIP AHBM: 45 k actors,
    ports and links): built with the GC on, the collector walks the growing
    heap again and again (issue #13: 0.5-1.9 s of the 4-SIP build, growing with
    every machine built in the same process, against 0.25 s with it paused).
    What was built is moved to the permanent generation (``gc.freeze``), which
    :meth:`System.run_async` does anyway; the GC is back on when the block ends,
    also on an error.  The garbage of machines built before (reference cycles,
    freed only by the cyclic GC) is collected first: frozen with the new
    machine it would never be freed, and a sweep builds many machines in one
    process.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


def versions() -> dict:
    import msgpack
    import numpy

    from emulator.version import __version__

    return {"emulator": __version__, "python": sys.version.split()[0], "trio": trio.__version__,
            "numpy": numpy.__version__, "msgpack": ".".join(map(str, msgpack.version))}


@dataclass
class BlockedActor:
    actor: str
    direction: str            # "recv", "send" or "other"
    ports: list[str]
    peers: list[str]
    queue: str                # occupancy, human readable

    def line(self) -> str:
        if self.direction == "other":
            return f"  {self.actor}: blocked outside the engine's ports (a Trio primitive?)"
        arrow = "receiving on" if self.direction == "recv" else "sending on"
        peer_word = "from" if self.direction == "recv" else "to"
        return (f"  {self.actor}: {arrow} {', '.join(self.ports)} {peer_word} {', '.join(self.peers) or '(nobody)'}"
                f" [{self.queue}]")


@dataclass
class DeadlockReport:
    time_ps: int
    blocked: list[BlockedActor]
    unfinished: int
    idle_servers: int = 0      # daemon actors waiting for input, not listed

    def __str__(self) -> str:
        head = (f"deadlock at t={self.time_ps} ps ({format_time(self.time_ps)}): nothing can run, no event is pending,"
                f" and {self.unfinished} workload actor(s) have not finished.\nBlocked actors ({len(self.blocked)}):")
        lines = [head] + [b.line() for b in self.blocked]
        if self.idle_servers:
            lines.append(f"  (and {self.idle_servers} idle server task(s) waiting for input, not listed)")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"time_ps": self.time_ps, "unfinished": self.unfinished, "idle_servers": self.idle_servers,
                "blocked": [b.__dict__ for b in self.blocked]}


@dataclass
class RunResult:
    status: str
    end_time_ps: int
    messages: int
    events: int
    wall_s: float
    digest: str
    seed: int
    time_steps: int
    reports: dict = field(default_factory=dict)
    deadlock: DeadlockReport | None = None
    error: str | None = None
    faults: list = field(default_factory=list)          # every injection (the bundle's faults.json)
    fault_summary: list = field(default_factory=list)   # per fault: matched, fired or not, count by target
    errors: list = field(default_factory=list)          # every error raised at the failing instant
    more_errors: int = 0                                # errors raised after it (not listed)

    @property
    def ok(self) -> bool:
        return self.status == "finished"

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0


class System:
    """The actors and links of one machine instance, and how to run them."""

    def __init__(self, name: str = "system", *, seed: int = 0, mode: str = "timing",
                 trace: TraceOptions | None = None, scenario: dict | None = None):
        if mode not in ("timing", "data"):
            raise BuildError(f"mode must be 'timing' or 'data', found {mode!r}")
        self.name = name
        self.seed = int(seed)
        self.mode = mode
        self.scenario = scenario or {}
        self.actors: dict[str, Actor] = {}
        self.links: list[Link] = []
        self.reports: dict[str, dict] = {}
        self.recorder = Recorder(trace)
        self.clock: VirtualClock | None = None
        self.deliveries = 0
        self.fault_log: list = []
        self.fault_plan: list = []     # what each fault matched (emulator.faults.install_faults)
        self.kills: list = []          # (time, fault, actors) from kill faults
        self._remaining = 0
        self._super_task = None
        self._wake_reason: str | None = None
        self._errors: list[ActorError] = []   # every error of the failing instant, in order
        self._late_errors = 0
        self._nursery = None
        self.lazy_links = LAZY_LINK_TASKS
        self.lazy_actors = LAZY_ACTOR_START
        self._stop_reason: str | None = None
        self._token = None
        self._t0_wall = 0.0
        self.on_step = None  # optional per-time-step callback (progress display)
        #: optional ``on_decided(reason)``: called once the run is decided (finished, deadlock, time limit,
        #: ...), while every task is still parked where it waits -- the moment a state snapshot reads
        #: the machine (emulator/snapshot.py, ``emu run --stop-at``)
        self.on_decided = None
        #: optional ``on_pause() -> bool``: called when virtual time would pass the clock's limit; True when it
        #: woke a task that will move the limit on (a test stepping the run, tools/pytest_plugin.py ``stepped``):
        #: the run is paused there, not ended
        self.on_pause = None
        #: ``checkpoint_every`` ps: the trace digest is recorded at every multiple of it (:meth:`_checkpointer`)
        self.checkpoint_every: int | None = None
        self.checkpoints: list[dict] = []

    # -- building -------------------------------------------------------------
    def add(self, actor: Actor) -> Actor:
        if actor.name in self.actors:
            raise BuildError(f"two actors named {actor.name!r}")
        if actor.system is not None:
            raise BuildError(f"actor {actor.name} already belongs to a system")
        actor.system = self
        actor.id = len(self.actors)
        actor._emit = self.recorder.emit
        self.actors[actor.name] = actor
        return actor

    def add_all(self, actors: Iterable[Actor]) -> None:
        for a in actors:
            self.add(a)

    def connect(self, src: OutPort, dst: InPort, *, capacity: int = 1, latency: int = 0, bandwidth: int = 0,
                name: str | None = None) -> Link:
        """Wire ``src`` to ``dst`` with a new link (one direction)."""
        if src.owner.system is not self or dst.owner.system is not self:
            port = src if src.owner.system is not self else dst
            raise BuildError(f"port {port.path} belongs to an actor not added to this system")
        if src.link is not None:
            raise BuildError(f"out-port {src.path} is already wired to {src.link.name}")
        name = name or f"{src.owner.name}.{src.name}->{dst.owner.name}.{dst.name}"   # src.path->dst.path
        try:
            link = Link(self, len(self.links), name, src, dst, capacity=int(capacity), latency=int(latency),
                        bandwidth=int(bandwidth))
        except ValueError as e:
            raise BuildError(str(e)) from None
        link.emit = self.recorder.emit
        src.link = link
        dst.links.append(link)
        self.links.append(link)
        return link

    def rng(self, name: str):
        return stream(self.seed, name)

    def link(self, name: str) -> Link:
        for l in self.links:
            if l.name == name:
                return l
        raise KeyError(name)

    def header(self) -> dict:
        return {
            "scenario": self.scenario.get("name", self.name), "scenario_resolved": self.scenario,
            "seed": self.seed, "mode": self.mode,
            "versions": versions(), "actors": list(self.actors), "links": [l.describe() for l in self.links],
            "event_kinds": {code: [name, list(fields)] for code, (name, fields) in __import__(
                "emulator.trace", fromlist=["KINDS"]).KINDS.items()},
        }

    # -- running --------------------------------------------------------------
    def run(self, *, until: int | None = None, wall_timeout: float | None = None, footer: bool = True) -> RunResult:
        """Run on a fresh virtual clock, deterministically; returns the result.

        ``footer=False``: the trace file is left without its footer; call
        :meth:`finish_trace` with the final status.
        """
        clock = VirtualClock()
        with deterministic_scheduling():
            try:
                return trio.run(self.run_async, until, wall_timeout, footer, clock=clock,
                                strict_exception_groups=True)
            except BaseException as e:
                # a hard stop (RunStopped raised where the main thread was, see
                # emulator.interrupt) may surface wrapped by Trio
                reason = self._stop_reason or (e.reason if isinstance(e, RunStopped) else None)
                if reason is not None:
                    self._stop_reason = reason
                    return self._result(reason, None, None, footer)
                if isinstance(e, OverflowError):
                    raise _overflow_error(e, clock.now) from None
                raise

    def request_stop(self, reason: str = "interrupted") -> None:
        """Ask the running system to stop (``interrupted``, ``wall-timeout``); safe from a signal handler.

        Sets a flag the clock's per-step hook reads and, through
        ``TrioToken.run_sync_soon`` (signal- and thread-safe), pulls the clock's
        virtual-time limit down to now, so the stop takes whether or not virtual
        time moves.  The run then ends the way a ``time-limit`` does (the clock
        stops before the next event and wakes the supervisor): a stop never
        cancels tasks in the middle of a time step.
        """
        if self._stop_reason is None:
            self._stop_reason = reason
        token = self._token
        if token is not None:
            _safe_soon(token, self._limit_now)

    def _limit_reached(self) -> bool:
        """Virtual time would pass the limit: pause (:attr:`on_pause`) or end the run (``time-limit``, or the
        reason of a stop request)."""
        if (self._stop_reason is None and self.on_pause is not None and self.clock.overflow is None
                and self.on_pause()):
            return True
        return self._wake(self._stop_reason or "time-limit")

    def _limit_now(self) -> None:
        clock = self.clock
        if clock is not None and clock.limit > clock.now:
            clock.limit = clock.now

    async def run_async(self, until: int | None = None, wall_timeout: float | None = None,
                        footer: bool = True) -> RunResult:
        clock = current_clock()
        self.clock = clock
        for link in self.links:
            link.clock = clock
        self._t0_wall = time.perf_counter()
        if self.recorder.options.path is not None:   # the header (45 k link descriptions on 4 SIPs) only for a file
            self.recorder.open(self.header())
        clock.on_idle = self._on_idle
        # the horizon: virtual time never passes 2**62 ps (~53 days), so every time the trace
        # holds (an event's time plus a bounded duration) still fits msgpack's int64
        clock.limit = min(until, HORIZON_PS) if until is not None else HORIZON_PS
        # a stop request (emulator.interrupt) pulls the limit down to now through run_sync_soon,
        # which the clock's I/O poll serves within a bounded wall time (emulator/clock.py)
        clock.on_limit = self._limit_reached
        clock.events, clock.flush = self.recorder.events, self.recorder.flush  # buffer kept bounded per step
        clock.on_step = self._checkpointer(self.on_step) if self.checkpoint_every else self.on_step
        self._remaining = sum(1 for a in self.actors.values() if not a.daemon)
        self._super_task = current_task()
        self._token = current_trio_token()
        if self._stop_reason is not None:      # asked to stop before the run began
            self._limit_now()
        guard = None
        if wall_timeout:
            guard = threading.Timer(wall_timeout, self.request_stop, ("wall-timeout",))
            guard.daemon = True
            guard.start()
        gc_state = gc.get_threshold()
        gc.freeze()  # the built machine is long-lived: keep it out of the cyclic GC (engine-perf.md §6)
        gc.set_threshold(100_000, 50, 100)
        report = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if not self.lazy_links:
                    for link in self.links:
                        nursery.start_soon(self._guard_link, link, name=f"link:{link.name}")
                killable = {a.name for _, _, targets in self.kills for a in targets}
                lazy = self.lazy_actors and self.lazy_links
                for actor in self.actors.values():
                    if lazy and actor.starts_on is not None and actor.daemon and not actor.faults \
                            and actor.name not in killable:
                        port = actor.inputs.get(actor.starts_on)
                        if port is not None and port.idle:   # (else declare.check_actor reports the class)
                            port.unstarted = True            # started by its first message
                            continue
                    nursery.start_soon(self._guard_actor, actor, actor.name in killable, name=actor.name)
                for at, fault, targets in self.kills:
                    nursery.start_soon(killer, self, at, fault, targets, name=f"fault:{fault.label}")
                reason = await self._park()
                if self.on_decided is not None:
                    self.on_decided(reason)
                if reason == "error":
                    await self._collect_errors_at_this_instant()
                if reason == "deadlock":
                    report = self.deadlock_report()
                # the run is decided: end the guarded tasks parked in the engine with a wake each,
                # then cancel whatever is left (tasks in Trio primitives, actors' own nurseries)
                clock.end_parked(_task_tree(nursery.child_tasks), _GUARD_CODES)
                nursery.cancel_scope.cancel()
        finally:
            self._token = None
            gc.set_threshold(*gc_state)
            gc.unfreeze()
            clock.on_idle = None
            clock.on_step = None
            clock.events = clock.flush = None
            clock.on_limit = None
            clock.limit = float("inf")
            if guard is not None:
                guard.cancel()
        if clock.overflow is not None:   # raised in the clock's own work (VirtualClock.deadline_to_sleep_time)
            raise _overflow_error(clock.overflow, clock.now)
        status = reason
        if status == "finished" and any(a.killed and not a.daemon for a in self.actors.values()):
            status = "killed"   # it ended only because unfinished workload actors were killed
        error_text = None
        errors, more = self._listed_errors()
        if reason == "error":
            for e, text in zip(self._errors, errors):
                self.recorder.emit((ERROR, e.time_ps, e.where, text))
            error_text = errors[0] if len(self._errors) == 1 else (
                f"{len(self._errors)} errors at t={self._errors[0].time_ps} ps:\n" +
                "\n".join(f"  {text}" for text in errors))
            if more:
                error_text += f"\n  (and {more} further error(s), not listed)"
        elif reason == "deadlock":
            self.recorder.emit((ERROR, clock.now, "deadlock", str(report)))
        return self._result(status, report, error_text, footer)

    def _result(self, status: str, report, error_text, footer: bool) -> RunResult:
        end = self.clock.now if self.clock is not None else 0
        wall = time.perf_counter() - self._t0_wall if self._t0_wall else 0.0
        self.recorder.flush()
        digest = self.recorder.digest
        errors, more = self._listed_errors()
        if footer:
            self.finish_trace(status, end)
        return RunResult(
            status=status, end_time_ps=end, messages=sum(l.delivered for l in self.links),
            events=self.recorder.count, wall_s=wall, digest=digest, seed=self.seed,
            time_steps=self.clock.steps if self.clock is not None else 0,
            reports=self.reports, deadlock=report, error=error_text, faults=list(self.fault_log),
            fault_summary=fault_summary(self.fault_plan, self.fault_log),
            errors=errors, more_errors=more,
        )

    def _listed_errors(self) -> tuple[list[str], int]:
        """The first ``MAX_LISTED_ERRORS`` errors as text, and how many more there were."""
        return ([str(e) for e in self._errors[:MAX_LISTED_ERRORS]],
                self._late_errors + max(0, len(self._errors) - MAX_LISTED_ERRORS))

    def stop_result(self, status: str) -> RunResult:
        """The partial result of a run stopped from outside, now, with the trace footer written.

        For a watchdog thread while the main thread is stuck in one C call
        (:mod:`emulator.interrupt`): it reads the clock and counters as they are.
        """
        return self._result(status, None, None, True)

    def finish_trace(self, status: str, end_time_ps: int) -> str:
        """Write the trace footer with the run's final ``status`` (once); returns the digest."""
        return self.recorder.close({"end_time_ps": end_time_ps, "status": status})

    async def _guard_actor(self, actor: Actor, killable: bool = False) -> None:
        try:
            if killable:   # a kill fault targets it: its own cancel scope (emulator.faults.killer)
                with trio.CancelScope() as actor.cancel_scope:
                    await actor.run()
            else:          # no scope to enter and close: ~8.5 k of them on the 4-SIP machine (issue #13)
                await actor.run()
        except trio.Cancelled:
            if self._wake_reason is not None:
                return   # the run is over: end quietly (a Cancelled per task costs Trio a formatted reason)
            raise
        except RunOver:  # the run is over (VirtualClock.end_parked)
            return
        except RunStopped as e:       # a hard stop landed in this actor's code
            self.request_stop(e.reason)
            self._limit_now()
            return
        except BaseException as e:  # report, do not crash the runner
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if self._stop_reason is not None:   # e.g. RunStopped inside an actor's own nursery
                self._limit_now()
                return
            self._fail(ActorError(f"actor {actor.name}", self.clock.now, e))
            return
        if actor.killed:
            actor.blocked.clear()
            if not actor.daemon:
                self._remaining -= 1
                if self._remaining == 0:
                    self._wake("finished")
            return
        actor.finished_at = self.clock.now
        self.recorder.emit((DONE, self.clock.now, actor.id))
        self.recorder.maybe_flush()
        if not actor.daemon:
            self._remaining -= 1
            if self._remaining == 0:
                self._wake("finished")

    def _spawn_link(self, link: Link):
        """Start ``link``'s task and return it (Trio's ``spawn_impl``: ``start_soon`` returns no task).

        Link tasks are started on a link's first message (``LAZY_LINK_TASKS``):
        most links of a large machine carry nothing in a given run, and their
        tasks would only be spawned, parked and cancelled (issue #13: the
        4-SIP machine has ~37 k links).  A link's task does nothing until its
        first message anyway, and the message's delivery wake-up is put on the
        clock heap when the message enters the link, as before, so event order
        and digests are the same either way.
        """
        return _trio_run.GLOBAL_RUN_CONTEXT.runner.spawn_impl(self._guard_link, (link,), self._nursery,
                                                             f"link:{link.name}")

    def _start_on_first_message(self, port: InPort) -> None:
        """Start the task of ``port``'s owner, a server that declares ``starts_on`` = this port, as its
        first message enters a link to it (Link._accept, before the link looks at the port's waiter).

        Most servers of a large machine (the 4-SIP machine's 4,096 HBM channels, 512 TCMs and
        512 of each PE engine) get no work in a given run; started at the run's start, each
        would be spawned, take one step to park in its first receive, and be ended (issue #13:
        the idle machine's fixed cost).  The run is the same either way:

        * until its first message nothing can reach such an actor (its only way in is the
          port), and its run did nothing before the receive that anyone could see;
        * the port is armed now with the waiter that receive would have left (``arm_for``),
          so the sender's link co-schedules the receiver as it would have, and any later
          sender sees a parked receiver;
        * the new task's first step only parks on that waiter, and it runs before the
          message can be delivered: a delivery needs the clock, which moves only once no
          task is runnable, and no other message is in flight to the port (this one is
          the first on any of its links).

        tests/test_lazy_actors.py compares real scenarios both ways (``EMU_EAGER_ACTORS=1``).
        """
        port.unstarted = False
        actor = port.owner
        task = _trio_run.GLOBAL_RUN_CONTEXT.runner.spawn_impl(self._guard_actor, (actor, False), self._nursery,
                                                              actor.name)
        port.arm_for(task)

    async def _guard_link(self, link: Link) -> None:
        try:
            await link.run()
        except trio.Cancelled:
            if self._wake_reason is not None:
                return   # the run is over: end quietly
            raise
        except RunOver:
            return
        except Exception as e:
            self._fail(ActorError(f"link {link.name}", self.clock.now, e))

    def _fail(self, err: ActorError) -> None:
        """Record an error; the first wakes the supervisor, which gathers the rest of that instant."""
        if not self._errors or err.time_ps == self._errors[0].time_ps:
            self._errors.append(err)
        else:
            self._late_errors += 1
        self._wake("error")

    async def _collect_errors_at_this_instant(self) -> None:
        """Let every task runnable at the failing instant run, so all its errors are reported (issue 15).

        Virtual time is held at the instant (the clock's limit), and the
        supervisor waits until the clock is idle or would pass it; errors raised
        meanwhile at the same time join ``_errors``.
        """
        clock = self.clock
        clock.limit = clock.now
        clock.on_limit = lambda: self._wake("limit")
        clock.on_idle = lambda: self._wake("idle")
        while True:
            self._wake_reason = None
            if await self._park() != "error":   # idle, limit (or the wall-clock guard): the instant is over
                return

    def _wake(self, reason: str) -> bool:
        if self._super_task is not None and self._wake_reason is None:
            self._wake_reason = reason
            reschedule(self._super_task, Value(reason))
            return True
        return False

    def _on_idle(self) -> bool:
        if self._stop_reason is not None:
            return self._wake(self._stop_reason)
        if self._remaining > 0:
            return self._wake("deadlock")
        return self._wake("finished")

    async def _park(self) -> str:
        if self._remaining == 0 and not self.actors:
            return "finished"

        def abort(_):
            return Abort.FAILED

        return await wait_task_rescheduled(abort)

    def _checkpointer(self, inner):
        """The per-step hook that records checkpoints: at a time step ``t`` that passes one or more multiples
        ``b`` of ``checkpoint_every``, the digest and count of the events so far -- every event of the steps
        before ``t``, so the run's state at each such ``b`` -- as ``{"from_ps", "t_ps", "events",
        "digest"}`` (``from_ps`` .. ``t_ps``: the multiples it covers: nothing happened between them).  Two
        runs whose digests differ at ``b`` and agree at ``b - every`` diverge within that interval
        (``emu bisect``); recording costs one flush and a hash copy per checkpoint, no trace file."""
        every, rec, marks = self.checkpoint_every, self.recorder, self.checkpoints
        due = [every]

        def on_step(t: int) -> None:
            if t >= due[0]:
                rec.flush()
                last = t - t % every
                marks.append({"from_ps": due[0], "t_ps": last, "events": rec.count, "digest": rec.digest})
                due[0] = last + every
            if inner is not None:
                inner(t)
        return on_step

    def actor_tasks(self) -> dict:
        """Actor name -> its Trio tasks (the guarded task and its sub-tasks), while the system runs."""
        if self._nursery is None:
            return {}
        return {t.name: list(_task_tree([t])) for t in self._nursery.child_tasks if t.name in self.actors}

    # -- reports --------------------------------------------------------------
    def deadlock_report(self) -> DeadlockReport:
        """Who waits on what when the system is stuck.

        Listed: every unfinished workload (non-daemon) actor -- each of its
        blocked tasks, or "blocked outside the engine's ports" -- and every
        blocked task of a server (daemon), except the ones waiting on request
        queues (in-ports marked ``idle``): those have nothing to do and are
        only counted.
        """
        blocked, idle = [], 0
        for actor in sorted(self.actors.values(), key=lambda a: a.daemon):
            if actor.finished_at is not None or actor.killed:
                continue
            states = waits_of(actor)
            if not states:
                if not actor.daemon:
                    blocked.append(BlockedActor(actor.name, "other", [], [], ""))
                elif actor.starts_on is not None and getattr(actor.inputs.get(actor.starts_on), "unstarted", False):
                    idle += 1    # not started yet: it waits for its first request
                continue
            for direction, what in states:
                if direction == "recv":
                    if actor.daemon and all(p.idle for p in what):
                        idle += 1
                        continue
                    ports = list(what)
                    links = [l for p in ports for l in p.links]
                    peers = sorted({l.src.owner.name for l in links})
                    queue = "; ".join(
                        f"{l.name}: {len(l.inflight)} in flight, {l.outstanding}/{l.capacity} credits used"
                        for l in links) or "no incoming links"
                    blocked.append(BlockedActor(actor.name, "recv", [p.path for p in ports], peers, queue))
                else:
                    l = what.link
                    queue = (f"{l.name}: {l.outstanding}/{l.capacity} credits used, {len(l.inflight)} in flight,"
                             f" {len(l.dst.buf)} waiting in {l.dst.path}")
                    blocked.append(BlockedActor(actor.name, "send", [what.path], [l.dst.owner.name], queue))
        unfinished = sum(1 for a in self.actors.values()
                         if not a.daemon and a.finished_at is None and not a.killed)
        return DeadlockReport(self.clock.now, blocked, unfinished, idle)

    def actor_metrics(self, end_time: int) -> list[dict]:
        rows = []
        for a in self.actors.values():
            rows.append({"actor": a.name, "type": type(a).__name__, "busy_ps": a.busy_ps, "spans": a.busy_spans,
                         "utilisation": (a.busy_ps / end_time) if end_time else 0.0,
                         "finished_at_ps": a.finished_at})
        return rows

    def link_metrics(self, end_time: int) -> list[dict]:
        """Per-link counters (``links.csv``; columns in docs/outputs-links.md).

        ``max_depth`` is the peak number of messages waiting in the receiving in-port (all the links
        into that port), a message handed straight to a waiting receiver counting as 1 -- the same
        number ``emu trace summary`` reads from the DELIVER events' depth.
        """
        rows = []
        for l in self.links:
            rows.append({"link": l.name, "messages": l.messages, "bytes": l.bytes, "delivered": l.delivered,
                         "dropped": l.dropped, "busy_ps": l.busy_ps,
                         "utilisation": (l.busy_ps / end_time) if end_time else 0.0,
                         "sender_blocked": l.blocked_count,
                         "max_depth": max(l.dst.max_depth, 1 if l.dst.taken else 0)})
        return rows


#: the coroutines :meth:`VirtualClock.end_parked` may end: the guards, which catch :class:`RunOver`
#: (an actor's, a link's and a sub-task's in an actor's nursery, emulator/actor.py)
_GUARD_CODES = frozenset((System._guard_actor.__code__, System._guard_link.__code__, SUBTASK_CODE))


def _task_tree(tasks):
    """``tasks`` and, depth first, the tasks of their nurseries (actors' sub-tasks)."""
    for task in tasks:
        yield task
        for nursery in task.child_nurseries:
            yield from _task_tree(nursery.child_tasks)


def _safe_soon(token, fn, *args) -> None:
    try:
        token.run_sync_soon(fn, *args)
    except trio.RunFinishedError:
        pass


def _overflow_error(cause: OverflowError, now: int) -> EmulatorError:
    """The error for an int64 overflow: the recorder packs every event as int64 (msgpack), and a
    product of in-range parameters (cycles x period, bytes / bandwidth) passed it."""
    return EmulatorError(f"a time or size computed by the model passed the engine's 64-bit integer range near "
                         f"t={now} ps ({cause}): a parameter is too large for this machine")

"""pytest plugin for async integration tests against emulated machines.

Why: a kernel or hardware architect wants to state properties of a run --
"every partial reaches the root within 300 ns", "the DMA finishes before the
GEMM starts", "a dropped message deadlocks the root" -- as ordinary tests that
run in-process, on virtual time, in milliseconds.

Installing the package registers this plugin with pytest (entry point
``pytest11``, name ``tools.pytest_plugin``), so a test file anywhere needs no
configuration::

    async def test_reduce_latency(vclock, emu_sim):
        run = await emu_sim.run("scenarios/demo/reduce.yaml",
                                set=["workload.params.rounds=1"],
                                faults=[{"kind": "delay", "link": "cube05/pe1*", "delay": "50ns"}])
        assert run.status == "finished"
        run.assert_latency(link="cube00/pe1*", max="200ns")
        assert run.count("deliver", link="cube05/*") == 8
        assert run.metric("max_abs_err") < 1e-5        # what the workload's check measured

What the plugin provides:

* ``vclock``: a fresh :class:`~emulator.clock.VirtualClock` with Trio's
  scheduling order pinned (deterministic runs).  pytest-trio runs a test on
  any clock fixture it requests, so the test runs on virtual picoseconds;
* ``async def`` tests that use ``vclock`` or ``emu_sim`` are marked for
  pytest-trio even without ``trio_mode = true`` in the project's pytest
  configuration (other async tests are left alone);
* ``emu_sim``: ``await emu_sim.run(...)`` runs one scenario inside the test's
  own Trio run, on its clock (a system's times are absolute from 0, so one such
  run per test); ``emu_sim.run_sync(...)`` (plain ``def`` tests) runs any number
  of scenarios, each in its own Trio run, and ``emu_sim.compare(a, b)`` gives
  their end-time, per-link and per-actor deltas (:mod:`tools.trace.compare`).

A :class:`SimRun` has the run's result (``status``, ``end_time``, ``digest``,
``messages``, ``events``, ``seed``, ``deadlock``, ``error``), ``json`` (the
dictionary ``emu run --json`` prints and ``result.json`` holds, same keys),
``metrics`` (what the workload's check measured: ``latency_ps``,
``ratio_to_bound``, ``tok_per_s``, ``max_abs_err``, ... -- docs/outputs.md has
them per workload) with :meth:`SimRun.metric` and :meth:`SimRun.assert_metric`,
and the trace with event queries and assertions.

``emu_sim.run`` validates exactly like ``emu run`` (``set`` items are
``--set key.path=value`` strings; ``faults`` are extra fault entries appended
to the scenario's, validated against the fault schema), records a full trace
to the test's temporary directory and returns a :class:`SimRun` with event
queries (:meth:`SimRun.events`) and assertions whose failure messages name
the events involved.  A relative scenario path that does not exist from the
current directory is looked up in the emulator's own ``scenarios/`` (so
``"scenarios/demo/reduce.yaml"`` works from any project with a source install).

Needs pytest-trio (``pip install 'accel-emulator[test]'``).
"""
from __future__ import annotations

import fnmatch
import inspect
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from emulator.clock import VirtualClock, current_clock, deterministic_scheduling
from emulator.system import HORIZON_PS
from emulator.trace import BLOCK, FAULT, KIND_CODES, KINDS, SEND, TraceFile, read_trace
from emulator.units import format_time, parse_time

__all__ = ["emu_sim", "SimHarness", "SimRun", "Event", "vclock"]

@pytest.fixture
def vclock():
    """A virtual clock for the test (pytest-trio runs the test on it), with deterministic scheduling."""
    with deterministic_scheduling():
        yield VirtualClock()


def pytest_collection_modifyitems(config, items):
    """Mark ``async def`` tests that use the emulator's fixtures for pytest-trio (no ``trio_mode`` needed)."""
    try:
        trio_mode = config.getini("trio_mode")
    except ValueError:
        trio_mode = None          # pytest-trio is not installed
    if trio_mode:
        return
    for item in items:
        fn = getattr(item, "obj", None)
        names = getattr(item, "fixturenames", ())
        if not (inspect.iscoroutinefunction(fn) and ("vclock" in names or "emu_sim" in names)):
            continue
        if trio_mode is None:
            raise pytest.UsageError(f"{item.nodeid}: async emulator tests need pytest-trio "
                                    "(pip install 'accel-emulator[test]')")
        if item.get_closest_marker("trio") is None:
            item.add_marker(pytest.mark.trio)


class Event:
    """One trace event with names resolved: ``ev.kind``, ``ev.t`` and the kind's fields.

    Link events also carry ``src`` and ``dst`` (actor names); ``ev.actor`` is
    the actor the event belongs to (sender of a send/block, receiver of a
    deliver/take, the target of a fault).  A fault event's label (the trace
    field ``kind``) is ``ev.fault``, since ``ev.kind`` is always the event kind.
    """

    __slots__ = ("kind", "t", "fields", "index")

    def __init__(self, kind: str, t: int, fields: dict, index: int):
        self.kind = kind
        self.t = t
        self.fields = fields
        self.index = index

    def __getattr__(self, name):
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(f"{self.kind} event has no field {name!r} (fields: {', '.join(self.fields)})") \
                from None

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'<%d bytes>' % len(v) if isinstance(v, bytes) else v}"
                          for k, v in self.fields.items() if k not in ("src", "dst"))
        return f"<{self.kind} t={format_time(self.t)} {shown}>"


def _time(x) -> int | None:
    if x is None:
        return None
    return parse_time(x) if isinstance(x, str) else int(x)


class SimRun:
    """A finished in-process run: its result, its workload's metrics and its trace, with queries and
    assertions (module docstring)."""

    def __init__(self, result, system, trace: TraceFile, json: dict | None = None, metrics: dict | None = None):
        self.result = result
        self.system = system
        self.trace = trace
        self.json = json or {}            # the result.json dictionary (``emu run --json``)
        self.metrics = metrics or {}      # the workload check's measurements (result.json's top-level extras)
        self._events: list[Event] | None = None
        self.label = "run"
        self.trace_path: str | None = None

    def record(self):
        """This run as a :class:`tools.trace.compare.RunRecord` (for :func:`tools.trace.compare.compare_runs`)."""
        from tools.trace.compare import record_from_run

        return record_from_run(self.label, self.system, self.result, self.trace_path, self.trace)

    # -- the result -------------------------------------------------------------
    @property
    def status(self) -> str:
        return self.result.status

    @property
    def end_time(self) -> int:
        return self.result.end_time_ps

    @property
    def digest(self) -> str:
        return self.result.digest

    @property
    def deadlock(self):
        return self.result.deadlock

    @property
    def error(self) -> str | None:
        return self.result.error

    @property
    def reports(self) -> dict:
        return self.result.reports

    @property
    def messages_sent(self) -> int:
        return self.result.messages

    @property
    def seed(self) -> int:
        return self.result.seed

    def metric(self, name: str):
        """One of the workload's metrics (``run.metric("ratio_to_bound")``); a missing one names the others."""
        if name not in self.metrics:
            known = ", ".join(sorted(k for k, v in self.metrics.items() if not isinstance(v, (dict, list)))) or "none"
            raise KeyError(f"the run has no metric {name!r}; its scalar metrics: {known}")
        return self.metrics[name]

    def assert_metric(self, name: str, *, min=None, max=None, equals=None):
        """``min <= metric <= max`` (and ``== equals`` when given); times as strings (``"2us"``) are ps."""
        v = self.metric(name)
        assert v is not None, f"metric {name!r} is None (status {self.status!r})"
        lo, hi = (_time(x) if isinstance(x, str) else x for x in (min, max))
        if equals is not None:
            assert v == equals, f"metric {name} = {v!r}, expected {equals!r}"
        if lo is not None:
            assert v >= lo, f"metric {name} = {v!r} < min {min!r}"
        if hi is not None:
            assert v <= hi, f"metric {name} = {v!r} > max {max!r}"
        return v

    # -- queries ----------------------------------------------------------------
    def _all(self) -> list[Event]:
        if self._events is None:
            tr = self.trace
            out = []
            for i, ev in enumerate(tr.events):
                name, fields = KINDS[ev[0]]
                d = dict(zip(fields[1:], ev[2:]))
                actor = None
                if "link" in d and isinstance(d["link"], int):
                    l = tr.links[d["link"]]
                    d["link"] = l["name"]
                    d["src"], d["dst"] = l["src"], l["dst"]
                    actor = l["src"] if ev[0] in (SEND, BLOCK) else l["dst"]
                elif "actor" in d and isinstance(d["actor"], int):
                    d["actor"] = actor = tr.actors[d["actor"]]
                elif ev[0] == FAULT:  # fault: target is an actor or link name; its label is ``fault``
                    actor = d.get("target")
                    d["fault"] = d.pop("kind")   # (``kind`` is the event kind)
                d.setdefault("actor", actor)
                out.append(Event(name, ev[1], d, i))
            self._events = out
        return self._events

    def events(self, kind: str | None = None, *, link: str | None = None, actor: str | None = None,
               start=None, end=None, **fields) -> list[Event]:
        """Events of ``kind`` (``send``, ``deliver``, ``take``, ``busy``, ``fault``, ...), in trace order.

        ``link`` / ``actor`` are globs over names; ``start`` / ``end`` bound the
        time (ints in ps or strings like ``"2us"``); other keywords must equal
        the field (``label="merge"``, ``seq=1``).
        """
        if kind is not None and kind not in KIND_CODES:
            raise ValueError(f"unknown event kind {kind!r} (known: {', '.join(KIND_CODES)})")
        lo, hi = _time(start), _time(end)
        out = []
        for e in self._all():
            if kind is not None and e.kind != kind:
                continue
            if link is not None and not (isinstance(e.fields.get("link"), str)
                                         and fnmatch.fnmatchcase(e.fields["link"], link)):
                continue
            if actor is not None and not (isinstance(e.fields.get("actor"), str)
                                          and fnmatch.fnmatchcase(e.fields["actor"], actor)):
                continue
            if lo is not None and e.t < lo or hi is not None and e.t > hi:
                continue
            if any(e.fields.get(k) != v for k, v in fields.items()):
                continue
            out.append(e)
        return out

    def count(self, kind: str | None = None, **filters) -> int:
        return len(self.events(kind, **filters))

    def messages(self, link: str = "*") -> list[dict]:
        """Every message on links matching ``link``: ``{link, seq, sent, delivered, taken, latency, bytes}``
        (``delivered``/``taken``/``latency`` are None for a message that never arrived)."""
        msgs: dict[tuple, dict] = {}
        for e in self.events(link=link):
            key = (e.link, e.fields.get("seq"))
            if e.kind == "send":
                msgs[key] = {"link": e.link, "seq": e.seq, "sent": e.t, "delivered": None, "taken": None,
                             "latency": None, "bytes": e.nbytes}
            elif e.kind == "deliver" and key in msgs:
                msgs[key]["delivered"] = e.t
                msgs[key]["latency"] = e.t - msgs[key]["sent"]
            elif e.kind == "take" and key in msgs:
                msgs[key]["taken"] = e.t
        return list(msgs.values())

    # -- assertions -------------------------------------------------------------
    def assert_status(self, status: str) -> None:
        detail = self.error or (str(self.deadlock) if self.deadlock else "")
        assert self.status == status, f"run ended {self.status!r}, expected {status!r}. {detail}"

    def assert_count(self, kind: str, n: int, **filters) -> list[Event]:
        evs = self.events(kind, **filters)
        assert len(evs) == n, (f"expected {n} {kind} event(s) matching {filters}, found {len(evs)}: "
                               f"{evs[:5]}{' ...' if len(evs) > 5 else ''}")
        return evs

    def assert_latency(self, link: str = "*", *, max=None, min=None, delivered: bool = True) -> list[dict]:
        """Every message on ``link`` (glob) took between ``min`` and ``max`` from send to delivery.

        With ``delivered`` (default) a message that never arrived fails the assertion too.
        Returns the messages checked.
        """
        hi, lo = _time(max), _time(min)
        msgs = self.messages(link)
        assert msgs, f"no message was sent on a link matching {link!r}"
        for m in msgs:
            where = f"message #{m['seq']} on {m['link']} sent at {format_time(m['sent'])}"
            if m["latency"] is None:
                assert not delivered, f"{where} was never delivered"
                continue
            if hi is not None:
                assert m["latency"] <= hi, f"{where} took {format_time(m['latency'])} > max {format_time(hi)}"
            if lo is not None:
                assert m["latency"] >= lo, f"{where} took {format_time(m['latency'])} < min {format_time(lo)}"
        return msgs

    def assert_order(self, *groups) -> None:
        """Each argument (an :class:`Event` or a list of them) happens no earlier than everything before it.

        ``run.assert_order(run.events("busy", actor="a", label="load"), run.events("busy", actor="a",
        label="gemm"))``: every load span starts before every gemm span.
        """
        prev = None
        for i, g in enumerate(groups):
            evs = [g] if isinstance(g, Event) else list(g)
            assert evs, f"argument {i} of assert_order matches no event"
            if prev is not None:
                last = max(prev, key=lambda e: (e.t, e.index))
                first = min(evs, key=lambda e: (e.t, e.index))
                assert (last.t, last.index) <= (first.t, first.index), \
                    f"order violated: {last} (argument {i - 1}) is not before {first} (argument {i})"
            prev = evs

    def assert_within(self, events, *, start=None, end=None) -> None:
        """Every event of ``events`` lies in ``[start, end]``."""
        lo, hi = _time(start), _time(end)
        for e in ([events] if isinstance(events, Event) else events):
            assert lo is None or e.t >= lo, f"{e} is before {format_time(lo)}"
            assert hi is None or e.t <= hi, f"{e} is after {format_time(hi)}"


class SimHarness:
    """What the ``emu_sim`` fixture gives a test: load and run scenarios in-process."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = Path(tmp_path)
        self.runs = 0

    def load(self, path, *, set=(), faults=(), seed: int | None = None, mode: str | None = None):
        """Load and validate a scenario like ``emu run`` (a :class:`SchemaError` names what is wrong)."""
        from actors import registry
        from emulator.faults import FAULT_SCHEMA
        from emulator.scenario import load_scenario, scenario_path
        from emulator.schema import Doc, List, SchemaError, validate

        sets = list(set)
        if seed is not None:
            sets.append(f"seed={int(seed)}")
        if mode is not None:
            sets.append(f"mode={mode}")
        sc = load_scenario(str(scenario_path(path)), registry, sets)
        if faults:
            doc = Doc(list(faults), {}, "<faults passed to emu_sim>")
            try:
                extra = validate(List(FAULT_SCHEMA), doc)
            except SchemaError as e:
                for p in e.problems:
                    p.path = "faults" + (p.path if p.path.startswith("[") else "." + p.path if p.path else "")
                raise SchemaError(e.problems) from None   # (the message is built from the problems)
            sc.faults = list(sc.faults) + list(extra)
        return sc

    def _loaded(self, method: str, scenario, set, faults, seed, mode):
        """``scenario`` loaded with the overrides, or as given when already loaded (then without overrides)."""
        if not hasattr(scenario, "resolved"):
            return self.load(scenario, set=set, faults=faults, seed=seed, mode=mode)
        if set or faults or seed is not None or mode is not None:
            raise ValueError(f"emu_sim.{method}: pass set/faults/seed/mode to load() when giving a loaded scenario")
        return scenario

    async def run(self, scenario, *, set=(), faults=(), seed: int | None = None, mode: str | None = None,
                  until=None) -> SimRun:
        """Run a scenario (a path or a loaded :class:`Scenario`) on the test's virtual clock."""
        from tools.run.runner import build_system, final_status, result_dict

        try:
            clock = current_clock()
        except Exception:
            clock = None
        if not isinstance(clock, VirtualClock):
            raise RuntimeError("emu_sim.run needs the virtual clock: add the `vclock` fixture to the test's "
                               "arguments (async def test_x(vclock, emu_sim): ...)")
        if self.runs or clock.now != 0:
            raise RuntimeError("emu_sim.run: one scenario per test (a machine's times start at 0 and the test's "
                               f"virtual clock is already at {format_time(clock.now)}); use another test")
        scenario = self._loaded("run", scenario, set, faults, seed, mode)
        self.runs += 1
        path = self.tmp_path / f"{scenario.name}.emutrace"
        scenario.trace = {"enabled": True, "payloads": True}
        system, workload = build_system(scenario, trace_path=str(path))
        result = await system.run_async(_time(until))
        checks = {}
        if workload.check is not None:
            checks = workload.check(system, scenario.profile, scenario.params, result) or {}
            result.reports = {**result.reports, "checks": checks}
        metrics = dict(checks)
        status, error = final_status(result, checks, None)
        res = result_dict(scenario, system, result, status, error, checks, str(path))
        run = SimRun(result, system, read_trace(str(path)), json=res, metrics=metrics)
        run.trace_path = str(path)
        return run

    @asynccontextmanager
    async def stepped(self, scenario, *, set=(), faults=(), seed: int | None = None, mode: str | None = None):
        """Run a scenario on the test's virtual clock in steps: ``async with emu_sim.stepped(path) as sim:``,
        then ``await sim.run_until("2.3us")`` or ``await sim.run_until(lambda sim: ...)``, ``sim.state(glob)``
        on the paused machine, and ``run = await sim.resume()`` to the end (a :class:`SimRun`).  Leaving the
        block runs what is left to the end.  One per test, like :meth:`run`."""
        from tools.run.runner import build_system

        clock = self._clock_for("stepped")
        scenario = self._loaded("stepped", scenario, set, faults, seed, mode)
        self.runs += 1
        path = self.tmp_path / f"{scenario.name}.emutrace"
        scenario.trace = {"enabled": True, "payloads": True}
        system, workload = build_system(scenario, trace_path=str(path))
        sim = SteppedRun(system, workload, scenario, path, clock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim._run)
            await sim._wait()          # the first instant (time 0) has run; paused there
            yield sim
            if sim.result is None:
                await sim.resume()

    def _clock_for(self, method: str):
        try:
            clock = current_clock()
        except Exception:
            clock = None
        if not isinstance(clock, VirtualClock):
            raise RuntimeError(f"emu_sim.{method} needs the virtual clock: add the `vclock` fixture to the test's "
                               "arguments (async def test_x(vclock, emu_sim): ...)")
        if self.runs or clock.now != 0:
            raise RuntimeError(f"emu_sim.{method}: one scenario per test (a machine's times start at 0 and the "
                               f"test's virtual clock is already at {format_time(clock.now)}); use another test")
        return clock

    def run_sync(self, scenario, *, set=(), faults=(), seed: int | None = None, mode: str | None = None,
                 label: str | None = None) -> SimRun:
        """Run a scenario in its own Trio run (from a plain ``def`` test): call it as often as needed.

        Each run is exactly ``emu run`` (its workload check decides the final status) with a full
        trace in the test's temporary directory; ``label`` names it in comparisons.
        """
        from tools.run.runner import execute, plan_run

        scenario = self._loaded("run_sync", scenario, set, faults, seed, mode)
        self.runs += 1
        path = self.tmp_path / f"{scenario.name}-{self.runs}.emutrace"
        scenario.trace = {"enabled": True, "payloads": True}
        outcome = execute(plan_run(scenario, bundle=False, trace_path=str(path)))
        res, system, result = outcome.res, outcome.system, outcome.result
        result.status, result.error = res["status"], res.get("error")
        run = SimRun(result, system, read_trace(str(path)), json=res, metrics=outcome.checks)
        run.label = label or f"run {self.runs} ({scenario.name})"
        run.trace_path = str(path)
        return run

    @staticmethod
    def compare(a: "SimRun", b: "SimRun"):
        """``b`` against ``a``: a :class:`tools.trace.compare.Comparison` (end time, per-link and per-actor deltas)."""
        from tools.trace.compare import compare_runs

        return compare_runs(a.record(), b.record())


class SteppedRun:
    """A run the test advances in steps (:meth:`SimHarness.stepped`): the machine pauses where virtual time
    would pass the limit the test sets (``System.on_pause``), with every actor parked where it waits, so
    :meth:`state` reads it as ``emu run --stop-at`` does (emulator/snapshot.py)."""

    def __init__(self, system, workload, scenario, path, clock):
        self.system, self.workload, self.scenario, self.path, self.clock = system, workload, scenario, path, clock
        self.result = None
        self._waiter = None
        self._until = None
        system.on_pause = self._pause
        inner = system.on_step

        def on_step(t: int) -> None:        # a condition is checked at the start of each time step
            if self._until is not None and self._until(self):
                self._until = None
                clock.limit = t             # this step runs, the next one pauses
            if inner is not None:
                inner(t)
        system.on_step = on_step

    @property
    def now(self) -> int:
        """The virtual time the run is paused at (ps)."""
        return self.clock.now

    async def _run(self) -> None:
        self.result = await self.system.run_async(0)   # limit 0: pause after the first instant
        self._wake()

    def _pause(self) -> bool:
        return self._wake()

    def _wake(self) -> bool:
        task, self._waiter = self._waiter, None
        if task is None:
            return False
        trio.lowlevel.reschedule(task)
        return True

    async def _wait(self) -> None:
        self._waiter = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def run_until(self, until) -> int:
        """Run on until virtual time ``until`` (ps or ``"2.3us"``: every step at or before it runs, none
        after), or until ``until(sim)`` is true at the start of a time step (that step runs, then the run
        pauses); returns the time paused at.  A run that ends first raises ``AssertionError`` naming its
        status and end time."""
        if self.result is not None:
            raise AssertionError(f"the run is over ({self.result.status} at {format_time(self.result.end_time_ps)})")
        if callable(until):
            self._until = until
            self.clock.limit = HORIZON_PS
        else:
            t = _time(until)
            if t < self.clock.now:
                raise ValueError(f"run_until({format_time(t)}): the run is already at {format_time(self.clock.now)}")
            self.clock.limit = t
        await self._wait()
        if self.result is not None:
            raise AssertionError(f"the run ended ({self.result.status}) at {format_time(self.result.end_time_ps)} "
                                 f"before run_until({until if callable(until) else format_time(_time(until))})")
        return self.clock.now

    def state(self, path: str = "*", *, full: bool = True) -> dict:
        """The paused machine's state: ``{actor name: its snapshot}`` for the actors matching the glob ``path``
        (one actor's dict when ``path`` names exactly one actor), links under the key ``"links"`` for
        ``path="links"`` (emulator/snapshot.py)."""
        from emulator.snapshot import snapshot

        snap = snapshot(self.system, full=full)
        if path == "links":
            return snap["links"]
        if path in snap["actors"]:
            return snap["actors"][path]
        return {n: d for n, d in snap["actors"].items() if fnmatch.fnmatchcase(n, path)}

    async def resume(self) -> SimRun:
        """Run on to the end; the finished run as a :class:`SimRun` (like :meth:`SimHarness.run`)."""
        from tools.run.runner import final_status, result_dict

        if self.result is None:
            self.clock.limit = HORIZON_PS
            self.system.on_pause = None
            await self._wait()
        system, result, sc = self.system, self.result, self.scenario
        checks = {}
        if self.workload.check is not None:
            checks = self.workload.check(system, sc.profile, sc.params, result) or {}
            result.reports = {**result.reports, "checks": checks}
        status, error = final_status(result, checks, None)
        res = result_dict(sc, system, result, status, error, checks, str(self.path))
        run = SimRun(result, system, read_trace(str(self.path)), json=res, metrics=dict(checks))
        run.trace_path = str(self.path)
        return run


@pytest.fixture
def emu_sim(tmp_path) -> SimHarness:
    """Load and run scenarios in-process on the test's virtual clock (see the module docstring)."""
    return SimHarness(tmp_path)

"""Links delivering inside the clock (emulator/clock.py ``VirtualClock._run_instant``) change nothing.

Why the order is the same.  Let the clock find entries due at ``t``: link
delivery wake-ups ``L0`` (their heap keys come first) and the other tasks due
at ``t``, ``R0`` (timed wake-ups, co-scheduled receivers).  Trio (FIFO-pinned)
then runs the batch ``L0 R0``; what ``L0`` wakes (receivers handed a message,
senders handed a credit), ``L1``, and what ``R0`` wakes, ``R1``, form the next
batch ``L1 R1`` (in the order of the wake calls: ``L0`` ran first), and so on:
the run order is ``L0, R0, L1, R1, L2, R2, ...`` where ``Lk+1``/``Rk+1`` are
the tasks woken by ``Lk``/``Rk``.  In-clock delivery runs ``L0``'s bodies
before any task, with its wake-ups held back, then makes ``R0`` runnable and
then ``L1``: the first batch is ``R0 L1``, its wake calls give ``R1 L2`` (``R0``
ran first), and so on -- the same sequence ``L0, R0, L1, R1, L2, ...``.  Heap
sequence numbers are taken in the same order too (``L0`` re-arms before ``R0``
runs, in both).  Two things could come between the two batches of Trio's
version and are therefore excluded: a Trio deadline expiring at ``t`` (its
cancellations are queued after ``R0``) -- the clock then reschedules every
task as before -- and a due message that must be decoded (its decode error
belongs to the link's task) -- the same fallback, for the whole instant.

The tests run real scenarios both ways in one process and compare status,
digest, end time, messages and events; and check that the in-clock path was
taken (so a test can fail if it is silently off).
"""
import pytest
import trio

from emulator import clock as clock_module

SCENARIOS = [
    "scenarios/demo/ring.yaml",           # one message per time step
    "scenarios/demo/reduce.yaml",         # data mode, fan-in, busy spans at delivery instants
    "scenarios/demo/deadlock.yaml",       # the deadlock report (blocked senders and receivers)
    "scenarios/faults/corrupt.yaml",      # decoded messages: the link task delivers those instants
    "scenarios/faults/drop.yaml",
    "scenarios/faults/stall.yaml",
    "scenarios/ahbm/attention_decode.yaml",
    "scenarios/pccx/program.yaml",
]


def _run(path, monkeypatch, direct: bool):
    from actors import registry
    from conftest import ROOT
    from emulator.scenario import load_scenario
    from tools.run.runner import build_system

    monkeypatch.setattr(clock_module, "DIRECT_DELIVERY", direct)
    system, _ = build_system(load_scenario(ROOT / path, registry))
    res = system.run()
    return (res.status, res.digest, res.end_time_ps, res.messages, res.events), system.clock.deliveries_here


@pytest.mark.parametrize("path", SCENARIOS)
def test_in_clock_delivery_gives_the_same_run_as_link_task_steps(path, monkeypatch):
    assert clock_module.DIRECT_DELIVERY, "in-clock delivery is off on the pinned Trio range"
    tasks, none = _run(path, monkeypatch, False)
    here, n = _run(path, monkeypatch, True)
    assert none == 0
    assert n > 0, "no link delivered inside the clock"
    assert here == tasks


def test_a_trio_deadline_at_a_delivery_instant_keeps_trio_order(monkeypatch):
    """A watchdog (trio.sleep, virtual time) expiring at the instant a message arrives runs where it did."""
    from emulator.actor import Actor
    from emulator.system import System
    from protocols.demo import Token

    def build():
        order = []

        class Src(Actor):
            async def run(self):
                await self.out.send(Token(0, 1))
                await self.out.send(Token(1, 1))       # no credit: waits for the first to be taken
                order.append(("src-sent", self.now))

        class Dst(Actor):
            async def run(self):
                await self.inp.recv()
                order.append(("recv", self.now))
                await self.busy(0)
                order.append(("after-busy", self.now))
                await self.inp.recv()

        class Dog(Actor):
            async def run(self):
                await trio.sleep(1000)                 # the link below delivers at exactly 1000 ps
                order.append(("dog", self.now))

        system = System("t")
        src, dst = system.add(Src("src")), system.add(Dst("dst"))
        src.out, dst.inp = src.out_port("out"), dst.in_port("in")
        system.add(Dog("dog"))
        system.connect(src.out, dst.inp, latency=1000, capacity=1)
        return system, order

    runs = {}
    for direct in (False, True):
        monkeypatch.setattr(clock_module, "DIRECT_DELIVERY", direct)
        system, order = build()
        res = system.run()
        runs[direct] = (res.digest, order)
    assert runs[True] == runs[False]
    assert runs[True][1][:3] == [("recv", 1000), ("dog", 1000), ("src-sent", 1000)]


@pytest.mark.parametrize("path", ["scenarios/ahbm/attention_decode.yaml", "scenarios/faults/kill.yaml",
                                  "scenarios/demo/deadlock.yaml"])
def test_ending_parked_tasks_with_a_wake_gives_the_same_run_as_cancelling_them(path, monkeypatch):
    """The end of a decided run (VirtualClock.end_parked) changes no result, and it is used."""
    with_wake, n = _run_end(path, monkeypatch, True)
    with_cancel, none = _run_end(path, monkeypatch, False)
    assert n > 0 and none == 0
    assert with_wake == with_cancel


def _run_end(path, monkeypatch, use: bool):
    from actors import registry
    from conftest import ROOT
    from emulator.scenario import load_scenario
    from tools.run.runner import build_system

    if not use:
        monkeypatch.setattr(clock_module.VirtualClock, "end_parked", lambda self, tasks, codes: 0)
    system, _ = build_system(load_scenario(ROOT / path, registry))
    res = system.run()
    monkeypatch.undo()
    out = (res.status, res.digest, res.end_time_ps, res.messages, res.events, str(res.deadlock), res.error, res.errors)
    return out, system.clock.ended_parked


def test_a_deadlock_report_lists_an_actors_waits_in_the_order_they_began():
    """Receives keep no per-message record any more (emulator.link.waits_of reads the port waiters)."""
    from emulator.actor import Actor
    from emulator.system import System
    from protocols.demo import Token

    class Many(Actor):
        async def run(self):
            async with self.subtasks() as n:
                n.start_soon(self._recv, self.in_port("b"))
                n.start_soon(self._send)
                n.start_soon(self._recv, self.in_port("a"))

        async def _recv(self, port):
            await port.recv()

        async def _send(self):
            await self.sleep(5)
            for k in range(3):                  # capacity 1 and nobody receives: the second send blocks
                await self.out_port("out").send(Token(k, 1))

    class Sink(Actor):
        async def run(self):
            await self.in_port("never").recv()

    system = System("t")
    many, sink, feeder = system.add(Many("many")), system.add(Sink("sink")), system.add(Sink("feeder"))
    system.connect(many.out_port("out"), sink.in_port("in"), capacity=1)
    system.connect(feeder.out_port("x"), many.in_port("a"))
    system.connect(feeder.out_port("y"), many.in_port("b"))
    system.connect(sink.out_port("z"), feeder.in_port("never"))
    system.connect(feeder.out_port("w"), sink.in_port("never"))
    res = system.run()
    assert res.status == "deadlock"
    mine = [(b.direction, b.ports) for b in res.deadlock.blocked if b.actor == "many"]
    assert mine == [("recv", ["many.b"]), ("recv", ["many.a"]), ("send", ["many.out"])]


def test_the_link_task_steps_switch_is_honoured():
    """EMU_LINK_TASK_STEPS=1 turns in-clock delivery off (the link tasks deliver), read at import."""
    import os
    import subprocess
    import sys

    code = "import emulator.clock as c; print(c.DIRECT_DELIVERY, c.FAST_PARK)"
    env = {**os.environ, "EMU_LINK_TASK_STEPS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]

"""Helpers for tests on virtual time (pytest-trio).

Fixtures (the project's ``tests/conftest.py`` imports them; a user project can
add ``pytest_plugins = ["emulator.testing"]``):

* ``vclock``: a fresh :class:`~emulator.clock.VirtualClock`.  pytest-trio uses
  any fixture whose value is a ``trio.abc.Clock`` as the test's clock, so an
  ``async def test_x(vclock)`` runs on virtual picoseconds;
* ``deterministic`` (autouse): pins Trio's scheduling order for every test.

Building blocks for small systems:

* :class:`Source` sends scripted messages at given virtual times;
* :class:`Sink` records ``(time, message)`` for everything it receives;
* :func:`pair` builds ``Source -> link -> Sink`` in one call;
* :func:`run` runs a system inside the current test (``await run(system)``).
"""
from __future__ import annotations

import pytest

from emulator.actor import Actor
from emulator.clock import VirtualClock, deterministic_scheduling
from emulator.declare import ANY, In, Out
from emulator.system import RunResult, System

__all__ = ["Source", "Sink", "pair", "run", "vclock", "deterministic"]


class Source(Actor):
    """Sends ``script`` = ``[(time_ps, message), ...]`` on port ``out``, in order.

    A time earlier than now means "as soon as possible" (back-to-back).
    """

    PORTS = (Out("out", ANY, doc="the script's messages, whatever their type"),)

    def __init__(self, name: str, script):
        super().__init__(name)
        self.out = self.out_port("out")
        self.script = list(script)
        self.sent_at: list[int] = []

    async def run(self) -> None:
        for t, msg in self.script:
            if t > self.now:
                await self.sleep_until(t)
            await self.out.send(msg)
            self.sent_at.append(self.now)


class Sink(Actor):
    """Receives ``expect`` messages on port ``in`` (forever if None), recording ``(time, msg)``.

    ``service`` ps of busy time per message models a slow consumer.
    """

    PORTS = (In("in", ANY, doc="any message"),)

    def __init__(self, name: str, expect: int | None = None, service: int = 0):
        super().__init__(name)
        self.inp = self.in_port("in")
        self.expect = expect
        self.service = service
        self.got: list[tuple[int, object]] = []
        self.daemon = expect is None

    async def run(self) -> None:
        n = 0
        while self.expect is None or n < self.expect:
            msg = await self.inp.recv()
            self.got.append((self.now, msg))
            n += 1
            if self.service:
                await self.busy(self.service, "consume")

    @property
    def times(self) -> list[int]:
        return [t for t, _ in self.got]


def pair(script, *, capacity=1, latency=0, bandwidth=0, service=0, seed=0, mode="timing", trace=None):
    """``Source -> link -> Sink`` ready to run: returns ``(system, source, sink, link)``."""
    system = System("pair", seed=seed, mode=mode, trace=trace)
    src = system.add(Source("src", script))
    sink = system.add(Sink("sink", expect=len(script), service=service))
    link = system.connect(src.out, sink.inp, capacity=capacity, latency=latency, bandwidth=bandwidth)
    return system, src, sink, link


async def run(system: System, *, until: int | None = None) -> RunResult:
    """Run ``system`` inside the current (virtual-clock) test."""
    return await system.run_async(until)


@pytest.fixture
def vclock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture(autouse=True)
def deterministic():
    with deterministic_scheduling():
        yield

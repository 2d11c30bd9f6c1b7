"""The Trio internals the virtual clock relies on (emulator/clock.py).

If a Trio upgrade changes any of them, these fail loudly instead of the
emulator silently losing determinism or virtual time.
"""
import trio
from trio._core import _run

from emulator.clock import VirtualClock, deterministic_scheduling, sleep


def test_trio_version_is_in_the_tested_range():
    major, minor = (int(x) for x in trio.__version__.split(".")[:2])
    assert (0, 28) <= (major, minor) < (0, 36), trio.__version__


def test_private_hooks_exist():
    assert hasattr(_run, "_r") and hasattr(_run._r, "random")
    assert hasattr(_run, "GLOBAL_RUN_CONTEXT")
    assert hasattr(_run.Runner, "reschedule")
    assert "waiting_for_idle" in {a.name for a in _run.Runner.__attrs_attrs__}


def test_deadline_hook_is_called_only_with_an_empty_run_queue():
    calls = []

    class Spy(VirtualClock):
        def deadline_to_sleep_time(self, deadline):
            calls.append(len(self._runner.runq))
            return super().deadline_to_sleep_time(deadline)

    async def main():
        async def w(i):
            for _ in range(5):
                await sleep(i + 1)
        async with trio.open_nursery() as n:
            for i in range(4):
                n.start_soon(w, i)

    with deterministic_scheduling():
        trio.run(main, clock=Spy())
    assert calls and set(calls) == {0}


def test_fifo_pinning_makes_batches_run_in_reschedule_order():
    order = []

    async def main():
        async def w(i):
            await trio.lowlevel.checkpoint()
            order.append(i)
        async with trio.open_nursery() as n:
            for i in range(50):
                n.start_soon(w, i)

    before = _run._r
    with deterministic_scheduling():
        trio.run(main, clock=VirtualClock())
    assert order == list(range(50))
    assert _run._r is before  # restored on exit


def test_instruments_still_work_with_the_dict_backed_stand_in():
    from emulator.clock import _FastInstruments

    seen = []

    class Counter(trio.abc.Instrument):
        def before_task_step(self, task):
            seen.append(task.name)

    async def main():
        assert isinstance(_run.GLOBAL_RUN_CONTEXT.runner.instruments, _FastInstruments)
        inst = Counter()
        trio.lowlevel.add_instrument(inst)
        await sleep(5)
        trio.lowlevel.remove_instrument(inst)
        n = len(seen)
        await sleep(5)
        return n

    with deterministic_scheduling():
        n = trio.run(main, clock=VirtualClock())
    assert n >= 1 and len(seen) == n

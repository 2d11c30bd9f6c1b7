"""The Trio internals the virtual clock relies on (emulator/clock.py).

If a Trio upgrade changes any of them, these fail loudly instead of the
emulator silently losing determinism or virtual time.
"""
import pytest
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


# --------------------------------------------------------------------------- issue #13 fast paths
def test_the_fast_path_internals_exist_on_the_pinned_range():
    from emulator import clock as clock_module
    from emulator import system as system_module

    assert clock_module.FAST_PARK, "WaitTaskRescheduled / Task slots / Runner fields changed: fast park disabled"
    assert system_module.LAZY_LINK_TASKS, "Runner.spawn_impl is gone: link tasks start eagerly"
    assert {"_next_send_fn", "_next_send", "_abort_func", "custom_sleep_data"} <= {
        a.name for a in _run.Task.__attrs_attrs__}


def test_paced_io_skips_most_polls_and_still_polls():
    from emulator.clock import _PacedIO

    async def main():
        for _ in range(2000):
            await sleep(1)
        return _run.GLOBAL_RUN_CONTEXT.runner.io_manager

    with deterministic_scheduling():
        io = trio.run(main, clock=VirtualClock())
    assert isinstance(io, _PacedIO)
    assert io.skipped > io.polls > 0


def test_a_thread_reaches_a_busy_run_through_the_paced_io():
    """run_sync_soon from another thread (how the wall-clock guard and Ctrl-C get in) is served."""
    import threading

    async def main():
        token = trio.lowlevel.current_trio_token()
        seen = []
        threading.Thread(target=lambda: token.run_sync_soon(seen.append, 1)).start()
        t = 0
        while not seen:               # virtual time keeps moving: the loop never sleeps for real
            t += 1
            await sleep(1)
        return t

    with deterministic_scheduling():
        assert trio.run(main, clock=VirtualClock()) > 0


@pytest.mark.parametrize("path", ["scenarios/demo/ring.yaml", "scenarios/ahbm/attention_decode.yaml"])
def test_the_public_api_fallback_gives_the_same_digest(path, emu):
    """EMU_SAFE_PARK=1 (wait_task_rescheduled/reschedule, every I/O poll) and EMU_EAGER_LINKS=1 (link tasks
    started up front with start_soon) must give the very same run."""
    import json
    import os

    from conftest import ROOT

    fast = json.loads(emu("run", ROOT / path, "--json", "--no-bundle", check=0).stdout)
    os.environ.update(EMU_SAFE_PARK="1", EMU_EAGER_LINKS="1")
    try:
        safe = json.loads(emu("run", ROOT / path, "--json", "--no-bundle", check=0).stdout)
    finally:
        del os.environ["EMU_SAFE_PARK"], os.environ["EMU_EAGER_LINKS"]
    assert (safe["digest"], safe["end_time_ps"]) == (fast["digest"], fast["end_time_ps"])


def test_the_fallback_switch_is_honoured(monkeypatch):
    from emulator import clock as clock_module

    monkeypatch.setenv("EMU_SAFE_PARK", "1")
    assert not clock_module._fast_park_available()
    monkeypatch.setattr(clock_module, "FAST_PARK", False)

    async def main():
        await sleep(3)
        return _run.GLOBAL_RUN_CONTEXT.runner.clock.fast, type(_run.GLOBAL_RUN_CONTEXT.runner.io_manager).__name__

    with deterministic_scheduling():
        fast, io = trio.run(main, clock=VirtualClock())
    assert fast is False and io != "_PacedIO"


def test_idle_deadlines_stand_in_until_the_first_cancel_scope_deadline():
    """While no cancel scope has a deadline, runner.deadlines is the clock's C-call stand-in; the first
    deadline puts Trio's own Deadlines back, and virtual-time timeouts still fire on time."""
    from emulator.clock import _IdleDeadlines

    assert {"add", "remove", "next_deadline", "expire"} <= set(dir(_run.Deadlines))
    assert "_heap" in {a.name for a in _run.Deadlines.__attrs_attrs__}
    seen = {}

    async def main():
        runner = _run.GLOBAL_RUN_CONTEXT.runner
        seen["before"] = type(runner.deadlines)
        await sleep(10)
        with trio.move_on_after(25) as scope:
            seen["during"] = type(runner.deadlines)
            await sleep(100)
        seen["cancelled_at"] = (scope.cancelled_caught, trio.current_time())
        await sleep(5)
        seen["end"] = trio.current_time()

    with deterministic_scheduling():
        trio.run(main, clock=VirtualClock())
    assert seen == {"before": _IdleDeadlines, "during": _run.Deadlines, "cancelled_at": (True, 35), "end": 40}

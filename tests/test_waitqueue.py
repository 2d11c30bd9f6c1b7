"""Actors' internal waits (emulator/waitqueue.py) and sub-tasks (Actor.subtasks) change no run.

* :class:`WaitQueue` wakes in the order tasks parked, like Trio's ``ParkingLot``, and a
  cancelled waiter leaves it;
* a sub-task started at its queue's first unpark (``start_at_first_unpark``) gives the same
  run as one started at once, and fewer sub-tasks are spawned;
* sub-tasks ended with a wake at the end of a decided run (their guard in the clock's
  ``end_parked``) give the same run as cancelling them, and are used.

Real scenarios run both ways in one process; status, digest, end time, messages and events
are compared.
"""
import pytest
import trio
import trio.testing

from emulator import actor as actor_module
from emulator import system as system_module
from emulator.waitqueue import WaitQueue

AHBM = ["scenarios/ahbm/attention_decode.yaml",            # store-and-forward routers, HBM, GEMM
        "scenarios/ahbm/microbench-cut-through.yaml"]      # cut-through routers


async def test_a_wait_queue_wakes_in_parking_order_and_forgets_a_cancelled_waiter(vclock):
    q = WaitQueue()
    woken = []

    async def waiter(tag):
        await q.park()
        woken.append(tag)

    async with trio.open_nursery() as n:
        for tag in "abcd":
            n.start_soon(waiter, tag)
        await trio.testing.wait_all_tasks_blocked()
        assert len(q) == 4
        q.unpark()
        q.unpark()
        await trio.testing.wait_all_tasks_blocked()
        assert woken == ["a", "b"]
        n.cancel_scope.cancel()
    assert len(q) == 0   # the cancelled waiters left the queue
    q.unpark_all()
    assert woken == ["a", "b"]


def _run(path, patch=None):
    from actors import registry
    from conftest import ROOT
    from emulator.scenario import load_scenario
    from tools.run.runner import build_system

    spawned = []
    start_soon = actor_module.Subtasks.start_soon

    def counting(self, fn, *args, name=None):
        spawned.append(fn)
        start_soon(self, fn, *args, name=name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(actor_module.Subtasks, "start_soon", counting)
        if patch is not None:
            patch(mp)
        system, _ = build_system(load_scenario(ROOT / path, registry))
        res = system.run()
    out = (res.status, res.digest, res.end_time_ps, res.messages, res.events, str(res.deadlock), res.error)
    return out, len(spawned), system.clock.ended_parked


@pytest.mark.parametrize("path", AHBM)
def test_starting_a_subtask_at_its_first_unpark_gives_the_same_run(path):
    def eager(mp):
        mp.setattr(WaitQueue, "start_at_first_unpark", lambda self, group, fn, *args: group.start_soon(fn, *args))

    lazy, lazy_spawned, _ = _run(path)
    now, now_spawned, _ = _run(path, eager)
    assert lazy == now
    assert lazy_spawned < now_spawned, "no sub-task was left unstarted"


@pytest.mark.parametrize("path", AHBM)
def test_ending_subtasks_with_a_wake_gives_the_same_run_as_cancelling_them(path):
    def cancel_subtasks(mp):
        mp.setattr(system_module, "_GUARD_CODES", system_module._GUARD_CODES - {actor_module.SUBTASK_CODE})

    quiet, _, ended = _run(path)
    cancelled, _, ended_without = _run(path, cancel_subtasks)
    assert quiet == cancelled
    assert ended > ended_without, "no sub-task was ended with a wake"

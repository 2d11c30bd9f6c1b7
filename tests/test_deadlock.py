"""A stuck system ends with a report naming every blocked actor, never a hang."""
import json

from emulator.actor import Actor
from emulator.system import System
from emulator.testing import run
from protocols.demo import Token

from conftest import ROOT


def test_deadlock_scenario_reports_the_blocked_actors(emu):
    proc = emu("run", ROOT / "scenarios/demo/deadlock.yaml", "--no-bundle")
    assert proc.returncode == 3
    assert "deadlock-demo: deadlock" in proc.stdout
    err = proc.stderr
    assert "nothing can run, no event is pending" in err
    for i in range(4):
        nxt = (i + 1) % 4
        assert f"ring/n{i}: sending on ring/n{i}.out to ring/n{nxt}" in err
    assert "1/1 credits used" in err
    assert "Traceback" not in err


def test_deadlock_json_carries_the_report(emu):
    proc = emu("run", ROOT / "scenarios/demo/deadlock.yaml", "--json", "--no-bundle")
    assert proc.returncode == 3
    res = json.loads(proc.stdout)
    assert res["status"] == "deadlock"
    blocked = {b["actor"]: b for b in res["deadlock"]["blocked"]}
    assert set(blocked) == {f"ring/n{i}" for i in range(4)}
    assert all(b["direction"] == "send" for b in blocked.values())


class Waiter(Actor):
    def __init__(self, name):
        super().__init__(name)
        self.inp = self.in_port("in")
        self.out = self.out_port("out")

    async def run(self):
        await self.sleep(100)
        await self.inp.recv()


async def test_receivers_waiting_on_each_other_are_named_with_their_peers(vclock):
    system = System("cycle")
    a, b = system.add(Waiter("a")), system.add(Waiter("b"))
    system.connect(a.out, b.inp)
    system.connect(b.out, a.inp)
    res = await run(system)
    assert res.status == "deadlock" and res.end_time_ps == 100
    text = str(res.deadlock)
    assert "a: receiving on a.in from b" in text and "b: receiving on b.in from a" in text
    assert "deadlock at t=100 ps" in text


class Forever(Actor):
    """Keeps virtual time moving and never finishes."""

    async def run(self):
        while True:
            await self.busy(1000, "spin")


def test_virtual_time_limit_stops_a_run_that_never_ends():
    system = System("forever")
    system.add(Forever("f"))
    res = system.run(until=10_500)
    assert res.status == "time-limit" and res.end_time_ps == 10_500


def test_wall_clock_guard_stops_a_run_that_never_ends():
    system = System("forever")
    system.add(Forever("f"))
    res = system.run(wall_timeout=0.3)
    assert res.status == "wall-timeout" and res.end_time_ps > 0


def test_cli_exit_codes_for_limits(emu, tmp_path):
    proc = emu("run", ROOT / "scenarios/demo/ring.yaml", "--no-bundle", "--set", "stop.max_time=1us")
    assert proc.returncode == 4 and "time-limit" in proc.stdout


def test_a_pending_kill_fault_does_not_delay_the_deadlock_report(emu):
    proc = emu("run", ROOT / "scenarios/demo/deadlock.yaml", "--json", "--no-bundle",
               "--set", "faults=[{kind: kill, actor: ring/n0, at: 1ms}]")
    res = json.loads(proc.stdout)
    assert proc.returncode == 3 and res["status"] == "deadlock"
    assert res["end_time_ps"] == 20094          # when progress stopped, not at the kill time


class TwoTasks(Actor):
    """An actor with two sub-tasks, each waiting on its own port."""

    def __init__(self, name):
        super().__init__(name)
        self.a, self.b = self.in_port("a"), self.in_port("b")

    async def run(self):
        import trio

        async with trio.open_nursery() as n:
            n.start_soon(self.a.recv)
            n.start_soon(self.b.recv)


class Nothing(Actor):
    daemon = True

    def __init__(self, name):
        super().__init__(name)
        self.out_a, self.out_b = self.out_port("a"), self.out_port("b")
        self.inp = self.in_port("in", idle=True)   # its request queue

    async def run(self):
        await self.inp.recv()


async def test_every_blocked_task_of_an_actor_is_reported(vclock):
    system = System("tasks")
    t, n = system.add(TwoTasks("t")), system.add(Nothing("srv"))
    system.connect(n.out_a, t.a)
    system.connect(n.out_b, t.b)
    other = system.add(Waiter("w"))
    system.connect(other.out, n.inp)
    system.connect(n.out_port("back"), other.inp)
    res = await run(system)
    text = str(res.deadlock)
    assert "t: receiving on t.a from srv" in text and "t: receiving on t.b from srv" in text
    # the server waiting for input is counted, not listed
    assert "srv:" not in text and res.deadlock.idle_servers == 1


class SharedPort(Actor):
    def __init__(self, name):
        super().__init__(name)
        self.inp = self.in_port("in")

    async def run(self):
        import trio

        async with trio.open_nursery() as n:
            n.start_soon(self.inp.recv)
            n.start_soon(self.inp.recv)


async def test_two_tasks_receiving_on_one_port_is_a_clear_error(vclock):
    system = System("shared")
    s = system.add(SharedPort("s"))
    src = system.add(Waiter("src"))
    system.connect(src.out, s.inp)
    system.connect(s.out_port("x"), src.inp)
    res = await run(system)
    assert res.status == "error" and "two tasks of s receive on it at once" in res.error


def test_killing_every_workload_actor_is_not_a_finished_run(emu):
    proc = emu("run", ROOT / "scenarios/faults/kill.yaml", "--json", "--no-bundle", "--quiet",
               "--set", "faults=[{kind: kill, actor: 'ring/*', at: 5ns}]")
    assert proc.returncode == 6 and json.loads(proc.stdout)["status"] == "killed"

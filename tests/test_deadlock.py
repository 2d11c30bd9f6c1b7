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

"""The virtual clock: exact integer picoseconds, Trio's own timeouts on virtual time."""
import pytest
import trio

from emulator.clock import VirtualClock, deterministic_scheduling, now, sleep, sleep_until
from emulator.units import ClockDomain, ns, parse_frequency, parse_time, transfer_ps


@pytest.mark.parametrize("n", [100_000, pytest.param(1_000_000, marks=pytest.mark.slow)])
async def test_n_1ns_sleeps_end_at_exactly_n_ns(vclock, n):
    """Integer picoseconds: a long sum of sleeps is exact (a float sum of 1e-9 s would drift)."""
    for _ in range(n):
        await sleep(ns(1))
    assert now() == n * 1000
    assert isinstance(now(), int)


async def test_trio_sleep_and_timeouts_are_virtual(vclock):
    await trio.sleep(1000)
    assert trio.current_time() == 1000
    with trio.move_on_after(50) as scope:
        await sleep(100)
    assert scope.cancelled_caught and now() == 1050
    with pytest.raises(trio.TooSlowError):
        with trio.fail_after(5):
            await trio.sleep_forever()
    assert now() == 1055
    await trio.sleep(0.5)          # a fractional deadline is rounded up to a whole ps
    assert now() == 1056


async def test_same_time_wakeups_run_in_scheduling_order(vclock):
    order = []

    async def sleeper(i, t):
        await sleep_until(t)
        order.append((now(), i))

    async with trio.open_nursery() as n:
        for i, t in enumerate([30, 10, 30, 10, 20, 30]):
            n.start_soon(sleeper, i, t)
    assert order == [(10, 1), (10, 3), (20, 4), (30, 0), (30, 2), (30, 5)]


async def test_sleep_into_the_past_is_an_error(vclock):
    await sleep(10)
    with pytest.raises(ValueError, match="in the past"):
        await sleep_until(5)


async def test_cancelled_sleep_leaves_no_wakeup(vclock):
    with trio.move_on_after(10):
        await sleep(1000)
    assert vclock.pending() == 0
    await sleep(5)
    assert now() == 15


def test_clock_domains_convert_exactly():
    assert ClockDomain(parse_frequency("1GHz")).ps(1) == 1000
    assert ClockDomain(parse_frequency("400MHz")).ps(3) == 7500
    assert ClockDomain(parse_frequency("250MHz")).ps(10**9) == 4 * 10**12
    assert ClockDomain(parse_frequency("100MHz")).ps(7) == 70000
    d = ClockDomain(parse_frequency("1.2GHz"))        # period 2500/3 ps
    assert d.ps(3) == 2500 and d.ps(1) == 834          # rounded up, computed from the count
    assert d.ps(3 * 10**9) == 25 * 10**11
    assert d.cycles(2500) == 3


def test_units_parse_exactly_and_reject_missing_units():
    assert parse_time("30ns") == 30_000
    assert parse_time("2.5us") == 2_500_000
    assert parse_time("0.1ns") == 100
    assert transfer_ps(4096, 64 * 10**9) == 64_000
    assert transfer_ps(1, 3) == 333_333_333_334      # ceil
    from emulator.units import UnitError
    for bad in (30, "30", "30 parsecs", "0.5ps", "1.2GHz"):
        with pytest.raises(UnitError):
            parse_time(bad)


def test_whole_run_from_sync_code_is_deterministic():
    results = []
    for _ in range(2):
        async def main():
            seen = []

            async def worker(i):
                for k in range(3):
                    await sleep(1 + (i * k) % 3)
                    seen.append((now(), i))

            async with trio.open_nursery() as n:
                for i in range(20):
                    n.start_soon(worker, i)
            return seen

        with deterministic_scheduling():
            results.append(trio.run(main, clock=VirtualClock()))
    assert results[0] == results[1]

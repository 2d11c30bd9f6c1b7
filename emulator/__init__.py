"""The machine-independent engine: virtual clock, actors, links, system, trace, scenarios.

Knows nothing of AHBM or pccx.  See DESIGN.md §3 for the contracts.
"""
from emulator.version import __version__

from emulator.actor import Actor
from emulator.clock import VirtualClock, deterministic_scheduling, now, sleep, sleep_until
from emulator.errors import ActorError, BuildError, DeadlockError, EmulatorError
from emulator.link import InPort, Link, OutPort, select
from emulator.system import DeadlockReport, RunResult, System
from emulator.units import ClockDomain, parse_bandwidth, parse_frequency, parse_size, parse_time, transfer_ps

__all__ = [
    "Actor", "VirtualClock", "deterministic_scheduling", "now", "sleep", "sleep_until",
    "ActorError", "BuildError", "DeadlockError", "EmulatorError", "InPort", "Link", "OutPort", "select",
    "DeadlockReport", "RunResult", "System", "ClockDomain", "parse_bandwidth", "parse_frequency",
    "parse_size", "parse_time", "transfer_ps",
]

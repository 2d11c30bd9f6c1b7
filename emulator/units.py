"""Quantities with units, parsed exactly into the engine's integer units.

The engine's units: time in **picoseconds** (int), frequency in **Hz** (int),
bandwidth in **bytes per second** (int), sizes in **bytes** (int); for the energy
model (emulator/energy.py): energy per action in **femtojoules** (int, ``"0.4pJ"``
= 400), energy per bit in **fJ per bit** (``"3.9pJ/bit"`` = 3900; ``pJ/B`` is
divided by 8 and must stay whole) and power in **microwatts** (``"25mW"`` = 25000),
so that static energy, µW x ps, is an exact count of attojoules.  Strings such
as ``"30ns"``, ``"2.5us"``, ``"1.2GHz"``, ``"256GB/s"``, ``"64KiB"`` are parsed
with exact decimal arithmetic (``fractions.Fraction``), so ``"0.1ns"`` is exactly
100 ps and no float ever accumulates.  A value that does not land on a whole
unit (e.g. ``"0.5ps"``) is an error rather than a silent rounding.

Conversions that divide (cycles at a non-integer period, bytes over a
bandwidth) round **up** to the next picosecond: a transfer is never modelled as
finishing earlier than physics allows.  They are computed from the whole count
each time (``ceil(n * 10**12 / rate)``), never by summing rounded pieces.
"""
from __future__ import annotations

import re
from fractions import Fraction

__all__ = [
    "UnitError",
    "parse_time",
    "parse_frequency",
    "parse_bandwidth",
    "parse_size",
    "parse_quantity",
    "ClockDomain",
    "transfer_ps",
    "format_time",
    "ns",
    "us",
    "ms",
    "PS_PER_S",
    "QUANTITY_RANGE",
    "UNLIMITED",
    "WALL_TIME_MAX",
    "format_quantity",
]

PS_PER_S = 10**12

_TIME = {"ps": 1, "ns": 10**3, "us": 10**6, "µs": 10**6, "ms": 10**9, "s": 10**12, "min": 60 * 10**12,
         "h": 3600 * 10**12}
_FREQ = {"Hz": 1, "kHz": 10**3, "KHz": 10**3, "MHz": 10**6, "GHz": 10**9, "THz": 10**12}
_SIZE = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}
_BW = {f"{k}/s": v for k, v in _SIZE.items()}
_BW.update({"bps": Fraction(1, 8), "Kbps": Fraction(10**3, 8), "Mbps": Fraction(10**6, 8),
            "Gbps": Fraction(10**9, 8), "Tbps": Fraction(10**12, 8),
            "b/s": Fraction(1, 8), "Kb/s": Fraction(10**3, 8), "Mb/s": Fraction(10**6, 8),
            "Gb/s": Fraction(10**9, 8), "Tb/s": Fraction(10**12, 8)})

_ENERGY = {"fJ": 1, "pJ": 10**3, "nJ": 10**6, "uJ": 10**9, "µJ": 10**9, "mJ": 10**12, "J": 10**15}
_ENERGY_BIT = {f"{k}/bit": v for k, v in _ENERGY.items() if k in ("fJ", "pJ", "nJ")}
_ENERGY_BIT.update({f"{k}/B": Fraction(v, 8) for k, v in _ENERGY.items() if k in ("fJ", "pJ", "nJ")})
_POWER = {"uW": 1, "µW": 1, "mW": 10**3, "W": 10**6, "kW": 10**9}

KINDS = {"time": _TIME, "frequency": _FREQ, "size": _SIZE, "bandwidth": _BW, "energy": _ENERGY,
         "energy_per_bit": _ENERGY_BIT, "power": _POWER}
_EXAMPLES = {"time": "30ns", "frequency": "1.2GHz", "size": "64KiB", "bandwidth": "256GB/s", "energy": "0.4pJ",
             "energy_per_bit": "3.9pJ/bit", "power": "25mW"}

#: The range a scenario may give each kind of quantity (engine units). Virtual
#: time is an int64 count of ps in the trace (msgpack); capping a single time
#: at 10**15 ps (1000 s) leaves a factor of ~9,000 for sums before 2**63.
#: A bandwidth of 0 would silently mean "no serialisation delay": it is
#: refused, and a link without one is written ``unlimited`` (issue 14 item 2).
QUANTITY_RANGE = {
    "time": (0, 10**15),
    "frequency": (1, 10**13),
    "size": (0, 2**50),
    "bandwidth": (1, 10**15),
    "energy": (0, 10**15),          # up to 1 J per action
    "energy_per_bit": (0, 10**9),   # up to 1 µJ per bit
    "power": (0, 10**12),           # up to 1 MW per component
}
UNLIMITED = "unlimited"
#: the longest wall-clock limit a scenario or sweep may set (ps): 10**6 s, about 11.6 days
WALL_TIME_MAX = 10**18

_NUM = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+)\s*([A-Za-zµ/]+)\s*$")


class UnitError(ValueError):
    """A quantity string is malformed, lacks its unit, or has the wrong kind of unit."""


def parse_quantity(value, kind: str) -> int:
    """Parse ``value`` (a string with a unit) as a quantity of ``kind``; return an exact int.

    ``kind`` is one of ``time`` (-> ps), ``frequency`` (-> Hz), ``size`` (-> bytes),
    ``bandwidth`` (-> bytes/s).  Bare numbers are rejected: the unit is required.
    """
    units = KINDS[kind]
    expected = f"a {kind} with a unit, e.g. '{_EXAMPLES[kind]}' (units: {', '.join(units)})"
    if isinstance(value, bool) or not isinstance(value, str):
        raise UnitError(f"expected {expected}, found {value!r} (missing unit)")
    m = _NUM.match(value)
    if not m:
        raise UnitError(f"expected {expected}, found {value!r}")
    number, unit = m.groups()
    exp = re.search(r"[eE]([+-]?[0-9]+)$", number)
    if len(number) > 40 or (exp and abs(int(exp.group(1))) > 40):
        raise UnitError(f"expected {expected}, found {value[:40]!r}... (a number beyond any machine's range)")
    if unit not in units:
        other = [k for k, table in KINDS.items() if unit in table]
        hint = f" ({unit!r} is a {other[0]} unit)" if other else ""
        raise UnitError(f"expected {expected}, found {value!r}{hint}")
    exact = Fraction(number) * units[unit]
    if exact.denominator != 1:
        smallest = {"time": "1ps", "frequency": "1Hz", "size": "1B", "bandwidth": "1B/s", "energy": "1fJ",
                    "energy_per_bit": "1fJ/bit", "power": "1uW"}[kind]
        raise UnitError(f"{value!r} is not a whole number of {smallest}")
    if exact < 0:
        raise UnitError(f"{value!r} is negative")
    return int(exact)


def parse_time(value) -> int:
    return parse_quantity(value, "time")


def parse_frequency(value) -> int:
    return parse_quantity(value, "frequency")


def parse_bandwidth(value) -> int:
    return parse_quantity(value, "bandwidth")


def parse_size(value) -> int:
    return parse_quantity(value, "size")


def ns(x) -> int:
    """``x`` nanoseconds in ps (exact for decimal literals given as str or int)."""
    return int(Fraction(str(x)) * 1000)


def us(x) -> int:
    return int(Fraction(str(x)) * 10**6)


def ms(x) -> int:
    return int(Fraction(str(x)) * 10**9)


def transfer_ps(nbytes: int, bytes_per_s: int) -> int:
    """Serialisation time of ``nbytes`` at ``bytes_per_s``: ``ceil(nbytes * 1e12 / B)`` ps.

    A bandwidth of 0 means "infinite" (no serialisation delay).
    """
    if bytes_per_s <= 0 or nbytes <= 0:
        return 0
    return -((-nbytes * PS_PER_S) // bytes_per_s)


class ClockDomain:
    """Exact cycles <-> picoseconds for one clock frequency.

    ``period_ps`` is a Fraction (1 GHz = 1000, 400 MHz = 2500, 250 MHz = 4000,
    100 MHz = 10000 exactly; 1.2 GHz = 2500/3).  :meth:`ps` rounds a whole cycle
    count up to the next picosecond, computed from the count, never summed.
    """

    __slots__ = ("name", "hz", "period_ps")

    def __init__(self, hz: int, name: str = "clk"):
        if hz <= 0:
            raise UnitError(f"clock {name}: frequency must be positive, found {hz}")
        self.name = name
        self.hz = int(hz)
        self.period_ps = Fraction(PS_PER_S, self.hz)

    def __eq__(self, other) -> bool:       # by value: two profiles' equal clocks are the same clock
        return isinstance(other, ClockDomain) and (self.name, self.hz) == (other.name, other.hz)

    def __hash__(self) -> int:
        return hash((self.name, self.hz))

    @classmethod
    def parse(cls, value, name: str = "clk") -> "ClockDomain":
        return cls(parse_frequency(value), name)

    def ps(self, cycles: int) -> int:
        """Duration of ``cycles`` cycles in ps (rounded up when the period is fractional)."""
        p = self.period_ps
        return -((-cycles * p.numerator) // p.denominator)

    def cycles(self, ps: int) -> int:
        """Whole cycles elapsed in ``ps`` picoseconds (rounded down)."""
        p = self.period_ps
        return (ps * p.denominator) // p.numerator

    def __repr__(self) -> str:
        return f"ClockDomain({self.name}, {self.hz} Hz, period {self.period_ps} ps)"


def format_quantity(value: int, kind: str) -> str:
    """``value`` (engine units of ``kind``) written back with a unit, for messages."""
    if kind == "time":
        return format_time(value)
    if kind == "bandwidth" and value == 0:
        return UNLIMITED
    units = {"frequency": (("THz", 10**12), ("GHz", 10**9), ("MHz", 10**6), ("kHz", 10**3)),
             "energy": (("J", 10**15), ("mJ", 10**12), ("uJ", 10**9), ("nJ", 10**6), ("pJ", 10**3)),
             "energy_per_bit": (("nJ/bit", 10**6), ("pJ/bit", 10**3)),
             "power": (("kW", 10**9), ("W", 10**6), ("mW", 10**3)),
             "size": (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)),
             "bandwidth": (("PB/s", 10**15), ("TB/s", 10**12), ("GB/s", 10**9), ("MB/s", 10**6))}[kind]
    for unit, scale in units:
        if value >= scale:
            return f"{Fraction(value, scale).__float__():g}{unit}"
    if kind in ("energy", "energy_per_bit") and value:   # below 1 pJ: still in pJ ('0.15pJ/bit')
        return f"{value / 1000:g}{'pJ/bit' if kind == 'energy_per_bit' else 'pJ'}"
    return f"{value}{ {'frequency': 'Hz', 'size': 'B', 'bandwidth': 'B/s', 'energy': 'fJ', 'energy_per_bit': 'fJ/bit', 'power': 'uW'}[kind] }"


def format_time(ps: int) -> str:
    """Human form of a ps count, exact: ``1500 -> '1.5ns'``."""
    for unit, scale in (("s", 10**12), ("ms", 10**9), ("us", 10**6), ("ns", 10**3)):
        if abs(ps) >= scale:
            q = Fraction(ps, scale)
            text = f"{float(q):.6g}" if q.denominator != 1 else str(q.numerator)
            return f"{text}{unit}"
    return f"{ps}ps"

"""Declared uncertainty of machine parameters: how sure a profile is of each value (issue 38).

A profile may qualify any numeric parameter in a top-level ``uncertainty:`` map keyed by the
parameter's key path::

    uncertainty:
      hbm.efficiency: {range: [0.7, 0.9], reason: "ASSUMPTION: kernbench2's 0.8, +- 0.1"}
      cpu.dispatch_cycles.math: {spread: 25%, reason: "ASSUMPTION: no public cycle count"}

``range: [low, high]``: the endpoints are written like the value (a quantity with its own unit:
``[20ns, 60ns]``) and parsed by the same schema node, so a unitless range for a time is the same
error as a unitless time; ``spread: P%``: the value x (1 -/+ P).  Every entry needs a ``reason``
(where the spread comes from: an ``ASSUMPTION`` says why it is plausible, a sourced value its
source's spread).  The range must contain the value it qualifies (``low <= value <= high``,
``low < high``), its key must be a number of the profile (not a map, a flag or a width given
as a string).

The map belongs to the profile, not to a family: :func:`split_uncertainty` takes it out of the
profile document before the family schema validates (the family never sees it), and
:func:`check_uncertainty` validates it against that family's schema once the values are known.
It is inherited through ``extends:`` like any key (entry by entry; ``key: null`` drops an
inherited entry).  A key the scenario sets (``machine.overrides``, ``--set``) or names in
``interval: {pin: [...]}`` is *pinned*: ``emu interval`` does not sample it
(tools/explain/interval.py), and its range is not checked against the overridden value.
"""
from __future__ import annotations

import copy
import difflib
import math
import re
from dataclasses import dataclass

from emulator.declare import schema_spec, value_at
from emulator.schema import Doc, Float, Int, Problem, Quantity, SchemaError, Spec, _Ctx, _fmt_path, quote
from emulator.units import format_quantity

__all__ = ["Uncertain", "split_uncertainty", "check_uncertainty", "leaf_paths", "KEY"]

KEY = "uncertainty"
_SPREAD = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_FIELDS = ("range", "spread", "reason")


@dataclass
class Uncertain:
    """One declared parameter: its key path, the value, the range, why, and where it is declared."""
    key: str
    value: int | float
    low: int | float
    high: int | float
    reason: str
    file: str
    line: int | None
    integer: bool          # sampled values are rounded (ints, and quantities in the engine's integer units)
    kind: str | None       # the quantity kind ("time", "power", ...), None for a plain number
    pinned: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


def split_uncertainty(pdoc: Doc):
    """Remove the ``uncertainty:`` map from a profile document (so the family schema never sees it)
    and return it as written (None entries: dropped by a child profile)."""
    if not isinstance(pdoc.value, dict):
        return None
    return pdoc.value.pop(KEY, None)


def leaf_paths(node: dict, prefix: str = "") -> list[str]:
    """The dotted key paths of the leaves of a nested map (``{"a": {"b": 1}}`` -> ``["a.b"]``)."""
    out = []
    for k, v in node.items():
        out += leaf_paths(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_uncertainty(raw, pdoc: Doc, schema: Spec, profile: dict, pinned=frozenset()) -> dict:
    """``{key: Uncertain}`` of the profile's ``uncertainty:`` map, or a :class:`SchemaError` listing every
    wrong entry at its file:line.  ``profile``: the validated profile; ``pinned``: keys the scenario sets."""
    problems: list[Problem] = []
    ctx = _Ctx(pdoc)

    def fail(path, expected, found, hint=""):
        f, line = pdoc.where((KEY,) + path)
        problems.append(Problem(f, line, _fmt_path((KEY,) + path), expected, found, hint))

    if raw is None:
        return {}
    if not isinstance(raw, dict):
        fail((), "a map of parameter key paths to {range: [low, high]} or {spread: P%}, with a reason",
             type(raw).__name__)
        raise SchemaError(problems)
    out = {}
    for key, entry in raw.items():
        if entry is None:           # a child profile dropped an inherited declaration
            continue
        path = (key,)
        spec = schema_spec(schema, str(key))
        value = value_at(profile, str(key))
        if spec is None or value is None and not isinstance(spec, (Int, Float, Quantity)):
            close = difflib.get_close_matches(str(key), leaf_paths(profile), n=1)
            fail(path, "the key path of a parameter of this profile", quote(key),
                 f"did you mean {close[0]!r}?" if close else "unknown key path")
            continue
        if not isinstance(spec, (Int, Float, Quantity)) or not _number(value):
            fail(path, "a numeric parameter (an integer, a number or a quantity)", quote(key),
                 f"it is {type(value).__name__}")
            continue
        if not isinstance(entry, dict):
            fail(path, "a map {range: [low, high], reason: ...} or {spread: P%, reason: ...}",
                 type(entry).__name__)
            continue
        for extra in entry:
            if extra not in _FIELDS:
                fail(path + (extra,), "one of range, spread, reason", quote(extra))
        reason = entry.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            fail(path + ("reason",), "a reason (where the spread comes from; an ASSUMPTION says why)",
                 "nothing" if reason is None else quote(reason))
        if ("range" in entry) == ("spread" in entry):
            fail(path, "exactly one of range: [low, high] or spread: P%",
                 "both" if "range" in entry else "neither")
            continue
        before = len(ctx.problems)
        if "range" in entry:
            rng = entry["range"]
            if not isinstance(rng, list) or len(rng) != 2:
                fail(path + ("range",), "a list [low, high] in the parameter's unit", quote(rng))
                continue
            low, high = (spec.check(v, (KEY, key, "range", i), ctx) for i, v in enumerate(rng))
            if len(ctx.problems) > before:
                problems.extend(ctx.problems[before:])     # in file order, with this entry's other problems
                continue
            if not low < high:
                fail(path + ("range",), "low < high", f"{rng[0]} >= {rng[1]} (an inverted or empty range)")
                continue
        else:
            m = _SPREAD.match(str(entry["spread"])) if isinstance(entry["spread"], str) else None
            if m is None or not 0 < float(m.group(1)) < 100:
                fail(path + ("spread",), "a relative spread like '25%' (above 0 %, below 100 %)",
                     quote(entry["spread"]))
                continue
            p = float(m.group(1)) / 100
            low, high = value * (1 - p), value * (1 + p)
            if isinstance(value, int):
                low, high = math.floor(low), math.ceil(high)
            if not low < high and str(key) not in pinned:
                fail(path + ("spread",), "a spread that moves the value by at least one unit", quote(entry["spread"]))
                continue
        is_pinned = str(key) in pinned
        if not is_pinned and not low <= value <= high:
            shown = format_quantity(value, spec.kind) if isinstance(spec, Quantity) else f"{value:g}"
            fail(path + ("range",), f"a range containing the parameter's value {shown}",
                 "[" + ", ".join(map(str, entry["range"])) + "]")
            continue
        file, line = pdoc.where((KEY, key))
        out[str(key)] = Uncertain(str(key), value, low, high, reason, file, line,
                                  integer=isinstance(value, int), kind=getattr(spec, "kind", None),
                                  pinned=is_pinned)
    if problems:
        raise SchemaError(problems)
    return out


def with_values(resolved: dict, values: dict) -> dict:
    """A copy of a resolved scenario (emulator.scenario's ``resolved`` form) with each declared parameter
    ``key path -> value`` of ``values`` set in its machine profile: one sample of emu interval, one evaluation
    of emu calibrate."""
    out = copy.deepcopy(resolved)
    for key, v in values.items():
        node, path = out["machine"]["resolved"], key.split(".")
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = v
    return out

"""Machine families and their workloads.

Each family module provides ``PROFILE_SCHEMA`` (the schema of its machine
profile YAML) and ``WORKLOADS``: ``{kind: Workload}`` where a
:class:`Workload` has a parameter schema and a ``build(system, profile,
params)`` function that adds actors and links to the system.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from typing import Callable, Optional

from pathlib import Path

from emulator.errors import BuildError
from emulator.input_paths import SHIPPED, confined_file, input_roots
from emulator.schema import Map

#: ASSUMPTION: the arrays a data-mode run generates and holds at once must fit
#: a workstation: 2 GiB of inputs; a workload asking for more is refused by
#: ``emu validate`` with the bytes it would need (issue 15).
HOST_DATA_BYTES = 2 * 2**30


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit, exact count after, for limit messages (``'4 GiB (4294967296 B)'``)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit} ({n} B)"
    return f"{n} B"

def workload_file(value: str, system, key: str, what: str) -> Path:
    """The file a workload parameter names: absolute, or relative to the scenario file, the working directory
    or the repository (in that order), the first of them under the scenario's input roots
    (emulator/input_paths.py); else a BuildError at ``key`` saying where it looked, or that the file lies
    outside the roots (the bundle copies such files, tools/run/bundle.py)."""
    p = Path(value)
    cands = [p] if p.is_absolute() else []
    scen = (system.scenario or {}).get("file")
    if scen and not p.is_absolute():
        cands.append(Path(scen).resolve().parent / p)
    if not p.is_absolute():
        cands += [Path.cwd() / p, Path(__file__).resolve().parents[1] / p]
    roots = (system.scenario or {}).get("input_roots") or input_roots(Path(scen).parent if scen else SHIPPED)
    found = confined_file(cands, key, value, roots)
    if found is not None:
        return found
    raise BuildError(f"{key}: {what} {value!r} not found (looked in "
                     + ", ".join(dict.fromkeys(str(c.parent) for c in cands)) + ")")


FAMILIES = {
    "demo": "actors.demo.machine",
    "ahbm": "actors.ahbm.machine",
    "pccx": "actors.pccx.machine",
}


@dataclass
class Workload:
    name: str
    summary: str
    params: Map
    build: Callable
    #: optional ``check(system, profile, params, result) -> dict`` run after the
    #: run (e.g. error against a numpy reference); its keys join the result
    check: Optional[Callable] = None
    #: optional ``limits(profile, params, mode) -> [(param, expected, found), ...]``: the
    #: sizes this machine cannot hold or the host cannot generate, checked by
    #: ``emu validate`` before anything is built (issue 15: a clear error with the
    #: bytes it would need, never a MemoryError or an endless input generation)
    limits: Optional[Callable] = None
    #: optional ``progress(system, context=...) -> (done, total, unit)``: the work done so far out of a total
    #: known at build time (MACs of a kernel, tokens of a decode), read by the progress display from its own
    #: thread while the run goes on (so: plain attribute reads, no iteration over changing containers)
    progress: Optional[Callable] = None

    def bind(self, context) -> "Workload":
        """This workload with ``check`` and ``progress`` given ``context=`` the value ``build`` returned
        (DESIGN.md §7: workloads return a context that the runner hands to check).  ``None``: unchanged."""
        if context is None:
            return self
        bound = {name: functools.partial(fn, context=context) for name in ("check", "progress")
                 if (fn := getattr(self, name)) is not None}
        return dataclasses.replace(self, **bound) if bound else self


def family(name: str):
    """The module of machine family ``name`` (KeyError if unknown or not installed)."""
    try:
        return importlib.import_module(FAMILIES[name])
    except ModuleNotFoundError as e:
        if e.name and FAMILIES[name].startswith(e.name):
            raise KeyError(name) from None
        raise

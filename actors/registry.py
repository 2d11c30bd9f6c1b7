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

from emulator.schema import Map

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

    def bind(self, context) -> "Workload":
        """This workload with ``check`` given ``context=`` the value ``build`` returned (DESIGN.md §7:
        workloads return a context that the runner hands to check).  ``None``: unchanged."""
        if context is None or self.check is None:
            return self
        return dataclasses.replace(self, check=functools.partial(self.check, context=context))


def family(name: str):
    """The module of machine family ``name`` (KeyError if unknown or not installed)."""
    try:
        return importlib.import_module(FAMILIES[name])
    except ModuleNotFoundError as e:
        if e.name and FAMILIES[name].startswith(e.name):
            raise KeyError(name) from None
        raise

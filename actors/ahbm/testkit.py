"""Helpers for tests and notebooks on the AHBM machine (virtual time only).

* :func:`load_profile` reads scenarios/machines/<name>.yaml, applies overrides
  (a nested dict merged in) and validates it;
* :func:`build` makes a :class:`~emulator.system.System` with the machine and
  the given per-PE scripts; :func:`log` reads a PE's per-command timings after
  the run.
"""
from __future__ import annotations

from actors.ahbm.builder import build_machine
from actors.ahbm.params import PROFILE_SCHEMA, pe_name
from actors.ahbm.placement import Placement
from emulator.scenario import load_profile as emulator_load_profile
from emulator.system import System

__all__ = ["load_profile", "build", "log"]


def load_profile(name: str = "ahbm-1sip", overrides: dict | None = None) -> dict:
    """The validated AHBM profile ``name`` with ``overrides`` merged in."""
    return emulator_load_profile(name, PROFILE_SCHEMA, overrides)


def build(scripts: dict, profile: dict | None = None, *, mode: str = "timing", seed: int = 0, trace=None):
    """``(system, machine, placement)`` for ``scripts`` = {(sip, cube, pe): [commands]}."""
    system = System("ahbm-test", seed=seed, mode=mode, trace=trace)
    machine = build_machine(system, profile or load_profile(), scripts=scripts)
    return system, machine, Placement(machine, mode == "data")


def log(machine, coord, label: str):
    """``[label, t_start, t_issued, t_done]`` of the command ``label`` on PE ``coord``."""
    for row in machine.host.logs.get(f"{pe_name(*coord)}/cpu", []):
        if row[0] == label:
            return row
    raise KeyError(f"no command {label!r} in the log of PE {list(coord)}")

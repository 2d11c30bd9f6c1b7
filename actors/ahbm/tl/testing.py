"""Helpers to run ``tl`` kernels on a small machine (tests and workloads).

``profile(**overrides)`` validates an AHBM profile (defaults of
actors/ahbm/params.py merged with nested ``overrides``); ``machine(...)``
builds a System with one CUBE of ``tl`` PEs; ``launch_kernel`` adds the host.
"""
from __future__ import annotations

import copy

from emulator.schema import Doc, Map, validate
from emulator.system import System

from actors.ahbm.params import PROFILE_SCHEMA, Params
from actors.ahbm.tl.launcher import launch
from actors.ahbm.tl.pe import build_cube

__all__ = ["profile", "params", "machine", "merge"]


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def skeleton(spec=None) -> dict:
    """Every required map of the AHBM profile schema, empty: the schema fills in its sourced defaults."""
    spec = PROFILE_SCHEMA if spec is None else spec
    out = {}
    for key, sub in spec.fields.items():
        if isinstance(sub, Map):
            out[key] = skeleton(sub)
    return out


def profile(overrides: dict | None = None) -> dict:
    """The validated AHBM profile: schema defaults (the sourced values of actors/ahbm/params.py) + ``overrides``."""
    doc = Doc(merge({**skeleton(), "family": "ahbm"}, overrides or {}), {}, "<tl profile>")
    return validate(PROFILE_SCHEMA, doc)


def params(overrides: dict | None = None) -> Params:
    return Params.of(profile(overrides))


def machine(kernel: str, args_of, *, mode: str = "data", overrides: dict | None = None, pes=None, seed: int = 0,
            setup=None):
    """A System with one CUBE of tl PEs; ``kernel`` launched on ``pes`` (indices, default [0]).

    ``setup(pe_list, prm)`` runs before launch (e.g. hbm_place).  Returns (system, prm, pe_list, host).
    """
    prm = params(overrides)
    system = System("tl", seed=seed, mode=mode)
    cube = build_cube(system, prm)
    chosen = [cube[i] for i in (pes if pes is not None else [0])]
    if setup is not None:
        setup(cube, prm)
    host = launch(system, prm, chosen, kernel, args_of, lambda pe: (pe.index, 0), (len(chosen), 1))
    return system, prm, cube, host

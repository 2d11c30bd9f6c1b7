"""Helpers to run ``tl`` kernels on a small AHBM machine (tests and notebooks; virtual time only).

``profile(overrides)`` validates an AHBM profile: the base profile's sourced values
(scenarios/machines/ahbm.yaml) on a small mesh, :data:`SMALL` (one SIP of 2 x 1 CUBEs,
so a test builds 16 PEs rather than a whole SIP), with nested ``overrides``
merged in.  ``machine(...)`` builds that machine with the standard builder
(actors/ahbm/builder.py) and has its host launch a kernel on some PEs of CUBE 0
or on any ``coords``.  ``hbm_place`` / ``hbm_fetch`` write / read a PE's HBM
outside the run (the initial memory image; results after the run).
"""
from __future__ import annotations

import numpy as np

from emulator.scenario import deep_merge, load_profile
from emulator.system import System

from actors.ahbm.builder import build_machine
from actors.ahbm.costs import stripe
from actors.ahbm.params import PROFILE_SCHEMA, Params
from actors.ahbm.tl.launcher import kernel_launches

__all__ = ["SMALL", "profile", "params", "machine", "hbm_place", "hbm_fetch"]

#: the test machine's mesh: one SIP of 2 x 1 CUBEs (the IO die attaches to CUBE 0)
SMALL = {"sips": 1, "cubes": {"x": 2, "y": 1}}


def profile(overrides: dict | None = None) -> dict:
    """The validated AHBM profile: the base profile on the :data:`SMALL` mesh + ``overrides``."""
    return load_profile("ahbm", PROFILE_SCHEMA, deep_merge(SMALL, overrides or {}))


def params(overrides: dict | None = None) -> Params:
    return Params.of(profile(overrides))


def hbm_place(pe, prm, addr: int, array: np.ndarray) -> None:
    """Initial HBM contents of machine PE ``pe`` (builder.Pe): ``array`` at ``addr``, striped over its PCs."""
    blob = np.ascontiguousarray(array).tobytes()
    for pc, pieces in enumerate(stripe(addr, 1, len(blob), len(blob), prm.burst, prm.pcs)):
        for a, ln in pieces:
            pe.pcs[pc].preload(a, blob[a - addr:a - addr + ln])


def hbm_fetch(pe, prm, addr: int, shape, dtype) -> np.ndarray:
    """Read a tensor back from machine PE ``pe``'s HBM after the run (data mode)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    out = bytearray(n)
    for pc, pieces in enumerate(stripe(addr, 1, n, n, prm.burst, prm.pcs)):
        for a, ln in pieces:
            out[a - addr:a - addr + ln] = pe.pcs[pc]._read(a, ln)
    return np.frombuffer(bytes(out), dtype=np.dtype(dtype)).reshape(shape)


def machine(kernel: str, args_of, *, mode: str = "data", overrides: dict | None = None, pes=None, coords=None,
            seed: int = 0, setup=None):
    """A System with the test machine; ``kernel`` launched on PEs ``pes`` of CUBE 0 (indices, default [0])
    or on ``coords`` [(sip, cube, pe)], each with program_id ``[pe, cube, sip]``.

    ``args_of(coord)`` gives a PE's kernel arguments; ``setup(cube0_pes, prm)`` runs before the run (e.g.
    hbm_place).  Returns ``(system, prm, cube0_pes, machine)``.
    """
    prm = params(overrides)
    system = System("tl", seed=seed, mode=mode)
    if coords is None:
        coords = [(0, 0, p) for p in (pes if pes is not None else [0])]
    kernels = kernel_launches(kernel, coords, args_of, lambda c: (c[2], c[1], c[0]), (prm.P, prm.cubes, prm.sips))
    m = build_machine(system, profile(overrides), kernels=kernels)
    cube0 = [m.pe(0, 0, p) for p in range(prm.P)]
    if setup is not None:
        setup(cube0, prm)
    return system, prm, cube0, m

"""Seeded random streams, one per name.

All randomness of a run comes from the scenario seed.  Each consumer asks for a
stream by a stable name (an actor name, ``"faults/<i>"``, ...); the stream is a
``numpy.random.Generator`` seeded by ``SeedSequence(seed, spawn_key=...)`` where
the spawn key is derived from the sha256 of the name.  Streams are therefore
independent of each other, of creation order and of ``PYTHONHASHSEED``.
"""
from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["stream", "name_key"]


def name_key(name: str) -> tuple[int, ...]:
    digest = hashlib.sha256(name.encode()).digest()
    return tuple(int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4))


def stream(seed: int, name: str) -> np.random.Generator:
    """The random stream called ``name`` under scenario seed ``seed``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=name_key(name))))

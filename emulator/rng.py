"""Seeded random streams, one per name.

All randomness of a run comes from the scenario seed.  Each consumer asks for a
stream by a stable name (an actor name, ``"faults/<i>"``, ...); the stream is a
``numpy.random.Generator`` seeded by ``SeedSequence(seed, spawn_key=...)`` where
the spawn key is derived from the sha256 of the name.  Streams are therefore
independent of each other, of creation order and of ``PYTHONHASHSEED``.
"""
from __future__ import annotations

import hashlib
import struct

import numpy as np

__all__ = ["stream", "name_key"]


def name_key(name: str) -> tuple[int, ...]:
    """The spawn key of stream ``name``: the first 16 bytes of its sha256 as four little-endian u32."""
    return _FOUR_U32(hashlib.sha256(name.encode()).digest())


_FOUR_U32 = struct.Struct("<4I16x").unpack


def stream(seed: int, name: str) -> np.random.Generator:
    """The random stream called ``name`` under scenario seed ``seed``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=name_key(name))))

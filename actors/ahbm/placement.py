"""Tensor placement across the (cube, pe) axes and the per-PE HBM allocator.

Like the seed's ``DPPolicy`` (seed §2.1): each axis is ``row_wise`` (dimension 0
is split into contiguous, near-equal shards, CUBE axis first, then PE axis) or
``replicate`` (every rank holds the whole tensor).  A :class:`Placement` writes
the shards into the PEs' HBM before the run (the initial memory image) or,
with ``timed=True``, has the host load them over the NOC at run time
(host.py), and returns where each shard lives.

Allocator: a bump pointer per PE, each tensor aligned to ``burst x pcs``
(2 KiB by default) so every tensor starts on pseudo-channel 0 (assumption).
Data mode stores the bytes in the pseudo-channel controllers by address
striping (costs.stripe); timing mode only allocates.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protocols.codec import TensorDesc

from actors.ahbm.costs import stripe

__all__ = ["Placement", "Shard", "split_rows", "hbm_write", "hbm_read"]


@dataclass(frozen=True)
class Shard:
    coord: tuple      # (sip, cube, pe)
    addr: int
    shape: tuple
    dtype: str
    rows: tuple       # [start, stop) of dimension 0 of the whole tensor


def split_rows(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous near-equal shards of ``range(n)`` (the first ``n % parts`` get one more)."""
    base, rem = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < rem else 0)
        out.append((start, start + size))
        start += size
    return out


def hbm_write(pe, prm, addr: int, blob: bytes) -> None:
    """Preload ``blob`` at ``addr`` of machine PE ``pe``'s HBM (builder.Pe), striped over its pseudo-channels."""
    for pc, pieces in enumerate(stripe(addr, 1, len(blob), len(blob), prm.burst, prm.pcs)):
        for a, ln in pieces:
            pe.pcs[pc].preload(a, blob[a - addr:a - addr + ln])


def hbm_read(pe, prm, addr: int, nbytes: int) -> bytes:
    """``nbytes`` at ``addr`` of machine PE ``pe``'s HBM, gathered from its pseudo-channels (after a run)."""
    out = bytearray(nbytes)
    for pc, pieces in enumerate(stripe(addr, 1, nbytes, nbytes, prm.burst, prm.pcs)):
        for a, ln in pieces:
            out[a - addr:a - addr + ln] = pe.pcs[pc]._read(a, ln)
    return bytes(out)


class Placement:
    def __init__(self, machine, data_mode: bool):
        self.m = machine
        self.data = data_mode
        self.next: dict[tuple, int] = {}

    def alloc(self, coord: tuple, nbytes: int) -> int:
        prm = self.m.prm
        align = prm.burst * prm.pcs
        addr = self.next.get(coord, 0)
        end = addr + -(-max(nbytes, 1) // align) * align
        if end > prm.hbm_capacity:
            raise ValueError(f"HBM of PE {list(coord)} full: {end} B needed, capacity {prm.hbm_capacity} B")
        self.next[coord] = end
        return addr

    def put(self, coord: tuple, array: np.ndarray) -> int:
        """Allocate and (data mode) write one array into PE ``coord``'s HBM; returns its address."""
        arr = np.ascontiguousarray(array)
        addr = self.alloc(coord, arr.nbytes)
        if self.data:
            self.write(coord, addr, arr.tobytes())
        return addr

    def load(self, coord: tuple, array: np.ndarray) -> int:
        """Allocate and have the host load ``array`` into PE ``coord``'s HBM at run time (timed, host.py)."""
        arr = np.ascontiguousarray(array)
        addr = self.alloc(coord, arr.nbytes)
        self.m.host.loads.append((tuple(coord), addr, arr))
        return addr

    def tcm_put(self, coord: tuple, buf: str, array: np.ndarray) -> None:
        """Put a tensor in PE ``coord``'s TCM before the run (array in data mode, descriptor in timing mode)."""
        arr = np.ascontiguousarray(array)
        self.m.pe(*coord).tcm.preload(buf, arr if self.data else TensorDesc.like(arr))

    def write(self, coord: tuple, addr: int, blob: bytes) -> None:
        hbm_write(self.m.pe(*coord), self.m.prm, addr, blob)

    def read(self, coord: tuple, addr: int, nbytes: int) -> bytes:
        """Read back bytes after a run (for checks)."""
        return hbm_read(self.m.pe(*coord), self.m.prm, addr, nbytes)

    def place(self, array: np.ndarray, *, sip: int = 0, cubes: list[int], pes: list[int],
              cube: str = "row_wise", pe: str = "row_wise", timed: bool = False) -> list[Shard]:
        """Place ``array`` over ``cubes`` x ``pes`` of SIP ``sip`` with a DPPolicy-like rule."""
        for axis, rule in (("cube", cube), ("pe", pe)):
            if rule not in ("row_wise", "replicate"):
                raise ValueError(f"placement {axis}: expected row_wise or replicate, found {rule!r}")
        shards = []
        n = array.shape[0]
        cube_parts = split_rows(n, len(cubes)) if cube == "row_wise" else [(0, n)] * len(cubes)
        for c, (c0, c1) in zip(cubes, cube_parts):
            pe_parts = split_rows(c1 - c0, len(pes)) if pe == "row_wise" else [(0, c1 - c0)] * len(pes)
            for p, (p0, p1) in zip(pes, pe_parts):
                part = array[c0 + p0:c0 + p1]
                coord = (sip, c, p)
                addr = self.load(coord, part) if timed else self.put(coord, part)
                shards.append(Shard(coord, addr, part.shape, part.dtype.str,
                                    (c0 + p0, c0 + p1)))
        return shards

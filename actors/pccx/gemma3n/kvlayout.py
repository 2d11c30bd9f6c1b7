"""Where the KV ring lives in host DDR, and the DataMover pieces that stream a set of its slots.

The attention GEMVs take the cache as their weights (compiler docstring): ``scores = K q``
streams K rows (one per slot), ``ctx = V^T p`` streams V^T rows (one per channel) whose
K dimension runs over the slots.  Both regions are in the GEMV lane's chunk-major order
(actors/pccx/gemv.py: per 32-nibble slice of a row, every row's 16-byte beat), so:

* K (per producer layer and KV head): ``[kc slices][T slots][16 B]`` then ``T`` BF16
  scales (one per token: the GEMV's per-row ``w_scale``), ``kc = ceil(head_dim x b/4 / 32)``
  for ``b``-bit entries (an INT8 / FP16 entry is 2 / 4 INT4 nibble slots, compiler
  docstring).  A set of slots is streamed as one piece per slice and slot range, then
  the ranges' scales: the valid rows only.
* V^T (per producer layer, KV head and row block: one block per GEMV lane's rows
  when lanes split the rows, one block of all rows for a head-parallel GEMV): ``head_dim
  + 1`` rows, row 0 the softmax-sum row (1 at every written slot, scale 1: the V GEMV's
  first output is ``sum p``, the SCALE's scalar; compiler docstring), row ``1 + r``
  channel r; ``[vc slices][n rows][16 B]`` then ``n`` static BF16 per-row scales,
  ``vc = ceil(T x b/4 / 32)``.  A slice holds 32 nibble slots of every channel, so a set of
  slots is streamed as the slices that hold them (contiguous for a range that starts at
  slot 0): the valid part of the ring, padded to whole slices (< 32 nibble slots per
  range end and channel: the ``padding`` bytes the report names).

``slices(ranges)`` gives those slice ranges; the activation of the V GEMV is the EXP
output laid out the same way (slot s of a range at position ``32 x (slices before its
slice) + (s x b/4) mod 32``), so a range that does not start on a slice boundary leaves
positions the EXP does not write: the compiler zeroes them first (compiler docstring).
"""
from __future__ import annotations

from actors.pccx.gemv import k_chunks, lane_rows

__all__ = ["KvLayout", "slot_ranges", "deal", "row_blocks"]

BEAT = 16


def slot_ranges(slots: list[int]) -> list[tuple[int, int]]:
    """Sorted slots as contiguous ``[a, b)`` ranges."""
    out: list[list[int]] = []
    for s in sorted(slots):
        if out and out[-1][1] == s:
            out[-1][1] = s + 1
        else:
            out.append([s, s + 1])
    return [(a, b) for a, b in out]


def deal(pieces: list[tuple[int, int]], parts: list[int]) -> list[list[tuple[int, int]]]:
    """Cut a stream of ``(addr, nbytes)`` pieces into consecutive parts of ``parts`` bytes each."""
    out, i, off = [], 0, 0
    for want in parts:
        cur = []
        while want:
            addr, n = pieces[i]
            take = min(want, n - off)
            cur.append((addr + off, take))
            want -= take
            off += take
            if off == n:
                i, off = i + 1, 0
        out.append(cur)
    return out


class KvLayout:
    """The KV ring regions of every producer layer in one :class:`DdrLayout`; see the module docstring."""

    def __init__(self, ddr, c: dict, bits: int, blocks: list[tuple[int, int]], producers: list[int]):
        self.T, self.hd, self.kvh = c["kv"]["max_tokens"], c["head_dim"], c["num_kv_heads"]
        self.nib = bits // 4                                  # INT4 nibble slots per element
        self.kc = k_chunks(self.hd * self.nib)
        self.vc = k_chunks(self.T * self.nib)
        self.blocks = blocks                                  # V^T row blocks (first channel, channels)
        self.k: dict[tuple[int, int], int] = {}
        self.v: dict[tuple[int, int, int], int] = {}
        for i in producers:
            for h in range(self.kvh):
                self.k[(i, h)] = ddr.alloc(f"kv.L{i}.h{h}.K", self.kc * self.T * BEAT + 2 * self.T)
                for b, (r0, n) in enumerate(blocks):
                    self.v[(i, h, b)] = ddr.alloc(f"kv.L{i}.h{h}.V{b}", self.vc * n * BEAT + 2 * n)

    # -- streams -------------------------------------------------------------------------------------------
    def k_pieces(self, layer: int, head: int, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The K rows of the slots in ``ranges`` (in range order), chunk-major, then their scales."""
        base, T = self.k[(layer, head)], self.T
        out = [(base + (c * T + a) * BEAT, (b - a) * BEAT) for c in range(self.kc) for a, b in ranges]
        return out + [(base + self.kc * T * BEAT + 2 * a, 2 * (b - a)) for a, b in ranges]

    def slices(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Merged V^T slice ranges ``[c0, c1)`` holding the slots of ``ranges``."""
        out: list[list[int]] = []
        for a, b in ranges:
            c0, c1 = a * self.nib // 32, -(-b * self.nib // 32)
            if out and c0 <= out[-1][1]:
                out[-1][1] = max(out[-1][1], c1)
            else:
                out.append([c0, c1])
        return [(a, b) for a, b in out]

    def position(self, slot: int, slices: list[tuple[int, int]]) -> int:
        """Activation position (nibble slot) of ``slot`` in the V stream of ``slices``."""
        c, before = slot * self.nib // 32, 0
        for c0, c1 in slices:
            if c0 <= c < c1:
                return 32 * (before + c - c0) + slot * self.nib % 32
            before += c1 - c0
        raise ValueError(f"slot {slot} is not in the V slices {slices}")

    def v_pieces(self, layer: int, head: int, block: int, slices: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The V^T slices of one row block, then the block's per-channel scales."""
        base, n = self.v[(layer, head, block)], self.blocks[block][1]
        out = [(base + c0 * n * BEAT, (c1 - c0) * n * BEAT) for c0, c1 in slices]
        return out + [(base + self.vc * n * BEAT, 2 * n)]

    # -- the host's writes of one token's entries ---------------------------------------------------------------
    def k_cells(self, layer: int, head: int, slot: int) -> tuple[list[int], int]:
        """DDR addresses of slot ``slot``'s K row beats (one per slice) and of its scale."""
        base, T = self.k[(layer, head)], self.T
        return [base + (c * T + slot) * BEAT for c in range(self.kc)], base + self.kc * T * BEAT + 2 * slot

    def v_cells(self, layer: int, head: int, slot: int) -> list[tuple[int, int]]:
        """(DDR address, V^T row) of the byte holding slot ``slot`` in every row (INT4: with its pair slot)."""
        out = []
        nib = slot * self.nib
        for b, (r0, n) in enumerate(self.blocks):
            base = self.v[(layer, head, b)]
            out += [(base + (nib // 32 * n + r) * BEAT + nib % 32 // 2, r0 + r) for r in range(n)]
        return out

    def v_scale_addr(self, layer: int, head: int) -> list[tuple[int, int, int]]:
        """(DDR address, first row, rows) of each block's per-row scales."""
        return [(self.v[(layer, head, b)] + self.vc * n * BEAT, r0, n) for b, (r0, n) in enumerate(self.blocks)]


def row_blocks(rows: int, lanes: int, head: bool) -> list[tuple[int, int]]:
    """V^T row blocks: all ``rows`` in one (head-parallel GEMV), else the lanes' row split."""
    return [(0, rows)] if head else [(r0, n) for r0, n in lane_rows(rows, lanes) if n]

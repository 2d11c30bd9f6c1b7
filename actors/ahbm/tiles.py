"""The PE scheduler's tile plan for a composite GEMM (seed §0 ``CompositeCmd``, ADR-0014 D6).

``C[M, N] = epilogue(A[M, K] @ B[K, N])`` with row-major A, B, C in HBM is cut
into output tiles of TILE_M x TILE_N (default 32 x 32, DESIGN.md §4) walked
row-major; each output tile is a chain of K steps of TILE_K (default 64).  A
step loads the A block ``[tm, tk]`` and the B block ``[tk, tn]`` (2-D DMAs) and
runs one GEMM tile; the last step of an output tile is followed by the
epilogue MATH steps and a 2-D DMA store of the C block.  Edge tiles are
smaller (``tm = min(TILE_M, M - m0)`` ...).

B reuse across M tiles (seed §B.4: the K/V operand of an attention GEMM must be
read once for all ``G*T_q`` rows): when there are several M tiles and a B column
``[K, tn]`` fits the scheduler's two B buffers (``ceil(K / TILE_K) <= 2``), the
walk is column-major (N tile outer, then M tile, then K step) and the B blocks of
a column are loaded with its first M tile only (``Step.load_b``), into buffer
``(n_index * k_steps + k_index) % 2`` (``Step.b_buf``), where they stay for the
column's other M tiles.  With one M tile this is the row-major walk, buffer for
buffer.  Otherwise (a B column larger than two blocks) every step loads its B block.

A reuse across N tiles: with a single M tile whose A row block ``[tm, K]`` fits the
two A buffers (``ceil(K / TILE_K) <= 2``, e.g. the ``[G, d]`` query of a decode
``Q·Kᵀ`` or the ``[G, T]`` probabilities of ``P·V``) the A blocks are loaded with
the first N tile only (``Step.load_a``) into buffer ``k_index`` (``Step.a_buf``) and
stay there for the other N tiles, instead of re-reading the same bytes per N tile.

B panels (cross-composite prefetch, scheduler.py): :func:`panels` groups the
B-loading steps of a plan, in step order, into runs whose B blocks tile one
rectangle ``B[k_lo:k_hi, n_lo:n_hi]`` exactly (no block twice, no gap) of at most
``budget`` bytes, so one 2-D DMA brings several K steps / N tiles at once.  The
greedy run stops at the first block that would break the rectangle or the budget.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Step", "plan", "Panel", "panels"]


@dataclass(frozen=True)
class Step:
    index: int          # step number
    tile: int           # output tile number
    m0: int
    k0: int
    n0: int
    tm: int
    tk: int
    tn: int
    first: bool         # first K step of its output tile
    last: bool          # last K step of its output tile
    load_b: bool = True  # this step loads its B block (False: resident from an earlier M tile)
    b_buf: int = 0       # B buffer (0/1) the block is in
    load_a: bool = True  # this step loads its A block (False: resident from the first N tile)
    a_buf: int = 0       # A buffer (0/1) the block is in


def plan(M: int, K: int, N: int, tile: tuple[int, int, int]) -> list[Step]:
    TM, TK, TN = tile
    if min(M, K, N) <= 0:
        raise ValueError(f"composite GEMM needs positive m, k, n; found {M}, {K}, {N}")
    ks = list(range(0, K, TK))
    if M > TM and len(ks) <= 2:   # B-stationary walk (module docstring)
        steps = []
        t = 0
        for ni, n0 in enumerate(range(0, N, TN)):
            for mi, m0 in enumerate(range(0, M, TM)):
                for i, k0 in enumerate(ks):
                    steps.append(Step(len(steps), t, m0, k0, n0, min(TM, M - m0), min(TK, K - k0), min(TN, N - n0),
                                      i == 0, i == len(ks) - 1, mi == 0, (ni * len(ks) + i) % 2, True,
                                      len(steps) % 2))
                t += 1
        return steps
    a_resident = M <= TM and len(ks) <= 2   # A reuse across N tiles (module docstring)
    steps = []
    t = 0
    for m0 in range(0, M, TM):
        for ni, n0 in enumerate(range(0, N, TN)):
            for i, k0 in enumerate(ks):
                idx = len(steps)
                steps.append(Step(idx, t, m0, k0, n0, min(TM, M - m0), min(TK, K - k0), min(TN, N - n0),
                                  i == 0, i == len(ks) - 1, True, idx % 2, not a_resident or ni == 0,
                                  i if a_resident else idx % 2))
            t += 1
    return steps


@dataclass
class Panel:
    """One B rectangle loaded by one DMA for the consecutive B-loading ``steps`` of a plan."""
    k_lo: int
    k_hi: int
    n_lo: int
    n_hi: int
    steps: list[int]    # indices of the steps that copy their B block out of this panel


def _box(blocks) -> tuple[int, int, int, int]:
    return (min(b[0] for b in blocks), max(b[1] for b in blocks), min(b[2] for b in blocks),
            max(b[3] for b in blocks))


def panels(steps: list[Step], esize: int, budget: int) -> list[Panel]:
    """Group the B-loading steps into panels (module docstring); a block larger than ``budget``
    on its own still gets a panel of one block (the caller checks it fits its staging space)."""
    out: list[Panel] = []
    blocks: list[tuple[int, int, int, int]] = []
    idx: list[int] = []
    for s in steps:
        if not s.load_b:
            continue
        blk = (s.k0, s.k0 + s.tk, s.n0, s.n0 + s.tn)
        if blocks:
            k_lo, k_hi, n_lo, n_hi = _box(blocks + [blk])
            area = (k_hi - k_lo) * (n_hi - n_lo)
            exact = area == sum((b[1] - b[0]) * (b[3] - b[2]) for b in blocks + [blk]) and blk not in blocks
            if not exact or area * esize > budget:
                out.append(Panel(*_box(blocks), idx))
                blocks, idx = [], []
        blocks.append(blk)
        idx.append(s.index)
    if blocks:
        out.append(Panel(*_box(blocks), idx))
    return out

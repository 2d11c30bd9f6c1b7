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
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Step", "plan"]


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

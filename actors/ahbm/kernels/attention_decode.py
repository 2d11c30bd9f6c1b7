"""Baseline decode attention (seed §A ``_attention_mesh_mlo``): split-KV partials, all-to-all fan-out.

Every rank of an open line of PEs owns a slice of the KV cache (``S`` keys) and
the same query rows ``q [M, d]`` (M = G·T_q, G folded into M, seed §5.2).

1. Partial attention over the local slice (seed §5.2): one shot when ``tile`` is
   0 (``S = q Kᵀ · scale; m = rowmax S; P = exp(S - m); l = rowsum P; O = P V``),
   else tiled with the online softmax, each tile's temporaries in
   ``tl.scratch_scope()`` (seed §3, ADR-0063) so ``S`` may exceed the TCM.
   ``gemm="dot"``: K/V tiles are lazy ``tl.load``s, ``Kᵀ`` is a real ``tl.trans``
   and both GEMMs are blocking ``tl.dot`` (the baseline).  ``gemm="composite"``:
   both GEMMs are non-blocking ``tl.composite`` commands, K/V as ``tl.ref`` HBM
   operands, ``q`` and ``P`` read and the results written in the TCM (seed §B.3), K stored pre-transposed tile-major ``[n_tiles, d, T]`` (seed §B item 2), the
   scale as the composite's epilogue, and tile j+1's ``Q·Kᵀ`` issued before tile
   j's scores are waited for (cross-tile pipelining on the scheduler, seed §3).
2. Fan-out (seed §A limit 2): in step ``s = 1 .. n-1`` each rank passes on, in
   both directions, the partial it received at step ``s-1`` (its own at ``s = 1``)
   and folds what it receives with the log-sum-exp merge.  Rank i's partial
   reaches rank j at step |i-j|: after n-1 steps every rank holds the answer and
   stores ``O / l``.  Order per step: send fwd, recv bwd, send bwd, recv fwd
   (no cyclic wait on IPCQ credits).
"""
from __future__ import annotations

from actors.ahbm.kernels.merge import fold_tile, init_running, lse_merge

__all__ = ["attention_decode", "fanout_merge"]

F2 = 2  # bytes per bf16 (stored as float16, ref §3.3)


def attention_decode(q_ptr, k_ptr, v_ptr, o_ptr, *, M, d, S, tile, scale, rank, n, fwd, bwd, gemm="dot", tl):
    T = tile if 0 < tile < S else S
    composite = gemm == "composite"
    q = tl.load(q_ptr, (M, d))   # lazy; the composites read it from the TCM (seed TL;DR, §B.3)
    m, l, O = init_running(tl, M, d)
    n_tiles = S // T

    def scores(j):   # S_j = q K_jᵀ · scale on the PE scheduler (K pre-transposed tile-major)
        return tl.composite("gemm", a=q, b=tl.ref(k_ptr + j * d * T * F2, (d, T)), epilogue=[("scale", scale)])

    S_next = scores(0) if composite else None
    for j in range(n_tiles):
        with tl.scratch_scope():
            if composite:
                Sj = S_next
                if j + 1 < n_tiles:   # issue the next tile's Q·Kᵀ before waiting for this one (seed §3)
                    S_next = scores(j + 1)
                v = tl.ref(v_ptr + j * T * d * F2, (T, d))
            else:
                k = tl.load(k_ptr + j * T * d * F2, (T, d))
                v = tl.load(v_ptr + j * T * d * F2, (T, d))
                Sj = tl.dot(q, tl.trans(k)) * scale
            m, l, O = fold_tile(tl, m, l, O, Sj, v, composite)
    tl.report("partial_done_ps", tl.now())
    m, l, O = fanout_merge(tl, (m, l, O), rank=rank, n=n, fwd=fwd, bwd=bwd, M=M, d=d)
    tl.store(o_ptr, O / l)


def fanout_merge(tl, own, *, rank, n, fwd, bwd, M, d):
    """All-to-all bidirectional (m, l, O) fan-out along an open line; returns the merged state."""
    m, l, O = own
    east = list(own)     # travelling towards higher ranks (direction fwd)
    west = list(own)     # travelling towards lower ranks (direction bwd)
    shapes = ((M, 1), (M, 1), (M, d))
    steps = merges = 0
    for s in range(1, n):
        with tl.scratch_scope():
            active = False
            if fwd and rank - (s - 1) >= 0 and east:
                for x in east:
                    tl.send(fwd, x)
                active = True
            got_w = []
            if rank - s >= 0:
                got_w = [tl.recv(bwd, sh) for sh in shapes]
                m, l, O = lse_merge(tl, (m, l, O), got_w)
                merges += 1
                active = True
            if bwd and rank + (s - 1) <= n - 1 and west:
                for x in west:
                    tl.send(bwd, x)
                active = True
            got_e = []
            if rank + s <= n - 1:
                got_e = [tl.recv(fwd, sh) for sh in shapes]
                m, l, O = lse_merge(tl, (m, l, O), got_e)
                merges += 1
                active = True
            east, west = got_w, got_e
            steps += active
    tl.report("reduction_steps", steps)
    tl.report("merges", merges)
    return m, l, O

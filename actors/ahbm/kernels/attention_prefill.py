"""Baseline prefill attention (seed §A ``_attention_mesh_kv``, kernbench2 ADR-0059): open-mesh K/V propagation.

Every rank of an open line owns a query chunk ``q [M, d]`` and a K/V chunk of
``S`` keys.  It folds its own chunk, then for ``s = 1 .. n-1`` passes on, in both
directions, the K/V chunk it received at step ``s-1`` (its own at ``s = 1``) and
folds each chunk it receives with the online softmax: rank i's chunk reaches
rank j at step |i-j|, so after n-1 steps every rank has attended to all keys
(non-causal, as the baseline) and stores its ``O / l``.

Chunks travel as tiles of ``T`` keys (``tile``; 0 = the whole chunk): per tile
one K message ``[T, d]`` and one V message ``[T, d]`` (bf16).  Folding a tile:
``S = q · trans(K) · scale`` (real transpose, blocking ``tl.dot``), online softmax
(merge.fold_tile).  Every tile's temporaries live in a ``tl.scratch_scope()`` and
every step's received chunks in another, so the TCM holds O(chunk) whatever n and S.
"""
from __future__ import annotations

from actors.ahbm.kernels.merge import fold_tile, init_running

__all__ = ["attention_prefill", "fold_chunk"]

F2 = 2


def fold_chunk(tl, q, m, l, O, tiles, scale):
    """Fold a K/V chunk given as a flat list ``[k0, v0, k1, v1, ...]`` into (m, l, O)."""
    for i in range(0, len(tiles), 2):
        with tl.scratch_scope():
            Sj = tl.dot(q, tl.trans(tiles[i])) * scale
            m, l, O = fold_tile(tl, m, l, O, Sj, tiles[i + 1])
    return m, l, O


def attention_prefill(q_ptr, k_ptr, v_ptr, o_ptr, *, M, d, S, tile, scale, rank, n, fwd, bwd, tl):
    T = tile if 0 < tile < S else S
    q = tl.load(q_ptr, (M, d))
    own = []
    for j in range(S // T):
        own += [tl.load(k_ptr + j * T * d * F2, (T, d)), tl.load(v_ptr + j * T * d * F2, (T, d))]
    m, l, O = init_running(tl, M, d)
    m, l, O = fold_chunk(tl, q, m, l, O, own, scale)
    tl.report("partial_done_ps", tl.now())
    east, west = own, own
    steps = folds = 0
    for s in range(1, n):
        with tl.scratch_scope():
            active = False
            if fwd and rank - (s - 1) >= 0 and east:
                for x in east:
                    tl.send(fwd, x)
                active = True
            got_w = []
            if rank - s >= 0:
                got_w = [tl.recv(bwd, (T, d), "<f2") for _ in range(len(own))]
                m, l, O = fold_chunk(tl, q, m, l, O, got_w, scale)
                folds += 1
                active = True
            if bwd and rank + (s - 1) <= n - 1 and west:
                for x in west:
                    tl.send(bwd, x)
                active = True
            got_e = []
            if rank + s <= n - 1:
                got_e = [tl.recv(fwd, (T, d), "<f2") for _ in range(len(own))]
                m, l, O = fold_chunk(tl, q, m, l, O, got_e, scale)
                folds += 1
                active = True
            east, west = got_w, got_e
            steps += active
    tl.report("reduction_steps", steps)
    tl.report("merges", folds)
    tl.store(o_ptr, O / l)

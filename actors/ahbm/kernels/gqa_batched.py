"""Batched GQA decode: one launch sweeps every request of a batch, then reduces them (seed §4.3, §5.3, §6).

The seed's argument for a blocking ``tl.recv`` in the §4 reduce (§6) is that its waits are hidden
"by the sweep work of concurrent tokens": a PE with several decode tokens to serve sweeps the next
token while the previous token's partials travel up the tree.  ``gqa_attention`` serves one request
per launch, so a PE blocked in a ``tl.recv`` of the reduction cannot sweep anything else; this kernel
is the batched form the argument needs.  Per launch, ``reqs`` lists the batch's requests (each with
its own ``q_ptr``, ``k_ptr``, ``v_ptr``, ``o_ptr``, ``counter``, ``start_cube``, ``start_pe``, seed
§2.2), all on the same CUBE Group:

* **sweep, request after request**: this rank's slice of each request (the §2.1 formulas, rotated
  by the request's own ``start_cube`` / ``start_pe``), the online-softmax sweep of ``gqa_attention``
  (``_sweep``); a **leaf** of the reduction tree sends its partial ``(m, l, O)`` to its parent as soon
  as that request's sweep ends (seed §4.3: "send immediately"), then sweeps the next request;
* **reduce one behind**: a PE with children, after sweeping request ``i``, merges request ``i - 1``'s
  children in arrival order (``_reduce``: data-driven, the ``[M]`` half while ``O`` is in flight) and
  sends up (the Group root normalises and stores); after the last sweep, the last request.

So request ``i - 1``'s partials travel up while their parents sweep request ``i``: the reduction's
waits overlap sweep work.  One behind, not "all sweeps first": a child's partials wait in its IPCQ
queue until the parent takes them, and with the whole batch queued the bounded queues stop the
children (measured: 16 Llama3-70B requests took 192 us that way against 126 us queued one launch per
request).  The reduction trees are the tree
topologies of ``gqa_attention`` (``l2``: tree or chain; ``l1``: mesh or chain; the chunked-O rings are
not batched here).  Reports: ``batch_partial_done_ps`` and ``batch_root_done_ps`` (one entry per
request of the batch, ``None`` where this PE is not the root), ``batch_my_len``.
"""
from __future__ import annotations

from actors.ahbm.kernels.gqa_attention import _reduce, _sweep, decode_tiles, level1_links, level2_links
from actors.ahbm.kernels.gqa_index import GroupLayout, local_coords, rank_of, reduce_tree, root_of, valid_len

__all__ = ["gqa_batched_decode", "tree_links"]


def tree_links(tl, lay: GroupLayout, *, pe_id: int, cube_id: int, sip: int, C: int, P: int, l2: str, l1: str):
    """``(kids, parent)`` of this PE in the 2-level reduce-to-root trees (seed §4; ``gqa_attention``'s
    Level-2 / Level-1 links for ``l2`` tree / chain and ``l1`` mesh / chain); ``parent`` None at the root."""
    prm = tl.prm
    kids, parent, root_pe = [], None, pe_id
    if P > 1:
        par2 = reduce_tree(l2, prm.gx, prm.gy)
        root_pe = root_of(par2)
        kids, parent = level2_links(prm, pe_id, par2)
    if parent is None and C > 1:   # a CUBE root: Level-1 over the Group's CUBE roots
        w, h = lay.shape
        cube_kids, parent = level1_links(lay, reduce_tree(l1, w, h), sip=sip, cube_id=cube_id, root_pe=root_pe)
        kids += cube_kids
    return kids, parent


def gqa_batched_decode(reqs, *, G, d, tile, scale, C, P, gemm, l2, l1, tl):
    prm = tl.prm
    pe_id, cube_id, sip = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if l2 == "ring" or l1 == "ring":
        raise ValueError("the batched decode reduces over the tree topologies (l2 tree / chain, l1 mesh / chain)")
    lay = GroupLayout(prm.cx, prm.cy, C)
    gcube = lay.index_in_group(cube_id)
    M, R = G, C * P
    composite = gemm == "composite"
    kids, parent = tree_links(tl, lay, pe_id=pe_id, cube_id=cube_id, sip=sip, C=C, P=P, l2=l2, l1=l1) \
        if R > 1 else ([], None)
    tl.report("kv_head", lay.head_of_cube(sip, cube_id))
    kept, waiting, partial_done, lens, swept = [], [], [], [], 0
    root_done = [None] * len(reqs)

    def reduce(k: int) -> None:
        """Request ``waiting[k]``'s reduction; its kept partial is dropped (released at the next scope's end)."""
        i = waiting[k]
        with tl.scratch_scope():
            (m, l, O), _ = _reduce(tl, tuple(kept[3 * k:3 * k + 3]), kids, parent, M, d)
            if parent is None:
                tl.store(reqs[i]["o_ptr"], O / l)
                root_done[i] = tl.now()
        kept[3 * k:3 * k + 3] = [None, None, None]

    for i, r in enumerate(reqs):
        cube_local, pe_local = local_coords(gcube, pe_id if P > 1 else 0, r["start_cube"] % C, r["start_pe"] % P,
                                            C, P)
        my_len = valid_len(r["counter"], rank_of(cube_local, pe_local, P), R)
        tiles = [(s0, n, None) for s0, n in decode_tiles(my_len, tile)]
        with tl.scratch_scope():   # only the partials kept for a later reduction (in the carried `kept`) outlive it
            state = _sweep(tl, tl.load(r["q_ptr"], (M, d)), tiles, M=M, d=d, scale=scale, composite=composite,
                           k_ptr=r["k_ptr"], v_ptr=r["v_ptr"])
            partial_done.append(tl.now())
            lens.append(my_len)
            swept += len(tiles)
            if R == 1:
                m, l, O = state
                tl.store(r["o_ptr"], O / l)
            elif not kids:
                _reduce(tl, state, [], parent, M, d)
            else:   # a flat list of handles, which the scope's end moves out (tl/scratch.py)
                kept += list(state)
                waiting.append(i)
        if kids and len(waiting) >= 2:   # one behind: the previous request's children had this sweep to arrive
            reduce(len(waiting) - 2)
    if kids and waiting:
        reduce(len(waiting) - 1)
    if R == 1:
        root_done = list(partial_done)
    tl.report("batch_partial_done_ps", partial_done)
    tl.report("batch_root_done_ps", root_done)
    tl.report("batch_my_len", lens)
    tl.report("tiles_computed", swept)
    return None

"""The seed's GQA fused attention kernel (ADR-0060, the composite hybrid) for the four cases of its §5/§10.

One launch per PE of a CUBE Group (``C`` CUBEs x ``P`` PEs of one SIP jointly own
one KV head and its ``G`` query heads, seed §0).  The kernel derives everything
from ``tl.program_id`` (axis 0 = PE, 1 = CUBE, 2 = SIP) and the launch arguments
(``counter``, ``start_cube``, ``start_pe``, ``C``, ``P``, seed §2.2): the KV head
from the CUBE coordinate (gqa_index.GroupLayout.head_of_cube, no ``for kv``
loop), its rank, its valid length and slot -> global positions by the kept
§2.1 / §0.5 P5 formulas (gqa_index docstring says which formula was kept and why).

Per tile (seed §1, §3): ``G`` is folded into M (``q [G*T_q, d]``, no broadcast);
``gemm="composite"``: ``S_j = composite(q, K_jᵀ)`` with the scale as epilogue and
``O_j = composite(P, V_j)``, both non-blocking on the PE scheduler with K/V as ``tl.ref``
HBM operands (streamed by the scheduler's DMAs), K stored pre-transposed ``[d, T]``
per tile (seed §B.2), ``q`` and ``P`` read from the TCM and the results written
to the TCM (seed §B.3), tile j+1's ``Q·Kᵀ`` issued before tile j's scores are
used (cross-tile pipelining: its result is bound to the carried name ``S_next``,
so the scope ending moves it to the enclosing arena instead of recycling it,
seed §B.3); ``gemm="dot"``: K/V tiles are lazy ``tl.load``s and both GEMMs
blocking ``tl.dot`` (the comparison variant).  The online-softmax merge is
kernel MATH inside ``tl.scratch_scope()`` (merge.fold_tile).  ``q`` is a lazy
``tl.load`` in both variants.

Cases (``case``, and ``C*P``):

* **decode** (``T_q = 1``): this rank's ``my_len`` keys in tiles of ``tile``
  (0 = one shot), the last tile ragged (exact shape, no mask).  ``C = P = 1`` is
  decode no-SP.  With SP the partials ``(m, l, O)`` go up the 2-level
  reduce-to-root (below).
* **prefill, C = P = 1**: the chunk's query positions ``[counter - chunk,
  counter)`` in query blocks of ``T_q``; per block the KV tiles with
  ``ks >= qe`` are skipped (``tile_all_future``), a tile straddling the diagonal
  gets the additive triangular mask (``tile_partial``), fully visible tiles none.
* **prefill, C*P > 1 = Ring Attention** (seed §5.5): the ``R = C*P`` ranks form a
  ring (snake through each CUBE's PE grid, CUBE after CUBE in the Group's snake,
  so consecutive ranks are IPCQ neighbours inside a CUBE and NOC peers across
  CUBEs); rank ``r`` owns the query block and the KV block of positions
  ``[r*B, (r+1)*B)`` (ring-order sharding, B = counter / R).  At step ``s`` it folds
  block ``r - s`` (running ``(m, l, O)`` carried across steps) while the next block
  is already posted with ``tl.recv_async`` into the other ping-pong buffer, and
  forwards the block it holds to rank ``r + 1``.  Causal step skip: blocks after
  the local query block are never received, folded or forwarded (rank ``r`` runs
  ``r + 1`` of the ``R`` steps; about half the steps of the whole ring vanish).
  After the ring every rank's state is final for its own query block (no KV split
  is left for the §4 reduce), so each rank normalises and stores its own rows.
  Inside a step the query block is cut into sub-blocks with their own running
  state (TCM or HBM, :func:`ring_query_tiling`); ``order = "zigzag"`` shards the
  prompt in 2R chunks for balanced causal work (:func:`ring_chunks`).

2-level reduce-to-root (seed §4), data-driven: a rank posts receives for all its
children as soon as its own sweep is done and merges them in **arrival order**
(``tl.wait_any`` on a child's ``l``; the ``[M]`` half of the log-sum-exp merge runs
while its ``O`` is in flight, :func:`_reduce`), then sends its triplet (m, l, O as three
messages, seed §4.4 payload) to its parent.  Level-2 is the PE tree of the CUBE
on IPCQ (``l2``: ``tree`` = centre-root over the PE grid, depth ceil(log2 P) for
the 4x2 grid; ``ring`` = the snake chain towards its middle); Level-1 the
Group's CUBE roots over the CUBE NOC (``l1``: ``mesh`` = centre-root rows then
columns; ``ring`` = chain).  A CUBE root posts its Level-1 receives together with
its Level-2 ones, so it merges whatever arrives first and joins Level-1 the
moment its CUBE is done.  Only the Group root normalises and stores ``O``.
"""
from __future__ import annotations

from actors.ahbm.kernels.gqa_index import (GroupLayout, children_of, local_coords, rank_of, reduce_tree, root_of,
                                           snake, valid_len)
from actors.ahbm.kernels.merge import fold_tile, init_running, lse_merge, lse_scales

__all__ = ["gqa_attention", "decode_tiles", "prefill_tiles", "ring_query_tiling", "ring_tcm_bytes", "ring_chunks", "ring_units", "ring_folds",
           "level1_links", "level2_links"]

F2 = 2   # bytes per bf16 element (float16 numpy proxy, ref §3.3)
_STEP = {(1, 0): "E", (-1, 0): "W", (0, 1): "S", (0, -1): "N"}


def decode_tiles(my_len: int, tile: int) -> list[tuple[int, int]]:
    """``(first slot, keys)`` of each KV tile of a decode slice (0 = one shot); last tile ragged."""
    T = tile if 0 < tile < my_len else my_len
    return [(j, min(T, my_len - j)) for j in range(0, my_len, T)] if my_len else []


def prefill_tiles(counter: int, tile: int, qs: int, qe: int) -> tuple[list[tuple[int, int, bool]], int]:
    """KV tiles ``(ks, keys, partial)`` a query block ``[qs, qe)`` attends to and the number skipped.

    ``tile_all_future``: ``ks >= qe`` -> skipped; ``tile_partial``: some key after some query
    (``ke - 1 > qs``) -> masked; otherwise ``tile_all_past`` (seed §5.4; the seed's ``ke <= qs``
    also calls the tile whose last key is ``qs`` partial: every key ``<= qs`` is visible to the
    whole block, so it needs no mask)."""
    T = tile if 0 < tile < counter else counter
    out, skipped = [], 0
    for ks in range(0, counter, T):
        n = min(T, counter - ks)
        if ks >= qe:
            skipped += 1
            continue
        out.append((ks, n, ks + n - 1 > qs))
    return out, skipped


def _sweep(tl, q, tiles, *, M, d, scale, composite, k_ptr, v_ptr):
    """Online-softmax sweep over ``tiles`` = [(slot0, keys, mask kwargs or None)] of this rank's KV."""
    m, l, O = init_running(tl, M, d)
    if not tiles:
        return m, l, O

    def kt_addr(slot0):   # K pre-transposed per tile: tile starting at slot0 is [d, keys] at slot0*d
        return k_ptr + slot0 * d * F2

    def scores(t):
        return tl.composite("gemm", a=q, b=tl.ref(kt_addr(t[0]), (d, t[1])), epilogue=[("scale", scale)])

    S_next = scores(tiles[0]) if composite else None
    ahead = 0
    for j, (slot0, n, mask) in enumerate(tiles):
        with tl.scratch_scope():
            if composite:
                Sj = S_next
                if j + 1 < len(tiles):   # next tile's Q·Kᵀ before this tile's scores are used (seed §3)
                    ahead += Sj.pending is not None    # Sj not yet waited for: the issue is really ahead
                    S_next = scores(tiles[j + 1])
                v = tl.ref(v_ptr + slot0 * d * F2, (n, d))
            else:
                kT = tl.load(kt_addr(slot0), (d, n))
                v = tl.load(v_ptr + slot0 * d * F2, (n, d))
                Sj = tl.dot(q, kT) * scale
            if mask is not None:
                Sj = Sj + tl.causal_mask(M, n, **mask)
            m, l, O = fold_tile(tl, m, l, O, Sj, v, composite)
    tl.report("composites_issued_ahead", ahead)
    return m, l, O


def _reduce(tl, state, kids, parent, M, d):
    """Merge the children's triplets in arrival order, then send the result to ``parent``.

    Each log-sum-exp merge is split (merge.py): its ``[M]`` half (merge.lse_scales) needs a
    child's ``m, l`` only; of its ``[M, d]`` half ``O s_a + O_b s_b``, ``O s_a`` needs the running
    ``O`` only and ``O_b s_b`` and the add the child's ``O``.  Data-driven over all three: whichever
    arrives first is used first, a child's ``l`` (``m`` is ahead of it on the same link, FIFO)
    starts its ``[M]`` half, ``O s_a`` is issued once the running ``O`` is final, the ``O`` of the
    oldest child whose ``[M]`` half is done finishes its merge (in merge order: the scales chain
    through the running ``m``, the ``O`` updates through the running ``O``).  So the scalar chain
    runs while ``O`` is in flight, and after the last child's ``[M]`` half the final ``m, l`` go to
    ``parent`` before ``O`` is ready (the parent starts its own merge on them).  ``order`` lists the children in the order their ``l`` arrived."""
    m, l, O = state
    shapes = ((M, 1), (M, 1), (M, d))
    posted = [(name, [tl.recv_async(peer, sh) for sh in shapes]) for name, peer in kids]
    order, scaled = [], []   # merges whose [M] half is done, oldest first: [O_b, s_b, O s_a or None, s_a]

    def running_times_scale():   # O s_a of the oldest pending merge as soon as the running O is final
        if scaled and scaled[0][2] is None:
            scaled[0][2] = O * scaled[0][3]

    if parent is not None and not posted:
        tl.send(parent, m)
        tl.send(parent, l)
    while posted or scaled:
        i = tl.wait_any(*[trip[1] for _, trip in posted], *[x[0] for x in scaled[:1]])
        if i < len(posted):
            name, (mb, lb, Ob) = posted.pop(i)
            order.append([name, tl.now()])
            m, sa, sb, l = lse_scales(tl, (m, l), (mb, lb))
            scaled.append([Ob, sb, None, sa])
            running_times_scale()
            if parent is not None and not posted:
                tl.send(parent, m)
                tl.send(parent, l)
        else:
            Ob, sb, Osa, _ = scaled.pop(0)
            O = Ob * sb + Osa   # the [M, d] half of merge.lse_merge: O s_a + O_b s_b
            running_times_scale()
    if parent is not None:
        tl.send(parent, O)
    return (m, l, O), order


def gqa_attention(q_ptr, k_ptr, v_ptr, o_ptr, *, case, G, T_q, d, tile, scale, counter, chunk, start_cube, start_pe,
                  C, P, gemm, l2, l1, tl, q_tile=0, spill=False, order="contiguous", piece=0):
    prm = tl.prm
    pe_id, cube_id, sip = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    lay = GroupLayout(prm.cx, prm.cy, C)
    gcube = lay.index_in_group(cube_id)
    w, h = lay.shape
    composite = gemm == "composite"
    M = G * T_q
    R = C * P
    tl.report("kv_head", lay.head_of_cube(sip, cube_id))

    def q_handle(addr):   # lazy load; both variants read q from the TCM (seed TL;DR, §B.3)
        return tl.load(addr, (M, d))

    if case == "prefill" and R > 1:
        return _ring(tl, q_ptr, k_ptr, v_ptr, o_ptr, G=G, d=d, scale=scale, counter=counter, C=C, P=P, gcube=gcube,
                     pe_id=pe_id, sip=sip, lay=lay, composite=composite, q_tile=q_tile or counter // R,
                     spill=spill, order=order, piece=piece)

    if case == "prefill":   # no SP: one rank holds the whole prompt, query blocks of T_q
        q_start = counter - chunk
        computed = skipped = 0
        for b in range(chunk // T_q):
            qs = q_start + b * T_q
            with tl.scratch_scope():
                tiles, skip = prefill_tiles(counter, tile, qs, qs + T_q)
                skipped += skip
                computed += len(tiles)
                masked = [(ks, n, dict(q0=qs, q_period=T_q, k0=ks) if part else None) for ks, n, part in tiles]
                q = q_handle(q_ptr + b * M * d * F2)
                m, l, O = _sweep(tl, q, masked, M=M, d=d, scale=scale, composite=composite, k_ptr=k_ptr,
                                 v_ptr=v_ptr)
                tl.store(o_ptr + b * M * d * 4, O / l)
        tl.report("tiles_computed", computed)
        tl.report("tiles_skipped", skipped)
        return None

    # decode: this rank's slice by the kept §2.1 formulas
    cube_local, pe_local = local_coords(gcube, pe_id if P > 1 else 0, start_cube % C, start_pe % P, C, P)
    rank = rank_of(cube_local, pe_local, P)
    my_len = valid_len(counter, rank, R)
    tiles = [(s0, n, None) for s0, n in decode_tiles(my_len, tile)]
    q = q_handle(q_ptr)
    state = _sweep(tl, q, tiles, M=M, d=d, scale=scale, composite=composite, k_ptr=k_ptr, v_ptr=v_ptr)
    tl.report("my_len", my_len)
    tl.report("tiles_computed", len(tiles))
    tl.report("partial_done_ps", tl.now())
    if R == 1:
        m, l, O = state
        tl.store(o_ptr, O / l)
        tl.report("group_root", True)
        return None

    # ---- 2-level reduce-to-root (seed §4) ----
    stage = o_ptr + M * d * 4   # HBM staging of the chunked ring (after the root's final O)
    kids, parent = [], None
    if P > 1:
        par2 = reduce_tree(l2, prm.gx, prm.gy)
        me = (pe_id % prm.gx, pe_id // prm.gx)
        root_pe = root_of(par2)
        if l2 == "ring":
            order = snake(prm.gx, prm.gy)
            i = order.index(pe_id)

            def step(to):
                return _STEP[(to % prm.gx - me[0], to // prm.gx - me[1])]
            state = _chunk_ring(tl, state, nxt=step(order[(i + 1) % P]), prv=step(order[(i - 1) % P]), i=i, n=P,
                                root=order.index(root_pe), M=M, d=d, stage=stage,
                                o_ptr=o_ptr if C == 1 else None)
            if state is None or C == 1:   # a non-root PE, or the CUBE root of a single-CUBE Group (stored)
                if C == 1 and state is not None:
                    tl.report("group_root", True)
                    tl.report("root_done_ps", tl.now())
                return None
        else:
            kids, parent = level2_links(prm, pe_id, par2)
    else:
        root_pe = pe_id
    if parent is None and C > 1:   # this PE is its CUBE's root: Level-1 over the Group's CUBE roots
        par1 = reduce_tree(l1, w, h)
        if l1 == "ring":   # Level-2 first (its tree, if any), then the chunked ring over the CUBE roots
            _, cubes = lay.cubes_of_head(lay.head_of_cube(sip, cube_id))
            state, order = _reduce(tl, state, kids, None, M, d)
            tl.report("merge_order", order)
            ring = snake(w, h)
            i = ring.index(gcube)
            state = _chunk_ring(tl, state, nxt=[sip, cubes[ring[(i + 1) % C]], root_pe],
                                prv=[sip, cubes[ring[(i - 1) % C]], root_pe], i=i, n=C,
                                root=ring.index(root_of(par1)), M=M, d=d, stage=stage, o_ptr=o_ptr)
            if state is not None:
                tl.report("group_root", True)
                tl.report("root_done_ps", tl.now())
            return None
        cube_kids, parent = level1_links(lay, par1, sip=sip, cube_id=cube_id, root_pe=root_pe)
        kids += cube_kids
    (m, l, O), order = _reduce(tl, state, kids, parent, M, d)
    tl.report("merge_order", order)
    if parent is None:
        tl.store(o_ptr, O / l)
        tl.report("group_root", True)
        tl.report("root_done_ps", tl.now())
    return None


def level2_links(prm, pe_id: int, par2: list) -> tuple[list, object]:
    """``(kids, parent)`` of PE ``pe_id`` in its CUBE's Level-2 tree ``par2`` (seed §4): children as
    ``(name, IPCQ direction)``, the parent's direction, ``None`` at the CUBE root."""
    me = (pe_id % prm.gx, pe_id // prm.gx)
    kids = [(f"pe{c}", _STEP[(c % prm.gx - me[0], c // prm.gx - me[1])]) for c in children_of(par2, pe_id)]
    p = par2[pe_id]
    return kids, None if p is None else _STEP[(p % prm.gx - me[0], p // prm.gx - me[1])]


def level1_links(lay: GroupLayout, par1: list, *, sip: int, cube_id: int, root_pe: int) -> tuple[list, object]:
    """``(kids, parent)`` of a CUBE root in the Group's Level-1 tree ``par1`` over the CUBE NOC (seed §4):
    children as ``(name, [sip, cube, pe])``, the parent as ``[sip, cube, pe]``, ``None`` at the Group root."""
    _, cubes = lay.cubes_of_head(lay.head_of_cube(sip, cube_id))
    g = lay.index_in_group(cube_id)
    kids = [(f"cube{cubes[c]}", [sip, cubes[c], root_pe]) for c in children_of(par1, g)]
    return kids, None if par1[g] is None else [sip, cubes[par1[g]], root_pe]


def chunk_rows(M: int, n: int) -> list[tuple[int, int]]:
    """Row range ``[a, b)`` of each of the ``n`` chunks of an ``M``-row ``O`` (sizes differ by at most 1)."""
    return [(c * M // n, (c + 1) * M // n) for c in range(n)]


def _chunk_ring(tl, state, *, nxt, prv, i, n, root, M, d, stage, o_ptr):
    """Chunked-O ring reduce-to-root over ``n`` nodes (seed §4.4 ``ring`` option), this node at ring index ``i``.

    ``O`` (with its ``m``, ``l``) is cut into ``n`` row chunks (:func:`chunk_rows`; rows are independent
    softmax rows, so each chunk carries its own ``m``, ``l``).  The kernel has no TCM slicing, so the
    partial is staged in this PE's HBM at ``stage`` and chunks are DMA-loaded from it.

    * reduce-scatter, ``n - 1`` steps: at step ``t`` node ``i`` sends the chunk ``(i - t) mod n`` it holds
      (its own partial at ``t = 0``, else the one it merged at ``t - 1``) to ``nxt`` and merges the chunk
      ``(i - t - 1) mod n`` arriving from ``prv`` into its own partial of that chunk; afterwards it holds
      chunk ``(i + 1) mod n`` reduced over all ``n`` nodes;
    * gather to the root ``root`` from both sides: the ``f = n div 2`` nodes upstream of the root send
      along the ring, the other ``n - 1 - f`` against it; the node ``k`` hops away sends its chunk and
      forwards the chunks of the nodes further out on its side; the root receives ``n - 1``.

    FORWARD: ``tl.send`` of a buffer still being received on the same IPCQ engine is not ordered after
    that receive by the runtime (same-engine handles are not settled, runtime._tcm), so the kernel waits
    for a received tensor before it forwards it (here and in the Ring's K/V forwarding).

    Every chunk travels as a triplet ``(m, l, O)`` of three messages (seed §4.4 payload).  Rounds
    ``n - 1 + n div 2``, triplets ``n (n - 1) + f (f + 1) / 2 + g (g + 1) / 2`` with ``g = n - 1 - f``
    (gqa_index.ring_rounds / ring_chunk_messages).
    Returns ``None`` on a non-root node; on the root, with ``o_ptr`` it normalises each chunk and stores
    it at its rows of ``O`` (returns ``()``), else it returns the full reduced ``(m, l, O)`` (reassembled
    through the staging area) for the next level.
    """
    m, l, O = state
    rows = chunk_rows(M, n)
    so, sm, sl = stage, stage + M * d * 4, stage + M * (d + 1) * 4
    tl.store(so, O)
    tl.store(sm, m)
    tl.store(sl, l)

    def part(c):
        a, b = rows[c]
        return (tl.load(sm + a * 4, (b - a, 1), "<f4"), tl.load(sl + a * 4, (b - a, 1), "<f4"),
                tl.load(so + a * d * 4, (b - a, d), "<f4"))

    def recv(c):
        a, b = rows[c]
        return [tl.recv_async(prv, sh) for sh in ((b - a, 1), (b - a, 1), (b - a, d))]

    def send(trip):
        for x in trip:
            tl.send(nxt, x)

    cur = part(i)
    for t in range(n - 1):
        c = (i - t - 1) % n
        with tl.scratch_scope():
            got = recv(c)
            send(cur)
            cur = lse_merge(tl, part(c), got)
    k = (root - i) % n   # hops to the root along nxt
    f = n // 2           # nodes 1..f hops upstream gather forwards (along nxt), the other n-1-f backwards
    if k:
        fwd = k <= f
        dist, far = (k, f) if fwd else (n - k, n - 1 - f)
        out, src = (nxt, prv) if fwd else (prv, nxt)
        for x in cur:
            tl.send(out, x)
        for u in range(1, far - dist + 1):   # forward the chunks of the nodes behind this one
            with tl.scratch_scope():
                c = (i - u + 1) % n if fwd else (i + u + 1) % n
                a, b = rows[c]
                trip = [tl.recv_async(src, sh) for sh in ((b - a, 1), (b - a, 1), (b - a, d))]
                tl.wait(*trip)   # FORWARD: the runtime does not order an IPCQ send after the IPCQ recv of its buffer
                for x in trip:
                    tl.send(out, x)
        return None
    chunks = {(i + 1) % n: cur}
    for u in range(1, f + 1):   # from the node u hops upstream (via prv): its chunk (i - u + 1) mod n
        chunks[(i - u + 1) % n] = recv((i - u + 1) % n)
    for u in range(1, n - f):   # from the node u hops downstream (via nxt): its chunk (i + u + 1) mod n
        a, b = rows[(i + u + 1) % n]
        chunks[(i + u + 1) % n] = [tl.recv_async(nxt, sh) for sh in ((b - a, 1), (b - a, 1), (b - a, d))]
    for c, (cm, cl, cO) in sorted(chunks.items()):
        a = rows[c][0]
        if o_ptr is not None:
            tl.store(o_ptr + a * d * 4, cO / cl)
        else:
            tl.store(sm + a * 4, cm)
            tl.store(sl + a * 4, cl)
            tl.store(so + a * d * 4, cO)
    if o_ptr is not None:
        return ()
    return tl.load(sm, (M, 1), "<f4"), tl.load(sl, (M, 1), "<f4"), tl.load(so, (M, d), "<f4")


def ring_position(pe_id: int, gcube: int, gx: int, gy: int, w: int, h: int, P: int) -> int:
    """Ring rank of a PE: its index along the CUBE's PE snake, CUBEs along the Group's snake."""
    return snake(w, h).index(gcube) * P + (snake(gx, gy).index(pe_id) if P > 1 else 0)


def ring_tcm_bytes(B: int, G: int, d: int, T_s: int, spill: bool, *, composite: bool = True,
                   order: str = "contiguous", piece: int = 0) -> int:
    """TCM bytes a Ring rank's kernel holds at its peak, the largest over all ranks and steps, for a block of
    ``B`` tokens in query sub-blocks of ``T_s`` tokens (``M_s = G*T_s`` rows) and K/V units of ``piece``
    keys (0: the whole block; :func:`ring_units`), fp32 = 4 B, bf16 = 2 B; the runtime's ``tcm_peak_B``
    (tests/test_gqa_kernel.py checks equality).  Held at every moment:

    * the running state of a sub-block, ``M_s*(d+2)*4``, and its Q, ``M_s*d*2``, for each of the ``B/T_s``
      sub-blocks (resident); spilled, the ``O`` and Q of the sub-block being folded and the ``m, l`` of all;
    * the K/V unit being folded, ``2*piece*d*2``, and, at every unit but a rank's last, the next one on its
      way (ping-pong); a block in pieces (staged in HBM between steps) also has the unit of the next block
      being received, at every step but the last;
    * what one sub-block's scope creates for a unit (merge.fold_tile, the diagonal mask; freed at the scope's
      end): per key folded, the ``[M_s, keys]`` fp32 tensors S, S - m and P, on a diagonal fold also the
      mask and S + mask, with ``tl.dot`` also the unscaled product (its scale is a MATH op, not an
      epilogue), with a composite the bf16 copy of P it reads; per fold seven ``[M_s, 1]`` vectors and the
      ``[M_s, d]`` P·V, O*corr and new O; at a rank's last unit the normalised ``O / l``.

    The peak is a rank's first unit (a diagonal fold of the whole unit with the next unit on its way;
    zigzag: the unit's two chunk pieces, one diagonal) or rank 0's last unit (contiguous: diagonal, no unit
    in flight, and ``O / l``).
    """
    Ms = G * T_s
    keys = piece if 0 < piece < B else B
    unit = 2 * keys * d * 2
    in_flight = 3 if keys < B else 2
    held = (Ms * d * 6 + B // T_s * Ms * 8) if spill else B // T_s * (Ms * (d + 2) * 4 + Ms * d * 2)
    plain = Ms * ((3 if composite else 4) * 4 + (2 if composite else 0))   # bytes per key of an unmasked fold
    masked = plain + Ms * 2 * 4
    per_fold = 7 * Ms * 4 + 3 * Ms * d * 4
    final = Ms * d * 4
    if order == "zigzag":   # every rank runs R steps; its first unit: half its keys masked, half not
        first = in_flight * unit + keys // 2 * (masked + plain) + 2 * per_fold
        last = unit + keys * plain + 2 * per_fold + final
    else:
        first = in_flight * unit + keys * masked + per_fold
        last = unit + keys * masked + per_fold + final     # rank 0: its last unit is diagonal
    return held + max(first, last)


def ring_query_tiling(B: int, G: int, d: int, budget: int, min_rows: int = 32, q_tile: int = 0,
                      state: str = "auto", unit: int = 0, composite: bool = True,
                      piece: int = 0) -> tuple[int, bool, int]:
    """``(T_s, spill, piece)``: query tokens per sub-block of a Ring rank's block of ``B`` tokens, whether the
    sub-blocks' running ``O`` lives in HBM between ring steps instead of the TCM, and the keys of the K/V
    units the block travels in (``B``: whole).

    TCM use by :func:`ring_tcm_bytes` (the kernel's exact peak; ``composite``: the GEMM variant).  For a
    given unit: resident (no spill) with the largest divisor ``T_s`` of ``B`` that fits ``budget`` and keeps
    ``M_s >= min_rows`` (the MAC array's rows: fewer rows pad the GEMMs and multiply the ops); else
    spill: the ``O`` of each sub-block is loaded from and stored back to HBM around its fold (one DMA each
    way per sub-block and unit; its ``m, l`` stay in the TCM), with the largest ``T_s`` that fits.
    The whole block travels as one unit if anything fits; else in the pieces (divisors of the chunk, one
    per chunk in a unit) that give the largest folds ``T_s x piece`` (fewest folds), the larger piece of
    equal ones (fewest messages).
    ``T_s`` divides ``unit`` (default ``B``; the zigzag order's chunk ``B/2``).
    ``q_tile > 0`` forces ``T_s``; ``state`` = ``"tcm"`` / ``"hbm"`` forces
    resident / spilled state (``"auto"``: as above); ``piece > 0`` forces the unit's keys.
    """
    unit = unit or B
    order = "zigzag" if unit < B else "contiguous"
    divs = [t for t in range(unit, 0, -1) if unit % t == 0] if q_tile <= 0 else [q_tile]

    def choose(pc):
        def need(t, spill):
            return ring_tcm_bytes(B, G, d, t, spill, composite=composite, order=order, piece=pc)
        if state != "hbm":
            for t in divs:
                if need(t, False) <= budget and (G * t >= min(min_rows, G * B) or q_tile > 0 or state == "tcm"):
                    return t, False, pc
        if state != "tcm":
            for t in divs:
                if need(t, True) <= budget:
                    return t, True, pc
        return None

    chunks = B // unit
    pieces = [piece] if piece > 0 else [p * chunks for p in range(unit, 0, -1) if unit % p == 0]
    found = [c for c in map(choose, pieces) if c is not None]
    if found:
        return found[0] if found[0][2] == B else max(found, key=lambda c: (c[0] * c[2], c[2]))
    raise ValueError(f"a Ring block of {B} tokens (G = {G}, d = {d}, query sub-blocks {divs[-1]} tokens, state"
                     f" {state}, K/V units of {pieces[-1]} keys) does not fit the TCM budget of {budget} B")


def ring_chunks(r: int, R: int, B: int, order: str) -> list[tuple[int, int]]:
    """``(first position, tokens)`` of the prompt chunks rank ``r`` owns (its Q, K and V rows).

    ``contiguous``: one chunk ``[r B, (r+1) B)``; ``zigzag``: the prompt in ``2R`` chunks of ``B/2``,
    rank ``r`` owns chunks ``r`` and ``2R - 1 - r`` (an early and a late one), so every rank has about the
    same causal work (Brandon et al. 2023, "Striped Attention"; the zigzag variant of ring-flash-attention).
    """
    if order == "contiguous":
        return [(r * B, B)]
    h = B // 2
    return [(r * h, h), ((2 * R - 1 - r) * h, h)]


def ring_units(j: int, R: int, B: int, order: str, piece: int = 0) -> list[list[tuple[int, int]]]:
    """The K/V pieces of block ``j`` in the order the ring carries them: unit ``u`` is ``[(first position,
    keys), ...]``, piece ``u`` of each of the block's chunks (:func:`ring_chunks`), ``piece`` keys in all
    (0: the whole block, one unit).  Every unit has the same shape."""
    chunks = ring_chunks(j, R, B, order)
    p = piece // len(chunks) if 0 < piece < B else chunks[0][1]
    return [[(c0 + u * p, p) for c0, _ in chunks] for u in range(chunks[0][1] // p)]


def ring_folds(r: int, R: int, B: int, order: str, q_tile: int, piece: int = 0) -> list[int]:
    """Keys of every (query sub-block x K/V piece of a chunk) fold rank ``r`` runs over the whole ring (the
    kernel's skip rule: a piece starting at or after the sub-block's last query + 1 is skipped)."""
    subs = [q0 + t for q0, n in ring_chunks(r, R, B, order) for t in range(0, n, q_tile)]
    srcs = range(r + 1) if order == "contiguous" else range(R)
    return [n for j in srcs for unit in ring_units(j, R, B, order, piece) for k0, n in unit for q0 in subs
            if k0 < q0 + q_tile]


def _ring(tl, q_ptr, k_ptr, v_ptr, o_ptr, *, G, d, scale, counter, C, P, gcube, pe_id, sip, lay, composite,
          q_tile, spill, order, piece):
    """Prefill SP: causal Ring Attention over the Group's R = C*P ranks (module docstring).

    The rank's query rows (its chunks, :func:`ring_chunks`) are cut into sub-blocks of ``q_tile`` tokens,
    ``M_s = G*q_tile`` rows (Q and O are sub-block-major ``[B/q_tile, G*q_tile, d]`` in HBM, chunk after
    chunk); every sub-block carries its own running ``(m, l, O)`` across the ring steps, in the TCM
    (``spill = False``) or, ``spill = True``, its ``O`` in HBM right after the final O (loaded before
    and stored after its folds, one DMA each way) and its ``m, l`` (``M_s`` values each) in the TCM.
    A step's K/V block (one tensor pair per chunk of the source rank, shared by all sub-blocks) is folded
    into every sub-block it is not entirely after (``tile_all_future`` skip per sub-block x chunk piece; a
    straddling pair gets the mask).  Whole (``piece`` 0: one unit), the next block is received into the
    TCM while this one is folded (ping-pong).  In units of ``piece`` keys (:func:`ring_units`: a block
    that cannot be held twice in the TCM), each unit is folded while the next is loaded from this PE's
    HBM, and the same unit of the next block arrives from the previous rank and is stored into an HBM
    staging area (two, ping-pong) the next step loads it from; the rank's own block is loaded unit by
    unit from its K/V region.

    ``contiguous``: rank ``r`` needs blocks ``r, r-1, .., 0`` only: ``r + 1`` steps (causal step skip).
    ``zigzag``: every rank needs every block: ``R`` steps over a closed ring (rank ``R-1`` sends to 0),
    about half of the sub-block x chunk pairs skipped on every rank.
    """
    prm = tl.prm
    w, h = lay.shape
    R = C * P
    B = counter // R
    Ts = q_tile
    Ms = G * Ts
    pes, cubes_snake = snake(prm.gx, prm.gy), snake(w, h)
    _, cubes = lay.cubes_of_head(lay.head_of_cube(sip, tl.program_id(1)))
    r = ring_position(pe_id, gcube, prm.gx, prm.gy, w, h, P)
    subs = [q0 + t for q0, n in ring_chunks(r, R, B, order) for t in range(0, n, Ts)]   # first position
    nsub = len(subs)

    def peer(rr):
        rr %= R
        gc, pp = cubes_snake[rr // P], pes[rr % P] if P > 1 else 0
        if gc == gcube:
            a, b = (pe_id % prm.gx, pe_id // prm.gx), (pp % prm.gx, pp // prm.gx)
            return _STEP[(b[0] - a[0], b[1] - a[1])]
        return [sip, cubes[gc], pp]

    def q_at(i):
        return q_ptr + i * Ms * d * F2

    def o_at(i):
        return o_ptr + i * Ms * d * 4

    def spill_at(i):   # the running O (Ms*d fp32) of sub-block i, after the final O
        return o_ptr + B * G * d * 4 + i * Ms * d * 4

    zig = order == "zigzag"
    n_steps = R if zig else r + 1
    nxt_peer = peer(r + 1) if zig or r + 1 < R else None
    prv_peer = peer(r - 1) if zig or r > 0 else None
    own = ring_units(r, R, B, order, piece)
    U = len(own)                  # units per block: K/V pieces that travel round the ring one after the other
    n_units = n_steps * U
    shapes = [sh for _, n in own[0] for sh in ((d, n), (n, d))]
    staged = U > 1                # a block larger than half the TCM waits in HBM between steps (HBM ping-pong)

    def load_unit(s, u):   # unit u of step s's block from this PE's HBM: its own K/V region at step 0, else the
        kb, vb = (k_ptr, v_ptr) if s == 0 else stage_at(s % 2)       # staging area the block was received into
        return [t for c, (_, n) in enumerate(own[u])
                for t in (tl.load(kb + (u * len(own[u]) + c) * n * d * F2, (d, n)),
                          tl.load(vb + (u * len(own[u]) + c) * n * d * F2, (n, d)))]

    def stage_at(slot):   # [K | V] of a received block, unit-major like the own block, after the own K and V
        return k_ptr + (1 + slot) * B * d * F2, v_ptr + (1 + slot) * B * d * F2

    kv = load_unit(0, 0)
    qs = [] if spill else [tl.load(q_at(i), (Ms, d)) for i in range(nsub)]   # lazy loads (composites read the TCM)
    # resident: (m, l, O) of every sub-block; spilled: (m, l) of every sub-block, added at the first unit (every
    # sub-block folds its own diagonal piece there)
    state = [] if spill else [x for _ in range(nsub) for x in init_running(tl, Ms, d)]
    steps = folds = 0
    for t in range(n_units):   # contiguous: causal step skip, blocks r+1 .. R-1 are after this rank's queries
        s, u = divmod(t, U)
        j = (r - s) % R
        with tl.scratch_scope():
            if staged:   # next unit from HBM while this one is folded; this unit of the next block arrives meanwhile
                if t + 1 < n_units:
                    nkv = load_unit(*divmod(t + 1, U))
                if s + 1 < n_steps:
                    rx = [tl.recv_async(prv_peer, sh, "<f2") for sh in shapes]
            elif s + 1 < n_steps:   # ping-pong: post the next block's receive before computing on this one
                nkv = [tl.recv_async(prv_peer, sh, "<f2") for sh in shapes]
            if nxt_peer is not None and (s + 1 < n_steps if zig else True):
                tl.wait(*kv)   # forward the unit held; it must have arrived (FORWARD note, _chunk_ring)
                for x in kv:
                    tl.send(nxt_peer, x)
            blocks = []
            for k, (k0, n) in enumerate(ring_units(j, R, B, order, piece)[u]):
                blocks.append((k0, n, kv[2 * k], kv[2 * k + 1]))   # in the TCM: composites read it there (§B.3)
            last = t + 1 == n_units
            for i, q0 in enumerate(subs):
                todo = [b for b in blocks if b[0] < q0 + Ts]   # tile_all_future pairs are skipped
                if not todo and not last:
                    continue
                with tl.scratch_scope():
                    q = qs[i] if qs else tl.load(q_at(i), (Ms, d))
                    if not spill:
                        m, l, O = state[3 * i:3 * i + 3]
                    elif t == 0:
                        m, l, O = init_running(tl, Ms, d)
                    else:
                        m, l = state[2 * i:2 * i + 2]
                        O = tl.load(spill_at(i), (Ms, d), "<f4")
                    for k0, n, kb, vb in todo:
                        if composite:
                            Sj = tl.composite("gemm", a=q, b=kb, epilogue=[("scale", scale)])
                        else:
                            Sj = tl.dot(q, kb) * scale
                        if k0 + n - 1 > q0:   # straddles the diagonal: triangular additive mask
                            Sj = Sj + tl.causal_mask(Ms, n, q0=q0, q_period=Ts, k0=k0)
                        m, l, O = fold_tile(tl, m, l, O, Sj, vb, composite)
                        folds += 1
                    if last:              # last unit: this sub-block is final
                        tl.store(o_at(i), O / l)
                    elif spill:
                        tl.store(spill_at(i), O)
                        state[2 * i:2 * i + 2] = [m, l]
                    else:
                        state[3 * i:3 * i + 3] = [m, l, O]
                    del m, l, O, q   # only `state` carries a sub-block's running state out of its scope
            if staged and s + 1 < n_steps:   # the next block's unit into its staging area (read at step s + 1;
                kst, vst = stage_at((s + 1) % 2)    # the DMA engine and the channels keep this store before that load)
                for c, (_, n) in enumerate(own[u]):
                    tl.store(kst + (u * len(own[u]) + c) * n * d * F2, rx[2 * c])
                    tl.store(vst + (u * len(own[u]) + c) * n * d * F2, rx[2 * c + 1])
                rx = None
            # the unit just folded and forwarded is now referenced only by these loop names: drop them so the
            # scope's end frees it (kept, it would stay a third K/V unit in the TCM until the next one's end)
            blocks = todo = kb = vb = x = None
            steps += u + 1 == U
            if t + 1 < n_units:
                kv = nkv
    tl.report("ring_steps", steps)
    tl.report("ring_steps_skipped", R - steps)
    tl.report("ring_folds", folds)
    tl.report("tiles_computed", folds)     # a fold is one (query sub-block x K/V chunk) tile
    tl.report("ring_rank", r)
    tl.report("ring_q_tile", Ts)
    tl.report("ring_spill", spill)
    tl.report("ring_piece", piece or B)
    return None

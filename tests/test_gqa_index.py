"""Index math of the GQA kernel (seed §0, §0.5 P5, §2.1, §B.2, §B.5): property tests, formulas against one another."""
from hypothesis import given, settings, strategies as st

from actors.ahbm.kernels.gqa_index import (GroupLayout, centre_tree, coords_of_rank, global_to_rank_slot,
                                           local_coords, place_s0, rank_of, slot_to_global, tree_depth,
                                           valid_len, writer_rank, writer_s21_literal)

geom = st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]),
                 st.integers(0, 7), st.integers(0, 7), st.integers(0, 300))


def _placed(S, C, P, sc, sp):
    """Token -> (group cube, pe, slot) by the kept formula (§2.1 / P5)."""
    R = C * P
    out = {}
    for i in range(S):
        r, slot = global_to_rank_slot(i, R)
        cube, pe = coords_of_rank(r, sc % C, sp % P, C, P)
        out[i] = (cube, pe, slot)
    return out


@settings(max_examples=200, deadline=None)
@given(geom)
def test_every_token_one_rank_dense_slots_and_lengths(g):
    C, P, sc, sp, S = g
    sc, sp, R = sc % C, sp % P, C * P
    placed = _placed(S, C, P, sc, sp)
    assert len(set(placed.values())) == S                      # exactly one (rank, slot) per token
    for cube in range(C):
        for pe in range(P):
            slots = sorted(s for (c, p, s) in placed.values() if (c, p) == (cube, pe))
            assert slots == list(range(len(slots)))            # dense, contiguous per rank
            r = rank_of(*local_coords(cube, pe, sc, sp, C, P), P)
            assert len(slots) == valid_len(S, r, R)            # §2.1 valid length
            for s in slots:                                     # slot -> global -> (rank, slot) round trip
                assert global_to_rank_slot(slot_to_global(s, r, R), R) == (r, s)
                assert placed[slot_to_global(s, r, R)] == (cube, pe, s)   # P5 RoPE position
    assert sum(valid_len(S, r, R) for r in range(R)) == S
    # whose turn: appending token S lands on the writer rank, at slot = its current length
    cube, pe, slot = _placed(S + 1, C, P, sc, sp)[S]
    w = writer_rank(S, R)
    assert rank_of(*local_coords(cube, pe, sc, sp, C, P), P) == w and slot == valid_len(S, w, R)


@settings(max_examples=200, deadline=None)
@given(geom)
def test_s0_prose_is_also_a_dense_bijection(g):
    """§0's prose placement is a valid placement on its own (dense, balanced) ..."""
    C, P, sc, sp, S = g
    seen = [place_s0(i, sc % C, sp % P, C, P) for i in range(S)]
    assert len(set(seen)) == S
    per = {}
    for c, p, s in seen:
        per.setdefault((c, p), []).append(s)
    assert all(sorted(v) == list(range(len(v))) for v in per.values())


def test_s0_prose_contradicts_s21_p5_when_both_axes_split():
    """... but it orders tokens CUBE-fastest, so P5's slot -> global disagrees with it (C, P > 1):
    token 1 goes to CUBE 1 / PE 0 by §0, whose P5 global index of slot 0 is rank P = 2, not 1."""
    C, P = 2, 2
    cube, pe, slot = place_s0(1, 0, 0, C, P)
    assert (cube, pe, slot) == (1, 0, 0)
    assert slot_to_global(slot, rank_of(*local_coords(cube, pe, 0, 0, C, P), P), C * P) == 2
    # and they agree when one axis is not split
    for C, P in ((1, 8), (8, 1)):
        for i in range(40):
            c, p, s = place_s0(i, 0, 0, C, P)
            assert slot_to_global(s, rank_of(c, p, P), C * P) == i


def test_s21_turn_formula_literal_breaks_on_pe_carry():
    """§2.1's ``(start_rank + counter) mod R == rank`` with physical ranks disagrees with the per-axis
    rotation as soon as pe_local + start_pe wraps (C=2, P=2, start_pe=1, counter=1)."""
    C, P, sc, sp, counter = 2, 2, 0, 1, 1
    cube, pe = coords_of_rank(writer_rank(counter, C * P), sc, sp, C, P)
    assert (cube, pe) == (0, 0)
    assert not writer_s21_literal(counter, cube, pe, sc, sp, C, P)
    # without rotation the literal formula and the kept one agree
    for counter in range(64):
        cube, pe = coords_of_rank(writer_rank(counter, 8), 0, 0, 2, 4)
        assert writer_s21_literal(counter, cube, pe, 0, 0, 2, 4)


def test_group_layout_partitions_the_mesh_into_rectangles():
    for C, heads in ((1, 16), (2, 8), (4, 4), (8, 2), (16, 1)):
        lay = GroupLayout(4, 4, C)
        assert lay.groups_per_sip == heads
        seen = set()
        for h in range(heads):
            sip, cubes = lay.cubes_of_head(h)
            assert len(cubes) == C and sip == 0
            assert all(lay.head_of_cube(0, c) == h for c in cubes)
            assert [lay.index_in_group(c) for c in cubes] == list(range(C))
            seen |= set(cubes)
        assert seen == set(range(16))
    assert GroupLayout(4, 4, 8).head_of_cube(3, 9) == 7    # 4 SIPs x 2 Groups = the 8 KV heads


def test_centre_tree_is_one_hop_with_log_depth():
    for w, h in ((4, 2), (2, 2), (2, 1), (1, 1), (4, 4)):
        par = centre_tree(w, h)
        for n, p in par.items():
            if p is not None:
                (x0, y0), (x1, y1) = (n % w, n // w), (p % w, p // w)
                assert abs(x0 - x1) + abs(y0 - y1) == 1
        assert sum(p is None for p in par.values()) == 1
    assert tree_depth(centre_tree(4, 2)) == 3    # ceil(log2 8): the PE grid of a CUBE
    assert tree_depth(centre_tree(4, 4)) == 4 and tree_depth(centre_tree(2, 2)) == 2

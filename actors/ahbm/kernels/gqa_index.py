"""Index math of the GQA kernel: CUBE Groups, hierarchical round-robin KV placement, reduction trees.

Public sources: the seed ADR-0060 §0 (placement prose), §0.5 P5 (RoPE position of
a slot), §2.1 (slot -> global, valid length, whose turn it is to write) and §B.2
(CUBE-Group partition of a SIP's 4x4 CUBE mesh into contiguous rectangles with a
real centre CUBE).  Symbols: ``C`` CUBEs per Group, ``P`` PEs per CUBE, ``R = C*P``
ranks, ``counter`` = tokens in the KV cache, ``start_cube``/``start_pe`` the
rotation ``f(request_id)``.

**Which formula is kept.**  The seed states the placement three times and the
statements do not agree:

* §2.1 and §0.5 P5: ``rank = cube_local*P + pe_local`` with
  ``cube_local = (cube - start_cube) mod C``, ``pe_local = (pe - start_pe) mod P``,
  and ``global = slot*R + rank``; valid length ``counter//R + (rank < counter%R)``.
* §0 prose: token ``i`` goes to CUBE ``(start_cube + i) mod C`` and PE
  ``(i//C + start_pe) mod P`` -- i.e. the CUBE index varies fastest, so its
  global index is ``slot*R + pe_local*C + cube_local``: a *different* bijection
  whenever ``C > 1`` and ``P > 1`` (:func:`place_s0`).
* §2.1 "my turn: ``(start_rank + counter) mod R == rank``" only holds if ``rank``
  there is the *physical* index ``cube*P + pe`` with ``start_rank =
  start_cube*P + start_pe`` -- and then the PE carry crosses into the next CUBE,
  which disagrees with the per-axis rotation above (:func:`writer_s21_literal`).

tests/test_gqa_index.py exercises all of them against one another and pins the
counter-examples.  This module keeps **§2.1 / §0.5 P5** (:func:`slot_to_global`,
:func:`valid_len`, :func:`writer_rank`): the three §2.1 statements and P5 agree
with each other, and P5 is the contract with the upstream ``qkv_rope`` kernel
that writes the cache (RoPE positions must be the global index), so it is the
one the KV cache's contents depend on.  The turn test is taken with the rotated
(local) rank, ``writer_rank(counter) = counter mod R``, which is what placing
token ``counter`` by P5 gives.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["local_coords", "rank_of", "coords_of_rank", "valid_len", "slot_to_global", "global_to_rank_slot",
           "writer_rank", "place_s0", "writer_s21_literal", "GroupLayout", "centre_tree", "tree_depth",
           "snake", "chain_tree", "reduce_tree", "children_of", "root_of", "ring_rounds", "ring_chunk_messages"]


# -- §2.1 / P5 (kept) -----------------------------------------------------------------------------
def local_coords(cube: int, pe: int, start_cube: int, start_pe: int, C: int, P: int) -> tuple[int, int]:
    """``(cube_local, pe_local)`` of the PE ``pe`` of the ``cube``-th CUBE of its Group (seed §2.1)."""
    return (cube - start_cube) % C, (pe - start_pe) % P


def rank_of(cube_local: int, pe_local: int, P: int) -> int:
    """``rank = cube_local*P + pe_local`` (seed §2.1, §0.5 P5)."""
    return cube_local * P + pe_local


def coords_of_rank(rank: int, start_cube: int, start_pe: int, C: int, P: int) -> tuple[int, int]:
    """Inverse of :func:`local_coords` + :func:`rank_of`: the (Group CUBE index, PE) holding ``rank``."""
    cl, pl = divmod(rank, P)
    return (cl + start_cube) % C, (pl + start_pe) % P


def valid_len(counter: int, rank: int, R: int) -> int:
    """Tokens held by ``rank``: ``counter//R + (1 if rank < counter%R else 0)`` (seed §2.1)."""
    base, rem = divmod(counter, R)
    return base + (1 if rank < rem else 0)


def slot_to_global(slot: int, rank: int, R: int) -> int:
    """``global_idx = local_slot*R + rank`` (seed §2.1, §0.5 P5)."""
    return slot * R + rank


def global_to_rank_slot(i: int, R: int) -> tuple[int, int]:
    """Where global token ``i`` lives: ``(rank, slot) = (i mod R, i div R)`` (inverse of P5)."""
    return i % R, i // R


def writer_rank(counter: int, R: int) -> int:
    """The (rotated) rank whose turn it is to append token ``counter``."""
    return counter % R


# -- the seed's other statements (exercised by the tests, not used by the kernel) ----------------
def place_s0(i: int, start_cube: int, start_pe: int, C: int, P: int) -> tuple[int, int, int]:
    """§0 prose: token ``i`` -> (Group CUBE ``(start_cube+i) mod C``, PE ``(i//C + start_pe) mod P``,
    slot ``i // R``)."""
    return (start_cube + i) % C, (i // C + start_pe) % P, i // (C * P)


def writer_s21_literal(counter: int, cube: int, pe: int, start_cube: int, start_pe: int, C: int, P: int) -> bool:
    """§2.1 literally, with the physical rank ``cube*P + pe`` and ``start_rank = start_cube*P + start_pe``."""
    R = C * P
    return (start_cube * P + start_pe + counter) % R == cube * P + pe


# -- CUBE Groups (seed §0, §B.2) ------------------------------------------------------------------
#: Group rectangle (width, height) in CUBEs for each C on a 4x4 mesh: contiguous, centre CUBE real
GROUP_SHAPES = {1: (1, 1), 2: (2, 1), 4: (2, 2), 8: (4, 2), 16: (4, 4)}


@dataclass(frozen=True)
class GroupLayout:
    """Partition of each SIP's ``cx x cy`` CUBE mesh into Groups of ``C`` CUBEs (rectangles ``w x h``,
    row-major).  ``head_of_cube`` picks the KV head from the CUBE coordinate (no ``for kv`` loop)."""

    cx: int
    cy: int
    C: int

    @property
    def shape(self) -> tuple[int, int]:
        if self.C not in GROUP_SHAPES:
            raise ValueError(f"C must be one of {sorted(GROUP_SHAPES)}, found {self.C}")
        w, h = GROUP_SHAPES[self.C]
        if self.cx % w or self.cy % h:
            raise ValueError(f"a {w}x{h} CUBE Group (C = {self.C}) does not tile a {self.cx}x{self.cy} CUBE mesh")
        return w, h

    @property
    def groups_per_sip(self) -> int:
        w, h = self.shape
        return (self.cx // w) * (self.cy // h)

    def head_of_cube(self, sip: int, cube: int) -> int:
        """KV head owned by CUBE ``cube`` of SIP ``sip``: its Group's index, SIP-major."""
        w, h = self.shape
        x, y = cube % self.cx, cube // self.cx
        return sip * self.groups_per_sip + (y // h) * (self.cx // w) + x // w

    def index_in_group(self, cube: int) -> int:
        """The CUBE's index inside its Group (row-major in the rectangle): the ``cube`` of §2.1."""
        w, _ = self.shape
        x, y = cube % self.cx, cube // self.cx
        return (y % GROUP_SHAPES[self.C][1]) * w + x % w

    def cubes_of_head(self, head: int) -> tuple[int, list[int]]:
        """``(sip, [cube ids in Group order])`` of KV head ``head``."""
        w, h = self.shape
        sip, g = divmod(head, self.groups_per_sip)
        gx, gy = g % (self.cx // w), g // (self.cx // w)
        return sip, [(gy * h + j) * self.cx + gx * w + i for j in range(h) for i in range(w)]


# -- reduction trees (seed §4.1, §4.2) -----------------------------------------------------------
def centre_tree(w: int, h: int) -> dict[int, int | None]:
    """Centre-root reduce over a ``w x h`` mesh (row-major node ids): parent of each node.

    Columns fold along y towards the centre row, then the centre row folds along x
    towards the centre column (seed §4.2 "row-then-col converging on the centre
    CUBE", lrab phases 1-2, reduce-only).  Every pair is a 1-hop mesh neighbour;
    depth = ``ceil((h-1)/2) + ceil((w-1)/2)`` hops from the farthest node -- for the
    4x2 PE grid of a CUBE that is 3 = ``ceil(log2 8)`` (seed §4.1).
    """
    rx, ry = (w - 1) // 2, (h - 1) // 2
    parent: dict[int, int | None] = {}
    for y in range(h):
        for x in range(w):
            if y != ry:
                parent[y * w + x] = (y + (1 if y < ry else -1)) * w + x
            elif x != rx:
                parent[y * w + x] = y * w + x + (1 if x < rx else -1)
            else:
                parent[y * w + x] = None
    return parent


def tree_depth(parent: dict[int, int | None]) -> int:
    """Longest child -> root path in hops."""
    def depth(n):
        d = 0
        while parent[n] is not None:
            n, d = parent[n], d + 1
        return d
    return max(depth(n) for n in parent)


def snake(w: int, h: int) -> list[int]:
    """Boustrophedon order of a ``w x h`` mesh (row 0 west->east, row 1 east->west, ...): consecutive
    nodes are 1-hop neighbours."""
    out = []
    for y in range(h):
        xs = range(w) if y % 2 == 0 else range(w - 1, -1, -1)
        out += [y * w + x for x in xs]
    return out


def chain_tree(w: int, h: int) -> dict[int, int | None]:
    """Ring option of seed §4.4 as a reduce-to-root: the snake path of the mesh, both halves passing
    towards its middle node (the root).  Every pair is 1-hop; depth ``ceil((n-1)/2)``."""
    order = snake(w, h)
    mid = (len(order) - 1) // 2
    parent: dict[int, int | None] = {order[mid]: None}
    for i, n in enumerate(order):
        if i < mid:
            parent[n] = order[i + 1]
        elif i > mid:
            parent[n] = order[i - 1]
    return parent


def reduce_tree(topology: str, w: int, h: int) -> dict[int, int | None]:
    """Parent map of the reduction over a ``w x h`` mesh: ``tree``/``mesh`` = :func:`centre_tree`,
    ``chain`` = :func:`chain_tree`; ``ring`` (the chunked-O ring, gqa_attention._chunk_ring) has no
    tree, it shares the chain's root (the snake's middle node) so :func:`root_of` names its root."""
    if topology in ("tree", "mesh"):
        return centre_tree(w, h)
    if topology in ("chain", "ring"):
        return chain_tree(w, h)
    raise ValueError(f"reduction topology must be tree|mesh|chain|ring, found {topology!r}")


def ring_rounds(n: int) -> int:
    """Rounds of the chunked-O ring over ``n`` nodes: ``n - 1`` reduce-scatter steps + ``n div 2`` gather
    steps (the gather runs towards the root from both sides)."""
    return n - 1 + n // 2 if n > 1 else 0


def ring_chunk_messages(n: int) -> int:
    """Chunk triplets the chunked-O ring sends over ``n`` nodes: ``n (n - 1)`` in the reduce-scatter (every
    node, every step) + the gather's hops: the ``f = n div 2`` nodes on one side of the root at 1..f hops,
    the ``g = n - 1 - f`` on the other at 1..g hops, ``f (f + 1) / 2 + g (g + 1) / 2``."""
    f, g = n // 2, n - 1 - n // 2
    return n * (n - 1) + f * (f + 1) // 2 + g * (g + 1) // 2


def children_of(parent: dict[int, int | None], node: int) -> list[int]:
    return sorted(n for n, p in parent.items() if p == node)


def root_of(parent: dict[int, int | None]) -> int:
    return next(n for n, p in parent.items() if p is None)

"""TCM scratch arenas and ``tl.scratch_scope`` (seed ADR-0063: per-tile scratch recycling).

The kernel's TCM is a bump allocator: every tensor a ``tl`` op creates gets a
fresh buffer and nothing is freed implicitly, as in the seed's baseline ("the
1 MiB scratch bump allocator leaks per-tile temporaries", seed §A limit 3).  The
budget is the TCM size minus the PE scheduler's own composite buffers
(:func:`scheduler_reserve`); exceeding it is a KernelError naming the line.

``with tl.scratch_scope():`` opens a child arena.  When the block ends:

* handles created inside and still bound to a *carried* local variable of the
  kernel frame - a name that was already bound before the block, like the
  running ``m, l, O`` of the seed's loop (also inside a list/tuple/dict held by
  such a name, including a list or dict that was empty before the block, where
  a kernel collects what it keeps: kernels/gqa_batched.py) - move to the
  enclosing arena;
* every other handle created inside is released: the runtime waits for the
  command producing it and the last command reading it, frees its TCM buffer and
  marks it dead (a later use is a KernelError "used after its scratch_scope
  ended at file:line");
* a handle a carried name held before the block, that no local variable of this
  frame or of its callers refers to any more (the previous ``m`` after
  ``m = m_new``), is released too, so a loop over many tiles uses O(1) TCM.

Handles kept elsewhere (attributes, nested containers) are not seen: keep
carried state in plain local variables or flat lists/tuples/dicts of handles.
"""
from __future__ import annotations

import sys


from actors.ahbm.tl.handles import TensorHandle

__all__ = ["Arena", "ScratchScope", "scheduler_reserve", "handles_in"]


def scheduler_reserve(prm) -> int:
    """TCM bytes the PE scheduler keeps for composites (actors/ahbm/scheduler.py docstring):
    two A blocks, two B blocks, an fp32 accumulator and two output blocks of the
    TILE_M x TILE_K x TILE_N plan, sized for 4-byte elements (worst case)."""
    tm, tk, tn = prm.tile
    return 4 * (2 * tm * tk + 2 * tk * tn + tm * tn + 2 * tm * tn)


class Arena:
    """A set of TCM buffers released together."""

    __slots__ = ("parent", "handles", "site")

    def __init__(self, parent, site: str):
        self.parent = parent
        self.handles: list[TensorHandle] = []
        self.site = site


def handles_in(value) -> list[TensorHandle]:
    """Handles held by a local variable: the value itself or the items of a list/tuple/dict."""
    if isinstance(value, TensorHandle):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, TensorHandle)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, TensorHandle)]
    return []


def _add_ids(ids: set, values) -> None:
    """Add to ``ids`` the ``id`` of every handle in ``values`` (as :func:`handles_in` of each value;
    inlined: it runs over every local of every frame on the stack at each scope's end)."""
    for value in values:
        if isinstance(value, TensorHandle):
            ids.add(id(value))
        elif isinstance(value, (list, tuple)):
            ids.update(id(v) for v in value if isinstance(v, TensorHandle))
        elif isinstance(value, dict):
            ids.update(id(v) for v in value.values() if isinstance(v, TensorHandle))


class ScratchScope:
    """``with tl.scratch_scope():`` (see the module docstring)."""

    def __init__(self, rt):
        self.rt = rt
        self.frame = None
        self.before: dict[str, list[TensorHandle]] = {}
        self.arena = None

    def __enter__(self):
        self.frame = sys._getframe(1)
        self.before = {}
        for k, v in self.frame.f_locals.items():
            held = handles_in(v)
            live = [h for h in held if h.dead is None]
            if live or (not held and isinstance(v, (list, dict)) and not v):
                self.before[k] = live   # names bound to dead handles are not carried; an empty list or dict is
        self.arena = self.rt._push_arena(f"{self.frame.f_code.co_filename}:{self.frame.f_lineno}")
        return self

    def __exit__(self, et, ev, tb):
        rt = self.rt
        arena = self.arena
        rt._pop_arena(arena)
        site = rt.site()
        if et is not None:
            for h in arena.handles:
                h.dead = f"its scratch_scope ended (with an error) at {site}"
            return False
        local = self.frame.f_locals
        now = {k: handles_in(local[k]) for k in self.before if k in local}
        referenced = set()
        f = self.frame
        while f is not None:  # handles still held by this frame or any caller's frame stay alive
            _add_ids(referenced, f.f_locals.values())
            f = f.f_back
        self.frame = None
        keep = {id(h) for k, hs in now.items() if k in self.before for h in hs if h.arena is arena}
        release = [h for h in arena.handles if id(h) not in keep]
        for k, hs in self.before.items():
            for h in hs:
                if id(h) not in referenced and h.dead is None and h.arena is not None and h.arena is not arena:
                    release.append(h)
        for h in arena.handles:
            if id(h) in keep:
                h.arena = arena.parent
                arena.parent.handles.append(h)
        rt._release(release, f"its scratch_scope ended at {site}")
        return False

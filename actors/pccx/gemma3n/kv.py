"""The driver's KV ring buffer (seed §4; reference §5 ``kv_cache.rst``).

``pccx_kv_init(max_tokens)`` fixes the ring's slot count for good.  Token ``t``
(0-based position) is written to slot :meth:`KvRing.slot`; while ``t <
max_tokens`` that is slot ``t``.  Once full, the ring wraps by the
attention-sink + local-window policy: the first ``sink`` slots (tokens
0..sink-1) are never overwritten, the other ``max_tokens - sink`` slots hold the
most recent tokens, oldest overwritten first.  The hardware sees only which
slots are valid (``pccx_kv_evict`` moves the valid range, reference §5): here
:meth:`valid` lists the token positions attended to, in slot order, and
:meth:`attended` their count, the ``L`` of the attention GEMVs.

Element sizes in host DDR (per K or V vector of ``head_dim``): fp16 2 B/elem;
int8 1 B/elem + one BF16 scale per (token, head); int4 0.5 B/elem + one BF16
scale per (token, head) — quantised on the write path by the host (the scales
ride along as the GEMV's per-row ``w_scale``).
"""
from __future__ import annotations

from actors.pccx.gemma3n.kvlayout import slot_ranges

__all__ = ["KvRing", "kv_elem_bits"]


def kv_elem_bits(dtype: str) -> int:
    return {"fp16": 16, "int8": 8, "int4": 4}[dtype]


class KvRing:
    """Slot bookkeeping of one hard-capped ring (shared by every KV-producing layer: same positions)."""

    def __init__(self, max_tokens: int, sink: int):
        if max_tokens <= 0:
            raise ValueError(f"pccx_kv_init: max_tokens must be positive, found {max_tokens}")
        if not 0 <= sink < max_tokens:
            raise ValueError(f"KV ring: sink must be in [0, max_tokens), found {sink} (max_tokens {max_tokens})")
        self.max_tokens = max_tokens
        self.sink = sink
        self.written = 0          # tokens written so far (positions 0..written-1)
        self.slots: list[int | None] = [None] * max_tokens   # token position held by each slot

    def slot(self, t: int) -> int:
        """The slot token position ``t`` is written to."""
        if t < self.max_tokens:
            return t
        ring = self.max_tokens - self.sink
        return self.sink + (t - self.sink) % ring

    def append(self) -> int:
        """Write the next token; returns its slot (evicting the oldest non-sink entry when full)."""
        s = self.slot(self.written)
        self.slots[s] = self.written
        self.written += 1
        return s

    def valid(self, window: int | None = None) -> list[int]:
        """Token positions attended to (slot order); ``window`` limits them to the last ``window`` positions (the
        HF sliding window of local layers when enabled: the newest entries, the sinks are not among them)."""
        pos = [p for p in self.slots if p is not None]
        if window is not None:
            last = self.written - 1
            pos = [p for p in pos if p > last - window]
        return pos

    def ranges(self, window: int | None = None) -> list[tuple[int, int]]:
        """The slots of :meth:`valid`, as sorted contiguous ``[a, b)`` slot ranges (what the attention streams)."""
        key = (self.written, window)
        if getattr(self, "_ranges_key", None) != key:
            last = self.written - 1
            slots = [s for s, p in enumerate(self.slots) if p is not None and (window is None or p > last - window)]
            self._ranges_key, self._ranges = key, slot_ranges(slots)
        return self._ranges

    def attended(self, window: int | None = None) -> int:
        n = min(self.written, self.max_tokens)
        return min(n, window) if window is not None else n

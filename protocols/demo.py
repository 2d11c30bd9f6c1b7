"""Messages of the demo machine (tags 100-199)."""
from __future__ import annotations

from protocols.codec import message


@message(tag=100)
class Token:
    """A token travelling round the ring: ``hops`` still to go."""

    token: int
    hops: int


@message(tag=101, descs_as_arrays=True)
class Partial:
    """A flash-attention partial ``(m, l, O)`` of one round, merged from ``count`` PEs.

    ``m`` and ``l`` have shape ``[G]``, ``O`` (unnormalised) ``[G, d]``; numpy
    arrays in data mode, :class:`~protocols.codec.TensorDesc` in timing mode.
    Both forms are charged the same bytes (``descs_as_arrays``), so both modes
    give the same virtual times.
    """

    round: int
    count: int
    m: object
    l: object
    O: object

"""Messages of the AHBM ``tl`` kernel runtime (tags 450-499).

* :class:`KernelLaunch`: the host / IO die starts kernel ``kernel`` on one PE CPU,
  with keyword arguments ``args`` (msgpack values) and its grid coordinates
  ``program_id = [pe, cube]`` out of ``num_programs`` (``tl.program_id(0/1)``);
* :class:`KernelDone`: the PE CPU reports completion (``start``/``end`` ps) and
  the kernel's counters (``stats``: ops issued per kind, TCM peak, reports).
"""
from __future__ import annotations

from protocols.codec import message

__all__ = ["KernelLaunch", "KernelDone"]


@message(tag=450)
class KernelLaunch:
    kernel: str
    args: dict
    program_id: list
    num_programs: list


@message(tag=451)
class KernelDone:
    pe: str
    kernel: str
    start: int
    end: int
    stats: dict

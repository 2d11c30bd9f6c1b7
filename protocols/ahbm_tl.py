"""Messages of the AHBM ``tl`` kernel runtime (tags 450-499).

* :class:`KernelLaunch`: the host / IO die (``io/host``) starts kernel ``kernel`` on
  one PE CPU, with keyword arguments ``args`` (msgpack values) and its grid
  coordinates ``program_id = [pe, cube, sip]`` out of ``num_programs``
  (``tl.program_id(0/1/2)``); the same CPU also runs command scripts
  (protocols.ahbm.Launch);
* :class:`KernelDone`: the PE CPU reports completion to the host (``start``/``end`` ps)
  and the kernel's counters (``stats``: ops issued per kind, TCM peak, reports).
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

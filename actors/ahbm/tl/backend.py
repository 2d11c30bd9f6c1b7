"""The interface the ``tl`` runtime calls to reach a PE's engines.

The runtime (runtime.py) never builds a message: it asks a :class:`PeBackend`
to charge a dispatch cost, to issue a command to an engine (returning a command
id), to wait for a command, and to read/write/free TCM buffers.  The machine's
PE CPU implements it over the AHBM engine actors and their messages
(actors/ahbm/cpu.py: :class:`~actors.ahbm.cpu.PeCpu`, the same actor that runs
command scripts).

All methods are coroutines, awaited from the kernel's greenlet through
``greenback.await_``.  Engines (``engine`` names used for ordering): ``dma``,
``gemm``, ``math``, ``sched`` (composite commands), ``ipcq``, ``noc``.  Commands to one
engine are served in issue order (every engine is FIFO), which lets the runtime
chain same-engine commands without waiting.
"""
from __future__ import annotations

from typing import Protocol

__all__ = ["PeBackend"]


class PeBackend(Protocol):
    """What a PE CPU offers the kernel runtime (see the module docstring); structural, so the
    hardware (actors/ahbm/cpu.py) implements it without importing the runtime."""

    #: this PE's actor-name prefix, e.g. ``sip0/cube00/pe3``
    pe: str
    #: directions with an IPCQ neighbour (subset of N, S, E, W)
    dirs: tuple
    #: ``timing`` or ``data``
    mode: str
    #: the machine parameters (actors.ahbm.params.Params)
    prm: object

    @property
    def now(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    async def dispatch(self, kind: str) -> None:
        """Charge the CPU's issue cost of one op of ``kind`` (costs.dispatch_ps)."""
        raise NotImplementedError

    async def cpu_busy(self, ps: int, label: str) -> None:
        """The CPU itself works for ``ps`` (e.g. a transpose through its TCM port)."""
        raise NotImplementedError

    async def dma(self, op: str, addr: int, rows: int, row_bytes: int, pitch: int, buf: str, shape, dtype: str) -> int:
        raise NotImplementedError

    async def dma_gather(self, op: str, addr: int, parts: list) -> int:
        """One DMA between a contiguous HBM range and several TCM buffers ``[[buf, shape, dtype], ...]``."""
        raise NotImplementedError

    async def gemm(self, a: str, b: str, acc: str, m: int, k: int, n: int) -> int:
        raise NotImplementedError

    async def math(self, op: str, srcs: list, out: str, scalar: float, out_dtype: str) -> int:
        raise NotImplementedError

    async def composite(self, a_addr: int, b_addr: int, c_addr: int, m: int, k: int, n: int, dtype: str,
                        epilogue: list, *, a_buf: str = "", b_buf: str = "", c_buf: str = "", c_dtype: str = "") -> int:
        """A CompositeCmd; an operand named by a TCM buffer (``*_buf``) is read/written there, not in HBM."""
        raise NotImplementedError

    async def ipcq(self, op: str, dir: str, buf: str) -> int:
        raise NotImplementedError

    #: ``[sip, cube, pe]`` of this PE; ``has_noc``: attached to a CUBE NOC router
    coord: list
    has_noc: bool

    async def noc_send(self, dst, buf: str) -> None:
        """Send TCM buffer ``buf`` to PE ``dst = [sip, cube, pe]`` over the CUBE NOC."""
        raise NotImplementedError

    async def noc_recv(self, src, buf: str) -> int:
        """Post a receive of the next NOC packet from PE ``src`` into ``buf``; returns a command id."""
        raise NotImplementedError

    async def wait(self, cid: int) -> dict:
        """Wait until command ``cid`` completed (idempotent); returns its completion info."""
        raise NotImplementedError

    async def wait_any(self, cids: list) -> int:
        """Wait until one of commands ``cids`` completed; the index of the earliest-completed one."""
        raise NotImplementedError

    async def tcm_read(self, buf: str):
        raise NotImplementedError

    async def tcm_write(self, buf: str, data) -> None:
        raise NotImplementedError

    async def tcm_free(self, buf: str) -> None:
        raise NotImplementedError

    async def tcm_free_all(self, bufs: list) -> None:
        """Free TCM buffers ``bufs`` in one access (the end of a scratch scope or kernel)."""
        raise NotImplementedError

    def report(self, key: str, value) -> None:
        raise NotImplementedError

"""The IO die / host: loads tensors into HBM over the NOC, then launches scripts and collects completions.

Two ways to get tensors into HBM (placement.py):

* ``Placement.put``: the initial memory image, written before the run (t < 0);
* ``Placement.load``: a *timed* host load.  At t = 0 the host sends one
  :class:`~protocols.ahbm.MemReq` write per tensor through its host interface
  (``io.bandwidth``, ``io.latency``; assumptions, see the profile) to the NOC
  router it attaches to (``io.attach``), which XY-routes it to the owner PE's
  HBM port (hbmport.py); the port answers with an acknowledgement.  Requests
  are pipelined (as many in flight as the interface link has credits).  At
  zero load one load of S bytes over h CUBE hops takes
  ``S/B_io + L_io + (h+1) alpha + h (S/B_cube + L_cube) + S/B_att + L_att + channels(N)``
  plus the acknowledgement's way back.

When every load is acknowledged the host sends one :class:`~protocols.ahbm.Launch`
per PE that has a script, over a link of latency ``io.launch_latency``
(assumption: 100 ns IO die -> PE command path), then waits for every
:class:`~protocols.ahbm.PeDone`.  Reports: ``loads_done_ps``, ``pes_done``,
``last_done_ps``; ``logs`` holds each PE's per-command timings.
"""
from __future__ import annotations

import numpy as np
import trio

from emulator.actor import Actor
from protocols.ahbm import Launch, MemReq, PeDone, payload
from protocols.codec import TensorDesc

from actors.ahbm.noc import first_error


class Host(Actor):
    def __init__(self, name: str, *, scripts: dict[str, list], coord: list):
        super().__init__(name)
        self.scripts = scripts
        self.coord = list(coord)
        self.outs = {pe: self.out_port(f"launch_{i}") for i, pe in enumerate(scripts)}
        self.done = self.in_port("done")
        self.noc_out = self.out_port("noc_out")
        self.noc_in = self.in_port("noc_in")
        #: timed loads ``(coord, addr, array or TensorDesc)``, filled by Placement.load before the run
        self.loads: list[tuple] = []
        self.logs: dict[str, list] = {}
        self.load_done: list[int] = []

    async def _send_loads(self) -> None:
        data_mode = self.system.mode == "data"
        for i, (coord, addr, arr) in enumerate(self.loads, start=1):
            if data_mode:
                blob = np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8)
            else:
                blob = TensorDesc.of((arr.nbytes,), "|u1")
            n = int(blob.nbytes)
            await self.noc_out.send(MemReq(i, "write", self.coord, list(coord), 0, addr, 1, n, n, payload(blob)))

    async def _load_all(self) -> None:
        """Send every load (pipelined) while a second task takes the acknowledgements as they arrive."""
        async def acks():
            for _ in range(len(self.loads)):
                await self.noc_in.recv()
                self.load_done.append(self.now)

        try:
            async with trio.open_nursery() as n:
                n.start_soon(acks)
                await self._send_loads()
        except BaseExceptionGroup as eg:
            raise first_error(eg) from None

    async def run(self) -> None:
        if self.loads:
            await self._load_all()
            self.report("loads_done_ps", self.now)
        for pe, script in self.scripts.items():
            await self.outs[pe].send(Launch(script))
        for _ in range(len(self.scripts)):
            d: PeDone = await self.done.recv()
            self.logs[d.pe] = d.log
        self.report("pes_done", len(self.logs))
        self.report("last_done_ps", self.now)

"""The NOC side of a PE's HBM controller: serves other PEs' DMAs (``.../pe3/hbm/port``).

kernbench2 ADR-0019 D1/D4 (ref §1.2): the HBM controller is split per PE and
reachable only through that PE's router.  A :class:`~protocols.ahbm.MemReq`
arriving from the router is served like a local DMA block access: one request
per pseudo-channel holding part of the block, all channels in parallel
(``max_pc(access_latency + bytes_pc / (pc_bandwidth x efficiency))``, costs.pc_ps),
then one :class:`~protocols.ahbm.MemResp` back over the NOC (the data for a
read, an acknowledgement for a write).  The port adds no time of its own
(assumption) and serves requests one at a time in arrival order; the channels
are shared FIFO with the owner PE's own DMA, so remote and local traffic contend.  With ``hbm_stack``
(``fidelity: pipeline``, timing mode, builder.py) the access is one request to the PE's HBM stack
(memory.HbmStack, the same per-channel timing) and one answer.
"""
from __future__ import annotations

import numpy as np

from emulator.actor import Actor
from emulator.declare import In, Out
from protocols.ahbm import HbmReq, HbmResp, MemReq, MemResp, PcReq, PcResp, payload
from protocols.codec import TensorDesc

from actors.ahbm.answers import Direct
from actors.ahbm.hbm_access import channel_access, check_block, stack_access
from actors.ahbm.params import declare

__all__ = ["HbmPort"]


class HbmPort(Actor):
    """The NOC side of a PE's HBM controller (module docstring)."""

    daemon = True
    starts_on = "req"    # started by its first request (Actor.starts_on)
    PORTS = (In("req", MemReq, doc="remote HBM requests from the router (other PEs' DMAs, host loads)", idle=True),
             Out("out", MemResp, doc="answers, back over the NOC"),
             Out("pc{i}", PcReq, doc="requests to pseudo-channel i"),
             Out("hbm", HbmReq, doc="block accesses to the PE's HBM stack (fidelity pipeline, timing mode)"),
             In("pc_resp", PcResp, HbmResp, doc="the channels' (or the HBM stack's) answers"))
    PARAMS = declare("pcs", "burst", "hbm_capacity")

    def __init__(self, name: str, *, prm, coord: tuple, hbm_stack: bool = False):
        """``hbm_stack``: the PE's channels are one :class:`~actors.ahbm.memory.HbmStack` (port ``hbm``)."""
        super().__init__(name)
        self.hbm_stack = hbm_stack
        self.hbm = self.out_port("hbm")
        self.prm = prm
        self.coord = list(coord)
        self.req = self.in_port("req", idle=True)
        self.out = self.out_port("out")
        self.pc_req = [self.out_port(f"pc{i}") for i in range(prm.pcs)]
        self.pc_resp = self.in_port("pc_resp")
        self.seq = [0]
        self._answers = Direct(self.pc_resp)
        self.served = 0

    async def run(self) -> None:
        data_mode = self.system.mode == "data"
        while True:
            r: MemReq = await self.req.recv()
            check_block(self.prm, f"{self.name} request {r.id} from {r.src}", r.addr, r.rows, r.row_bytes, r.pitch)
            blob = np.asarray(r.data.t).tobytes() if (r.op == "write" and data_mode) else None
            if self.hbm_stack:
                image = await stack_access(self, self.hbm, self._answers, "port", r.op, r.addr, r.rows, r.row_bytes,
                                           r.pitch, self.seq)
            else:
                image = await channel_access(self, self.pc_req, self._answers, "port", r.op, r.addr, r.rows,
                                             r.row_bytes, r.pitch, blob, data_mode, self.seq)
            data = None
            if r.op == "read":
                total = r.rows * r.row_bytes
                data = payload(np.frombuffer(image, np.uint8) if data_mode else TensorDesc.of((total,), "|u1"))
            self.served += 1
            await self.out.send(MemResp(r.id, self.coord, list(r.src), 0, data))

"""The host / IO die side of kernel launches.

:class:`KernelHost` sends one :class:`~protocols.ahbm_tl.KernelLaunch` per PE of
the grid at t = 0 over a link of latency ``io.launch_latency`` (the IO die ->
PE command path, assumption 100 ns, actors/ahbm/host.py) and learns of
completion from the PEs' :class:`~protocols.ahbm_tl.KernelDone` messages (over
links of the same latency).  It reports the kernel latency (last completion
minus launch), and per PE its start/end (relative to the launch) and op counts.
"""
from __future__ import annotations

from emulator.actor import Actor
from protocols.ahbm_tl import KernelDone, KernelLaunch

__all__ = ["KernelHost", "launch"]


class KernelHost(Actor):
    def __init__(self, name: str, *, launches: list[tuple[str, KernelLaunch]]):
        super().__init__(name)
        self.launches = launches
        self.outs = {pe: self.out_port(f"launch_{i}") for i, (pe, _) in enumerate(launches)}
        self.done_in = self.in_port("done")
        self.done: dict[str, KernelDone] = {}

    async def run(self) -> None:
        t0 = self.now
        for pe, msg in self.launches:
            await self.outs[pe].send(msg)
        for _ in self.launches:
            d: KernelDone = await self.done_in.recv()
            self.done[d.pe] = d
        self.report("launch_ps", t0)
        self.report("kernel_latency_ps", self.now - t0)
        self.report("pes", {pe: {"start_ps": d.start - t0, "end_ps": d.end - t0, **d.stats}
                            for pe, d in sorted(self.done.items())})


def launch(system, prm, pes, kernel: str, args_of, grid_of, num_programs, name: str = "io/host") -> KernelHost:
    """Build the host and its links: ``args_of(pe)`` / ``grid_of(pe)`` give each PE's arguments and program_id."""
    launches = [(pe.name, KernelLaunch(kernel, args_of(pe), list(grid_of(pe)), list(num_programs))) for pe in pes]
    host = system.add(KernelHost(name, launches=launches))
    for pe in pes:
        system.connect(host.outs[pe.name], pe.cpu.launch, capacity=1, latency=prm.launch_latency)
        system.connect(pe.cpu.kernel_done, host.done_in, capacity=1, latency=prm.launch_latency)
    return host

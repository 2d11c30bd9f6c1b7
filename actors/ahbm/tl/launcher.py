"""The launch side of ``tl`` kernels: KernelLaunch messages for a grid of PEs of the machine.

Kernels run on the PE CPUs of the machine built by actors/ahbm/builder.py; the
machine's host / IO die (``io/host``, actors/ahbm/host.py) sends each PE of the
grid its :class:`~protocols.ahbm_tl.KernelLaunch` when the run starts (after any
timed host loads) over the IO die -> PE command path (``io.launch_latency``)
and learns of completion from the PEs' :class:`~protocols.ahbm_tl.KernelDone`
messages.  The grid may be any set of PEs of any SIPs and CUBEs.

:func:`kernel_launches` builds the ``kernels`` argument of ``build_machine``.
The host's report (``system.reports["io/host"]``) holds the kernel latency (last
completion received minus the launch) and per-PE start/end and op counts.
"""
from __future__ import annotations

from protocols.ahbm_tl import KernelLaunch

import actors.ahbm.tl.kernel_registry  # noqa: F401  (registers the PE CPU's KernelLaunch handler)

__all__ = ["kernel_launches"]


def kernel_launches(kernel: str, coords, args_of, grid_of, num_programs) -> dict:
    """``{coord: KernelLaunch}`` for PEs ``coords`` = [(sip, cube, pe)]: ``args_of(coord)`` gives the kernel's
    keyword arguments (msgpack values), ``grid_of(coord)`` its ``program_id`` out of ``num_programs``."""
    return {tuple(c): KernelLaunch(kernel, dict(args_of(tuple(c))), [int(x) for x in grid_of(tuple(c))],
                                   [int(x) for x in num_programs]) for c in coords}


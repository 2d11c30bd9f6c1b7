"""The ``tl`` kernel registry and :func:`run_kernel`, the PE CPU's KernelLaunch handler.

The PE CPU (actors/ahbm/cpu.py, :class:`~actors.ahbm.cpu.PeCpu`) is one actor
per PE in the machine built by actors/ahbm/builder.py; it is hardware only and
knows no kernels.  Importing this module registers :func:`run_kernel` as its
handler of :class:`~protocols.ahbm_tl.KernelLaunch` (``PeCpu.register_launch``;
launcher.py imports it, so any workload that builds kernel launches has it).
When the host sends a PE a KernelLaunch the CPU calls :func:`run_kernel`, which
looks the kernel up (:func:`kernel`), enters a greenback portal in the CPU's
Trio task (once, at the first kernel) and calls the synchronous kernel function
with a :class:`~actors.ahbm.tl.runtime.Tl` whose backend is the CPU itself:
every ``tl`` call awaits the CPU's issue primitives, which send the engine
messages of protocols/ahbm.py.  When the kernel returns and its outstanding
commands are complete the CPU answers the host with the
:class:`~protocols.ahbm_tl.KernelDone` built here.

Time charged by the CPU itself: ``costs.dispatch_ps(kind)`` per op (profile
``cpu.dispatch_cycles``), and the explicit CPU work of runtime.py (transpose,
fills).  A kernel error (KernelError) ends the run with the PE and kernel line.
"""
from __future__ import annotations

import importlib
from typing import Callable

import greenback

from protocols.ahbm_tl import KernelDone, KernelLaunch

from actors.ahbm.cpu import PeCpu
from actors.ahbm.tl.errors import KernelError, site_of
from actors.ahbm.tl.runtime import Tl

__all__ = ["register_kernel", "kernel", "run_kernel", "KERNELS"]

#: kernel name -> function ``f(**args, tl=tl)``
KERNELS: dict[str, Callable] = {}


def register_kernel(fn: Callable, name: str | None = None) -> str:
    """Make ``fn`` launchable by name (default ``module:qualname``); returns the name."""
    name = name or f"{fn.__module__}:{fn.__qualname__}"
    KERNELS[name] = fn
    return name


def kernel(name: str) -> Callable:
    """The kernel called ``name``: registered, or importable as ``package.module:function``."""
    fn = KERNELS.get(name)
    if fn is None and ":" in name:
        mod, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError):
            fn = None
    if fn is None:
        raise KeyError(f"unknown kernel {name!r}; registered: {', '.join(sorted(KERNELS)) or 'none'}")
    return fn


async def run_kernel(cpu, launch: KernelLaunch) -> KernelDone:
    """Run ``launch`` on PE CPU ``cpu`` (the runtime's backend) to completion; its KernelDone."""
    try:
        fn = kernel(launch.kernel)
    except KeyError as e:
        raise KernelError(cpu.pe, str(e.args[0]), site="launch") from None
    if not greenback.has_portal():
        await greenback.ensure_portal()
    start = cpu.now
    tl = Tl(cpu, program_id=launch.program_id, num_programs=launch.num_programs)
    try:
        fn(**launch.args, tl=tl)
        stats = tl.finish()
    except KernelError:
        raise
    except Exception as e:  # a bug in the kernel itself: name the PE and the kernel line
        raise KernelError(cpu.pe, f"the kernel raised {type(e).__name__}: {e}", site_of(e.__traceback__)) from None
    launches = cpu.system.reports.get(cpu.name, {}).get("launches")
    if launches is None:   # per launch: its own reports (a PE that runs several requests, tl/gqa_requests.py)
        cpu.report("launches", launches := [])
    launches.append(tl.reported)
    return KernelDone(cpu.pe, launch.kernel, start, cpu.now, stats)


PeCpu.register_launch(KernelLaunch, run_kernel)

"""A ``tl`` kernel as a workload: per-kernel hooks, one generic build and check (DESIGN.md §7).

A kernel workload registers :class:`KernelHooks`: its parameter schema, how to
lay the launch out (``layout``: which PEs run the kernel, with which keyword
arguments and ``program_id``, where its tensors live), how to draw its inputs
from the scenario seed (``inputs``), how to write them into the PEs' HBM
(``place``), the float64 numpy reference of every output (``reference``) and
its own metrics (``metrics``).  :func:`kernel_workload` turns them into a
:class:`~actors.registry.Workload` whose ``build`` builds the machine, places
the inputs and returns a :class:`KernelContext`, which the runner hands to
``check``: nothing is stored on the system.  Adding a kernel = one module of
hooks + a scenario.

``check`` (generic): status, kernel latency (the host's, from launch to the last
KernelDone), per-PE reports, and in data mode the worst absolute / relative error
of every output against its reference (``max_abs_err``, ``max_rel_err``,
``outputs_checked``); then the hooks' metrics.  On a run that did not finish
(interrupted, wall-clock guard, time limit, deadlock) it gives what is known:
``latency_ps`` None, ``latency_at_least_ps`` (virtual time from the launch to
where the run stopped: the kernel had not finished by then), ``progress`` (the
share of the kernel's MACs the GEMM engines have done, with the ``work`` hook),
then the hooks' ``partial_metrics`` (bounds, a table row).

``progress`` (the live display, tools/run/progress.py): the MACs the launched PEs'
GEMM engines have done out of the hooks' ``work`` total.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from actors.ahbm.builder import build_machine
from actors.ahbm.params import Params, pe_name
from actors.ahbm.placement import Placement
from actors.ahbm.tl.launcher import kernel_launches
from actors.registry import Workload
from emulator.schema import Map

__all__ = ["KernelHooks", "KernelLayout", "KernelContext", "Output", "kernel_workload"]


@dataclass
class Output:
    """One output tensor a data-mode check reads back: PE, byte address, shape, dtype, and its name."""
    coord: tuple
    addr: int
    shape: tuple
    name: str
    dtype: str = "<f4"


@dataclass
class KernelLayout:
    """Where a launch runs: ``coords`` [(sip, cube, pe)], ``args_of(coord)`` its keyword arguments,
    ``grid_of(coord)`` its program_id, ``num_programs``; ``info`` anything the hooks need later."""
    coords: list
    args_of: Callable
    grid_of: Callable
    num_programs: tuple
    info: dict = field(default_factory=dict)


@dataclass
class KernelContext:
    """What ``build`` returns and ``check`` receives."""
    prm: Params
    machine: object
    layout: KernelLayout
    placement: Placement
    data: Optional[dict]
    params: dict

    def read(self, out: Output) -> np.ndarray:
        n = int(np.prod(out.shape)) * np.dtype(out.dtype).itemsize
        return np.frombuffer(self.placement.read(out.coord, out.addr, n), out.dtype).reshape(out.shape)

    def cpu_reports(self, system) -> dict:
        """``{coord: report of its PE CPU}`` for the launched PEs."""
        return {c: system.reports.get(f"{pe_name(*c)}/cpu", {}) for c in self.layout.coords}


@dataclass
class KernelHooks:
    name: str
    summary: str
    params: Map
    kernel: object                                 # registered kernel name, or (coord, layout) -> name
    layout: Callable                               # (prm, params) -> KernelLayout (raise BuildError on bad params)
    inputs: Callable                               # (rng, layout, params) -> dict of arrays
    place: Callable                                # (placement, layout, data, params) -> None
    outputs: Callable                              # (ctx) -> [Output]
    reference: Callable                            # (ctx) -> {output name: float64 array}
    metrics: Callable = lambda ctx, system, out: {}   # (ctx, system, generic result) -> extra keys
    rng_stream: str = "attention/inputs"
    limits: Optional[Callable] = None              # (profile, params, mode) -> [(param, expected, found)]
    work: Optional[Callable] = None                # (ctx) -> MACs the whole launch runs on the GEMM engines
    partial_metrics: Callable = lambda ctx, system, out: {}   # (ctx, system, partial result) -> keys, unfinished


def kernel_workload(h: KernelHooks) -> Workload:
    def build(system, profile: dict, p: dict) -> KernelContext:
        prm = Params.of(profile)
        lay = h.layout(prm, p)
        if callable(h.kernel):   # several kernels side by side: launches grouped by kernel, in coordinate order
            names = {tuple(c): h.kernel(tuple(c), lay) for c in lay.coords}
            kernels = {}
            for name in dict.fromkeys(names.values()):
                kernels.update(kernel_launches(name, [c for c in lay.coords if names[tuple(c)] == name],
                                               lay.args_of, lay.grid_of, lay.num_programs))
        else:
            kernels = kernel_launches(h.kernel, lay.coords, lay.args_of, lay.grid_of, lay.num_programs)
        machine = build_machine(system, profile, kernels=kernels, fidelity=p.get("fidelity", "block"))
        place = Placement(machine, system.mode == "data")
        data = None
        if system.mode == "data":
            data = h.inputs(system.rng(h.rng_stream), lay, p)
            h.place(place, lay, data, p)
        return KernelContext(prm, machine, lay, place, data, dict(p))

    def macs_done(ctx: KernelContext) -> int:
        return sum(ctx.machine.pe(*c).gemm.macs for c in ctx.layout.coords)

    def progress(system, context: KernelContext = None):
        if context is None or h.work is None:
            return None
        return macs_done(context), h.work(context), "MACs"

    def partial(system, result, ctx: KernelContext) -> dict:
        t0 = system.reports.get("io/host", {}).get("launch_ps")
        out = {"latency_ps": None,
               "latency_at_least_ps": None if t0 is None else max(0, result.end_time_ps - t0)}
        if h.work is not None:
            out["progress"] = round(macs_done(ctx) / max(1, h.work(ctx)), 4)
        out.update(h.partial_metrics(ctx, system, out))
        return out

    def check(system, profile: dict, p: dict, result, context: KernelContext = None) -> dict:
        if context is None:
            return {}
        if result.status != "finished":
            return partial(system, result, context)
        host = system.reports["io/host"]
        out = {"latency_ps": host["kernel_latency_ps"],
               "tcm_peak_B": max(v["tcm_peak_B"] for v in host["pes"].values())}
        if system.mode == "data":
            refs = h.reference(context)
            worst_abs = worst_rel = 0.0
            outs = h.outputs(context)
            for o in outs:
                got = context.read(o).astype(np.float64)
                err = np.abs(got - refs[o.name])
                worst_abs = max(worst_abs, float(err.max()))
                worst_rel = max(worst_rel, float((err / np.maximum(np.abs(refs[o.name]), 1e-3)).max()))
            out.update(max_abs_err=worst_abs, max_rel_err=worst_rel, outputs_checked=len(outs))
        out.update(h.metrics(context, system, out))
        return out

    return Workload(h.name, h.summary, h.params, build, check, h.limits, progress)

"""The AHBM ``energy_handcheck`` workload: one DMA load, one GEMM and one IPCQ send, small enough to add
up by hand (docs/energy.md, "A worked example").

PE (0, 0, 0) runs, in order: a DMA load of ``dma_bytes`` from its own HBM into its TCM, a GEMM
``m x k x n`` of two TCM tensors, and an IPCQ send of ``ipcq_bytes`` to its east neighbour
(0, 0, 1), which receives it.  Nothing else runs, so every energy action of the run can be
written down: HBM bits read = 8 x ``dma_bytes`` (no other HBM access), MACs = m x k x n, one DMA
command, the four dispatches' CPU cycles (``cpu.dispatch_cycles``: dma, gemm, ipcq on the sender,
ipcq on the receiver), and the bits of the links (``links.csv``); plus every component's static
power over the run.  ``tests/test_energy_handcheck.py`` runs the shipped scenario
(``scenarios/ahbm/energy-handcheck.yaml``) through the CLI and compares ``result.json``'s energy
with that sum, to the attojoule.

The check prints each command's issue and completion time (the PE CPU logs).
"""
from __future__ import annotations

import numpy as np

from emulator.errors import BuildError
from emulator.schema import Int, List, Map, Quantity

from actors.ahbm.builder import build_machine
from actors.ahbm.params import Params, pe_name
from actors.ahbm.placement import Placement

__all__ = ["HANDCHECK_PARAMS", "build_handcheck", "check_handcheck", "SENDER", "RECEIVER"]

SENDER, RECEIVER = (0, 0, 0), (0, 0, 1)     # PE 1 is PE 0's east neighbour (PE grid x >= 2)

HANDCHECK_PARAMS = Map({
    "dma_bytes": Quantity("size", default="4KiB", doc="bytes of the one DMA load (own HBM -> TCM)"),
    "gemm": List(Int(min=1), min_len=3, max_len=3, default=[32, 64, 32], doc="m, k, n of the one GEMM"),
    "ipcq_bytes": Quantity("size", default="128B", doc="payload of the one IPCQ send to the east neighbour"),
})


def build_handcheck(system, profile: dict, p: dict) -> dict:
    """The machine of ``profile`` with the two scripts; the context is ``{"machine": Machine}``."""
    prm = Params.of(profile)
    if prm.gx < 2:
        raise BuildError(f"energy_handcheck needs an east neighbour for PE 0 (PE grid x >= 2); found {prm.gx}")
    n, (m, k, nn), q = p["dma_bytes"], p["gemm"], p["ipcq_bytes"]
    if n % 2 or q % 2:
        raise BuildError(f"energy_handcheck: dma_bytes and ipcq_bytes must be even (fp16 elements); "
                         f"found {n} and {q}")
    scripts = {
        SENDER: [{"op": "dma", "kind": "load", "addr": None, "rows": 1, "row_bytes": n, "pitch": n, "buf": "x",
                  "shape": [n // 2], "dtype": "<f2", "label": "dma"},
                 {"op": "gemm", "a": "a", "b": "b", "acc": "c", "m": m, "k": k, "n": nn, "label": "gemm"},
                 {"op": "send", "dir": "E", "buf": "p", "label": "send"}],
        RECEIVER: [{"op": "recv", "dir": "W", "buf": "t", "label": "recv"}],
    }
    machine = build_machine(system, profile, scripts=scripts)
    place = Placement(machine, system.mode == "data")
    scripts[SENDER][0]["addr"] = place.put(SENDER, np.zeros((n // 2,), np.float16))
    place.tcm_put(SENDER, "a", np.ones((m, k), np.float16))
    place.tcm_put(SENDER, "b", np.ones((k, nn), np.float16))
    place.tcm_put(SENDER, "p", np.arange(q // 2, dtype=np.float16))
    return {"machine": machine}


def check_handcheck(system, profile: dict, params: dict, result, *, context: dict) -> dict:
    """Each command's issue and completion time, from the PE CPU logs."""
    if result.status != "finished":
        return {}
    logs = context["machine"].host.logs
    rows = []
    for coord in (SENDER, RECEIVER):
        for label, t0, t_issued, t_done in (tuple(r[:4]) for r in logs.get(f"{pe_name(*coord)}/cpu", [])):
            rows.append({"pe": str(list(coord)), "command": label, "issued_ps": t_issued, "done_ps": t_done})
    return {"tables": {"energy hand check: the commands": rows}}

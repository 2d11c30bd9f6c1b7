"""The pccx v002 machine family (actors/registry.py): ``PROFILE_SCHEMA`` and ``WORKLOADS``.

Layout: actors/pccx/profile.py (schema, ``load_profile``, clocks), builder.py (``build_machine``: every
actor and link), report.py (per-opcode latency table), the engines (frontend, memory, gemv, compute,
driver) and the workloads: ``program`` — the hand-written overlap program of actors/pccx/program.py;
``asm`` — a ``.pasm`` text program (actors/pccx/asmprog.py); ``gemma3n`` — Gemma 3N decode
(actors/pccx/gemma3n/).
"""
from __future__ import annotations

from actors.pccx import asmprog as _asm
from actors.pccx.energy import energy_inventory, energy_per, energy_report  # noqa: F401 (the family's energy model, tools/run/energy.py)
from actors.pccx import program as _program
from actors.pccx.gemma3n import workload as _gemma3n
from actors.pccx.profile import PROFILE_SCHEMA
from actors.registry import Workload

__all__ = ["PROFILE_SCHEMA", "WORKLOADS"]

WORKLOADS = {
    "program": Workload("program", "hand-written program using every opcode: MEMCPY in, MEMSET shapes, GEMVs with "
                        "HP-streamed INT4 weights (prefetch overlap), GEMM, CVO softmax, MEMCPY out",
                        _program.PARAMS, _program.build, _program.check),
    "asm": Workload("asm", "run a hand-written .pasm text program (emu pccx disasm text + driver directives)",
                    _asm.PARAMS, _asm.build, _asm.check),
    "gemma3n": Workload("gemma3n", "Gemma 3N decode tokens compiled from a model config (actors/pccx/gemma3n): "
                        "driver token loop, KV ring, weight prefetch; budget report", _gemma3n.PARAMS,
                        _gemma3n.build, _gemma3n.check, progress=_gemma3n.progress),
}

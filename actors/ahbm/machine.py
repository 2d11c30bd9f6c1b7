"""The AHBM machine family: profile schema and workloads (actors/registry.py).

Profiles: scenarios/machines/ahbm-{1,2,4}sip.yaml.  Workloads:

* ``microbench``: engine and interconnect microbenchmarks, measured vs closed form;
* ``idle``: builds the whole machine and runs empty scripts (scale check);
* ``energy_handcheck``: one DMA, one GEMM, one IPCQ send (the energy model's hand check);
* the ``tl`` kernel runtime's workloads (``attention_decode``, ``attention_prefill``,
  actors/ahbm/tl/workloads.py), merged in below.

Every workload builds the whole machine of its profile with actors/ahbm/builder.py;
its host launches command scripts (microbench, idle) or ``tl`` kernels (attention)
on the same PE CPU actor (actors/ahbm/cpu.py).
"""
from __future__ import annotations

from actors.ahbm.energy import energy_caveat, energy_inventory, energy_per  # noqa: F401 (the family's energy model, tools/run/energy.py)
from actors.ahbm.handcheck import HANDCHECK_PARAMS, build_handcheck, check_handcheck
from actors.ahbm.idle import IDLE_PARAMS, build_idle, check_idle
from actors.ahbm.microbench import MICRO_PARAMS, build_microbench, check_microbench
from actors.ahbm.params import PROFILE_SCHEMA, live_change  # noqa: F401 (the family's mid-run changes, emu fork)
from actors.ahbm.tl.workloads import WORKLOADS as TL_WORKLOADS
from actors.registry import Workload

__all__ = ["PROFILE_SCHEMA", "WORKLOADS"]


WORKLOADS = {
    "microbench": Workload("microbench", "DMA / GEMM / MATH / composite / IPCQ / NOC / UCIe times vs closed forms",
                           MICRO_PARAMS, build_microbench, check_microbench),
    "idle": Workload("idle", "build the whole machine and run an empty script on every PE", IDLE_PARAMS, build_idle,
                     check_idle),
    "energy_handcheck": Workload("energy_handcheck", "one DMA load, one GEMM, one IPCQ send: the energy hand check "
                                 "(docs/energy.md)", HANDCHECK_PARAMS, build_handcheck, check_handcheck),
}
WORKLOADS.update(TL_WORKLOADS)

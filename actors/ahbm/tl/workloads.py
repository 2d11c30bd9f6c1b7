"""The ``tl`` runtime's workloads, by name: the baseline attention kernels (baseline_workload.py), the GQA
fused-attention kernel (gqa_workload.py) and the two side by side (gqa_vs_baseline.py); a Chakra execution
graph replayed node by node (chakra_workload.py).

Only this module imports all three, so they import one another one way (baseline <- gqa_vs_baseline).
"""
from __future__ import annotations

from actors.ahbm.tl import baseline_workload, chakra_workload, gqa_requests, gqa_vs_baseline, gqa_workload
from actors.ahbm.tl.kernel_workload import kernel_workload

__all__ = ["WORKLOADS"]

WORKLOADS = {h.name: kernel_workload(h) for h in (baseline_workload.DECODE_HOOKS, baseline_workload.PREFILL_HOOKS,
                                                  gqa_workload.GQA, gqa_vs_baseline.HOOKS)}
WORKLOADS[gqa_requests.WORKLOAD.name] = gqa_requests.WORKLOAD
WORKLOADS[chakra_workload.WORKLOAD.name] = chakra_workload.WORKLOAD

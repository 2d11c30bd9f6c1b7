"""Data-mode results do not depend on the CPU: the BLAS kernel, its thread count, numpy's SIMD paths.

Each variant is a fresh process that runs shipped data-mode scenarios of every family (the runner, as
``emu run`` does) and prints their digests and errors; all variants must print the same.  The OpenBLAS
kernels are the ones issue 26 saw give three digests for one scenario (Haswell, SkylakeX, Prescott);
``NPY_DISABLE_CPU_FEATURES=X86_V3`` takes numpy's AVX2/FMA3 loops away (its float32 exp, tanh, sin, cos
have their own SIMD code per feature level).  emulator/numerics.py says how the arithmetic avoids them;
tests/test_numerics.py checks its order bit for bit.
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT

SCENARIOS = [
    "scenarios/demo/reduce.yaml",                   # demo: float32 log-sum-exp merges
    "scenarios/ahbm/attention_prefill.yaml",        # AHBM: tl.dot on the GEMM engine, MATH exp / rowsum
    "scenarios/ahbm/gqa/prefill_ring.yaml",         # AHBM: composite GEMMs over K tiles, Ring folds
    "scenarios/ahbm/microbench-data.yaml",          # AHBM: engine results against numpy
    "scenarios/pccx/program.yaml",                  # pccx: INT4 GEMV / GEMM, CVO EXP, REDUCE_SUM
    "scenarios/pccx/gemma3n/micro-data.yaml",       # pccx: Gemma 3N host math (RoPE sin/cos, tanh, GELU)
]

VARIANTS = {
    "haswell-1": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"},
    "skylakex-2": {"OPENBLAS_CORETYPE": "SkylakeX", "OPENBLAS_NUM_THREADS": "2"},
    "prescott-1": {"OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "1"},
    "no-avx2-2": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "2", "NPY_DISABLE_CPU_FEATURES": "X86_V3"},
}

_CHILD = """
import json, sys
from actors import registry
from emulator.scenario import load_scenario
from tools.run.runner import run_scenario
out = {}
for path in sys.argv[1:]:
    res, _, _ = run_scenario(load_scenario(path, registry))
    out[path] = {k: res.get(k) for k in ("status", "digest", "end_time_ps", "max_abs_err", "max_rel_err")}
print(json.dumps(out))
"""


def _run(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "NPY_", "OMP_", "MKL_"))}
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", _CHILD, *[str(ROOT / s) for s in SCENARIOS]], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=900)
    # -4: SIGILL, a forced kernel this CPU lacks (SkylakeX without AVX-512) ran: something called BLAS
    assert proc.returncode != -4, f"a BLAS call under {env_extra} (SIGILL): a data-mode result depends on the kernel"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("names", [("prescott-1", "no-avx2-2"),    # another kernel, thread count and SIMD level
                                   pytest.param(tuple(VARIANTS), marks=pytest.mark.slow)], ids=["two", "all"])
def test_data_mode_digests_are_the_same_on_every_blas_kernel_and_simd_level(names):
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(names, pool.map(_run, [VARIANTS[n] for n in names])))
    first_name, first = next(iter(results.items()))
    for path, res in first.items():
        assert res["status"] == "finished", (path, res)
    for name, res in results.items():
        for path in first:
            assert res[path] == first[path], (f"{path}: {name} gives {res[path]}, {first_name} gives {first[path]}")

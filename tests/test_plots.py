"""The bundle's plots: the numbers behind them, and which plots each machine gets."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.run.plots import binned_busy

ROOT = Path(__file__).resolve().parents[1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3_000)), min_size=0, max_size=40),
       st.integers(1, 12))
def test_binned_busy_is_the_overlap_of_each_span_with_each_bin(spans, bins):
    t0 = np.array([a for a, _ in spans], dtype=np.int64)
    t1 = np.array([a + d for a, d in spans], dtype=np.int64)
    edges = np.linspace(0, 13_000, bins + 1)
    got = binned_busy(t0, t1, edges)
    want = np.array([sum(max(0.0, min(b, e1) - max(a, e0)) for a, b in zip(t0, t1))
                     for e0, e1 in zip(edges[:-1], edges[1:])])
    assert np.allclose(got, want, atol=1e-6)


def _png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:4] == b"\x89PNG"


def _run_with_plots(emu, out, scenario, *, trace):
    emu("run", ROOT / "scenarios" / scenario, "--quiet", "--plots", "--out", out,
        "--set", f"trace.enabled={str(trace).lower()}", check=0)
    return out


def test_ahbm_bundle_plots_by_kind_per_pe_and_per_cube(tmp_path, emu):
    out = _run_with_plots(emu, tmp_path / "prefill", "ahbm/attention_prefill.yaml", trace=True)
    for name in ("utilisation.png", "links.png", "ahbm_pes.png", "ahbm_cubes.png"):
        assert _png(out / name), name
    assert not (out / "pccx_units.png").exists()


def test_pccx_bundle_plots_its_units_and_fifos(tmp_path, emu):
    out = _run_with_plots(emu, tmp_path / "softmax", "pccx/softmax-asm.yaml", trace=True)
    for name in ("utilisation.png", "links.png", "pccx_units.png"):
        assert _png(out / name), name
    assert not (out / "ahbm_pes.png").exists()


def test_plots_without_a_trace_come_from_the_counters(tmp_path, emu):
    out = _run_with_plots(emu, tmp_path / "notrace", "ahbm/attention_prefill.yaml", trace=False)
    for name in ("utilisation.png", "links.png", "ahbm_pes.png"):
        assert _png(out / name), name
    assert not (out / "ahbm_cubes.png").exists()      # a timeline needs the trace

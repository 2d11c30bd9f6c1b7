"""Declared parameter uncertainty (emulator/uncertainty.py) and ``emu interval`` (tools/explain/interval.py)."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from actors import registry
from emulator.scenario import load_scenario
from emulator.schema import SchemaError
from tools.explain.interval import latin_hypercube, run_interval, sample_values, spearman

DECODE = "scenarios/ahbm/gqa/decode.yaml"
WORKLOAD = "workload: {kind: gqa_attention, params: {case: decode, C: 1, P: 1, heads: 2, G: 4, d: 64, " \
           "context: 512, tile: 64, gemm: composite}}"


def _scenario(tmp_path, uncertainty: str, extra: str = "", overrides: str = "{}"):
    """A scenario on a profile extending ahbm-1sip whose ``uncertainty:`` map is ``uncertainty``."""
    (tmp_path / "mach.yaml").write_text("extends: ahbm-1sip\nuncertainty:\n" + textwrap.indent(
        textwrap.dedent(uncertainty), "  "))
    sc = tmp_path / "sc.yaml"
    sc.write_text(f"name: t\nmode: timing\nmachine: {{profile: mach.yaml, overrides: {overrides}}}\n{WORKLOAD}\n"
                  + extra)
    return str(sc)


def _problems(path) -> str:
    with pytest.raises(SchemaError) as e:
        load_scenario(path, registry)
    return str(e.value)


def test_shipped_profiles_declare_the_assumptions():
    sc = load_scenario(DECODE, registry)
    for key in ("hbm.efficiency", "cpu.dispatch_cycles.math", "energy.static.hbm_pc", "energy.noc.router",
                "energy.gemm.mac"):
        d = sc.uncertainty[key]
        assert d.low < d.value <= d.high or d.low <= d.value < d.high
        assert d.reason and "ahbm.yaml" in d.where
    assert sc.uncertainty["energy.static.hbm_pc"].low == 10_000      # 20mW x (1 - 50%), in uW
    pccx = load_scenario("scenarios/pccx/gemma3n/tiny-timing.yaml", registry)
    for key in ("axil.latency", "ddr.latency", "host.element_time", "host.call_overhead", "driver.poll_interval"):
        assert key in pccx.uncertainty and "ASSUMPTION" in pccx.uncertainty[key].reason


@pytest.mark.parametrize("entry, expected", [
    ("hbm.access_latency: {range: [40ns, 20ns], reason: x}", "low < high"),
    ("hbm.access_latency: {range: [20, 40], reason: x}", "the unit is missing"),
    ("hbm.access_latency: {range: [40ns, 60ns], reason: x}", "a range containing the parameter's value 30ns"),
    ("hbm.acces_latency: {range: [20ns, 40ns], reason: x}", "did you mean 'hbm.access_latency'?"),
    ("hbm.access_latency: {range: [20ns, 40ns]}", "expected a reason"),
    ("hbm.access_latency: {spread: 120%, reason: x}", "a relative spread like '25%'"),
    ("hbm.access_latency: {range: [20ns, 40ns], spread: 10%, reason: x}", "exactly one of"),
    ("hbm: {range: [1, 2], reason: x}", "a numeric parameter"),
])
def test_bad_declarations_name_file_and_line(tmp_path, entry, expected):
    text = _problems(_scenario(tmp_path, entry))
    assert f"{tmp_path / 'mach.yaml'}:3: uncertainty.{entry.split(':')[0]}" in text, text
    assert expected in text, text


def test_inherited_through_extends_and_dropped_by_null(tmp_path):
    sc = load_scenario(_scenario(tmp_path, """\
        hbm.efficiency: {range: [0.75, 0.85], reason: narrower here}
        energy.static.cpu: null
        """), registry)
    assert (sc.uncertainty["hbm.efficiency"].low, sc.uncertainty["hbm.efficiency"].high) == (0.75, 0.85)
    assert sc.uncertainty["hbm.efficiency"].where.endswith("mach.yaml:3")
    assert "energy.static.cpu" not in sc.uncertainty
    assert sc.uncertainty["cpu.dispatch_cycles.gemm"].where.split(":")[0].endswith("ahbm.yaml")
    # an entry is replaced whole: a spread here is not merged with the inherited range
    sc = load_scenario(_scenario(tmp_path, "hbm.efficiency: {spread: 5%, reason: r}\n"), registry)
    assert (sc.uncertainty["hbm.efficiency"].low, sc.uncertainty["hbm.efficiency"].high) == \
        pytest.approx((0.76, 0.84))


def test_pinning(tmp_path):
    path = _scenario(tmp_path, "hbm.efficiency: {range: [0.75, 0.85], reason: r}\n",
                     extra="interval: {pin: [math.fixed_cycles]}\n", overrides="{hbm: {efficiency: 0.95}}")
    sc = load_scenario(path, registry)     # 0.95 is outside the range: an override pins it, no range check
    assert sc.uncertainty["hbm.efficiency"].pinned and sc.uncertainty["math.fixed_cycles"].pinned
    assert not sc.uncertainty["dma.setup_cycles"].pinned
    sc = load_scenario(DECODE, registry, ["machine.overrides.cpu.dispatch_cycles.gemm=9"])
    assert sc.uncertainty["cpu.dispatch_cycles.gemm"].pinned and not sc.uncertainty["cpu.dispatch_cycles.dma"].pinned
    bad = _scenario(tmp_path, "hbm.efficiency: {range: [0.75, 0.85], reason: r}\n",
                    extra="interval: {pin: [hbm.eficiency]}\n")
    text = _problems(bad)
    assert f"{bad}:5: interval.pin[0]" in text and "did you mean 'hbm.efficiency'?" in text, text


def test_latin_hypercube_stratifies_and_is_seeded():
    u = latin_hypercube(10, 3, seed=7)
    for j in range(3):
        assert sorted(np.floor(u[:, j] * 10).astype(int)) == list(range(10))    # one draw per stratum
    assert np.array_equal(u, latin_hypercube(10, 3, seed=7))
    assert not np.array_equal(u, latin_hypercube(10, 3, seed=8))


def test_samples_stay_in_range_and_round_integers():
    declared = list(load_scenario(DECODE, registry).uncertainty.values())
    for values in sample_values(declared, 8, seed=1):
        for d in declared:
            v = values[d.key]
            assert d.low <= v <= d.high
            assert isinstance(v, int) == d.integer


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 400]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)     # ties averaged
    assert spearman([1, 2, 3], [5, 5, 5]) is None


#: every declared key of ahbm but these two is pinned: the sampled values must move their metrics
FREE = ("math.fixed_cycles", "energy.static.hbm_pc")


def _pinned_all_but_free():
    keys = [k for k in load_scenario(DECODE, registry).uncertainty if k not in FREE]
    return [f"interval.pin=[{', '.join(keys)}]"]


def test_sampled_values_move_the_metrics():
    w = run_interval(DECODE, ["mode=timing", *_pinned_all_but_free()], samples=6, seed=3, jobs=2)
    assert w["finished"] == 6 and [p["key"] for p in w["parameters"]] == list(FREE)
    rho = {r["key"]: r["rho"] for r in w["drivers"]}
    assert rho["math.fixed_cycles"]["end time"] > 0.8           # longer per-op pipeline: later end
    assert rho["energy.static.hbm_pc"]["energy"] > 0.8          # more static power: more joules
    shares = {r["key"]: r["share"]["end time"] for r in w["drivers"]}
    assert shares["math.fixed_cycles"] > shares["energy.static.hbm_pc"]   # a power cannot drive the end time
    m = w["metrics"]["end time"]
    assert m["p5"] <= m["p50"] <= m["p95"] and m["p95"] > m["p5"]
    assert m["inside"] == (m["p5"] <= m["default"] <= m["p95"])


@pytest.mark.slow     # the backends' equality is checked in the fast tier on a sweep (tests/test_sweep_ray.py)
def test_same_seed_same_interval_on_pool_and_ray():
    ray = pytest.importorskip("ray")
    sets = ["mode=timing", *_pinned_all_but_free()]
    pool = run_interval(DECODE, sets, samples=4, seed=11, backend="pool", jobs=2)
    try:   # a local instance of our own, never another agent's running cluster
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"Ray cannot start here: {type(e).__name__}: {e}")
    try:
        on_ray = run_interval(DECODE, sets, samples=4, seed=11, backend="ray", jobs=2)
    finally:
        ray.shutdown()
    assert pool["draws"] == on_ray["draws"]
    assert pool["metrics"] == on_ray["metrics"] and pool["drivers"] == on_ray["drivers"]


def test_cli_interval_and_explain(emu, tmp_path):
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = emu("interval", root / DECODE, "--samples", "3", "-j", "2", "--set", "mode=timing", check=0).stdout
    assert "3 of 3 samples finished" in out and "p95" in out and "drivers, top" in out
    bad = _scenario(tmp_path, "hbm.access_latency: {range: [40ns, 20ns], reason: x}")
    proc = emu("interval", bad)
    assert proc.returncode != 0 and f"{tmp_path / 'mach.yaml'}:3: uncertainty.hbm.access_latency.range" in \
        proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    out = emu("explain", root / "scenarios/pccx/gemma3n/tiny-timing.yaml", check=0).stdout
    assert "declared uncertainty" in out and "ddr.latency: 100ns in [60ns, 200ns]" in out

"""``emu bench``: the SimPy peer and the emulator agree on every bench workload; the machine report's kinds."""
import pytest

from tools.bench import command as bench


def test_engine_bench_runs_both_engines_to_the_same_end_and_reports_ratios():
    """run_bench raises if the two models disagree on end time, messages or the reduce's output."""
    pytest.importorskip("simpy")
    out = bench.run_bench(repeats=2, scale=0.02)
    rows = {r["name"]: r for r in out["workloads"]}
    assert set(rows) == {"ring-sparse", "ring-dense", "reduce"}
    for r in rows.values():
        assert r["messages"] > 0 and r["end_time_ps"] > 0
        assert r["ratio_min"] <= r["ratio"] <= r["ratio_max"] and r["cpu_ratio"] > 0
    assert out["loop_ns"] > 0 and out["repeats"] == 2


def test_a_disagreeing_peer_is_an_error(monkeypatch):
    pytest.importorskip("simpy")
    real = bench._simpy

    def off_by_one(kind, params, mode, seed=1):
        out = real(kind, params, mode, seed)
        return {**out, "end_time_ps": out["end_time_ps"] + 1}

    monkeypatch.setattr(bench, "_simpy", off_by_one)
    with pytest.raises(RuntimeError, match="disagree"):
        bench.run_bench(repeats=1, scale=0.02)


@pytest.mark.parametrize("name,kind", [("sip0/cube03/pe5/math", "math"), ("sip0/cube03/pe5/hbm/pc2", "hbm"),
                                       ("sip0/cube03/pe5/hbm/stack", "hbm"), ("sip0/cube03/pe5/hbm/port", "hbmport"),
                                       ("sip1/cube00/router", "router"),
                                       ("io/host", "host")])
def test_component_kind_of_an_actor_name(name, kind):
    assert bench._kind(name) == kind

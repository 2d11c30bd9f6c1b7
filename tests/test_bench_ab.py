"""tools.bench.ab: two trees measured side by side; the ratio only when both model the same timing."""
import json

import pytest

from tools.bench import ab as bench_ab


def _run(end, cpu, digest="d", messages=10):
    return {"status": "finished", "end_time_ps": end, "messages": messages, "digest": digest,
            "build_cpu_s": 0.5, "run_cpu_s": cpu}


def test_summary_is_medians_and_head_over_base():
    counted = {"base": [_run(7, 10.0), _run(7, 14.0), _run(7, 12.0)],
               "head": [_run(7, 5.0, "e", 4), _run(7, 6.0, "e", 4), _run(7, 30.0, "e", 4)]}
    out = bench_ab.summarise(counted, base_cpu=100.0)
    assert out["sides"]["base"]["run_cpu_s"] == 12.0 and out["sides"]["head"]["run_cpu_s"] == 6.0
    assert out["sides"]["head"]["run_cpu_s_max"] == 30.0 and out["sides"]["head"]["messages"] == 4
    assert out["run_ratio"] == 0.5
    assert out["total_ratio"] == round(6.5 / 12.5, 3)
    assert out["head_cpu_s_implied"] == round(6.5 / 12.5, 3) * 100.0


def test_trees_that_model_different_timings_give_no_ratio():
    with pytest.raises(bench_ab.AbError, match="different timings"):
        bench_ab.summarise({"base": [_run(7, 1.0)], "head": [_run(8, 1.0)]})
    with pytest.raises(bench_ab.AbError, match="different end times"):
        bench_ab.summarise({"base": [_run(7, 1.0), _run(9, 1.0)], "head": [_run(7, 1.0)]})


def test_this_tree_against_itself_side_by_side(capsys):
    """Real child processes: both lanes count their runs, the same digest on both sides."""
    root = str(bench_ab.ROOT)
    rc = bench_ab.main(["--base", root, "--scenario", "scenarios/demo/reduce.yaml", "--runs", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    base, head = out["sides"]["base"], out["sides"]["head"]
    assert base["runs"] >= 2 and head["runs"] >= 2     # the quicker side may count more (same stretch of time)
    assert base["digest"] == head["digest"] and base["messages"] == head["messages"] > 0
    assert out["end_time_ps"] > 0 and out["run_ratio"] > 0


def test_a_failing_run_and_a_bad_revision_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmachine: {profile: no-such-profile}\n")
    assert bench_ab.main(["--base", str(bench_ab.ROOT), "--scenario", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "the run of" in err and "failed (exit" in err
    assert bench_ab.main(["--base", "no-such-revision-xyz", "--scenario", "scenarios/demo/reduce.yaml"]) == 1
    assert "not a revision git can check out" in capsys.readouterr().err


def test_an_interrupt_is_a_one_line_message(monkeypatch, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench_ab, "measure", interrupted)
    try:
        rc = bench_ab.main(["--base", str(bench_ab.ROOT), "--scenario", "scenarios/demo/reduce.yaml"])
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped main() as a traceback")
    assert rc == 130
    assert "interrupted" in capsys.readouterr().err

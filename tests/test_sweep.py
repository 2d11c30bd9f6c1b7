"""``emu sweep``: spec errors, the minimal form, resume after a kill, failed points, determinism."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.cli import main
from tools.sweep.results import HOST_COLUMNS
from tools.sweep.spec import load_sweep, looks_like_sweep

ROOT = Path(__file__).resolve().parents[1]


def read_rows(directory: Path) -> list[dict]:
    with open(directory / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def deterministic(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in HOST_COLUMNS} for r in rows]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- spec errors -----------------------------------------------------------------

def test_spec_errors_name_file_line_key_path_and_closest_key(tmp_path, capsys):
    bad = write(tmp_path / "bad.yaml", "base: scenarios/demo/reduce.yaml\n"
                                       "vary:\n"
                                       "  seed: [1, 2]\n"
                                       "  workload.params.rouns: [1, 2]\n"
                                       "  workload.params.merge: [8ns, 3]\n")
    assert main(["sweep", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:4: vary.workload.params.rouns: expected a known key" in err
    assert "did you mean 'rounds'?" in err
    assert f"{bad}:5: vary.workload.params.merge[1]: expected a time like '30ns', found integer 3" in err
    assert err.count("vary.workload.params.rouns") == 1     # reported once, not once per point
    assert not (tmp_path / "out").exists()  # nothing ran
    assert main(["validate", str(bad)]) == 2


def test_spec_errors_in_the_sweep_keys_themselves(tmp_path, capsys):
    bad = write(tmp_path / "bad.yaml", "base: scenarios/demo/reduce.yaml\n"
                                       "vari: {seed: [1]}\n")
    assert main(["validate", str(bad)]) == 2
    assert f"{bad}:2: vari: expected a known key, found string 'vari' (did you mean 'vary'?)" in capsys.readouterr().err

    bad = write(tmp_path / "bad2.yaml", "base: scenarios/demo/reduce.yaml\n"
                                        "zip:\n"
                                        "  - {seed: [1, 2], workload.params.rounds: [1]}\n"
                                        "set: {seed: 3}\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: zip[0]: expected lists of equal length in a zip group, found seed: 2, workload.params.rounds: 1" in err

    bad = write(tmp_path / "bad3.yaml", "base: scenarios/demo/nope.yaml\nvary: {seed: [1]}\n")
    assert main(["validate", str(bad)]) == 2
    assert f"{bad}:1: base: expected an existing scenario file" in capsys.readouterr().err

    bad = write(tmp_path / "bad4.yaml", "base: scenarios/demo/reduce.yaml\n"
                                        "set: {seed: 3}\n"
                                        "vary: {seed: [1, 2]}\n")
    assert main(["validate", str(bad)]) == 2
    assert f"{bad}:3: vary.seed: expected each key varied or set once, found 'seed' again (also at set.seed)" \
        in capsys.readouterr().err

    bad = write(tmp_path / "bad5.yaml", "base: scenarios/demo/reduce.yaml\n"
                                        "vary: {seed: [1, 2], workload.params.rounds: [1]}\n"
                                        "best:\n"
                                        "  minimize: end_time_ps\n"
                                        "  over: [workload.params.round]\n")
    assert main(["validate", str(bad)]) == 2
    assert (f"{bad}:5: best.over[0]: expected a varied key (seed, workload.params.rounds), found "
            "'workload.params.round' (did you mean 'workload.params.rounds'?)") in capsys.readouterr().err


def test_expansion_ranges_zip_seeds_product(tmp_path):
    spec = load_sweep(str(write(tmp_path / "s.yaml", "base: scenarios/demo/reduce.yaml\n"
                                                     "set: {mode: timing}\n"
                                                     "vary:\n"
                                                     "  workload.params.G: {start: 1, stop: 8, times: 2}\n"
                                                     "zip:\n"
                                                     "  - {workload.params.rounds: [1, 2], workload.params.merge: [8ns, 16ns]}\n"
                                                     "seeds: [5, 6]\n")), None)
    assert spec.keys == ["workload.params.G", "workload.params.rounds", "workload.params.merge", "seed"]
    assert len(spec.points) == 4 * 2 * 2
    assert [p.values["workload.params.G"] for p in spec.points[::4]] == [1, 2, 4, 8]
    first = spec.points[0].resolved
    assert first["mode"] == "timing" and first["seed"] == 5
    assert first["workload"]["params"]["merge"] == 8000       # parsed like a scenario: 8 ns in ps
    assert {p.values["workload.params.merge"] for p in spec.points if p.values["workload.params.rounds"] == 2} == {"16ns"}
    assert len({p.key for p in spec.points}) == len(spec.points)


def test_validate_accepts_a_sweep_file(capsys):
    assert main(["validate", str(ROOT / "scenarios/sweeps/reduce-grid.yaml")]) == 0
    assert "4 point(s), varying seed, workload.params.rounds" in capsys.readouterr().out


# -- running -----------------------------------------------------------------------

def test_minimal_form_runs_verbatim_and_rerun_does_nothing(tmp_path, capsys):
    spec = write(tmp_path / "spec.yaml", "base: scenarios/demo/reduce.yaml\n"
                                         "vary: {seed: [1, 2], workload.params.rounds: [1, 2]}\n")
    out = tmp_path / "DIR"
    assert main(["sweep", str(spec), "--out", str(out), "-j", "2"]) == 0
    table = capsys.readouterr().out
    assert "4 finished" in table
    rows = read_rows(out)
    assert [(r["seed"], r["workload.params.rounds"], r["status"]) for r in rows] == \
        [("1", "1", "finished"), ("1", "2", "finished"), ("2", "1", "finished"), ("2", "2", "finished")]
    assert {"end_time_ps", "events", "max_abs_err", "digest", "wall_s", "events_per_s", "peak_rss_mib"} <= set(rows[0])
    assert len((out / "results.jsonl").read_text().splitlines()) == 4
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == sorted(
        f"{m}_vs_{k}.png" for m in ("end_time_ps", "events", "max_abs_err", "max_rel_err")
        for k in ("seed", "rounds"))
    # a point is the same run as `emu run` of its scenario: same digest
    assert main(["run", "scenarios/demo/reduce.yaml", "--set", "seed=2", "--set", "workload.params.rounds=1",
                 "--no-bundle", "--json", "--compact"]) == 0
    assert json.loads(capsys.readouterr().out)["digest"] == rows[2]["digest"]
    # and its bundle's scenario.yaml is that scenario, runnable by itself (docs/outputs.md): the same digest again
    assert main(["run", str(out / rows[2]["bundle"] / "scenario.yaml"), "--no-bundle", "--json", "--compact"]) == 0
    assert json.loads(capsys.readouterr().out)["digest"] == rows[2]["digest"]
    # a finished sweep run again runs nothing
    marks = {p: p.stat().st_mtime_ns for p in out.glob("points/*/point.json")}
    assert len(marks) == 4
    assert main(["sweep", str(spec), "--out", str(out), "--no-plots"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("points/*/point.json")} == marks
    assert deterministic(read_rows(out)) == deterministic(rows)
    # --only: a slice of the same points (same keys: nothing runs again)
    assert main(["sweep", str(spec), "--out", str(out), "--no-plots", "--only", "seed=2"]) == 0
    assert deterministic(read_rows(out)) == deterministic(rows)[2:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("points/*/point.json")} == marks
    assert main(["sweep", str(spec), "--out", str(out), "--only", "sed=2"]) == 2
    assert "did you mean 'seed'?" in capsys.readouterr().err


def test_a_deadlocking_point_is_recorded_and_the_others_finish(tmp_path, capsys):
    out = tmp_path / "ring"
    assert main(["sweep", str(ROOT / "scenarios/sweeps/ring-with-deadlock.yaml"), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    rows = read_rows(out)
    status = {(r["machine.overrides.pe_link.capacity"], r["workload.params.tokens"]): r["status"] for r in rows}
    assert status == {("1", "2"): "finished", ("1", "8"): "deadlock", ("2", "2"): "finished",
                      ("2", "8"): "finished", ("3", "2"): "finished", ("3", "8"): "finished"}
    assert "deadlock" in table and "5 finished, 1 deadlock" in table
    jl = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert jl[1]["status"] == "deadlock" and "ring/n0 (send)" in jl[1]["error"]
    # best capacity per token count: the deadlocked point ended earliest but must not win
    with open(out / "best.csv", newline="") as f:
        best = {r["workload.params.tokens"]: r["machine.overrides.pe_link.capacity"] for r in csv.DictReader(f)}
    assert best == {"2": "1", "8": "2"}
    assert "best machine.overrides.pe_link.capacity by end_time_ps" in table


def test_a_point_whose_worker_dies_fails_alone(tmp_path, monkeypatch):
    """A point whose workload raises, whose worker process dies, or that overruns fails alone."""
    from tools.sweep import backends as sweep_backends

    class Events:
        records = {}

        @staticmethod
        def running(n):
            pass

        @staticmethod
        def done(task, record):
            Events.records[task["index"]] = record["result"]

    spec = load_sweep(str(ROOT / "scenarios/sweeps/reduce-grid.yaml"), None)
    tasks = [{"index": p.index, "key": p.key, "dir": str(tmp_path / p.key), "resolved": p.resolved, "sets": p.sets,
              "timeout_ps": None, "plots": False, "kill_after_s": None} for p in spec.points]
    tasks[1]["resolved"] = {**tasks[1]["resolved"], "workload": {"kind": "no-such-workload", "params": {}}}
    # a point that runs for minutes, killed half a second after it started (a point that
    # finishes before the backend looks is finished, not killed: this one cannot)
    long = tasks[2]["resolved"]["workload"]
    tasks[2]["resolved"] = {**tasks[2]["resolved"], "workload": {**long, "params": {**long["params"], "rounds": 10**6}}}
    tasks[2]["kill_after_s"] = 0.5
    tasks[3]["dir"] = "/proc/emu-sweep-test/point"   # the worker cannot make its directory: it dies
    sweep_backends.PoolBackend(2).run(tasks, Events)
    assert Events.records[0]["status"] == "finished"
    assert Events.records[1]["status"] == "error" and "no-such-workload" in Events.records[1]["error"]
    assert Events.records[2]["status"] == "wall-timeout"
    assert Events.records[3]["status"] == "error" and "worker process died" in Events.records[3]["error"]


def test_a_killed_sweep_resumes_and_skips_finished_points(tmp_path):
    spec = write(tmp_path / "spec.yaml", "base: scenarios/demo/reduce.yaml\n"
                                         "vary: {seed: [1, 2, 3], workload.params.rounds: [3, 4]}\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tools.cli", "sweep", str(spec), "--out", str(out), "-j", "1", "--no-plots", "-q"]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(out.glob("points/*/point.json")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)           # the sweep, its forkserver and its running point
    proc.wait()
    before = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("points/*/point.json")}
    assert 1 <= len(before) < 6, f"the kill should land mid-sweep, {len(before)} of 6 points were done"
    assert not (out / "results.csv").exists()

    assert main(["sweep", str(spec), "--out", str(out), "--no-plots", "-q"]) == 0
    after = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("points/*/point.json")}
    assert len(after) == 6
    assert all(after[k] == t for k, t in before.items())      # finished points were not run again
    rows = read_rows(out)
    assert [r["status"] for r in rows] == ["finished"] * 6

    clean = tmp_path / "clean"
    assert main(["sweep", str(spec), "--out", str(clean), "--no-plots", "-q"]) == 0
    assert deterministic(read_rows(clean)) == deterministic(rows)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scenarios").rglob("*.yaml")
                                        if looks_like_sweep(str(p))))
def test_every_shipped_sweep_file_validates(path):
    spec = load_sweep(str(ROOT / path), None)
    assert spec.points


def test_the_table_and_plots_show_what_varies_with_units(tmp_path, capsys):
    """A decode sweep: the Ring and prefill metrics are 0 on every point -- no column, no plot, one line
    naming them; times carry units, counts separators, keys and axes their short names."""
    spec = write(tmp_path / "dec.yaml", "base: scenarios/ahbm/gqa/decode.yaml\nvary: {workload.params.C: [1, 2]}\n"
                                        "set: {mode: timing}\n")
    out = tmp_path / "D"
    assert main(["sweep", str(spec), "--out", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    header = text.splitlines()[1].split()
    assert header[:3] == ["point", "C", "status"] and "latency" in header and "end_time" in header
    assert "ring_steps" not in header and "tiles_skipped" not in header and "events_per_s" not in header
    assert "constant over the points:" in text and "ring_steps=0" in text
    assert "4.284us" in text and "9,827" in text
    plots = {p.name for p in (out / "plots").glob("*.png")}
    assert "latency_ps_vs_C.png" in plots and not any("ring_steps" in p or "workload.params" in p for p in plots)
    rows = read_rows(out)                                  # the CSV keeps every column, raw
    assert rows[0]["ring_steps"] == "0" and rows[0]["latency_ps"].isdigit()


# -- confirm: the winners run once more (issue 22: best C / TILE on 1 SIP, confirmed on 4) -----------------

def test_confirm_reruns_each_winner_with_its_keys_set(tmp_path, capsys):
    spec = write(tmp_path / "spec.yaml", "base: scenarios/demo/reduce.yaml\n"
                                         "vary: {seed: [1, 2], workload.params.rounds: [1, 2]}\n"
                                         "best: {minimize: end_time_ps, over: [workload.params.rounds]}\n"
                                         "confirm: {set: {workload.params.rounds: 3}}\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o")]) == 2     # may not override a choice
    err = capsys.readouterr().err
    assert f"{spec}:4: confirm.set.workload.params.rounds: expected a key best does not choose over" in err

    spec.write_text(spec.read_text().replace("rounds: 3", "merge: 16ns"))
    out = tmp_path / "DIR"
    assert main(["sweep", str(spec), "--out", str(out), "--no-plots"]) == 0
    table = capsys.readouterr().out
    assert "best points confirmed with workload.params.merge=\"16ns\"" in table
    with open(out / "best.csv", newline="") as f:
        best = list(csv.DictReader(f))
    with open(out / "confirm.csv", newline="") as f:
        conf = list(csv.DictReader(f))
    assert [b["seed"] for b in best] == [c["seed"] for c in conf] == ["1", "2"]
    for b, c in zip(best, conf):
        # the confirmation is `emu run` of the winner with the key set
        assert main(["run", "scenarios/demo/reduce.yaml", "--set", f"seed={b['seed']}", "--set",
                     f"workload.params.rounds={b['workload.params.rounds']}", "--set", "workload.params.merge=16ns",
                     "--no-bundle", "--json", "--compact"]) == 0
        want = json.loads(capsys.readouterr().out)["end_time_ps"]
        assert c["confirm.status"] == "finished" and int(c["confirm.end_time_ps"]) == want
        assert float(c["confirm.end_time_ps_ratio"]) == round(want / int(b["end_time_ps"]), 4)
        assert want != int(b["end_time_ps"])     # the set key changed the run
    # resumable like the grid: a second run runs nothing
    marks = {p: p.stat().st_mtime_ns for p in out.glob("points/*/point.json")}
    assert len(marks) == 4 + 2
    assert main(["sweep", str(spec), "--out", str(out), "--no-plots", "-q"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("points/*/point.json")} == marks


def test_confirm_needs_best_and_known_keys(tmp_path, capsys):
    spec = write(tmp_path / "spec.yaml", "base: scenarios/demo/reduce.yaml\n"
                                         "vary: {seed: [1, 2]}\n"
                                         "confirm: {set: {workload.params.merge: 16ns}}\n")
    assert main(["validate", str(spec)]) == 2
    assert f"{spec}:3: confirm: expected a best: section" in capsys.readouterr().err
    spec.write_text("base: scenarios/demo/reduce.yaml\n"
                    "vary: {seed: [1, 2]}\n"
                    "best: {minimize: end_time_ps, over: [seed]}\n"
                    "confirm: {set: {workload.params.merj: 16ns}}\n")
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:4: confirm.set.workload.params.merj" in err and "did you mean 'merge'?" in err, err

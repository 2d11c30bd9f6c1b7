"""A newcomer's first hour (issue 26): errors in one round, build errors with their line, ``--set``
blamed for what it set, shipped scenario paths from any directory, movable bundles.

``emu`` runs in-process (``tools.cli.main``) or as the real command where the working directory matters.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"


def emu(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_every_layer_is_checked_in_one_round(tmp_path, capsys):
    """A typo in the scenario, a unit missing in a profile override, one missing in a workload parameter: one
    run of ``emu validate`` names all three (it took three rounds: schema, then profile, then parameters)."""
    f = tmp_path / "three.yaml"
    f.write_text("name: three\nsede: 1\nmachine:\n  profile: demo\n  overrides: {pe_link: {latency: 10}}\n"
                 "workload:\n  kind: reduce\n  params: {rounds: 2, period: 5}\n")
    rc, _, err = emu(capsys, "validate", f)
    assert rc == 2
    assert "3 problems" in err, err
    assert "three.yaml:2: sede: expected a known key" in err
    assert "three.yaml:5: pe_link.latency: expected a time" in err
    assert "three.yaml:8: workload.params.period: expected a time" in err


def test_a_bad_workload_kind_still_checks_the_rest(tmp_path, capsys):
    f = tmp_path / "k.yaml"
    f.write_text("machine: {profile: demo, overrides: {pe_link: {latency: 10}}}\nworkload: {kind: reduse}\n")
    rc, _, err = emu(capsys, "validate", f)
    assert rc == 2 and "2 problems" in err and "did you mean 'reduce'" in err and "pe_link.latency" in err, err


def test_a_build_error_names_the_file_and_line(tmp_path, capsys):
    f = tmp_path / "c3.yaml"
    f.write_text("name: c3\nmachine: {profile: ahbm-1sip}\nworkload:\n  kind: gqa_attention\n  params:\n    C: 3\n")
    rc, _, err = emu(capsys, "run", f, "--no-bundle")
    assert rc == 2
    assert f"error: {f}:6: workload.params.C: C must be one of" in err, err
    rc, _, err = emu(capsys, "run", f, "--no-bundle", "--set", "workload.params.C=5")
    assert rc == 2 and "error: --set workload.params.C=5: workload.params.C:" in err, err


def test_a_fault_given_by_set_is_blamed_on_the_set(capsys):
    item = 'faults=[{kind: dely, link: "x*"}]'
    rc, _, err = emu(capsys, "run", ROOT / "scenarios" / "faults" / "delay.yaml", "--no-bundle", "--set", item)
    assert rc == 2
    assert f"--set {item}: faults[0].kind: expected one of" in err, err
    assert "delay.yaml:" not in err, err


def test_shipped_scenario_paths_work_from_any_directory(emu, tmp_path):
    """``emu run scenarios/demo/reduce.yaml`` outside the repository, as the README shows it (emu_sim did)."""
    p = emu("run", "scenarios/demo/reduce.yaml", "--no-bundle", "--json", check=0, cwd=tmp_path)
    assert json.loads(p.stdout)["status"] == "finished"
    assert "using the emulator's own" in p.stderr and str(REDUCE) in p.stderr
    (tmp_path / "scenarios" / "demo").mkdir(parents=True)
    (tmp_path / "scenarios" / "demo" / "reduce.yaml").write_text("nonsense: 1\n")   # a file here wins
    p = emu("run", "scenarios/demo/reduce.yaml", "--no-bundle", check=2, cwd=tmp_path)
    assert "nonsense" in p.stderr


def test_a_bundle_copied_elsewhere_runs_the_same(emu, tmp_path):
    """A bundle names its own copies of the profile (extends: merged) and of the workload's input files."""
    for scen, extra in (("scenarios/pccx/softmax-asm.yaml", []),
                        ("scenarios/ahbm/gqa/decode.yaml", ["--set", "machine.overrides.clock.pe=900MHz"])):
        first = tmp_path / "deep" / "er" / "b"
        p = emu("run", ROOT / scen, "--out", first, "--json", *extra, check=0)
        digest = json.loads(p.stdout)["digest"]
        moved = tmp_path / "moved"
        shutil.copytree(first, moved)
        shutil.rmtree(tmp_path / "deep")
        again = emu("run", moved / "scenario.yaml", "--no-bundle", "--json", check=0, cwd=moved)
        assert json.loads(again.stdout)["digest"] == digest, scen
        assert "profile.yaml" in (moved / "scenario.yaml").read_text()
        assert "extends" not in (moved / "profile.yaml").read_text().split("\n", 2)[2]
        shutil.rmtree(moved)


def test_an_unfinished_gqa_run_says_what_it_has_at_least(capsys):
    """Stopped at a virtual-time limit: the latency it has at least, the share of the MACs done, the bound."""
    scen = ROOT / "scenarios" / "ahbm" / "gqa" / "prefill_ring.yaml"
    rc, out, _ = emu(capsys, "run", scen, "--no-bundle", "--json", "--set", "stop.max_time=3us")
    res = json.loads(out)
    assert rc == 4 and res["status"] == "time-limit"
    assert res["latency_ps"] is None and 0 < res["latency_at_least_ps"] <= 3_000_000
    assert 0 < res["progress"] < 1 and res["bound_ps"] > 0
    assert res["ratio_to_bound_at_least"] == round(res["latency_at_least_ps"] / res["bound_ps"], 4)
    (row,) = res["tables"]["gqa attention"]
    assert row["latency"].startswith(">= ") and "unfinished" in row["latency"] and "% of MACs" in row["done"]
    rc, out, _ = emu(capsys, "run", scen, "--no-bundle")
    assert rc == 0 and "unfinished" not in out and "% of MACs" not in out


def _sweep_spec(tmp_path) -> Path:
    spec = tmp_path / "slow.yaml"
    spec.write_text(f"name: slow\nbase: {ROOT / 'scenarios/demo/ring.yaml'}\n"
                    "vary: {seed: [1, 2, 3, 4, 5, 6]}\nset: {workload.params.hops: 2000000}\n")
    return spec


def _signal_a_sweep(tmp_path, sig, preexec=None):
    import signal as _signal
    import subprocess
    import sys
    import time

    out = tmp_path / "sw"
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "sweep", str(_sweep_spec(tmp_path)), "--out", str(out),
                             "-j", "1", "--no-plots"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=preexec)
    try:
        t0 = time.monotonic()
        while not list((out / "points").glob("*")):      # a point is under way (its bundle directory)
            assert time.monotonic() - t0 < 120 and proc.poll() is None, "the sweep never started a point"
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, stdout, stderr, out


def test_a_sweep_stops_on_sigterm_with_a_message(tmp_path):
    import signal
    rc, _, err, out = _signal_a_sweep(tmp_path, signal.SIGTERM)
    assert rc == 130 and "sweep interrupted (SIGTERM)" in err and "run the same command again" in err, err
    assert "Traceback" not in err and (out / "sweep.yaml").exists()


def test_a_sweep_started_with_sigint_ignored_still_stops_on_sigint(tmp_path):
    """A script's background job inherits SIGINT ignored; ``kill -INT`` must still stop the sweep."""
    import signal
    rc, _, err, _ = _signal_a_sweep(tmp_path, signal.SIGINT,
                                    preexec=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert rc == 130 and "sweep interrupted (SIGINT)" in err, err


def test_explain_prints_parameters_with_their_units(capsys):
    rc, out, _ = emu(capsys, "explain", REDUCE)
    assert rc == 0
    assert "  pe_link: {latency: 20ns, bandwidth: 64GB/s, capacity: 2}" in out
    assert "  period: 5us" in out and "  merge: 8ns" in out and "latency': 20000" not in out


def test_gqa_counts_name_what_happened(capsys):
    """A decode sweeps tiles (its count was 0); a prefill reduces nothing (it reported the trees' depth)."""
    from actors.ahbm.kernels.gqa_attention import decode_tiles
    rc, out, _ = emu(capsys, "run", ROOT / "scenarios/ahbm/gqa/decode_sp.yaml", "--no-bundle", "--json")
    res = json.loads(out)
    p = res["reports"]
    keys_per_rank = [r["my_len"] for name, r in p.items() if name.endswith("/cpu") and "my_len" in r]
    tile = 64
    assert res["tiles_computed"] == sum(len(decode_tiles(n, tile)) for n in keys_per_rank) > 0
    assert res["l2_rounds"] + res["l1_rounds"] > 0
    rc, out, _ = emu(capsys, "run", ROOT / "scenarios/ahbm/gqa/prefill_ring.yaml", "--no-bundle", "--json")
    res = json.loads(out)
    assert res["l2_rounds"] == res["l1_rounds"] == 0 and res["merges_ipcq"] == res["merges_noc"] == 0
    assert res["tiles_computed"] == sum(r.get("ring_folds", 0) for r in res["reports"].values()) > 0

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

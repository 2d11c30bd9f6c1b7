"""Files a scenario names stay inside the scenario's tree (issue 39 item 3, emulator/input_paths.py).

A scenario (or sweep file, or bundle) from someone else must not make the tool read any file the user can
read and show it: a file it names is resolved (``..`` collapsed, symlinks followed) and must lie under the
scenario's folder, the shipped scenarios/ tree, an ``--allow-path`` folder or ``inputs_root:``; else the
error names the key, the value and the resolved path -- and never the file's contents, which are not read.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "scenarios" / "ahbm" / "requests" / "trace.yaml"     # arrivals_file: arrivals.csv
ARRIVALS = ROOT / "scenarios" / "ahbm" / "requests" / "arrivals.csv"
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"
DEMO_PROFILE = ROOT / "scenarios" / "machines" / "demo.yaml"
SECRET = "SECRET-MARKER-7f3a"
SMALL = ["--set", "workload.params.rounds=2", "--set", "machine.overrides.cubes_x=2",
         "--set", "machine.overrides.cubes_y=2", "--set", "workload.params.root=[1,1]"]


@pytest.fixture
def tree(tmp_path):
    """``proj/`` (where scenarios go) and ``outside/`` beside it holding a file with a secret line."""
    proj, outside = tmp_path / "proj", tmp_path / "outside"
    proj.mkdir()
    outside.mkdir()
    (outside / "secret.csv").write_text(f"{SECRET}:x:0:0:root:/root:/bin/bash\n")
    (outside / "secret.yaml").write_text(f"{SECRET}: [root, x, 0]\n")
    return proj, outside


def arrivals_scenario(proj: Path, value: str, extra: str = "") -> Path:
    scen = proj / "s.yaml"
    scen.write_text(extra + TRACE.read_text().replace("arrivals_file: arrivals.csv", f"arrivals_file: {value}"))
    return scen


def name_outside(how: str, proj: Path, target: Path, link: str) -> str:
    """How a file in proj/ names ``target`` (in outside/): ``..``, absolute, or a symlink ``link`` in proj/."""
    if how == "symlink":
        (proj / link).parent.mkdir(parents=True, exist_ok=True)
        (proj / link).symlink_to(target)
        return link
    return f"../outside/{target.name}" if how == "dotdot" else str(target)


def refused(p, key: str, value: str, resolved: Path) -> str:
    """The error of a refused file: exit 2, the key, the value, the resolved path; no secret, no traceback."""
    err = p.stdout + p.stderr
    assert p.returncode == 2, err
    assert "Traceback" not in err and SECRET not in err, err
    assert f"{key}: expected a file under one of the input roots" in err, err
    assert f"found {value!r}, which resolves to {resolved}" in err, err
    assert "--allow-path DIR" in err
    return err


# --------------------------------------------------------------------------- arrival traces
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_an_arrivals_file_outside_the_scenario_folder_is_refused_unread(emu, tree, how):
    proj, outside = tree
    target = outside / "secret.csv"
    value = name_outside(how, proj, target, "link.csv")
    scen = arrivals_scenario(proj, value)
    err = refused(emu("run", scen, "--no-bundle", "--quiet"), "workload.params.arrivals_file", value, target)
    assert f"{scen}:9: workload.params.arrivals_file" in err and f"{proj} (the scenario's folder)" in err
    refused(emu("validate", scen), "workload.params.arrivals_file", value, target)


def test_the_issue_s_etc_passwd_is_refused_without_being_shown(emu, tree):
    proj, _ = tree
    value = "../" * (len(proj.parts) + 2) + "etc/passwd"
    err = refused(emu("run", arrivals_scenario(proj, value), "--no-bundle", "--quiet"),
                  "workload.params.arrivals_file", value, Path("/etc/passwd"))
    assert "root:x:" not in err and "/bin/" not in err


def test_allow_path_admits_a_folder_and_its_bundle_runs_alone(emu, tree, tmp_path):
    proj, outside = tree
    shutil.copyfile(ARRIVALS, outside / "arrivals.csv")
    scen = arrivals_scenario(proj, "../outside/arrivals.csv")
    p = emu("run", scen, "--quiet", "--json", "--set", "mode=timing", "--out", tmp_path / "b", "--allow-path", outside,
            check=0)
    first = json.loads(p.stdout)
    bundle = yaml.safe_load((tmp_path / "b" / "scenario.yaml").read_text())
    assert bundle["workload"]["params"]["arrivals_file"] == "input.arrivals.csv"
    moved = tmp_path / "elsewhere" / "b"
    shutil.copytree(tmp_path / "b", moved)
    again = json.loads(emu("run", moved / "scenario.yaml", "--quiet", "--json", "--no-bundle", check=0).stdout)
    assert again["digest"] == first["digest"]


def test_a_bundle_copies_no_file_from_outside_the_roots(tree, tmp_path):
    """runnable_scenario copied any param naming an existing file: ../../../etc/passwd went into the bundle."""
    from actors import registry
    from emulator.input_paths import input_roots
    from emulator.scenario import load_scenario
    from tools.run.bundle import runnable_scenario

    proj, outside = tree
    scen = arrivals_scenario(proj, "../outside/secret.csv")
    sc = load_scenario(str(scen), registry, allow=[outside])      # loads: the file is read only at build
    sc.input_roots = input_roots(proj)                            # as if run without --allow-path
    out = tmp_path / "bundle"
    out.mkdir()
    doc = runnable_scenario(sc, out)
    assert doc["workload"]["params"]["arrivals_file"] == "../outside/secret.csv"
    assert not list(out.glob("input.*"))


def test_a_header_error_quotes_the_field_cut_never_the_line(emu, tree):
    proj, _ = tree
    (proj / "bad.csv").write_text("x" * 70 + SECRET + ",context,prefill,steps\n0ns,64,0,1\n")
    p = emu("run", arrivals_scenario(proj, "bad.csv"), "--no-bundle", "--quiet", check=2)
    assert "bad.csv:1: expected the header arrival,context,prefill,steps, found 'xxxx" in p.stderr, p.stderr
    assert "... in column 1" in p.stderr and SECRET not in p.stderr
    assert p.stderr.count(",context,prefill") == 1    # the expected header only, not the line


# --------------------------------------------------------------------------- inputs_root
def test_inputs_root_dotdot_admits_a_sibling_data_folder_and_says_so(emu, tmp_path):
    scenarios, data = tmp_path / "project" / "scenarios", tmp_path / "project" / "data"
    scenarios.mkdir(parents=True)
    data.mkdir()
    shutil.copyfile(ARRIVALS, data / "arrivals.csv")
    scen = arrivals_scenario(scenarios, "../data/arrivals.csv", "inputs_root: ..\n")
    p = emu("run", scen, "--no-bundle", "--set", "mode=timing", check=0)
    assert f"note: inputs_root: the files the scenario names may lie under {tmp_path / 'project'}" in p.stderr
    assert "requests-trace: finished" in p.stdout
    without = arrivals_scenario(scenarios, "../data/arrivals.csv")
    refused(emu("validate", without), "workload.params.arrivals_file", "../data/arrivals.csv", data / "arrivals.csv")


@pytest.mark.parametrize("value, why", [("/", "which resolves to /"),
                                        ("../outside", "which resolves to {home}/outside, which does not contain"),
                                        ("..", "which resolves to {home}")])
def test_inputs_root_must_contain_the_scenario_and_not_be_root_or_home(emu, tree, tmp_path, monkeypatch, value, why):
    proj, _ = tree
    monkeypatch.setenv("HOME", str(tmp_path))     # inputs_root: .. from proj/ is then the home directory
    scen = arrivals_scenario(proj, "arrivals.csv", f"inputs_root: {value}\n")
    p = emu("validate", scen, check=2)
    assert (f"{scen}:1: inputs_root: expected a folder that contains the scenario (e.g. '..'), not / or the "
            f"home directory, found {value!r}, {why.format(home=tmp_path)}") in p.stderr, p.stderr


# --------------------------------------------------------------------------- machine profiles
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_machine_profile_outside_the_scenario_folder_is_refused_unread(emu, tree, how):
    proj, outside = tree
    target = outside / "secret.yaml"
    value = name_outside(how, proj, target, "machines/demo.yaml")
    scen = proj / "s.yaml"
    scen.write_text(REDUCE.read_text().replace("profile: demo", f"profile: {value}"))
    err = refused(emu("run", scen, "--no-bundle", "--quiet"), "machine.profile", value, target)
    assert f"{scen}:9: machine.profile" in err


def test_a_named_profile_found_up_the_parents_must_lie_in_a_root(emu, tree):
    """``profile: demo`` searches machines/ folders up the parents: one found outside the roots is refused."""
    proj, _ = tree
    sub = proj / "deep"
    sub.mkdir()
    (proj / "machines").mkdir()
    shutil.copyfile(DEMO_PROFILE, proj / "machines" / "demo.yaml")
    scen = sub / "s.yaml"
    scen.write_text(REDUCE.read_text())
    refused(emu("validate", scen), "machine.profile", "demo", proj / "machines" / "demo.yaml")
    emu("validate", scen, "--allow-path", proj, check=0)
    emu("validate", scen, "--set", "inputs_root=..", check=0)


def test_an_extends_outside_the_roots_is_refused_and_allow_path_admits_it(emu, tree):
    proj, outside = tree
    shutil.copyfile(DEMO_PROFILE, outside / "base.yaml")
    (proj / "m.yaml").write_text("extends: ../outside/base.yaml\n")
    scen = proj / "s.yaml"
    scen.write_text(REDUCE.read_text().replace("profile: demo", "profile: m.yaml"))
    err = refused(emu("validate", scen), "extends", "../outside/base.yaml", outside / "base.yaml")
    assert f"{proj / 'm.yaml'}:1: extends" in err
    emu("run", scen, "--no-bundle", "--quiet", *SMALL, "--allow-path", outside, check=0)


def test_shipped_profiles_work_for_a_scenario_anywhere(emu, tree):
    proj, _ = tree
    scen = proj / "s.yaml"
    scen.write_text(TRACE.read_text().replace("arrivals_file: arrivals.csv", f"arrivals_file: {ARRIVALS}"))
    emu("validate", scen, check=0)      # ahbm-1sip (extends: ahbm) and the shipped CSV: the shipped tree


# --------------------------------------------------------------------------- sweeps
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_sweep_base_outside_the_sweep_folder_is_refused_unread(emu, tree, how):
    proj, outside = tree
    target = outside / "base.yaml"
    target.write_text(f"# {SECRET}\n" + REDUCE.read_text())
    value = name_outside(how, proj, target, "base.yaml")
    sweep = proj / "sweep.yaml"
    sweep.write_text(f"base: {value}\nvary: {{seed: [1, 2]}}\n")
    err = refused(emu("sweep", sweep, "--out", proj / "runs", "-q"), "base", value, target)
    assert f"{sweep}:1: base" in err and f"{proj} (the sweep file's folder)" in err
    refused(emu("validate", sweep), "base", value, target)
    p = emu("validate", sweep, "--allow-path", outside, check=0)
    assert "ok (sweep sweep over" in p.stdout


# --------------------------------------------------------------------------- bundles
@pytest.fixture
def outside_profile_bundle(emu, tree, tmp_path):
    """A bundle of a run whose machine profile came from outside/ (admitted by --allow-path then)."""
    proj, outside = tree
    shutil.copyfile(DEMO_PROFILE, outside / "mine.yaml")
    scen = proj / "s.yaml"
    scen.write_text(REDUCE.read_text().replace("profile: demo", "profile: ../outside/mine.yaml"))
    bundle = tmp_path / "bundle"
    emu("run", scen, "--quiet", *SMALL, "--set", "trace.enabled=true", "--out", bundle, "--allow-path", outside,
        check=0)
    resolved = yaml.safe_load((bundle / "scenario.resolved.yaml").read_text())
    assert resolved["machine"]["profile_file"] == str(outside / "mine.yaml")
    return bundle, outside


def test_replay_refuses_a_recorded_profile_outside_the_bundle(emu, outside_profile_bundle):
    bundle, outside = outside_profile_bundle
    trace = bundle / "trace.emutrace"
    p = emu("trace", "replay", trace, "--actor", "cube00/pe1", "--set", "workload.params.merge=16ns")
    err = refused(p, "machine.profile_file", str(outside / "mine.yaml"), outside / "mine.yaml")
    assert f"{bundle} (the trace's folder)" in err
    p = emu("trace", "replay", trace, "--actor", "cube00/pe1", "--set", "workload.params.merge=16ns",
            "--allow-path", outside)
    assert p.returncode in (0, 1) and "replay of cube00/pe1" in p.stdout, p.stdout + p.stderr
    emu("run", bundle / "scenario.yaml", "--no-bundle", "--quiet", check=0)   # the bundle's own profile.yaml


def test_compare_refuses_a_bundle_file_that_links_out_of_the_bundle(emu, outside_profile_bundle, tmp_path):
    bundle, outside = outside_profile_bundle
    (bundle / "actors.csv").unlink()
    (bundle / "actors.csv").symlink_to(outside / "secret.csv")
    p = emu("compare", bundle, bundle)
    refused(p, "actors.csv", "actors.csv", outside / "secret.csv")


def test_profile_refuses_a_bundle_file_that_links_out_of_the_bundle(emu, outside_profile_bundle):
    bundle, outside = outside_profile_bundle
    (bundle / "scenario.resolved.yaml").unlink()
    (bundle / "scenario.resolved.yaml").symlink_to(outside / "secret.yaml")
    refused(emu("profile", bundle), "scenario.resolved.yaml", "scenario.resolved.yaml", outside / "secret.yaml")

"""``emu fork BUNDLE --at T``: the re-execution to T is checked against the recorded run, a change from T on
diverges only after T, and what cannot be forked is refused before anything is written (tools/run/fork.py)."""
import json

import pytest

from conftest import ROOT
from emulator.units import format_time

DECODE_SP = str(ROOT / "scenarios/ahbm/gqa/decode_sp.yaml")


@pytest.fixture
def original(emu, tmp_path):
    emu("run", DECODE_SP, "--quiet", "--out", tmp_path / "orig", check=0)
    return tmp_path / "orig", json.loads((tmp_path / "orig" / "result.json").read_text())


@pytest.mark.parametrize("scenario", [pytest.param("scenarios/ahbm/requests/trace.yaml", marks=pytest.mark.slow),
                                      pytest.param("scenarios/pccx/gemma3n/tiny-timing.yaml", marks=pytest.mark.slow),
                                      "scenarios/ahbm/gqa/decode_sp.yaml"])
def test_a_fork_with_no_change_is_the_recorded_run(emu, tmp_path, scenario):
    emu("run", ROOT / scenario, "--quiet", "--out", tmp_path / "orig", check=0)
    res = json.loads((tmp_path / "orig" / "result.json").read_text())
    at = res["end_time_ps"] // 2
    r = emu("fork", tmp_path / "orig", "--at", f"{at}ps", "--out", tmp_path / "fork", "--json", check=0)
    fork = json.loads(r.stdout)
    assert fork["digest"] == res["digest"] and fork["end_time_ps"] == res["end_time_ps"]
    assert fork["prefix"]["events"] > 0 and "trace" in fork["prefix"]["checked_against"]
    assert not fork["first_divergence"]


def test_a_link_fault_from_t_diverges_only_after_t(emu, tmp_path, original):
    bundle, res = original
    at = 1_300_000
    r = emu("fork", bundle, "--at", f"{at}ps", "--out", tmp_path / "fork", "--json",
            "--delay", '{link: "sip0/cube00/pe4/ipcq.tx_N->*", delay: 50ns}', check=0)
    fork = json.loads(r.stdout)
    assert fork["digest"] != res["digest"] and fork["end_time_ps"] > res["end_time_ps"]
    firsts = fork["first_divergence"]
    assert firsts and all(d["t_ps"] >= at for d in firsts)
    assert firsts[0]["t_ps"] == min(d["t_ps"] for d in firsts)
    written = json.loads((tmp_path / "fork" / "result.json").read_text())
    assert written["fork"]["at_ps"] == at and written["fork"]["changes"][0]["fault"]["start"] == f"{at}ps"
    text = emu("fork", bundle, "--at", f"{at}ps", "--out", tmp_path / "fork2",
               "--delay", '{link: "sip0/cube00/pe4/ipcq.tx_N->*", delay: 50ns}', check=0).stdout
    assert "first divergent event per actor" in text and f"end time   {format_time(res['end_time_ps'])} ->" in text


def test_a_parameter_changed_at_the_start_is_the_run_with_that_parameter(emu, tmp_path, original):
    """A live change applied at the first time step gives exactly the run that had it from the start; applied
    later, only what is computed after T changes."""
    bundle, res = original
    whole = json.loads(emu("run", DECODE_SP, "--quiet", "--no-bundle", "--json", "--compact",
                           "--set", "machine.overrides.hbm.access_latency=80ns", check=0).stdout)
    fork = json.loads(emu("fork", bundle, "--at", "1ps", "--out", tmp_path / "f", "--json",
                          "--set", "machine.overrides.hbm.access_latency=80ns", check=0).stdout)
    assert fork["digest"] == whole["digest"] != res["digest"]
    assert fork["changes"][-1] == {"fields": ["hbm_latency"]}
    late = json.loads(emu("fork", bundle, "--at", "1.3us", "--out", tmp_path / "g", "--json",
                          "--set", "machine.overrides.hbm.access_latency=80ns", check=0).stdout)
    assert res["end_time_ps"] < late["end_time_ps"] < whole["end_time_ps"]      # only the accesses after T
    assert late["first_divergence"] and all(d["t_ps"] >= 1_300_000 for d in late["first_divergence"])


def test_what_cannot_be_forked_is_refused_and_nothing_is_written(emu, tmp_path, original):
    bundle, res = original
    out = tmp_path / "refused"
    cases = [(["--at", "1s"], "a fork time lies inside it"),
             (["--at", "5"], "expected a time with a unit"),
             (["--at", "1us", "--set", "machine.overrides.gemm.array_rows=64"], "array_rows, which the machine fixes"),
             (["--at", "1us", "--set", "workload.params.C=2"], "a fork changes machine parameters"),
             (["--at", "1us", "--delay", "{link: 'x*', delay: 5ns, start: 10ns}"], "is before the fork at 1us")]
    for args, says in cases:
        r = emu("fork", bundle, *args, "--out", out, check=2)
        assert says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not out.exists()
    edited = tmp_path / "edited"                     # the bundle's scenario changed since it was recorded
    edited.mkdir()
    for f in bundle.iterdir():
        (edited / f.name).write_bytes(f.read_bytes())
    text = (edited / "scenario.yaml").read_text()
    (edited / "scenario.yaml").write_text(text.replace("seed: 1", "seed: 2") if "seed: 1" in text
                                          else text + "seed: 12345\n")
    r = emu("fork", edited, "--at", "1.3us", "--out", out, check=2)
    assert "is not the recorded run before 1.3us" in r.stderr and not out.exists()


def test_forks_from_one_prefix_fan_out_over_the_pool(emu, tmp_path, original):
    bundle, res = original
    (tmp_path / "v.yaml").write_text('- name: same\n'
                                     '- name: late-ipcq\n  delay: {link: "sip0/cube00/pe4/ipcq.tx_N->*", delay: 50ns}\n'
                                     '- name: wide\n  set: machine.overrides.gemm.array_rows=64\n')
    r = emu("fork", bundle, "--at", "1.3us", "--variants", tmp_path / "v.yaml", "--out", tmp_path / "forks",
            "--json", "-j", "2", check=1)                 # one variant is refused: not every fork finished
    table, _, records = r.stdout.partition("\n{")
    records = json.loads("{" + records)
    assert records["0"]["digest"] == res["digest"] and records["0"]["first_divergence_ps"] is None
    assert records["1"]["end_time_ps"] > res["end_time_ps"] and records["1"]["first_divergence_ps"] >= 1_300_000
    assert records["2"]["status"] == "refused" and "array_rows" in records["2"]["error"]
    assert "none (same digest)" in table and "late-ipcq" in table and "refused" in table
    assert (tmp_path / "forks" / "late-ipcq" / "result.json").is_file()
    (tmp_path / "bad.yaml").write_text("- name: a\n  colour: red\n")
    r = emu("fork", bundle, "--at", "1.3us", "--variants", tmp_path / "bad.yaml", check=2)
    assert "unknown key 'colour'" in r.stderr

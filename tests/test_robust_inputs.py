"""Hostile input (issue 15, issue 14 items 2-4a): each class of bad input found by the fuzzing is a clear
error with exit 2 from ``emu validate`` -- file, line, key, expected, found -- never a traceback or a hang.

``emu`` runs in-process (``tools.cli.main``) for speed; the errors are read from stderr.
"""
from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import pytest

from tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"
DECODE = ROOT / "scenarios" / "ahbm" / "attention_decode.yaml"
ASM = ROOT / "scenarios" / "pccx" / "softmax-asm.yaml"


def emu(capsys, *argv):
    """(exit code, stdout, stderr) of the real CLI, in-process; an escaping exception fails the test."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def rejected(capsys, *argv) -> str:
    rc, _, err = emu(capsys, *argv)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error:") and all(l.startswith(("error:", "  ")) for l in lines), err
    return err


def test_nul_byte_is_a_clear_error_with_its_line(tmp_path, capsys):
    f = tmp_path / "nul.yaml"
    f.write_bytes(REDUCE.read_bytes().replace(b"seed: 1", b"seed: 1\0"))
    err = rejected(capsys, "validate", f)
    assert f"{f}:6: (top level): expected printable text, found a NUL byte" in err


def test_non_utf8_byte_is_a_clear_error(tmp_path, capsys):
    f = tmp_path / "bin.yaml"
    f.write_bytes(REDUCE.read_bytes() + b"\nname: caf\xe9\n")
    assert "which is not UTF-8" in rejected(capsys, "validate", f)


@pytest.mark.parametrize("text", ["a: " + "[" * 20000 + "]" * 20000,
                                  "".join(f"{' ' * i}k{i}:\n" for i in range(1200)) + " " * 1200 + "v: 1\n"],
                         ids=["flow-20000", "block-1200"])
def test_deep_nesting_is_refused_at_the_depth_limit(tmp_path, capsys, text):
    f = tmp_path / "deep.yaml"
    f.write_text(text)
    assert "expected at most 64 levels of nested maps and lists" in rejected(capsys, "validate", f)


def test_alias_bomb_fails_fast(tmp_path, capsys):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    f = tmp_path / "bomb.yaml"
    f.write_text(REDUCE.read_text() + "\n".join(lines) + "\n")
    t0 = time.perf_counter()
    err = rejected(capsys, "validate", f)
    assert "values after alias expansion" in err
    assert time.perf_counter() - t0 < 20   # 9**9 values would take minutes and gigabytes


def test_oversized_file_is_refused(tmp_path, capsys):
    f = tmp_path / "big.yaml"
    f.write_text(REDUCE.read_text() + "#" * (5 * 2**20))
    assert "of at most 4194304 bytes" in rejected(capsys, "validate", f)


@pytest.mark.parametrize("item", ["machine.overrides.pe_link.latency=1e30ns", "workload.params.period=1e30ns",
                                  "machine.overrides.mesh_link.latency=99999999999999999999999ps"])
def test_huge_quantities_are_range_checked_at_validation(capsys, item):
    err = rejected(capsys, "validate", REDUCE, "--set", item)
    assert "of at most 1000s" in err and "fit the engine's integer picoseconds" in err


def test_huge_fault_delay_is_range_checked(capsys):
    err = rejected(capsys, "validate", ROOT / "scenarios" / "faults" / "delay.yaml", "--set", "faults.0.delay=1e30ns")
    assert "faults[0].delay" in err and "of at most 1000s" in err


def test_huge_integers_are_refused(capsys):
    err = rejected(capsys, "validate", REDUCE, "--set", "seed=100000000000000000000000000000")
    assert "seed: expected an integer >= 0 of magnitude at most 2**62" in err


def test_zero_bandwidth_is_refused_and_unlimited_is_explicit(capsys):
    err = rejected(capsys, "validate", REDUCE, "--set", "machine.overrides.pe_link.bandwidth=0GB/s")
    assert "write 'unlimited'" in err
    rc, out, _ = emu(capsys, "explain", REDUCE, "--set", "machine.overrides.pe_link.bandwidth=unlimited")
    assert rc == 0
    assert "cube05/pe1.up->cube05/pe0.in: capacity 2, latency 20ns, bandwidth unlimited" in out
    assert "latency 50ns, bandwidth 32 GB/s" in out   # a mesh link keeps its finite bandwidth


@pytest.mark.parametrize("item,words", [
    ("machine.overrides.cubes_x=1000000", "cubes_x: expected an integer >= 1 and <= 64"),
    ("machine.overrides.cubes_x=1.0e+30", "cubes_x: expected an integer"),
    ("workload.params.G=1000000000", "workload.params.G: expected partials of at most 2 GiB"),
])
def test_sizes_the_demo_cannot_hold_are_validation_errors(capsys, item, words):
    assert words in rejected(capsys, "validate", REDUCE, "--set", item)


def test_attention_rows_beyond_the_hbm_give_the_bytes_needed(capsys):
    err = rejected(capsys, "validate", DECODE, "--set", "workload.params.rows=1000000000")
    assert "workload.params.rows: expected a per-rank footprint" in err
    assert "358 GiB (384000008192 B) needed" in err


@pytest.mark.parametrize("item,words", [
    ("workload.params.tile=2147483648", "workload.params.tile: must divide s_per_rank"),
    ("workload.params.ranks=1.0e+30", "workload.params.ranks: expected an integer >= 1, found number 1e+30"),
])
def test_validate_rejects_what_run_would_reject(capsys, item, words):
    assert words in rejected(capsys, "validate", DECODE, "--set", item)


def test_truncated_program_file_name_is_a_validation_error(capsys):
    err = rejected(capsys, "validate", ASM, "--set", "workload.params.source=softmax.pa")
    assert "program file 'softmax.pa' not found" in err


def test_program_file_with_a_nul_byte_is_a_clear_error(tmp_path, capsys):
    prog = tmp_path / "p.pasm"
    prog.write_bytes((ROOT / "scenarios" / "pccx" / "softmax.pasm").read_bytes() + b"\0")
    assert "found a NUL byte" in rejected(capsys, "validate", ASM, "--set", f"workload.params.source={prog}",
                                          "--allow-path", tmp_path)   # outside the scenario's folder: admitted


def test_microbench_with_empty_params_uses_parsed_defaults():
    from actors import registry
    from emulator.scenario import load_scenario

    sc = load_scenario(str(ROOT / "scenarios" / "ahbm" / "microbench.yaml"), registry, ["workload.params={}"])
    assert sc.params["dma_sizes"] == [4096, 65536, 262144]    # the TypeError: these stayed strings
    assert sc.params["ipcq_bytes"] == [128, 4096]


def test_set_values_go_through_the_same_limits(capsys):
    err = rejected(capsys, "validate", REDUCE, "--set", "workload.params=" + "[" * 200 + "]" * 200)
    assert "--set workload.params" in err and "levels of nested" in err


def test_fault_targets_are_resolved_by_validate_and_listed_by_explain(capsys):
    glob = "faults=[{kind: delay, link: '*cube00/pe3*', delay: 1ns}]"
    rc, out, _ = emu(capsys, "validate", REDUCE, "--set", glob)
    assert rc == 0 and "matches 2 link(s)" in out
    rc, out, _ = emu(capsys, "explain", REDUCE, "--set", glob, "--faults")
    assert rc == 0
    assert out.strip() == ("faults[0] delay@*cube00/pe3* (delay): link glob '*cube00/pe3*' matches 2 link(s): "
                           "cube00/pe3.up->cube00/pe1.in, cube00/pe7.up->cube00/pe3.in")
    err = rejected(capsys, "validate", REDUCE, "--set", "faults=[{kind: drop, link: 'nowhere*'}]")
    assert "faults[0].link: no link matches 'nowhere*'" in err


def test_a_fault_that_never_fired_is_reported(capsys):
    rc, out, _ = emu(capsys, "run", ROOT / "scenarios" / "faults" / "delay.yaml", "--no-bundle", "--json",
                     "--set", "faults.0.start=1s")
    res = json.loads(out)
    assert res["faults"] == [{"index": 0, "fault": "delay@cube15/pe0.up->cube14/pe0.in", "kind": "delay",
                              "link": "cube15/pe0.up->cube14/pe0.in", "matched": 1, "fired": False,
                              "injected": 0, "by_target": {}}]
    rc, out, _ = emu(capsys, "run", ROOT / "scenarios" / "faults" / "delay.yaml", "--no-bundle",
                     "--set", "faults.0.start=1s")
    assert "never fired (1 target(s) matched)" in out


def test_fault_results_in_json_are_summarised_per_fault(capsys, tmp_path):
    rc, out, _ = emu(capsys, "run", REDUCE, "--json", "--out", tmp_path / "b", "--set", "output.plots=false",
                     "--set", "faults=[{kind: slow, link: 'cube00/*->cube00/*', factor: 2}]")
    res = json.loads(out)
    (f,) = res["faults"]
    assert f["fired"] and f["matched"] == 7 and f["injected"] == sum(f["by_target"].values()) > 4
    full = json.loads((tmp_path / "b" / "faults.json").read_text())
    assert len(full) == f["injected"] and {e["target"] for e in full} == set(f["by_target"])


def test_all_errors_of_the_failing_instant_are_reported(capsys):
    rc, out, err = emu(capsys, "run", REDUCE, "--no-bundle", "--json",
                       "--set", "faults=[{kind: corrupt, link: '*', bits: 64}]")
    res = json.loads(out)
    assert res["status"] == "error" and rc == 1
    t = res["errors"][0].split(" failed at t=")[1].split(" ps")[0]
    assert len(res["errors"]) == 20 and res["more_errors"] > 0        # 20 listed, the rest counted
    assert all(f" failed at t={t} ps" in e for e in res["errors"])
    assert len({e.split(" failed")[0] for e in res["errors"]}) == 20  # 20 different links
    assert res["error"].startswith(f"{20 + res['more_errors']} errors at t={t} ps:")


def test_pccx_asm_reads_through_the_same_limits(tmp_path, capsys):
    prog = tmp_path / "bad.pasm"
    prog.write_bytes(b"GEMV \0\n")
    err = rejected(capsys, "pccx", "asm", prog)
    assert f"{prog}:1: (top level): expected printable text, found a NUL byte at column 6" in err


def test_virtual_time_stops_at_the_engine_horizon_instead_of_overflowing(capsys):
    # each quantity is in range (1000 s), but 10,000 of them in sequence would pass int64 ps
    rc, out, _ = emu(capsys, "run", ROOT / "scenarios" / "demo" / "ring.yaml", "--no-bundle", "--json",
                     "--set", "workload.params.service=1000s", "--set", "workload.params.nodes=2", "--set", "workload.params.tokens=1",
                     "--set", "workload.params.hops=10000")
    res = json.loads(out)
    assert res["status"] == "time-limit" and rc == 4
    assert res["end_time_ps"] == 2**62


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_model_product_beyond_int64_is_a_clear_error(capsys):
    # each value is in range (an integer <= 2**62), but cycles x period is not
    rc, _, err = emu(capsys, "run", ROOT / "scenarios" / "pccx" / "program.yaml", "--no-bundle",
                     "--set", "machine.overrides.decoder_cycles=4611686018427387904")
    assert rc == 1
    assert "passed the engine's 64-bit integer range" in err and "a parameter is too large" in err
    # the overflow surfaced in the clock's own work (a trace flush): the run must still end its
    # tasks, not abandon them to the garbage collector (nurseries with children, unfinished tasks)
    gc.collect()


def test_a_list_of_the_wrong_length_is_a_validation_error(capsys):
    # found by the fuzzing: a GEMM shape [m, k] (one deleted) crashed later as "not enough values to unpack"
    err = rejected(capsys, "validate", ROOT / "scenarios" / "ahbm" / "microbench.yaml",
                   "--set", "workload.params.gemm=[32, 64]")
    assert "workload.params.gemm: expected exactly 3 item(s), found 2 item(s)" in err


GQA_DECODE = ROOT / "scenarios" / "ahbm" / "gqa" / "decode.yaml"


@pytest.mark.parametrize("item,words", [
    ("workload.params.context=100000000000", "workload.params.context: expected a per-rank k of at most 512 MiB"),
    ("workload.params.G=100000000", "workload.params.G: expected a per-rank q of at most 64 MiB"),
])
def test_gqa_sizes_beyond_their_hbm_regions_give_the_bytes_needed(capsys, item, words):
    err = rejected(capsys, "validate", GQA_DECODE, "--set", item)
    assert words in err and "needed" in err

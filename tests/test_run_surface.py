"""``emu run`` as a user meets it: interrupts, one final status, bundles, exit codes.

The interrupt tests drive the real CLI in a subprocess and send it a real
signal; their only wall bound is a generous ``communicate`` timeout.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import EMU, ROOT
from emulator.interrupt import RunStopped, StopSwitch
from emulator.trace import read_trace

RING = ROOT / "scenarios/demo/ring.yaml"
REDUCE = ROOT / "scenarios/demo/reduce.yaml"


def _wait_for(path, min_bytes, timeout_s=120.0):
    t0 = time.monotonic()
    while not (path.exists() and path.stat().st_size > min_bytes):
        assert time.monotonic() - t0 < timeout_s, f"{path} never grew past {min_bytes} bytes"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_long_run_with_a_partial_result_and_a_readable_trace(tmp_path, emu, sig):
    out = tmp_path / "b"
    proc = subprocess.Popen([*EMU, "run", str(RING), "--set", "workload.params.hops=30000000", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the run is under way: past the header (~10 KB), the first chunk of 8192 events is in the file
        _wait_for(out / "trace.emutrace", 64_000)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "ring-demo: interrupted" in stdout
    res = json.loads((out / "result.json").read_text())
    assert res["status"] == "interrupted" and res["stopped_in"] == "run"
    assert res["end_time_ps"] > 0 and res["events"] > 0 and res["messages"] > 0
    tr = read_trace(str(out / "trace.emutrace"))          # whole: it has its footer
    assert tr.footer["status"] == "interrupted" and tr.footer["events"] == res["events"]
    assert tr.footer["end_time_ps"] == res["end_time_ps"]
    summary = emu("trace", "summary", out / "trace.emutrace", check=0)
    assert "interrupted" in summary.stdout


def test_the_wall_clock_guard_stops_synchronous_python():
    """Input generation and machine building are plain Python: the guard must reach them too."""
    before = signal.getsignal(signal.SIGINT)   # default_int_handler, or SIG_IGN when started in the background
    t0 = time.monotonic()
    with pytest.raises(RunStopped) as e:
        with StopSwitch(0.2):
            while time.monotonic() - t0 < 60:
                pass
    assert e.value.reason == "wall-timeout"
    assert signal.getsignal(signal.SIGINT) is before   # handlers restored


def test_the_watchdog_reports_a_main_thread_stuck_in_one_c_call():
    """No Python signal handler runs inside one long C call; the watchdog thread still reports the stop."""
    import hashlib

    fired = []
    with pytest.raises(RunStopped):
        with StopSwitch(0.05, on_stuck=fired.append, stuck_after_s=0.05):
            hashlib.pbkdf2_hmac("sha256", b"key", b"salt", 1_000_000)   # one C call, GIL released, ~0.3-3 s
    assert fired == ["wall-timeout"]


def test_the_wall_clock_guard_ends_a_run_generating_inputs_in_numpy(emu, tmp_path):
    # 2 PEs drawing 10^7-row partials in numpy (bounded memory): the guard ends it with a partial result
    p = emu("run", REDUCE, "--set", "machine.overrides.cubes_x=1", "--set", "machine.overrides.cubes_y=1",
            "--set", "machine.overrides.pes_per_cube=2", "--set", "workload.params.root=[0,0]",
            "--set", "workload.params.G=10000000", "--set", "workload.params.d=1",
            "--set", "stop.wall_timeout=300ms", "--out", tmp_path / "b")
    assert p.returncode == 5, p.stdout + p.stderr
    res = json.loads((tmp_path / "b/result.json").read_text())
    assert res["status"] == "wall-timeout" and res["stopped_in"] in ("build", "run")
    if res["stopped_in"] == "run":
        assert read_trace(str(tmp_path / "b/trace.emutrace")).footer["status"] == "wall-timeout"


def test_result_and_trace_footer_agree_when_the_workload_check_fails(emu, tmp_path):
    # the engine finishes; the pccx check finds a halted driver and makes the run an error
    out = tmp_path / "b"
    p = emu("run", ROOT / "scenarios/pccx/program.yaml", "--quiet", "--out", out,
            "--set", "faults=[{kind: drop, link: '*hp2*', count: 1}]",
            "--set", "machine.overrides.driver.wait_timeout=50us")
    assert p.returncode == 1, p.stdout + p.stderr
    res = json.loads((out / "result.json").read_text())
    footer = read_trace(str(out / "trace.emutrace")).footer
    assert res["status"] == footer["status"] == "error"
    assert res["digest"] == footer["digest"]


def test_rerunning_into_a_bundle_clears_the_earlier_run(emu, tmp_path):
    out = tmp_path / "b"
    emu("run", RING, "--out", out, "--set", "workload.params.hops=5", "--plots", check=0)
    assert (out / "trace.emutrace").exists() and (out / "links.png").exists()
    emu("run", RING, "--out", out, "--set", "workload.params.hops=5", "--set", "trace.enabled=false", check=0)
    assert not (out / "trace.emutrace").exists() and not (out / "links.png").exists()
    assert json.loads((out / "result.json").read_text())["trace"] is None


def test_a_directory_that_is_not_a_bundle_is_refused_before_the_run(emu, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    p = emu("run", RING, "--out", out, check=2)
    assert "not from an emu run (notes.txt)" in p.stderr and p.stdout == ""
    assert (out / "notes.txt").read_text() == "keep me"
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = emu("run", RING, "--out", blocker / "sub", check=2)
    assert "--out" in p.stderr and "cannot create" in p.stderr and p.stdout == ""
    p = emu("run", RING, "--no-bundle", "--trace", blocker / "t.emutrace", check=2)
    assert "trace file" in p.stderr and "cannot create" in p.stderr and p.stdout == ""


def test_the_bundle_scenario_is_runnable_and_reproduces_the_digest(emu, tmp_path):
    out = tmp_path / "b"
    first = json.loads(emu("run", ROOT / "scenarios/pccx/softmax-asm.yaml", "--json", "--out", out,
                           "--set", "seed=5", check=0).stdout)
    again = json.loads(emu("run", out / "scenario.yaml", "--json", "--no-bundle", check=0).stdout)
    assert again["digest"] == first["digest"] and again["seed"] == 5
    assert yaml.safe_load((out / "scenario.yaml").read_text())["workload"]["params"]["source"].endswith("softmax.pasm")


def test_the_trace_tools_work_right_after_a_run(emu, tmp_path):
    emu("run", REDUCE, "--set", "workload.params.rounds=1", check=0)      # default bundle runs/reduce-demo
    trace = tmp_path / "runs/reduce-demo/trace.emutrace"
    assert "critical path" in emu("trace", "summary", trace, check=0).stdout
    assert not (tmp_path / "runs/reduce-demo/trace.pftrace").exists()   # on request only


def test_bad_input_is_exit_status_2_for_every_command(emu, tmp_path):
    missing = tmp_path / "nope.emutrace"
    for args in (("run", tmp_path / "nope.yaml"), ("validate", tmp_path / "nope.yaml"),
                 ("trace", "summary", missing), ("trace", "perfetto", missing), ("trace", "diff", missing, missing),
                 ("trace", "replay", missing, "--actor", "x"), ("pccx", "disasm", "zz"), ("run",),
                 ("frobnicate",)):
        p = emu(*args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
    (tmp_path / "junk.emutrace").write_bytes(b"\x01\x02not a trace")
    assert emu("trace", "summary", tmp_path / "junk.emutrace").returncode == 2


def test_a_closed_pipe_ends_quietly(tmp_path):
    emu_run = subprocess.run([*EMU, "run", str(REDUCE), "--set", "workload.params.rounds=1", "--out", "b"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert emu_run.returncode == 0, emu_run.stderr
    proc = subprocess.Popen([*EMU, "trace", "summary", "b/trace.emutrace", "--rows", "100000"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()                      # what `| head -1` does
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and stderr == ""


def test_version(emu):
    from emulator import __version__

    p = emu("--version", check=0)
    assert p.stdout.startswith(f"emu {__version__}")

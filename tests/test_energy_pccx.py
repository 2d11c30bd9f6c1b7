"""The pccx energy model (actors/pccx/energy.py, docs/energy.md): every coefficient moves the total by exactly
its count, the counters match what the program moved, the Gemma 3N run reports energy per token through the
real CLI with its digest unchanged, and the sweep's energy metrics."""
import json
import subprocess
import sys

import pytest

from actors import registry
from actors.pccx.energy import energy_inventory
from energy_check import assert_every_coefficient_counts
from emulator.energy import account
from emulator.scenario import load_scenario
from tools.run.runner import run_scenario
from tools.sweep.results import metric_value


@pytest.fixture(scope="module")
def program_run():
    sc = load_scenario("scenarios/pccx/program.yaml", registry)
    res, system, result = run_scenario(sc)
    assert res["status"] == "finished"
    return sc.profile, system, result.end_time_ps, res




#: the program runs no host step (the Gemma 3N driver does: test_gemma3n_cli_energy)
NOT_HERE = {("host", "active")}


def test_every_pccx_coefficient_counts(program_run):
    prof, system, T, _ = program_run
    assert assert_every_coefficient_counts(prof, energy_inventory, system, T, NOT_HERE) > 0


def test_pccx_counts_are_the_bytes_moved(program_run):
    prof, system, T, res = program_run
    acc = account(*energy_inventory(system, prof, T), T)
    hp = sum(a.moved_bytes for a in system.actors.values() if type(a).__name__ == "HpPort")
    ddr = system.actors["pccx/ddr"]
    # every HP byte was read from DDR (the ACP and the host read and write it too)
    assert ddr.rd_bytes >= hp > 0
    assert acc.coefs["energy.hp.bit"]["count"] == 8 * hp == acc.coefs["energy.weight_fifo.bit"]["count"]
    assert acc.coefs["energy.ddr.read"]["count"] == 8 * ddr.rd_bytes
    lanes = [a for a in system.actors.values() if type(a).__name__ == "GemvLane"]
    assert acc.coefs["energy.gemv.mac"]["count"] == sum(a.macs for a in lanes) > 0
    assert acc.coefs["energy.frontend.instruction"]["count"] == system.actors["pccx/decoder"].busy_spans
    assert res["energy"]["per_program_j"] == pytest.approx(res["energy"]["total_j"])


def test_gemma3n_cli_energy(tmp_path):
    """The real CLI on the tiny Gemma 3N scenario: energy per token and tokens per joule beside tok/s, the
    host steps charged, the summary line, and the digest the run has without the energy model."""
    out = tmp_path / "tiny"
    r = subprocess.run([sys.executable, "-m", "tools.cli", "run", "scenarios/pccx/gemma3n/tiny-timing.yaml",
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "result.json").read_text())
    assert res["digest"] == "2358c40332301ca662e3b090f08bd901"
    en = res["energy"]
    assert en["per_token_j"] == pytest.approx(en["total_j"] / res["tokens"])
    assert en["tokens_per_j"] == pytest.approx(res["tokens"] / en["total_j"])
    assert en["actions"]["energy.host.active"]["count"] > 0
    assert "  energy " in r.stdout and "token/J, tokens of the whole model)" in r.stdout     # not one layer's
    assert en["per_unit"] == {"unit": "token", "count": res["tokens"], "what": "tokens of the whole model"}
    # tokens per joule inside the budget table, under tok/s: in result.json's budget, its table and the printout
    from actors.pccx.gemma3n.budget import BUDGET_TABLE
    for table in (res["budget"], res["tables"][BUDGET_TABLE]):
        assert [r["metric"] for r in table[:3]] == ["decode throughput (tok/s)", "tokens per joule (tok/J)",
                                                   "average power (W)"]
        assert table[1]["emulated"] == round(en["tokens_per_j"], 4) and table[2]["emulated"] == round(en["avg_power_w"], 4)
    rows = [line for line in r.stdout.splitlines() if line.startswith("  tokens per joule (tok/J)")]
    assert len(rows) == 1 and f"{round(en['tokens_per_j'], 4):.4g}" in rows[0], rows
    assert metric_value(res, "energy_per_token_j") == en["per_token_j"]
    assert metric_value(res, "edp_js") == pytest.approx(en["total_j"] * res["end_time_ps"] / 1e12)


def test_sweep_energy_metrics_are_none_without_an_energy_model():
    assert metric_value({"end_time_ps": 5}, "energy_j") is None
    en = {"total_j": 2.0, "avg_power_w": 1.0, "per_kernel_j": 2.0, "kernels_per_j": 0.5}
    res = {"end_time_ps": 2 * 10**12, "energy": en}
    assert metric_value(res, "energy_j") == 2.0
    assert metric_value(res, "energy_per_token_j") == 2.0
    assert metric_value(res, "tokens_per_j") == 0.5
    assert metric_value(res, "edp_js") == 4.0
    assert metric_value(res, "avg_power_w") == 1.0

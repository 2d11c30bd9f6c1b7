"""The energy hand check through the real CLI on a shipped scenario (docs/energy.md, "A worked example"):
one DMA load, one GEMM, one IPCQ send (scenarios/ahbm/energy-handcheck.yaml).  result.json's energy must
equal, to the attojoule, the sum a person writes down from the scenario, the bundle's counters
(links.csv bytes and messages, actors.csv types) and the profile's coefficients, plus static power x time."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from actors import registry
from emulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "scenarios/ahbm/energy-handcheck.yaml"
DIGEST = "22305cff7041dc94976105f359456732"

#: actor type -> its static-power coefficient (docs/energy.md's AHBM table, written out here by hand)
STATIC = {"PeCpu": "cpu", "PeScheduler": "sched", "DmaEngine": "dma", "GemmEngine": "gemm", "MathEngine": "math",
          "Tcm": "tcm", "Ipcq": "ipcq", "HbmChannel": "hbm_pc", "HbmPort": "hbm_port", "Router": "router"}


def _run(tmp_path, *sets):
    out = tmp_path / "hc"
    args = [sys.executable, "-m", "tools.cli", "run", SCENARIO, "--out", str(out), "--quiet"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "result.json").read_text())
    with open(out / "links.csv") as f:
        links = list(csv.DictReader(f))
    with open(out / "actors.csv") as f:
        actors = {row["actor"]: row["type"] for row in csv.DictReader(f)}
    return res, links, actors


def _hand_sum(sc, res, links, actors) -> int:
    """The energy in aJ, from the scenario's own numbers and the counters (fJ x 1000 + µW x ps)."""
    e, p = sc.profile["energy"], sc.params
    d = sc.profile["cpu"]["dispatch_cycles"]
    m, k, n = p["gemm"]

    def ends(link):                       # (type of the sending actor, type of the receiving actor)
        src, dst = link["link"].split("->")
        return actors[src.rsplit(".", 1)[0]], actors[dst.rsplit(".", 1)[0]]

    bits = {"tcm": 0, "ipcq": 0, "wire": 0, "other": 0}
    tcm_accesses = 0
    for link in links:
        s, t = ends(link)
        b = 8 * int(link["bytes"])
        if t == "Tcm":
            tcm_accesses += int(link["messages"])     # a request into the TCM is one access
        if "Tcm" in (s, t):
            bits["tcm"] += b
        elif "HbmChannel" in (s, t):
            pass                                     # the HBM per-bit figure is the whole access
        elif s == t == "Ipcq":
            bits["ipcq"] += b
        elif "Router" in (s, t):
            bits["other"] += b
        else:
            bits["wire"] += b                        # commands and completions inside a PE, the host's launches
    assert bits["other"] == 0                        # nothing crosses a router in this scenario
    # 5 requests: the DMA's write of x, the GEMM's read of a and b (one request) and write of c, the sender's
    # IPCQ's read of p, the receiver's IPCQ's write of t
    assert tcm_accesses == 5
    hbm_bits = 8 * p["dma_bytes"]                    # the one load; nothing else touches HBM
    macs = m * k * n
    cpu_cycles = d["dma"] + d["gemm"] + d["ipcq"] + d["ipcq"]   # sender: dma, gemm, send; receiver: recv
    fj = (hbm_bits * e["hbm"]["read"] + macs * e["gemm"]["mac"] + cpu_cycles * e["cpu"]["cycle"]
          + 1 * e["dma"]["command"] + tcm_accesses * e["tcm"]["access"] + bits["tcm"] * e["tcm"]["bit"]
          + bits["ipcq"] * e["ipcq"]["bit"] + bits["wire"] * e["wire"])
    static_uw = sum(e["static"][STATIC[t]] for t in actors.values() if t in STATIC)
    return fj * 1000 + static_uw * res["end_time_ps"]


def test_the_shipped_hand_check_scenario_adds_up_exactly(tmp_path):
    res, links, actors = _run(tmp_path)
    assert res["status"] == "finished" and res["digest"] == DIGEST
    sc = load_scenario(str(ROOT / SCENARIO), registry, [])
    en = res["energy"]
    assert en["total_aj"] == _hand_sum(sc, res, links, actors)          # exactly, in attojoules
    # the counts the sum used are the ones the model charged
    acts = en["actions"]
    m, k, n = sc.params["gemm"]
    assert acts["energy.hbm.read"]["count"] == 8 * sc.params["dma_bytes"]
    assert acts["energy.gemm.mac"]["count"] == m * k * n
    assert acts["energy.dma.command"]["count"] == 1
    assert not {"energy.hbm.write", "energy.math.element", "energy.noc.router", "energy.noc.attach",
                "energy.ucie.intra_sip", "energy.ucie.inter_sip", "energy.io.bit"} & set(acts)
    # and its commands ran in order on the two PEs
    cmds = [(r["pe"], r["command"]) for r in res["tables"]["energy hand check: the commands"]]
    assert cmds == [("[0, 0, 0]", "dma"), ("[0, 0, 0]", "gemm"), ("[0, 0, 0]", "send"), ("[0, 0, 1]", "recv")]


@pytest.mark.parametrize("override", ["machine.overrides.energy.gemm.mac=0.6pJ",
                                      pytest.param("machine.overrides.energy.static.tcm=11mW", marks=pytest.mark.slow),
                                      "machine.overrides.energy.ipcq.bit=0.2pJ/bit"])
def test_a_changed_coefficient_moves_both_sums_alike(tmp_path, override):
    """The hand sum reads the coefficient from the profile as the run does: change one, both follow (and the
    total moves, so the comparison above is not between two constants)."""
    base, _, _ = _run(tmp_path / "base")
    res, links, actors = _run(tmp_path, override)
    sc = load_scenario(str(ROOT / SCENARIO), registry, [override])
    assert res["digest"] == DIGEST                                       # energy is not traced
    assert res["energy"]["total_aj"] == _hand_sum(sc, res, links, actors) != base["energy"]["total_aj"]


def test_bad_handcheck_params_are_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tools.cli", "run", SCENARIO, "--no-bundle", "--set",
                        "workload.params.gemm=[32, 64]"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "workload.params.gemm" in r.stderr + r.stdout and "Traceback" not in r.stderr

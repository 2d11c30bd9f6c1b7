"""The energy model (docs/energy.md): a hand-computed check on one DMA, one GEMM, one MATH op and one IPCQ
send; tests that fail when a counter is dropped or a coefficient is ignored; units; the bundle's columns."""
import json
import subprocess
import sys

import numpy as np
import pytest

from actors.ahbm.energy import energy_inventory
from actors.ahbm.testkit import buf, ipcq_size, noc_size, profile, run_scripts
from energy_check import assert_every_coefficient_counts, leaves
from emulator.energy import AJ_PER_FJ, Charge, Leak, account, energy_summary, power_series
from emulator.units import UnitError, format_quantity, parse_quantity

A, B = (0, 0, 0), (0, 0, 1)        # PE 1 is PE 0's east neighbour (pe_grid 4 x 2)
C = (0, 1, 0)                      # a PE of the other CUBE: one NOC message A -> C crosses the CUBE <-> CUBE link
DMA_BYTES = 4096
M, K, N = 32, 64, 32
MATH_SHAPE = (32, 128)
IPCQ_BYTES = 128


async def _run():
    prof = profile()
    scripts = {
        A: [{"op": "dma", "kind": "load", "addr": 0, "row_bytes": DMA_BYTES, "buf": "x", "shape": [DMA_BYTES],
             "dtype": "|u1", "label": "dma"},
            {"op": "gemm", "a": "a", "b": "b", "acc": "c", "m": M, "k": K, "n": N, "label": "gemm"},
            {"op": "math", "fn": "exp", "srcs": ["e"], "out": "y", "label": "exp"},
            {"op": "send", "dir": "E", "buf": "p", "label": "send"},
            {"op": "noc_send", "to": list(C), "buf": "p", "label": "noc"}],
        B: [{"op": "recv", "dir": "W", "buf": "t", "label": "recv"}],
        C: [{"op": "noc_recv", "from": list(A), "buf": "q", "label": "noc_recv"}],
    }
    tcm = [(A, "a", np.ones((M, K), np.float16)), (A, "b", np.ones((K, N), np.float16)),
           (A, "e", np.ones(MATH_SHAPE, np.float16)), (A, "p", buf(IPCQ_BYTES))]
    system, m, res = await run_scripts(scripts, tcm, prof)
    return prof, system, res


def _links(system, pred):
    return [l for l in system.links if pred(l.src.owner, l.dst.owner)]


async def test_energy_equals_the_counted_actions_times_the_coefficients_plus_static_power_times_time(vclock):
    prof, system, res = await _run()
    e, T = prof["energy"], res.end_time_ps
    charges, leaks = energy_inventory(system, prof, T)
    acc = account(charges, leaks, T)

    # the counts, from what the run did (a human can write them down)
    hbm_bits = 8 * DMA_BYTES                         # one 4 KiB load of PE A's own HBM, nothing else touches HBM
    macs = M * K * N
    elements = MATH_SHAPE[0] * MATH_SHAPE[1]
    d = prof["cpu"]["dispatch_cycles"]
    # A: dma, gemm, math, send, noc_send; B: recv; C: noc_recv
    cpu_cycles = d["dma"] + d["gemm"] + d["math"] + d["ipcq"] + d["noc"] + d["ipcq"] + d["noc"]
    ipcq_data_bits = 8 * ipcq_size(IPCQ_BYTES)       # the encoded IpcqData message (testkit's own encoder)
    ipcq_links = _links(system, lambda s, t: type(s).__name__ == type(t).__name__ == "Ipcq")
    assert sum(8 * l.bytes for l in ipcq_links if ".tx_" in l.name) == ipcq_data_bits
    ipcq_bits = sum(8 * l.bytes for l in ipcq_links)     # data + its credit return
    tcm_in = _links(system, lambda s, t: type(t).__name__ == "Tcm")
    tcm_out = _links(system, lambda s, t: type(s).__name__ == "Tcm")
    tcm_accesses = sum(l.messages for l in tcm_in)
    tcm_bits = 8 * sum(l.bytes for l in tcm_in + tcm_out)
    # A: the DMA writes x, the GEMM reads a and b (one access) and writes c, the MATH reads e and writes y, the
    # IPCQ reads p, the CPU reads p for the NOC send; B: its IPCQ writes t; C: its CPU writes q
    assert tcm_accesses == 9

    cube_bits = 8 * sum(l.bytes for l in system.links if type(l.src.owner).__name__ == type(l.dst.owner).__name__
                        == "Router")
    assert cube_bits == 8 * noc_size(IPCQ_BYTES)       # the one NOC packet over the one CUBE crossing

    def bits(kind):
        return 8 * sum(l.bytes for l in system.links if _kind(l) == kind)

    router_bits = 8 * sum(l.bytes for l in system.links if type(l.dst.owner).__name__ == "Router")
    fj = (hbm_bits * e["hbm"]["read"] + macs * e["gemm"]["mac"] + elements * e["math"]["element"]
          + cpu_cycles * e["cpu"]["cycle"] + 1 * e["dma"]["command"] + ipcq_bits * e["ipcq"]["bit"]
          + tcm_accesses * e["tcm"]["access"] + tcm_bits * e["tcm"]["bit"]
          + bits("attach") * e["noc"]["attach"] + bits("io") * e["io"]["bit"] + bits("wire") * e["wire"]
          + router_bits * e["noc"]["router"] + cube_bits * e["ucie"]["intra_sip"])
    static_uw = 0
    from actors.ahbm.energy import STATIC_CLASSES
    for a in system.actors.values():
        cls = STATIC_CLASSES.get(type(a).__name__)
        if cls:
            static_uw += e["static"][cls]
    assert acc.total_aj == fj * AJ_PER_FJ + static_uw * T          # exactly, in attojoules
    assert acc.categories["static"] == static_uw * T
    assert acc.categories["compute"] == (macs * e["gemm"]["mac"] + elements * e["math"]["element"]
                                         + cpu_cycles * e["cpu"]["cycle"]) * AJ_PER_FJ
    assert acc.coefs["energy.hbm.read"]["count"] == hbm_bits
    assert acc.coefs["energy.gemm.mac"]["count"] == macs
    assert acc.coefs["energy.math.element"]["count"] == elements
    assert acc.coefs["energy.cpu.cycle"]["count"] == cpu_cycles
    assert acc.coefs["energy.dma.command"]["count"] == 1
    assert "energy.hbm.write" not in acc.coefs and "energy.ucie.inter_sip" not in acc.coefs


def _kind(link):
    s, t = type(link.src.owner).__name__, type(link.dst.owner).__name__
    if "Router" in (s, t) and s != t:
        return "io" if "Host" in (s, t) else "attach"
    if "Host" in (s, t):
        return "wire"
    if s == t == "Router" or "Tcm" in (s, t) or "HbmChannel" in (s, t) or s == t == "Ipcq":
        return None
    return "wire"




#: coefficients this small scenario cannot exercise (and the test that does)
NOT_HERE = {("hbm", "write"): "test_microbench_cli_energy (DMA stores)",
            ("io", "bit"): "test_microbench_cli_energy (host load over the host interface)",
            ("ucie", "inter_sip"): "test_microbench_cli_energy (2 SIPs)"}


async def test_every_coefficient_counts_and_no_counter_is_dropped(vclock):
    """Raise each coefficient by 1 fJ (or 1 µW): the total moves by exactly its count (or components x time).
    A coefficient the action map ignores, or a counter it stops reading, leaves the total unchanged."""
    prof, system, res = await _run()
    T = res.end_time_ps
    assert assert_every_coefficient_counts(prof, energy_inventory, system, T, NOT_HERE) > 0


async def test_dropping_a_counter_changes_the_energy(vclock):
    prof, system, res = await _run()
    T = res.end_time_ps
    base = account(*energy_inventory(system, prof, T), T).total_aj
    gemm = system.actors["sip0/cube00/pe0/gemm"]
    macs, gemm.macs = gemm.macs, 0
    assert account(*energy_inventory(system, prof, T), T).total_aj == base - macs * prof["energy"]["gemm"]["mac"] * 1000


def test_units_parse_exactly_and_refuse_sub_femtojoule():
    assert parse_quantity("3.9pJ/bit", "energy_per_bit") == 3900
    assert parse_quantity("1pJ/B", "energy_per_bit") == 125
    assert parse_quantity("0.5pJ", "energy") == 500
    assert parse_quantity("25mW", "power") == 25_000
    assert format_quantity(150, "energy_per_bit") == "0.15pJ/bit" and format_quantity(20_000, "power") == "20mW"
    for bad, kind in (("0.0001pJ", "energy"), ("3.9pJ", "energy_per_bit"), ("5", "power")):
        with pytest.raises(UnitError):
            parse_quantity(bad, kind)


def test_account_and_power_series_are_exact_and_conserve_energy():
    charges = [Charge.of("x", "hbm", "memory", "energy.hbm.read", 80, 3900),
               Charge.active("h", "ps", "compute", "energy.host.active", 1000, 500_000)]
    leaks = [Leak("x", "hbm", "energy.static.hbm_pc", 20_000)]
    acc = account(charges, leaks, 10_000)
    assert acc.total_aj == 80 * 3900 * 1000 + 1000 * 500_000 + 20_000 * 10_000
    s = energy_summary(acc, per=("token", 2))
    assert s["per_token_j"] == pytest.approx(s["total_j"] / 2)
    series = power_series(acc, {"x": [1000, 0, 0, 0], "h": [0, 1000, 0, 0]}, 2500)
    joules = sum(w * min(2500, 10_000 - t) / 1e12 for t, w in zip(series["t_ps"], series["total_w"]))
    assert joules == pytest.approx(s["total_j"], rel=1e-12)
    assert series["peak_at_ps"] == 2500     # h (0.5 nJ) in window 1 outweighs x (0.31 nJ) in window 0


def test_bad_energy_coefficient_is_a_clear_error(tmp_path):
    prof = tmp_path / "m.yaml"
    prof.write_text("extends: ahbm-1sip\nenergy: {hbm: {read: 3.9pJ}}\n")
    sc = tmp_path / "s.yaml"
    sc.write_text(f"name: t\nmachine: {{profile: {prof}}}\nworkload: {{kind: idle}}\n")
    out = subprocess.run([sys.executable, "-m", "tools.cli", "validate", str(sc)], capture_output=True, text=True)
    assert out.returncode == 2, out
    assert "energy.hbm.read" in out.stderr + out.stdout and "pJ/bit" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


def test_microbench_cli_energy(tmp_path):
    """The real CLI on a shipped scenario: the energy is in result.json and in the CSV columns (their sum is
    the total), every AHBM coefficient is exercised, and the digest is the one the run had without it."""
    out = tmp_path / "mb"
    r = subprocess.run([sys.executable, "-m", "tools.cli", "run", "scenarios/ahbm/microbench.yaml", "--out", str(out),
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "result.json").read_text())
    assert res["digest"] == "9194cd5e4af8be6b66040fa31df76a03"
    en = res["energy"]
    assert set(en["split_j"]) == {"memory", "interconnect", "compute", "static"}
    assert en["total_j"] == pytest.approx(sum(en["split_j"].values()), rel=1e-12)
    used = {k for k, v in en["actions"].items() if v.get("count") or v.get("components")}
    prof_keys = {"energy." + ".".join(p) for p in leaves(_shipped_energy())}
    assert prof_keys <= used, prof_keys - used
    import csv
    total = 0.0
    by_class: dict = {}
    for name in ("actors.csv", "links.csv"):
        with open(out / name) as f:
            for row in csv.DictReader(f):
                total += float(row["energy_j"])
                if row["energy_class"]:
                    by_class[row["energy_class"]] = by_class.get(row["energy_class"], 0.0) + float(row["energy_j"])
    assert total == pytest.approx(en["total_j"], rel=1e-9)
    assert set(by_class) == set(en["by_class_j"])
    for cls, v in en["by_class_j"].items():     # per class in the CSVs = per class in result.json
        assert by_class[cls] == pytest.approx(v["dynamic_j"] + v["static_j"], rel=1e-9), cls
    assert en["per_kernel_j"] == pytest.approx(en["total_j"])


def _shipped_energy():
    from actors.ahbm.params import PROFILE_SCHEMA
    from emulator.scenario import load_profile
    return load_profile("ahbm-2sip", PROFILE_SCHEMA)["energy"]


def test_power_profile_in_the_bundle_and_the_perfetto_counter_tracks(tmp_path):
    """With a Perfetto trace: power.csv (its energy adds up to the total), the peak and its window in
    result.json, and one power counter track per class in trace.pftrace."""
    import csv

    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    out = tmp_path / "mb"
    r = subprocess.run([sys.executable, "-m", "tools.cli", "run", "scenarios/ahbm/microbench.yaml", "--out", str(out),
                        "--set", "machine.profile=ahbm-1sip", "--set", "trace.enabled=true"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    en = json.loads((out / "result.json").read_text())["energy"]
    window, end = en["power"]["window_ps"], en["time_s"] * 1e12
    with open(out / "power.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 200
    joules = sum(float(row["total_w"]) * (min(int(row["t_ps"]) + window, end) - int(row["t_ps"])) / 1e12
                 for row in rows)
    assert joules == pytest.approx(en["total_j"], rel=1e-9)
    assert en["power"]["peak_w"] == pytest.approx(max(float(row["total_w"]) for row in rows))
    assert en["power"]["peak_w"] > en["avg_power_w"]
    t = pb.Trace()
    t.ParseFromString((out / "trace.pftrace").read_bytes())
    counters = {p.track_descriptor.name for p in t.packet
                if p.HasField("track_descriptor") and p.track_descriptor.name.startswith("power ")}
    assert "power total (mW)" in counters and "power hbm (mW)" in counters
    assert {c for c in counters} == {f"power {c} (mW)" for c in ["total", *en["by_class_j"]]}


def test_the_energy_line_says_what_one_unit_of_work_is(emu):
    """token/J of an attention layer is not tokens of the model (issue 39): the energy line and result.json
    say which unit is counted -- a token of the one attention layer the AHBM scenario runs, a launch of a
    layer's kernel, a token of the whole Gemma model on pccx (tests/test_energy_pccx.py)."""
    from conftest import ROOT

    from actors.ahbm.energy import energy_per as ahbm_per
    from actors.pccx.energy import energy_per as pccx_per
    from tools.cli import energy_line

    cases = [("scenarios/ahbm/requests/trace.yaml", "token", "tokens of this attention layer, not of the whole model"),
             ("scenarios/ahbm/gqa/decode.yaml", "kernel", "kernel launches: one layer's kernel, not a model token")]
    # (a Gemma 3N token is one of the whole model: tests/test_energy_pccx.py checks its line)
    for scen, unit, what in cases:
        r = emu("run", f"{ROOT}/{scen}", "--json", "--compact", "--no-bundle", "--quiet", check=0)
        en = json.loads(r.stdout)["energy"]
        assert en["per_unit"]["unit"] == unit and en["per_unit"]["what"] == what, (scen, en["per_unit"])
        assert en["per_unit"]["count"] * en[f"per_{unit}_j"] == pytest.approx(en["total_j"])
        assert f"{unit}/J, {what})" in energy_line(en), energy_line(en)
    assert ahbm_per({}, {"tokens": 3})[:2] == ("token", 3) and pccx_per({}, {})[:2] == ("program", 1)

"""``emu calibrate`` (tools/explain/calibrate.py): the fit recovers parameters from figures the emulator itself
produced with them, the held-out error is reported, the calibrated profile loads; bad input names file:line."""
from __future__ import annotations

import textwrap

import pytest

from actors import registry
from emulator.scenario import load_scenario
from emulator.schema import SchemaError
from emulator.uncertainty import with_values
from tools.cli import main as emu
from tools.explain import calibrate as cal

HEADER = "scenario,metric,value,unit,source,split\n"


def _demo(tmp_path, root, name=None) -> str:
    """A small timing-mode reduce on the demo machine (a few ms of wall time)."""
    name = name or f"r{root[0]}{root[1]}"
    (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        mode: timing
        machine: {{profile: demo}}
        workload: {{kind: reduce, params: {{rounds: 1, period: 5us, produce: 100ns, merge: 8ns, G: 8, d: 128,
                    root: [{root[0]}, {root[1]}]}}}}
        """))
    return f"{name}.yaml"


def _produce(path, values: dict) -> dict:
    """The result of one run of scenario ``path`` with ``values`` written into its profile (the same path as
    the fit's runs, so the figures are exactly what the emulator gives with these parameters)."""
    sc = load_scenario(str(path), registry)
    task = {"index": 0, "dir": "", "resolved": with_values(sc.resolved(), values), "sets": [],
            "timeout_ps": None, "plots": False, "label": "truth"}
    res = cal.calibrate_point(task)["result"]
    assert res["status"] == "finished", res
    return res


TRUTH = {"pe_link.latency": 27_000, "mesh_link.latency": 64_000}          # ps (demo: 20ns, 50ns)
ROWS = (((1, 1), "fit"), ((0, 0), "fit"), ((0, 1), "holdout"))
FIT = ["pe_link.latency=10ns,40ns", "mesh_link.latency=30ns,90ns"]


def _truth_csv(tmp_path, truth=TRUTH) -> str:
    """A calibration file of end times the emulator gave with ``truth``."""
    lines = []
    for root, split in ROWS:
        f = _demo(tmp_path, root)
        end = _produce(tmp_path / f, truth)["end_time_ps"]
        lines.append(f"{f},end_time_ps,{end},ps,\"the emulator with {truth}\",{split}")
    (tmp_path / "c.csv").write_text(HEADER + "\n".join(lines) + "\n")
    return str(tmp_path / "c.csv")


def test_fit_recovers_the_parameters_that_produced_the_figures(tmp_path):
    truth = TRUTH
    c = cal.run_calibration(_truth_csv(tmp_path), FIT, jobs=2)
    assert c["default"] == {"pe_link.latency": 20_000, "mesh_link.latency": 50_000}
    for key, want in truth.items():
        assert abs(c["fitted"][key] - want) <= 2, (key, c["fitted"][key], want)     # within 2 ps
    e = c["error"]
    assert e["fit"]["before"]["max"] > 0.05 and e["holdout"]["before"]["max"] > 0.05     # the default was off
    assert e["fit"]["after"]["max"] < 1e-5 and e["holdout"]["after"]["max"] < 1e-5
    text = cal.format_calibration(c)
    assert "held-out rows (1): mean |err|" in text and "-> 0.0%" in text
    # the written profile extends demo, sets the fitted values, and a scenario runs on it
    note = cal.write_profile(c, str(tmp_path / "out" / "cal.yaml"))
    assert "extends demo" in note
    prof = (tmp_path / "out" / "cal.yaml").read_text()
    assert prof.splitlines()[4] == "extends: demo" and "held-out rows at lines 4 (the file's split column)" in prof
    sc = load_scenario(str(tmp_path / "r11.yaml"), registry, [f"machine.profile={tmp_path / 'out' / 'cal.yaml'}"],
                       allow=[str(tmp_path / "out")])
    assert sc.profile["pe_link"]["latency"] == c["fitted"]["pe_link.latency"]


@pytest.mark.slow
def test_the_fit_is_the_same_on_one_worker_and_two(tmp_path):
    path = _truth_csv(tmp_path, {"pe_link.latency": 23_500, "mesh_link.latency": 71_000})
    one, two = (cal.run_calibration(path, FIT, jobs=j) for j in (1, 2))
    assert one["fitted"] == two["fitted"] and one["after"] == two["after"] and one["runs"] == two["runs"]


def test_fit_recovers_an_integer_cycle_count_from_microbench_rows(tmp_path):
    """dma.setup_cycles (declared [10, 40] in ahbm.yaml) from the microbenchmark's DMA rows (bench: metrics)."""
    src = (cal.Path(__file__).resolve().parents[1] / "scenarios/calibration/ahbm-microbench-128b.yaml").read_text()
    (tmp_path / "mb.yaml").write_text(src)
    res = _produce(tmp_path / "mb.yaml", {"dma.setup_cycles": 31})
    ns = {r["bench"]: r["measured_ns"] for r in res["tables"]["AHBM microbenchmarks: measured vs closed form"]}
    (tmp_path / "c.csv").write_text(HEADER + "".join(
        f"mb.yaml,bench:{b},{ns[b]},ns,setup 31 cycles,{s}\n"
        for b, s in (("dma_load 128 B", "fit"), ("dma_store 128 B", "fit"), ("dma_load remote 6 hops 128 B", "holdout"))))
    c = cal.run_calibration(str(tmp_path / "c.csv"), ["dma.setup_cycles"], jobs=2)
    assert c["default"]["dma.setup_cycles"] == 20 and c["fitted"]["dma.setup_cycles"] == 31
    assert c["params"][0].where.startswith("scenarios/machines/ahbm.yaml:")      # the declared range
    assert c["error"]["holdout"]["before"]["max"] > 0.02 and c["error"]["holdout"]["after"]["max"] == 0


def _error(tmp_path, csv_text: str, fit=("pe_link.latency=10ns,40ns",)) -> str:
    (tmp_path / "c.csv").write_text(csv_text)
    with pytest.raises(SchemaError) as e:
        cal.run_calibration(str(tmp_path / "c.csv"), list(fit), jobs=2)
    return str(e.value)


def test_unknown_scenario_bad_unit_bad_split_name_the_line(tmp_path):
    f = _demo(tmp_path, (1, 1))
    text = _error(tmp_path, HEADER + f"{f},end_time_ps,1.2,us,x,fit\n"
                                     "nope.yaml,end_time_ps,1.2,us,x,holdout\n"
                                     f"{f},end_time_ps,1.2,GB/s,x,holdout\n"
                                     f"{f},end_time_ps,1.2,us,,maybe\n")
    c = tmp_path / "c.csv"
    assert f"{c}:3: scenario: expected a scenario file" in text and "'nope.yaml' (no such file)" in text
    assert f"{c}:4: unit: expected a time unit for metric 'end_time_ps'" in text and "'GB/s'" in text
    assert f"{c}:5: source: expected where the figure comes from" in text
    assert f"{c}:5: split: expected fit or holdout, found 'maybe'" in text


def test_unknown_metric_names_the_line_and_a_close_match(tmp_path):
    f = _demo(tmp_path, (1, 1))
    text = _error(tmp_path, HEADER + f"{f},end_time_ps,1.2,us,x,fit\n{f},end_tme_ps,1.2,us,x,holdout\n")
    assert f"{tmp_path / 'c.csv'}:3: metric: expected a metric of {f}'s result" in text
    assert "did you mean 'end_time_ps'?" in text


def test_a_parameter_no_fitted_row_constrains_is_refused(tmp_path):
    """The IPCQ intercept moves only the held-out IPCQ row, not the fitted DMA one: refused, and told which
    rows would constrain it; a declared parameter with no effect is refused at its uncertainty: line."""
    src = (cal.Path(__file__).resolve().parents[1] / "scenarios/calibration/ahbm-microbench-128b.yaml").read_text()
    (tmp_path / "mb.yaml").write_text(src)
    text = _error(tmp_path, HEADER + "mb.yaml,bench:dma_load 128 B,77,ns,x,fit\n"
                                     "mb.yaml,bench:ipcq E 128 B,31.1,ns,x,holdout\n",
                  fit=("dma.setup_cycles", "ipcq.fixed_overhead=20ns,40ns"))
    assert "--fit: ipcq.fixed_overhead: expected a parameter some fitted row depends on, found no fitted row of " \
           "c.csv changes over its range [20ns, 40ns] (its sensitivity is zero there)" in text
    assert "held-out lines 3 depend on it: fit one of them" in text
    assert "dma.setup_cycles" not in text                # the other one is constrained
    text = _error(tmp_path, HEADER + "mb.yaml,bench:dma_load 128 B,77,ns,x,fit\n"
                                     "mb.yaml,bench:ipcq E 128 B,31.1,ns,x,holdout\n", fit=("math.fixed_cycles",))
    assert "scenarios/machines/ahbm.yaml:" in text and ": uncertainty.math.fixed_cycles: expected a parameter some " \
           "fitted row depends on" in text and "no row depends on it" in text


def test_no_range_inverted_range_and_unknown_key(tmp_path):
    f = _demo(tmp_path, (1, 1))
    body = HEADER + f"{f},end_time_ps,1.2,us,x,fit\n{f},end_time_ps,1.3,us,x,holdout\n"
    text = _error(tmp_path, body, fit=("pe_link.latency", "mesh_link.latency=90ns,30ns", "pe_lnk.latency"))
    assert "--fit: pe_link.latency: expected a range to fit in: declared in the profile's uncertainty: map" in text
    assert "--fit: mesh_link.latency: expected low < high, found [90ns, 30ns] (an inverted or empty range)" in text
    assert "--fit: pe_lnk.latency: expected the key path of a numeric parameter of profile demo" in text
    assert "did you mean 'pe_link.latency'?" in text


def test_both_splits_are_required_and_a_seeded_split_is_named(tmp_path):
    f = _demo(tmp_path, (1, 1))
    text = _error(tmp_path, HEADER + f"{f},end_time_ps,1.2,us,x,fit\n")
    assert "at least one fit row and one holdout row" in text and "found no holdout row" in text
    (tmp_path / "s.csv").write_text("scenario,metric,value,unit,source\n" + "".join(
        f"{f},end_time_ps,1.{i},us,x\n" for i in range(6)))
    rows, how = cal.read_calibration(str(tmp_path / "s.csv"), seed=3)
    held = [r.line for r in rows if r.split == "holdout"]
    assert len(held) == 2 and how.endswith("lines " + ", ".join(map(str, held)))
    assert cal.read_calibration(str(tmp_path / "s.csv"), seed=3)[1] == how          # the same seed, the same split


def test_cli_bad_input_exit_2(tmp_path, capsys):
    f = _demo(tmp_path, (1, 1))
    (tmp_path / "c.csv").write_text(HEADER + f"{f},end_time_ps,1.2,us,x,fit\nmissing.yaml,end_time_ps,1,us,x,holdout\n")
    assert emu(["calibrate", str(tmp_path / "c.csv"), "--fit", "pe_link.latency=10ns,40ns",
                "--out", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'c.csv'}:3: scenario" in err and "Traceback" not in err

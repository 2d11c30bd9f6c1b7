"""``emu whatif`` (tools/explain/whatif.py): the knobs come from the declared parameters, the variants run
on the sweep pool, and the measured sensitivity agrees with the one-run critical-path estimate."""
import pytest

from tools.explain.whatif import format_whatif, knob_coverage, largest_error, run_whatif, scaled_profile

SCENARIO = "scenarios/ahbm/gqa/decode_sp.yaml"


#: one KV head (its two are alike) in timing mode: the same end time and critical path at a third of the run time
CHEAP = ["mode=timing", "workload.params.heads=1"]
#: every resource of the decode but three that are off its critical path (share 0: they cannot enter a top three)
#: and cost 6 of the 22 variant runs; UCIe, also off the path, stays for the zero check
ON_PATH = ["clock.pe", "MATH", "HBM channels", "CPU dispatch", "host", "DMA", "GEMM array", "UCIe"]


@pytest.fixture(scope="module")
def whatif():
    return run_whatif(SCENARIO, CHEAP, only=ON_PATH, jobs=2)


def test_top_three_agree_in_sign_and_order_with_the_estimate(whatif):
    rows = whatif["rows"]
    assert all(v["status"] == "finished" for r in rows for v in r["variants"].values())

    def top(what):
        ranked = sorted(rows, key=lambda r: (-abs(r["variants"]["faster"][what]), r["resource"]))
        return [r["resource"] for r in ranked[:3]]

    assert top("measured") == top("estimate")
    for r in rows:
        if r["resource"] in top("measured"):
            for v in r["variants"].values():
                assert v["measured"] != 0 and (v["measured"] > 0) == (v["estimate"] > 0)
            assert r["variants"]["faster"]["measured"] < 0 < r["variants"]["slower"]["measured"]


def test_a_resource_off_the_critical_path_changes_nothing(whatif):
    """The decode's single SIP has no SIP-to-SIP traffic and its NOC is off the path: estimate and run say 0."""
    (ucie,) = [r for r in whatif["rows"] if r["resource"] == "UCIe"]
    assert ucie["critical_share"] == 0
    assert all(v["measured"] == 0 for v in ucie["variants"].values())


def test_knobs_scale_in_the_right_direction():
    resolved = {"machine": {"resolved": {"hbm": {"pc_bandwidth": 32_000_000_000, "access_latency": 30000},
                                         "cpu": {"dispatch_cycles": {"dma": 8, "gemm": 10}}}},
                "workload": {"params": {}}}
    out, ch = scaled_profile(resolved, {"hbm.pc_bandwidth": "B/s", "hbm.access_latency": "ps",
                                        "cpu.dispatch_cycles": "ps"}, 1.1)
    m = out["machine"]["resolved"]
    assert m["hbm"]["pc_bandwidth"] == 35_200_000_000          # a rate grows
    assert m["hbm"]["access_latency"] == 27273                 # a time shrinks (rounded to an integer ps)
    assert m["cpu"]["dispatch_cycles"] == {"dma": 7, "gemm": 9}
    assert ch["cpu.dispatch_cycles"]["speed"] == round(18 / 16, 4)   # the factor it really got
    assert resolved["hbm" if False else "machine"]["resolved"]["hbm"]["pc_bandwidth"] == 32_000_000_000   # a copy


def test_list_names_the_keys_and_a_bad_only_is_an_error(emu):
    p = emu("whatif", SCENARIO, "--list", check=0)
    assert "HBM channels: hbm.access_latency [ps], hbm.pc_bandwidth [B/s]" in p.stdout
    assert "clock.pe (drives CPU dispatch, DMA, GEMM array, MATH, scheduler)" in p.stdout
    assert "GEMM array *: gemm.fill_drain_cycles [cycles]" in p.stdout       # no exclusive knob for its MACs
    p = emu("whatif", SCENARIO, "--only", "warp drive", check=2)
    assert "unknown resource warp drive" in p.stderr


def test_the_gemm_array_is_marked_as_having_no_exclusive_knob(whatif):
    """Its core MAC cycles run at clock.pe (actors/ahbm/costs.py): the row scales only gemm.fill_drain_cycles, so
    the output marks it, names the widths that set its throughput and the clock row that speeds it."""
    rows = {r["resource"]: r for r in whatif["rows"]}
    assert rows["GEMM array"]["own_knob"] == "part" and rows["MATH"]["own_knob"] == "part"
    assert rows["HBM channels"]["own_knob"] == rows["CPU dispatch"]["own_knob"] == "all"
    g = whatif["coverage"]["partial"]["GEMM array"]
    assert g["own_keys"] == ["gemm.fill_drain_cycles"] and g["widths"] == ["gemm.array_rows", "gemm.array_cols"]
    assert g["clock"] == "clock.pe" and set(g["shared_with"]) == {"CPU dispatch", "DMA", "MATH", "scheduler"}
    # the measured change of its own row is well short of its estimate: what the mark warns of
    f = rows["GEMM array"]["variants"]["faster"]
    assert abs(f["measured"]) < 0.75 * abs(f["estimate"])
    text = format_whatif(whatif)
    assert "  GEMM array *" in text and "GEMM array: core MAC cycles ceil(m/R) ceil(n/C) k" in text
    assert "the clock.pe row speeds it (with CPU dispatch, DMA, MATH, scheduler)" in text


def test_a_class_on_the_path_without_a_row_of_its_own_is_listed():
    """pccx: the HP ports have no speed key of their own, only their clock (clocks.axi, which drives nothing
    else); a class off the path (share 0) is not listed."""
    groups = {"DDR": {"classes": ["DDR"], "keys": {"ddr.bandwidth": "B/s"}},
              "clocks.axi": {"classes": ["HP ports"], "keys": {"clocks.axi": "clock"}},
              "clocks.core": {"classes": ["GEMV lanes", "SFU"], "keys": {"clocks.core": "clock"}},
              "GEMV lanes": {"classes": ["GEMV lanes"], "keys": {"gemv.macs_per_lane": "MAC/clk"}}}
    cov = knob_coverage(groups, "pccx", {"HP ports": 0.82, "DDR": 0.1, "SFU": 0.0, "GEMV lanes": 0.05})
    assert cov["partial"] == {}
    assert cov["none"] == {"HP ports": {"share": 0.82, "clock": "clocks.axi", "shared_with": []}}


def test_every_measured_row_carries_its_estimate_error_and_the_largest_is_named(whatif):
    """error = measured - estimated change (points of end time) per variant; the line under the table names the
    largest."""
    for r in whatif["rows"]:
        for v in r["variants"].values():
            assert v["error"] == round(v["measured"] - v["estimate"], 5)
    errs = {(r["resource"], tag): abs(v["error"]) for r in whatif["rows"] for tag, v in r["variants"].items()}
    big = whatif["largest_error"]
    assert abs(big["error"]) == max(errs.values()) > 0 and errs[(big["resource"], big["variant"])] == abs(big["error"])
    text = format_whatif(whatif)
    assert text.splitlines()[1].split()[3:11] == ["faster:", "measured", "estimate", "error", "slower:", "measured",
                                              "estimate", "error"]
    assert f"largest estimate error: {100 * big['error']:+.2f}pt of the end time, {big['resource']} {big['variant']}" in text


def test_the_error_column_and_a_failed_variant():
    """A variant that did not finish has no error (nothing was measured) and is not the largest."""
    def v(measured, estimate):
        return {"speed": 1.1, "status": "finished" if measured is not None else "error", "measured": measured,
                "estimate": estimate, "error": None if measured is None else round(measured - estimate, 5),
                "changes": {}}
    rows = [{"resource": "MATH", "critical_share": 0.4, "own_knob": "all",
             "variants": {"faster": v(-0.0287, -0.0364), "slower": v(None, 0.0444)}},
            {"resource": "HBM channels", "critical_share": 0.1, "own_knob": "all",
             "variants": {"faster": v(-0.01, -0.0091), "slower": v(0.012, 0.0111)}}]
    big = largest_error(rows)
    assert (big["resource"], big["variant"], big["error"]) == ("MATH", "faster", 0.0077)
    w = {"factor": 0.1, "scenario": "x", "end_time_ps": 1000, "rows": rows, "largest_error": big}
    lines = format_whatif(w).splitlines()
    assert lines[2].split()[1:5] == ["40.0%", "-2.87%", "-3.64%", "+0.77pt"]
    assert lines[2].split()[5:7] == ["failed", "+4.44%"] and "pt" not in " ".join(lines[2].split()[6:])
    assert lines[-1] == "  largest estimate error: +0.77pt of the end time, MATH faster (measured -2.87%, estimated -3.64%)"
    assert largest_error([{**rows[0], "variants": {"slower": v(None, 0.04)}}]) is None

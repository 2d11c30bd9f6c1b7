"""Scenario files: every error names file, line, key path, expected and found; --set; validate; explain."""
import json
import textwrap

import pytest

from actors import registry
from emulator.scenario import load_scenario
from emulator.schema import SchemaError
from tools.sweep.spec import looks_like_sweep

from conftest import ROOT

GOOD = """\
name: t
seed: 3
mode: timing
machine:
  profile: demo
  overrides:
    pe_link: {latency: 10ns}
workload:
  kind: ring
  params:
    nodes: 4
    tokens: 1
    hops: 8
"""


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def problems(path, sets=None):
    with pytest.raises(SchemaError) as e:
        load_scenario(path, registry, sets)
    return [str(p) for p in e.value.problems]


def test_good_scenario_resolves_profile_overrides_and_units(tmp_path):
    sc = load_scenario(write(tmp_path, GOOD), registry)
    assert sc.profile["pe_link"]["latency"] == 10_000          # override, parsed from "10ns"
    assert sc.profile["pe_link"]["bandwidth"] == 64 * 10**9     # from the profile
    assert sc.params == {"nodes": 4, "tokens": 1, "hops": 8, "service": 0}
    assert sc.seed == 3 and sc.family == "demo"


def test_misspelled_key_names_file_line_path_and_suggests(tmp_path):
    p = write(tmp_path, GOOD.replace("  kind: ring", "  knid: ring"))
    out = problems(p)
    assert any(f"{p}:9: workload.knid: expected a known key, found string 'knid' (did you mean 'kind'?)" == x
               for x in out), out
    assert any("workload.kind" in x and "missing" in x for x in out)


def test_missing_unit_is_an_error_with_the_line(tmp_path):
    p = write(tmp_path, GOOD.replace("latency: 10ns", "latency: 10"))
    out = problems(p)
    assert out == [f"{p}:7: pe_link.latency: expected a time like '30ns', found integer 10 (the unit is missing)"]


def test_wrong_unit_kind_is_explained(tmp_path):
    p = write(tmp_path, GOOD.replace("latency: 10ns", "latency: 10GB/s"))
    (msg,) = problems(p)
    assert "pe_link.latency" in msg and "'GB/s' is a bandwidth unit" in msg


def test_workload_param_errors_point_into_the_scenario(tmp_path):
    p = write(tmp_path, GOOD.replace("hops: 8", "hops: -1").replace("nodes: 4", "nodez: 4"))
    out = problems(p)
    assert f"{p}:13: workload.params.hops: expected an integer >= 1, found integer -1" in out
    assert any(x.startswith(f"{p}:11: workload.params.nodez") and "did you mean 'nodes'" in x for x in out)


def test_unknown_profile_and_workload(tmp_path):
    out = problems(write(tmp_path, GOOD.replace("profile: demo", "profile: dmeo")))
    assert "machine.profile" in out[0] and "did you mean 'demo'" in out[0]
    out = problems(write(tmp_path, GOOD.replace("kind: ring", "kind: rign")))
    assert "workload.kind" in out[0] and "did you mean 'ring'" in out[0]


def test_yaml_syntax_error_has_a_line(tmp_path):
    p = write(tmp_path, GOOD + "  bad: [1, 2\n")
    (msg,) = problems(p)
    assert msg.startswith(f"{p}:") and "valid YAML" in msg


def test_set_overrides_any_field_and_is_validated(tmp_path):
    p = write(tmp_path, GOOD)
    sc = load_scenario(p, registry, ["seed=9", "machine.overrides.pe_link.capacity=5", "workload.params.hops=3"])
    assert (sc.seed, sc.profile["pe_link"]["capacity"], sc.params["hops"]) == (9, 5, 3)
    (msg,) = problems(p, ["machine.overrides.pe_link.latency=5"])
    assert msg.startswith("--set machine.overrides.pe_link.latency=5: pe_link.latency") and "unit is missing" in msg


def test_validate_command(emu, tmp_path):
    ok = emu("validate", write(tmp_path, GOOD), check=0)
    assert "ok (machine demo [demo], workload ring" in ok.stdout
    bad = emu("validate", write(tmp_path, GOOD.replace("seed: 3", "sede: 3")), check=2)
    assert "did you mean 'seed'?" in bad.stderr and "Traceback" not in bad.stderr


def test_explain_lists_actors_and_links_with_parameters(emu, tmp_path):
    out = emu("explain", write(tmp_path, GOOD), check=0).stdout
    assert "actors (4):" in out and "ring/n0 [RingNode]" in out
    assert "ring/n3.out->ring/n0.in: capacity 2, latency 10ns, bandwidth 64 GB/s" in out
    js = json.loads(emu("explain", write(tmp_path, GOOD), "--json", check=0).stdout)
    assert len(js["links"]) == 4 and js["links"][0]["latency_ps"] == 10_000


def test_missing_file_is_a_clear_error(emu, tmp_path):
    proc = emu("run", tmp_path / "nope.yaml", check=2)
    assert "no such file" in proc.stderr


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scenarios").rglob("*.yaml")
                                        if "machines" not in p.parts and "models" not in p.parts
                                        and not looks_like_sweep(str(p))))
def test_every_shipped_scenario_validates(path):   # sweep files: tests/test_sweep.py; models: test_gemma3n_*
    load_scenario(ROOT / path, registry)


def test_schema_listing_documents_the_format(emu):
    out = emu("validate", "--schema", ROOT / "scenarios/demo/reduce.yaml", check=0).stdout
    assert "seed: an integer >= 0 [default 0]" in out
    assert "kind: one of 'delay', 'drop', 'corrupt', 'stall', 'slow', 'kill' [required]" in out
    assert "machine profile (family demo):" in out and "workload reduce:" in out
    assert "merge: a time like '30ns' [default '8ns']" in out


def test_yaml_shapes_that_are_refused(tmp_path):
    out = problems(write(tmp_path, GOOD + "seed: 4\n"))
    assert out == [f"{tmp_path / 's.yaml'}:14: seed: expected each key once in a map, found 'seed' again "
                   "(first at line 2)"]
    out = problems(write(tmp_path, "name: &a [*a]\n"))
    assert "no recursive alias" in out[0]
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    assert "expected a UTF-8 text file" in problems(bad)[0]


def test_non_finite_numbers_are_rejected(tmp_path):
    p = write(tmp_path, GOOD)
    out = problems(p, ["faults=[{kind: slow, link: 'ring/*', factor: .inf, probability: .nan}]"])
    assert any("faults[0].factor: expected a finite number" in x for x in out), out
    assert any("faults[0].probability: expected a finite number" in x for x in out), out


def test_errors_found_while_building_exit_2(emu):
    p = emu("run", ROOT / "scenarios/demo/reduce.yaml", "--no-bundle", "--set", "workload.params.root=[9,9]")
    assert p.returncode == 2 and "inside the 4x4 mesh" in p.stderr

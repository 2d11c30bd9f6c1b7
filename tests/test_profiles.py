"""Machine profiles inherit (``extends:``): a concrete profile states only what differs,
every key keeps the file and line that set it, and bad chains are clear errors."""
import textwrap

import pytest

from actors import registry
from actors.ahbm.params import PROFILE_SCHEMA
from emulator.scenario import MACHINES_DIR, load_profile, load_scenario
from emulator.schema import SchemaError

SCENARIO = """\
name: t
machine:
  profile: {profile}
workload:
  kind: idle
"""


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def problems(path):
    with pytest.raises(SchemaError) as e:
        load_scenario(path, registry)
    return [str(p) for p in e.value.problems]


def test_shipped_ahbm_profiles_differ_from_the_base_only_in_what_they_state():
    base = load_profile("ahbm", PROFILE_SCHEMA)
    for name, sips in (("ahbm-1sip", 1), ("ahbm-2sip", 2), ("ahbm-4sip", 4)):
        prof = load_profile(name, PROFILE_SCHEMA)
        diff = {k for k in base if base[k] != prof[k]}
        assert prof["sips"] == sips
        assert diff <= {"sips", "description"}, (name, diff)
        text = (MACHINES_DIR / f"{name}.yaml").read_text()
        assert "extends: ahbm" in text and "hbm:" not in text      # nothing repeated from the base


def test_the_profile_schema_has_no_defaults_a_value_lives_in_the_base_profile(tmp_path):
    p = write(tmp_path / "m.yaml", "family: ahbm\nsips: 1\n")
    out = problems(write(tmp_path / "s.yaml", SCENARIO.format(profile="m.yaml")))
    assert any("hbm" in x and "missing" in x for x in out), out


def test_child_overrides_and_inherits_from_a_profile_file(tmp_path):
    write(tmp_path / "fast.yaml", """\
        extends: ahbm-1sip
        description: faster HBM
        hbm: {pc_bandwidth: 64GB/s}
    """)
    sc = load_scenario(write(tmp_path / "s.yaml", SCENARIO.format(profile="fast.yaml")), registry)
    assert sc.profile["hbm"]["pc_bandwidth"] == 64 * 10**9          # the child's value
    assert sc.profile["hbm"]["access_latency"] == 30_000            # inherited from ahbm.yaml
    assert sc.profile["sips"] == 1                                   # from ahbm-1sip, two levels up


def test_error_in_the_child_names_the_child_file_and_line(tmp_path):
    child = write(tmp_path / "bad.yaml", """\
        extends: ahbm-1sip
        hbm:
          pc_bandwidth: 64
    """)
    out = problems(write(tmp_path / "s.yaml", SCENARIO.format(profile="bad.yaml")))
    assert any(x.startswith(f"{child}:3: hbm.pc_bandwidth:") for x in out), out


def test_error_in_an_inherited_value_names_the_parent_file_and_line(tmp_path):
    parent = write(tmp_path / "parent.yaml", (MACHINES_DIR / "ahbm.yaml").read_text()
                   .replace("access_latency: 30ns", "access_latency: 30"))
    line = next(i for i, t in enumerate(parent.read_text().splitlines(), 1) if "access_latency: 30 " in t)
    write(tmp_path / "child.yaml", "extends: parent.yaml\nsips: 1\n")
    out = problems(write(tmp_path / "s.yaml", SCENARIO.format(profile="child.yaml")))
    assert any(x.startswith(f"{parent}:{line}: hbm.access_latency:") for x in out), out


def test_unknown_parent_suggests_a_profile(tmp_path):
    child = write(tmp_path / "c.yaml", "extends: ahbm-1sp\n")
    out = problems(write(tmp_path / "s.yaml", SCENARIO.format(profile="c.yaml")))
    assert any(x.startswith(f"{child}:1: extends:") and "did you mean 'ahbm-1sip'" in x for x in out), out


def test_an_extends_cycle_is_an_error_naming_the_chain(tmp_path):
    write(tmp_path / "a.yaml", "extends: b.yaml\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\n")
    out = problems(write(tmp_path / "s.yaml", SCENARIO.format(profile="a.yaml")))
    assert any("extends" in x and "a -> b -> a" in x for x in out), out

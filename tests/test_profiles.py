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


def _leaves(tree: dict, path: tuple = ()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, path + (key,))
        else:
            yield path + (key,)


def _at(tree: dict, path: tuple):
    for key in path:
        tree = tree[key]
    return tree


def test_pccx_as_built_profile_states_only_what_differs_from_the_documented_one():
    """pccx-v002-rtl extends pccx-v002-documented: every value it states differs from the documented one,
    except what it pins on purpose (``cvo.gemv_fifo_words``: the RTL has no GEMV->SFU FIFO, whatever the
    documented what-if says), and every value it does not state is the documented one."""
    import yaml
    from actors.pccx.profile import PROFILE_SCHEMA as PCCX_SCHEMA
    documented = load_profile("pccx-v002-documented", PCCX_SCHEMA)
    rtl = load_profile("pccx-v002-rtl", PCCX_SCHEMA)
    stated_doc = yaml.safe_load((MACHINES_DIR / "pccx-v002-rtl.yaml").read_text())
    assert stated_doc.pop("extends") == "pccx-v002-documented"
    stated_doc.pop("uncertainty")     # declared ranges, not values (emulator/uncertainty.py, tests/test_interval.py)
    stated = set(_leaves(stated_doc))
    pinned = {("cvo", "gemv_fifo_words")}
    assert pinned <= stated and _at(rtl, ("cvo", "gemv_fifo_words")) == 0
    for path in stated - pinned:
        assert _at(rtl, path) != _at(documented, path), f"{'.'.join(path)} repeats the documented value"
    for path in set(_leaves(rtl)) - stated:
        assert _at(rtl, path) == _at(documented, path), path

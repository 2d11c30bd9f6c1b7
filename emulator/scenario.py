"""Scenario files: load, resolve the machine profile, validate everything before running.

A scenario is YAML::

    name: reduce-demo                 # optional, defaults to the file name
    seed: 1                           # all randomness derives from it
    mode: data                        # timing | data
    machine:
      profile: demo                   # scenarios/machines/demo.yaml, or a path
      overrides: {pe_link: {latency: 10ns}}
    workload:
      kind: reduce                    # one of the profile family's workloads
      params: {rounds: 4}
    faults: []                        # see emulator/faults.py
    trace: {enabled: true, payloads: true, kinds: [send, deliver], actors: ["cube05/*"]}
    stop: {max_time: 1ms, wall_timeout: 60s}
    output: {dir: runs/reduce-demo}
    inputs_root: ..                   # optional: files it names may lie anywhere under this folder

Every file a scenario names (its profile, a profile's ``extends:``, workload
input files) must lie under its folder, the shipped scenarios/ tree, an
``--allow-path`` folder or ``inputs_root:`` (emulator/input_paths.py).

Validation happens in layers, each against a schema (emulator/schema.py), and
every error names the file, the line, the key path, what was expected and what
was found: the scenario itself, then the machine profile with the overrides
merged in (errors in overridden keys point at the override in the scenario),
then the workload parameters against the workload's own schema.

``--set key.path=value`` (``sets``) edits the scenario before validation; the
value is parsed as YAML (``--set seed=3``, ``--set machine.overrides.pe_link.latency=10ns``).

This module knows no machine: the caller passes a *registry* with a
``family(name)`` function returning a module that has ``PROFILE_SCHEMA`` and
``WORKLOADS`` (see ``actors/registry.py``).
"""
from __future__ import annotations

import copy
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from emulator.input_paths import SHIPPED, check_inputs_root, confined_file, input_roots
from emulator.units import WALL_TIME_MAX
from emulator.schema import (AnyValue, Bool, Doc, Enum, Int, List, Map, Problem, Quantity, SchemaError, Str,
                             load_yaml, read_text, validate)
from emulator.trace import KIND_CODES
from emulator.uncertainty import KEY as UNCERTAINTY, check_uncertainty, leaf_paths, split_uncertainty

__all__ = ["Scenario", "load_scenario", "SCENARIO_SCHEMA", "find_profile", "apply_set", "deep_merge", "load_profile",
           "scenario_path"]

ROOT = Path(__file__).resolve().parents[1]
MACHINES_DIR = SHIPPED / "machines"


def _fault_schema():
    from emulator.faults import FAULT_SCHEMA
    return FAULT_SCHEMA


SCENARIO_SCHEMA = Map({
    "name": Str(default=None, doc="defaults to the file name"),
    "description": Str(default=""),
    "seed": Int(min=0, default=0, doc="the root of every random stream"),
    "mode": Enum(["timing", "data"], default="timing",
                 doc="timing: tensors travel as descriptors; data: real numpy arrays"),
    "machine": Map({
        "profile": Str(doc="a profile name under scenarios/machines/ or a path to a YAML file"),
        "overrides": Map(open=True, default={}, doc="keys merged into the profile"),
    }),
    "workload": Map({
        "kind": Str(doc="one of the machine family's workloads"),
        "params": Map(open=True, default={}, doc="checked against the workload's schema"),
    }),
    "faults": List(AnyValue(), default=[], doc="fault and delay injections (emulator/faults.py)"),
    "trace": Map({
        "enabled": Bool(default=False, doc="true: keep the trace whatever its size and export Perfetto JSON; "
                                           "false: no trace; unset: a bundle keeps a trace up to 256 MB "
                                           "(docs/outputs.md)"),
        "path": Str(default=None, doc="defaults to <output dir>/trace.emutrace"),
        "payloads": Bool(default=True, doc="store message payloads (needed by emu trace replay)"),
        "kinds": List(Enum(sorted(KIND_CODES)), default=None, doc="event kinds to keep (default: all)"),
        "actors": List(Str(), default=None, doc="actor name globs to keep"),
        "links": List(Str(), default=None, doc="link name globs to keep"),
    }, required=False),
    "stop": Map({
        "max_time": Quantity("time", default=None, doc="stop when virtual time would pass this"),
        "wall_timeout": Quantity("time", high=WALL_TIME_MAX, default=None, doc="wall-clock guard over build, run and check "
                                                           "(unset: 1h); status wall-timeout, exit 5"),
    }, required=False),
    "output": Map({
        "dir": Str(default=None, doc="result bundle directory (default runs/<name>)"),
        "plots": Bool(default=False, doc="write PNG plots into the bundle (also: emu run --plots)"),
    }, required=False),
    "interval": Map({
        "pin": List(Str(), default=[], doc="declared uncertain profile keys emu interval keeps at their value"),
    }, required=False, doc="emu interval (docs/interval.md)"),
    "inputs_root": Str(default=None, doc="a folder (relative to the scenario, containing it: '..') under which "
                                         "the files the scenario names may lie; default: the scenario's folder "
                                         "(docs/scenario.md, \"Files a scenario names\")"),
})


@dataclass
class Scenario:
    file: str
    name: str
    description: str
    seed: int
    mode: str
    profile_name: str
    profile_file: str
    family: str
    profile: dict
    workload: str
    params: dict
    faults: list
    trace: dict
    stop: dict
    output: dict
    source: dict = field(default_factory=dict)   # the scenario as written (after --set)
    where: dict = field(default_factory=dict)    # key path -> (file or "--set ...", line) of what the file states
    input_roots: dict = field(default_factory=dict)   # folder -> why: where the files it names may lie
    uncertainty: dict = field(default_factory=dict)   # key -> Uncertain: the profile's declared ranges

    def locate(self, message: str) -> str:
        """``message`` (``"workload.params.C: ..."``, as build errors start) prefixed with where that key is set:
        ``file:line: workload.params.C: ...``; a key the file does not state names the file alone."""
        key = message.split(":", 1)[0].strip()
        if not key or " " in key or key.count(".") == 0 and key not in self.source:
            return f"{self.file}: {message}"
        path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        while path and path not in self.where:
            path = path[:-1]
        origin, line = self.where.get(path, (self.file, None))
        return f"{origin}:{line}: {message}" if line else f"{origin}: {message}"

    def resolved(self) -> dict:
        """The fully resolved scenario (profile merged, units parsed), for result bundles."""
        return {
            "name": self.name, "file": self.file, "seed": self.seed, "mode": self.mode,
            "machine": {"profile": self.profile_name, "profile_file": self.profile_file, "family": self.family,
                        "resolved": self.profile},
            "workload": {"kind": self.workload, "params": self.params},
            "faults": self.faults, "trace": self.trace, "stop": self.stop, "output": self.output,
            "input_roots": self.input_roots,
        }


def scenario_path(path) -> Path:
    """``path`` as given, or -- relative and missing from the current directory -- the same path in the
    emulator's own source tree (``scenarios/demo/reduce.yaml`` works from any directory, as in the README)."""
    p = Path(path)
    if not p.is_absolute() and not p.exists() and (ROOT / p).is_file():
        return ROOT / p
    return p


def find_profile(name: str, scenario_file: str, roots: dict | None = None, *, key: str = "machine.profile",
                 where: tuple | None = None) -> Path | None:
    """Where profile ``name`` lives: a path (relative to the scenario) or a name, looked up in ``machines/``
    folders beside the scenario and up its parents, then in scenarios/machines/; the first file found must
    lie under ``roots`` (default: the scenario's folder and the shipped tree), else a SchemaError at ``where``
    naming ``key`` (emulator/input_paths.py)."""
    base = Path(scenario_file).resolve().parent
    candidates = []
    if name.endswith((".yaml", ".yml")) or "/" in name:
        candidates += [base / name, Path(name)]
    else:
        for d in [base, *base.parents]:
            candidates.append(d / "machines" / f"{name}.yaml")
            candidates.append(d / "scenarios" / "machines" / f"{name}.yaml")
            if d == d.parent:
                break
        candidates.append(MACHINES_DIR / f"{name}.yaml")
    return confined_file(candidates, key, name, roots if roots is not None else input_roots(base),
                         where or (str(scenario_file), None), first=True)


def known_profiles() -> list[str]:
    return sorted(p.stem for p in MACHINES_DIR.glob("*.yaml"))


def _parse_set(item: str) -> tuple[list, Any]:
    if "=" not in item:
        raise SchemaError([Problem("--set", None, item, "key.path=value", repr(item))])
    key, _, text = item.partition("=")
    try:
        value = load_yaml(text, f"--set {key}").value if text.strip() else ""
    except SchemaError as e:   # the same limits as a file (NUL, depth, aliases)
        for p in e.problems:
            p.path = key + (p.path and "." + p.path)
        raise
    path = [int(p) if p.isdigit() else p for p in key.strip().split(".") if p != ""]
    if not path:
        raise SchemaError([Problem("--set", None, key, "a key path like machine.overrides.x", repr(item))])
    return path, value


def apply_set(doc: Doc, item: str) -> None:
    """Apply one ``--set key.path=value`` to a loaded document (records the origin)."""
    path, value = _parse_set(item)
    node = doc.value
    for i, key in enumerate(path[:-1]):
        if isinstance(node, list):
            if not isinstance(key, int) or key >= len(node):
                raise SchemaError([Problem("--set", None, ".".join(map(str, path[:i + 1])),
                                           f"an index below {len(node)}", repr(key))])
            node = node[key]
            continue
        if not isinstance(node, dict):
            raise SchemaError([Problem("--set", None, ".".join(map(str, path[:i])), "a map", type(node).__name__)])
        if key not in node or not isinstance(node[key], (dict, list)):
            node[key] = {}
        node = node[key]
    last = path[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or last >= len(node):
            raise SchemaError([Problem("--set", None, item, f"an index below {len(node)}", repr(last))])
    node[last] = value
    here = tuple(path)
    for table in (doc.lines, doc.origins):    # what the file said under this path is gone: so are its lines
        for k in [k for k in table if k[:len(here)] == here]:
            del table[k]
    doc.origins[here] = (f"--set {item}", None)


def deep_merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in, map by map (``over`` wins); neither input is modified."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def read_profile(path: Path, _chain: tuple = (), roots: dict | None = None) -> Doc:
    """A machine profile document with its ``extends:`` chain resolved.

    A profile may name a parent (``extends: ahbm``, found like
    ``machine.profile``); the parent is read first and this file's keys are
    merged over it, map by map, so a concrete profile states only what differs
    (gem5's parameter inheritance, SST's parameter-set layering). Every key
    keeps the file and line that set it, so an error in an inherited value names
    the parent file.  The parent must lie under ``roots`` (those of the scenario that named this profile;
    default: this profile's folder and the shipped tree).
    """
    doc = load_yaml(read_text(str(path)), str(path))
    if not isinstance(doc.value, dict):
        raise SchemaError([Problem(str(path), 1, "", "a map of machine parameters", type(doc.value).__name__)])
    parent = doc.value.pop("extends", None)
    if parent is None:
        return doc
    where = doc.where(("extends",))
    if not isinstance(parent, str):
        raise SchemaError([Problem(*where, "extends", "a machine profile name or path", repr(parent))])
    parent_path = find_profile(parent, str(path), roots, key="extends", where=where)
    if parent_path is None:
        close = difflib.get_close_matches(parent, known_profiles(), n=1)
        raise SchemaError([Problem(*where, "extends", "a machine profile name or path (known: "
                                   + ", ".join(known_profiles()) + ")", repr(parent),
                                   f"did you mean {close[0]!r}?" if close else "")])
    chain = _chain + (Path(path).resolve(),)
    if parent_path.resolve() in chain:
        raise SchemaError([Problem(*where, "extends", "a profile that does not extend itself",
                                   " -> ".join(p.stem for p in chain + (parent_path.resolve(),)))])
    base = read_profile(parent_path, chain, roots)
    for key, line in base.lines.items():
        base.origins.setdefault(key, (base.file, line))
    declared = doc.value.pop(UNCERTAINTY, None)
    base.value = _merge(base.value, doc.value, (), base.origins, doc, ())
    _replace_entries(base, doc, declared)
    base.file, base.lines = doc.file, doc.lines      # unplaced problems name the concrete profile
    return base


def _replace_entries(base: Doc, doc: Doc, declared) -> None:
    """A child profile's ``uncertainty:`` entries replace the parent's whole (a ``spread`` is not merged
    with an inherited ``range``), each keeping the child's lines (emulator/uncertainty.py)."""
    if declared is None:
        return
    inherited = base.value.get(UNCERTAINTY)
    if not isinstance(declared, dict) or not isinstance(inherited, dict):
        base.value[UNCERTAINTY] = declared          # a wrong shape is reported by check_uncertainty
        base.origins[(UNCERTAINTY,)] = doc.where((UNCERTAINTY,))
        return
    for key, entry in declared.items():
        inherited[key] = entry
        here = (UNCERTAINTY, key)
        for path in [p for p in base.origins if p[:2] == here]:
            del base.origins[path]
        base.origins.update({p: (doc.file, line) for p, line in doc.lines.items() if p[:2] == here})


def load_profile(name: str, schema, overrides: dict | None = None) -> dict:
    """A validated machine profile ``scenarios/machines/<name>.yaml`` with ``overrides`` merged (tests, tools)."""
    doc = read_profile(MACHINES_DIR / f"{name}.yaml")
    split_uncertainty(doc)
    doc.value = deep_merge(doc.value, overrides or {})
    return validate(schema, doc)


def _merge(base: dict, over: dict, path: tuple, origins: dict, over_doc: Doc, over_root: tuple) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, path + (k,), origins, over_doc, over_root + (k,))
        else:
            out[k] = copy.deepcopy(v)
            origins[path + (k,)] = over_doc.where(over_root + (k,))
    return out


def _raw(value: Any, *path, kind=str):
    """``value[path...]`` as written, when it is of ``kind`` (a fallback while an earlier layer has problems)."""
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value if isinstance(value, kind) else None


class _Problems(list):
    """The problems of every layer of a scenario, collected (load_scenario)."""

    def attempt(self, check, rename=None):
        """``check()``, or None with its problems kept (their key paths renamed by ``rename``)."""
        try:
            return check()
        except SchemaError as e:
            for p in e.problems:
                if rename is not None:
                    p.path = rename(p.path)
            self.extend(e.problems)
            return None


def _profile_layer(doc: Doc, prof_name, file: str, registry, problems: _Problems, roots: dict):
    """``(family module, family name, validated profile, profile path, declared uncertainty)``; parts are None
    where they are wrong."""
    family = family_name = profile = None
    declared = {}
    prof_path, known = None, len(problems)
    if prof_name is not None:
        prof_path = problems.attempt(lambda: find_profile(prof_name, file, roots,
                                                          where=doc.where(("machine", "profile"))))
        if len(problems) > known:
            return family, family_name, profile, prof_path, declared   # found, but outside the roots: said
    if prof_name is not None and prof_path is None:
        close = difflib.get_close_matches(prof_name, known_profiles(), n=1)
        problems.append(Problem(*doc.where(("machine", "profile")), "machine.profile",
                                "a machine profile name or path (known: " + ", ".join(known_profiles()) + ")",
                                repr(prof_name), f"did you mean {close[0]!r}?" if close else ""))
    if prof_path is None:
        return family, family_name, profile, prof_path, declared
    pdoc = problems.attempt(lambda: read_profile(prof_path, roots=roots))
    if pdoc is None:
        return family, family_name, profile, prof_path, declared
    raw_uncertainty = split_uncertainty(pdoc)
    family_name = pdoc.value.get("family")
    try:
        family = registry.family(family_name)
    except (KeyError, TypeError):
        problems.append(Problem(*pdoc.where(("family",)), "family",
                                "a machine family (" + ", ".join(registry.FAMILIES) + ")", repr(family_name)))
        return None, family_name, profile, prof_path, declared
    overrides = _raw(doc.value, "machine", "overrides", kind=dict) or {}
    pdoc.value = _merge(pdoc.value, overrides, (), pdoc.origins, doc, ("machine", "overrides"))
    profile = problems.attempt(lambda: validate(family.PROFILE_SCHEMA, pdoc))
    if profile is not None:
        pinned = _pinned(raw_uncertainty, overrides, doc, problems)
        declared = problems.attempt(lambda: check_uncertainty(raw_uncertainty, pdoc, family.PROFILE_SCHEMA,
                                                              profile, pinned)) or {}
    return family, family_name, profile, prof_path, declared


def _pinned(raw, overrides: dict, doc: Doc, problems: _Problems) -> set:
    """The declared keys the scenario fixes: set by ``machine.overrides`` (or a key above or below one) or
    named in ``interval.pin`` (which must name declared keys)."""
    declared = [str(k) for k, v in raw.items() if v is not None] if isinstance(raw, dict) else []
    over = leaf_paths(overrides)

    def overlaps(a: str, b: str) -> bool:
        return a == b or a.startswith(b + ".") or b.startswith(a + ".")

    pinned = {k for k in declared if any(overlaps(k, o) for o in over)}
    pins = _raw(doc.value, "interval", "pin", kind=list) or []
    for i, key in enumerate(pins):
        if key in declared:
            pinned.add(key)
        else:
            close = difflib.get_close_matches(str(key), declared, n=1)
            problems.append(Problem(*doc.where(("interval", "pin", i)), f"interval.pin[{i}]",
                                    f"a key the profile declares uncertain ({len(declared)} in its uncertainty: "
                                    "map, listed by emu explain)", repr(key),
                                    f"did you mean {close[0]!r}?" if close else ""))
    return pinned


def _workload_layer(doc: Doc, family, family_name, kind, profile, mode, file: str, problems: _Problems):
    """The workload's validated parameters (None where they or what they need are wrong)."""
    if family is None or kind is None:
        return None
    workloads = family.WORKLOADS
    if kind not in workloads:
        close = difflib.get_close_matches(kind, list(workloads), n=1)
        problems.append(Problem(*doc.where(("workload", "kind")), "workload.kind",
                                f"a workload of machine family {family_name!r}: " + ", ".join(workloads),
                                repr(kind), f"did you mean {close[0]!r}?" if close else ""))
        return None
    params_doc = Doc(_raw(doc.value, "workload", "params", kind=dict) or {}, {}, file)
    params_doc.lines = {k[2:]: v for k, v in doc.lines.items() if k[:2] == ("workload", "params")}
    params_doc.origins = {k[2:]: v for k, v in doc.origins.items() if k[:2] == ("workload", "params")}
    params = problems.attempt(lambda: validate(workloads[kind].params, params_doc),
                              lambda path: "workload.params." + path if path else "workload.params")
    limits = getattr(workloads[kind], "limits", None)
    if limits is not None and params is not None and profile is not None:
        problems.extend(Problem(*params_doc.where((key,)), f"workload.params.{key}", expected, found)
                        for key, expected, found in limits(profile, params, mode) or [])
    return params


def _faults_layer(doc: Doc, file: str, problems: _Problems) -> list:
    raw = doc.value.get("faults")
    if not raw or not isinstance(raw, list):
        return []
    fdoc = Doc(raw, {k[1:]: v for k, v in doc.lines.items() if k[:1] == ("faults",)}, file)
    fdoc.origins = {k[1:]: v for k, v in doc.origins.items() if k[:1] == ("faults",)}
    return problems.attempt(lambda: validate(List(_fault_schema()), fdoc),
                            lambda path: "faults" + (path if path.startswith("[") else "." + path if path else "")) or []


def load_scenario(path: str, registry, sets: list[str] | None = None, *, allow=()) -> Scenario:
    """Load and validate a scenario file; raises :class:`SchemaError` with every problem found.

    ``allow``: folders (``--allow-path``) the files it names may lie under besides its own folder (or its
    ``inputs_root:``) and the shipped scenarios/ tree (emulator/input_paths.py).

    Every layer is checked even when an earlier one has problems (the scenario's
    own keys, the profile with the overrides, the workload parameters and their
    limits, the faults), so a file with several mistakes is reported in one go;
    a layer is skipped only when what it needs is itself wrong (a workload's
    parameters need a known workload kind, its limits a valid profile).
    """
    file = str(path)
    if not os.path.isfile(file):
        raise SchemaError([Problem(file, None, "", "an existing scenario file", "no such file")])
    doc = load_yaml(read_text(file), file)
    if doc.value is None:
        doc.value = {}
    if not isinstance(doc.value, dict):
        raise SchemaError([Problem(file, 1, "", "a map of scenario keys", type(doc.value).__name__)])
    for item in sets or []:
        apply_set(doc, item)
    source = copy.deepcopy(doc.value)
    problems = _Problems()
    sc = problems.attempt(lambda: validate(SCENARIO_SCHEMA, doc))
    written = doc.value            # where the scenario's own keys are wrong, later layers read what is written
    prof_name = sc["machine"]["profile"] if sc else _raw(written, "machine", "profile")
    kind = sc["workload"]["kind"] if sc else _raw(written, "workload", "kind")
    mode = sc["mode"] if sc else ("data" if _raw(written, "mode") == "data" else "timing")
    roots = _input_roots(doc, file, allow, problems)
    family, family_name, profile, prof_path, declared = _profile_layer(doc, prof_name, file, registry, problems,
                                                                        roots)
    params = _workload_layer(doc, family, family_name, kind, profile, mode, file, problems)
    faults = _faults_layer(doc, file, problems)
    if problems:
        raise SchemaError(list(problems))

    where = {k: (file, line) for k, line in doc.lines.items()}
    where.update(doc.origins)
    return Scenario(
        file=file, name=sc["name"] or Path(file).stem, description=sc["description"], seed=sc["seed"],
        mode=sc["mode"], profile_name=prof_name, profile_file=str(prof_path), family=family_name, profile=profile,
        workload=kind, params=params, faults=faults, trace=sc["trace"], stop=sc["stop"], output=sc["output"],
        source=source, where=where, input_roots=roots, uncertainty=declared,
    )


def _input_roots(doc: Doc, file: str, allow, problems: _Problems) -> dict:
    """The folders the scenario's files may lie under; a bad ``inputs_root:`` is a problem (and ignored)."""
    value = _raw(doc.value, "inputs_root")
    folder = None
    if value is not None:
        folder, expected, found = check_inputs_root(value, file)
        if folder is None:
            problems.append(Problem(*doc.where(("inputs_root",)), "inputs_root", expected, found))
    return input_roots(Path(file).parent, allow=allow, inputs_root=folder)

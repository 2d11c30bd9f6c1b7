"""Component declarations for the CLI: ``emu explain`` and ``emu validate --schema`` print each component
class's declared ports and parameters (emulator/declare.py), never what a build happened to create.

* :func:`family_components` - every declared actor class of a machine family (its package's ``Actor``
  subclasses with ``PORTS`` or ``PARAMS``), so ``validate --schema`` lists them without building;
* :func:`schema_notes` - per profile key, the classes that read it (and a parameter's doc where the
  schema has none), for the profile schema listing;
* :func:`describe_components` - the lines for a list of classes, defaults from the scenario's schemas and
  current values from the resolved scenario.
"""
from __future__ import annotations

from emulator.actor import Actor
from emulator.declare import (WORKLOAD_PREFIX, ParamView, describe_class, params_for, params_of, ports_of,
                              schema_spec, value_at)
from emulator.errors import BuildError
from emulator.schema import Map

__all__ = ["family_components", "schema_notes", "describe_components", "components_json"]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def family_components(family_module) -> list[type]:
    """The declared component classes of a family, by module then name (their modules are imported by then:
    the family module imports its builders)."""
    package = family_module.__name__.rsplit(".", 1)[0] + "."
    found = {c for c in _subclasses(Actor) if c.__module__.startswith(package) and (ports_of(c) or params_of(c))}
    return sorted(found, key=lambda c: (c.__module__, c.__name__))


def scenario_schema(profile_schema: Map, workload_schema: Map | None = None) -> Map:
    """One schema for a component's key paths: the profile's keys, and ``workload.params.<k>``."""
    fields = dict(profile_schema.fields)
    if workload_schema is not None:
        fields["workload"] = Map({"params": workload_schema})
    return Map(fields)


def schema_notes(classes, schema: Map) -> dict[str, str]:
    """``{dotted key: note}``: which classes read each key; a parameter's doc when the schema gives none."""
    readers: dict[str, list[str]] = {}
    docs: dict[str, str] = {}
    for cls in classes:
        for p in params_of(cls).values():
            for key in p.keys:
                readers.setdefault(key, []).append(cls.__name__)
                docs.setdefault(key, p.doc)
    notes = {}
    for key, names in readers.items():
        spec = schema_spec(schema, key)
        doc = "" if spec is None or spec.doc else f" - {docs[key]}"
        notes[key] = f"{doc} (read by {', '.join(sorted(set(names)))})"
    return notes


def _values(cls, instance, profile: dict, params: dict | None) -> dict:
    """The values ``cls`` reads in this scenario: from the view its ``instance`` was given (AHBM, demo), else
    computed by the declarations from the profile (pccx), else read at each single key path."""
    for v in vars(instance).values() if instance is not None else ():
        if isinstance(v, ParamView) and v._view_cls is cls:
            return v.kwargs()
    try:
        return params_for(cls, profile).kwargs()
    except BuildError:
        pass
    values = {}
    for p in params_of(cls).values():
        if len(p.keys) == 1 and p.value is None:
            key = p.keys[0]
            src = params if key.startswith(WORKLOAD_PREFIX) else profile
            v = value_at(src or {}, key.removeprefix(WORKLOAD_PREFIX))
            if v is not None:
                values[p.name] = v
    return values


def describe_components(classes, schema: Map, profile: dict | None = None, params: dict | None = None,
                        instances: dict | None = None) -> list[str]:
    """Lines for ``classes``: ports with message types, parameters with unit, key path, default (``schema``),
    with a ``profile``: the value each reads in this scenario (``instances``: one built actor per class), doc."""
    lines = []
    for cls in classes:
        values = None
        if profile is not None:
            values = _values(cls, (instances or {}).get(cls), profile, params)
        lines += describe_class(cls, schema, values)
    return lines


def components_json(classes) -> dict:
    """The declarations of ``classes`` as data (``emu explain --json``)."""
    return {cls.__name__: {
        "module": cls.__module__,
        "ports": [{"name": p.name, "direction": p.direction, "messages": p.message_names, "doc": p.doc}
                  for p in ports_of(cls).values()],
        "params": [{"name": p.name, "keys": list(p.keys), "unit": p.unit, "doc": p.doc}
                   for p in params_of(cls).values()],
    } for cls in classes}

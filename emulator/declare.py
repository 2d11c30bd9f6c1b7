"""Declared ports and parameters of a component class (DESIGN.md §7).

Every actor class states, as class attributes, what it is:

* ``PORTS``: its ports - :func:`In` / :func:`Out` with a name or a name
  pattern (``done_{client}``, ``pc{i}``: one ``{field}`` stands for any run of
  characters without ``/``; where several match, the one with the most
  literal characters wins), the message types the port accepts (in) or sends
  (out) and a one-line doc.  Like SST's ``SST_ELI_DOCUMENT_PORTS``.
* ``PARAMS``: the parameters it reads - :class:`Param` with the name the
  component reads, the profile (or workload) key path(s) it comes from, its
  unit and a doc; like SST's ``SST_ELI_DOCUMENT_PARAMS`` and gem5's
  ``Param.Latency("...")`` class attributes.  Defaults live in the family's
  schema (one place); :func:`schema_spec` finds a parameter's default there.

A subclass states only what differs (gem5: a concrete part is a subclass):
:func:`ports_of` / :func:`params_of` merge the declarations along the MRO, a
later declaration of the same name replacing the earlier one.

How a component gets its parameters (one rule for every family): the builder
hands it :func:`params_for` ``(cls, source)``, a :class:`ParamView` holding
exactly the declared parameters - as ``prm=`` (AHBM: over the derived
:class:`~actors.ahbm.params.Params`; demo: over the workload parameters) or
unpacked as keyword arguments (``**params_for(...).kwargs()``, pccx: each
declaration computes its value from the profile).  Reading an undeclared
parameter through the view raises at once, so declarations cannot fall behind
the code.

Checks, once per build (never per message; :func:`check_system`):

* every port an actor created matches one declared port of its class, with the
  right direction;
* every link joins an out-port to an in-port that accepts every message type
  the out-port declares it sends (the wiring type-checks, as SST's port
  declarations allow).

Whether an actor really sends only its declared types is checked by the test
suite (tests/test_declare.py), which records every send of small runs of every
family: a check per message would slow the engine's hot path.
"""
from __future__ import annotations

import re
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from emulator.errors import BuildError

__all__ = ["ANY", "Port", "In", "Out", "Param", "ParamView", "ports_of", "params_of", "params_for", "declared_port",
           "check_actor", "check_system", "schema_spec", "value_at", "describe_class"]


# -- ports ----------------------------------------------------------------------------------------------------
#: the message "type" of a generic port that carries whatever it is given (a test source or sink): a link with
#: an ANY end is not type-checked at build
ANY = object


@dataclass(frozen=True)
class Port:
    """One declared port (or family of ports, by pattern) of a component class."""

    name: str                       # "cmd", or a pattern "done_{client}"
    direction: str                  # "in" | "out"
    messages: tuple                 # message classes it accepts (in) / sends (out)
    doc: str
    idle: bool = False              # a request queue (Actor.in_port(idle=True))
    pattern: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.direction not in ("in", "out"):
            raise ValueError(f"port {self.name!r}: direction is 'in' or 'out', not {self.direction!r}")
        rx = re.sub(r"\\{\w+\\}", "[^/]+", re.escape(self.name))
        object.__setattr__(self, "pattern", re.compile(rx + r"\Z"))

    def matches(self, name: str) -> bool:
        return self.pattern.match(name) is not None

    @property
    def specificity(self) -> int:
        """Literal characters of the name: when several declarations match a port, the most specific wins
        (``out_pe{p}`` over ``out_{dir}``)."""
        return len(re.sub(r"\{\w+\}", "", self.name))

    @property
    def message_names(self) -> list[str]:
        return [m.__name__ for m in self.messages]


def In(name: str, *messages: type, doc: str, idle: bool = False) -> Port:
    """A declared in-port accepting ``messages``."""
    return Port(name, "in", tuple(messages), doc, idle)


def Out(name: str, *messages: type, doc: str) -> Port:
    """A declared out-port sending ``messages``."""
    return Port(name, "out", tuple(messages), doc)


# -- parameters ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """One parameter a component reads.

    ``name``: what the component reads (``prm.<name>``, ``p["<name>"]`` or its keyword argument);
    ``key``: the profile key path(s) it comes from (``"hbm.access_latency"``; several for a derived value;
    ``workload.params.<k>`` for a workload parameter); ``unit``: ``ps``, ``B/s``, ``B``, ``cycles``,
    ``count``, ``bool``, ``choice``, ``table``...; ``value``: how the value is computed from the source
    when it is not the source's own ``name`` (a derived quantity: its formula is in the doc).
    """

    name: str
    key: str | tuple
    unit: str
    doc: str
    value: Callable | None = None

    @property
    def keys(self) -> tuple:
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)


#: key-path prefix of a parameter that comes from the scenario's workload parameters, not the machine profile
WORKLOAD_PREFIX = "workload.params."


def _merged(cls, attr: str) -> dict:
    out: dict = {}
    for klass in reversed(cls.__mro__):
        for d in klass.__dict__.get(attr, ()):
            out[d.name] = d
    return out


def ports_of(cls) -> dict[str, Port]:
    """The declared ports of ``cls`` by name (its own and inherited; a subclass overrides by name)."""
    return _merged(cls, "PORTS")


def params_of(cls) -> dict[str, Param]:
    """The declared parameters of ``cls`` by name (its own and inherited; a subclass overrides by name)."""
    return _merged(cls, "PARAMS")


class ParamView:
    """The declared parameters of one component class, read from ``source`` once.

    Attribute access (``prm.burst``) and item access (``p["merge"]``) both work.  The values are plain
    instance attributes (no per-read cost); only a miss - an undeclared name - reaches
    :meth:`__getattr__`, which raises.  Properties and methods of the source's class (AHBM
    ``Params.cubes``, ``Params.global_x``) are available too and run against the view, so what they read
    must be declared as well.
    """

    __slots__ = ("__dict__", "_view_cls", "_view_source")

    def __init__(self, cls: type, source_type: type, values: dict):
        self.__dict__.update(values)
        object.__setattr__(self, "_view_cls", cls)
        object.__setattr__(self, "_view_source", source_type)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._view_source, name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if isinstance(attr, types.FunctionType):
            return types.MethodType(attr, self)
        cls = self._view_cls
        raise AttributeError(f"{cls.__name__} reads parameter {name!r}, which it does not declare"
                             f" (add Param({name!r}, ...) to {cls.__name__}.PARAMS, {cls.__module__})")

    def __getitem__(self, name: str):
        try:
            return self.__dict__[name]
        except KeyError:
            return self.__getattr__(name)

    def __setattr__(self, name, value):
        raise AttributeError(f"{self._view_cls.__name__}'s parameters are read-only ({name})")

    def __reduce__(self):   # copy / pickle: the same class, source type and values
        return ParamView, (self._view_cls, self._view_source, dict(self.__dict__))

    def kwargs(self) -> dict:
        """The values as keyword arguments of the component's constructor."""
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"<params of {self._view_cls.__name__}: {', '.join(sorted(self.__dict__))}>"


def _lookup(source, p: Param):
    if p.value is not None:
        return p.value(source)
    if isinstance(source, dict):   # a profile, or a workload's parameters (keys "workload.params.<k>")
        node = source
        for part in p.keys[0].removeprefix(WORKLOAD_PREFIX).split("."):
            node = node[part]
        return node
    return getattr(source, p.name)


def params_for(cls: type, source: Any) -> ParamView:
    """The view of ``source`` that ``cls`` may read: exactly its declared parameters."""
    try:
        return ParamView(cls, type(source), {name: _lookup(source, p) for name, p in params_of(cls).items()})
    except (AttributeError, KeyError) as e:
        raise BuildError(f"{cls.__name__}: a declared parameter is missing from its source"
                         f" {type(source).__name__}: {e}") from None


# -- checks -------------------------------------------------------------------------------------------------------
_PORT_CACHE: dict = {}


def declared_port(cls: type, direction: str, name: str) -> Port | None:
    """The declaration of ``cls`` matching port ``name`` (cached per class and name), or ``None``."""
    key = (cls, direction, name)
    hit = _PORT_CACHE.get(key)
    if hit is None and key not in _PORT_CACHE:
        hits = [p for p in ports_of(cls).values() if p.direction == direction and p.matches(name)]
        hit = max(hits, key=lambda p: p.specificity) if hits else None
        _PORT_CACHE[key] = hit
    return hit


def check_actor(actor) -> list[str]:
    """Problems with ``actor``'s ports against its class's declarations (empty: none)."""
    cls = type(actor)
    out = []
    for direction, ports in (("in", actor.inputs), ("out", actor.outputs)):
        for name in ports:
            if declared_port(cls, direction, name) is None:
                out.append(f"{actor.name}: {direction}-port {name!r} is not declared in {cls.__name__}.PORTS")
    start = getattr(cls, "starts_on", None)
    if start is not None:   # Actor.starts_on: a server started by its first request
        port = actor.inputs.get(start)
        if not actor.daemon or port is None or not port.idle:
            out.append(f"{actor.name}: {cls.__name__}.starts_on = {start!r} needs a daemon class and an in-port of that"
                       f" name made with idle=True; found daemon={actor.daemon}, in-ports"
                       f" {', '.join(f'{n} (idle={q.idle})' for n, q in actor.inputs.items()) or '(none)'}")
    return out


def check_system(system) -> None:
    """Check every actor's ports and every link's message types against the declarations (module docstring);
    raises :class:`BuildError` listing the problems."""
    problems: list[str] = []
    for actor in system.actors.values():
        problems += check_actor(actor)
    seen = set()
    for link in system.links:
        src, dst = link.src, link.dst
        key = (type(src.owner), src.name, type(dst.owner), dst.name)
        if key in seen:
            continue
        seen.add(key)
        out = declared_port(type(src.owner), "out", src.name)
        inp = declared_port(type(dst.owner), "in", dst.name)
        if out is None or inp is None:
            continue   # reported above
        if ANY in out.messages or ANY in inp.messages:
            continue
        missing = [m.__name__ for m in out.messages if m not in inp.messages]
        if missing:
            problems.append(f"link {link.name}: {type(src.owner).__name__}.{out.name} sends {', '.join(missing)},"
                            f" which {type(dst.owner).__name__}.{inp.name} does not accept"
                            f" (accepts {', '.join(inp.message_names) or 'nothing'})")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise BuildError("components do not match their declarations:\n  " + "\n  ".join(shown))


# -- description ----------------------------------------------------------------------------------------------------
def value_at(resolved: dict, key: str):
    """The value at dotted ``key`` of a nested dict, ``None`` where a part is missing."""
    node = resolved
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def schema_spec(schema, key: str):
    """The schema entry at dotted ``key`` of a family's profile schema (``None`` if it has none there)."""
    node = schema
    for part in key.split("."):
        fields = getattr(node, "fields", None)
        if not fields or part not in fields:
            return None
        node = fields[part]
    return node


def _default(schema, p: Param) -> str:
    if schema is None or len(p.keys) != 1:
        return ""
    spec = schema_spec(schema, p.keys[0])
    if spec is None or spec.required:
        return ""
    return f" [default {spec.default!r}]"


def describe_class(cls: type, schema=None, values: dict | None = None) -> list[str]:
    """Lines describing ``cls``'s declared ports and parameters (``emu explain``, ``emu validate --schema``):
    defaults from ``schema`` (the family's profile schema), current ``values`` if given."""
    lines = [f"{cls.__name__} ({cls.__module__}){': ' + cls.__doc__.strip().splitlines()[0] if cls.__doc__ else ''}"]
    ports = ports_of(cls)
    if ports:
        lines.append("  ports:")
        for p in ports.values():
            lines.append(f"    {p.direction:<3} {p.name:<16} {' | '.join(p.message_names) or '-':<28} {p.doc}")
    params = params_of(cls)
    if params:
        lines.append("  params:")
        for p in params.values():
            val = ""
            if values is not None and p.name in values:
                v = values[p.name]
                val = f" = {v if not isinstance(v, (dict, list, tuple)) or len(repr(v)) < 60 else type(v).__name__}"
            lines.append(f"    {p.name:<18} {p.unit:<8} {', '.join(p.keys)}{_default(schema, p)}{val} - {p.doc}")
    return lines

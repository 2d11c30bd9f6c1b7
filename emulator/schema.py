"""Declarative schemas for YAML documents, with errors a user can act on.

A schema is a tree of :class:`Spec` objects (:class:`Map`, :class:`List`,
:class:`Int`, :class:`Quantity`, ...).  :func:`validate` walks a YAML document
loaded by :func:`load_yaml` (which remembers the line of every key) and returns
the normalised value -- quantities parsed into the engine's integer units,
defaults filled in -- or raises :class:`SchemaError` listing *every* problem:
file, line, key path, what was expected, what was found, and for an unknown key
the closest valid key.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from emulator.errors import EmulatorError
from emulator.units import QUANTITY_RANGE, UNLIMITED, UnitError, format_quantity, parse_quantity

__all__ = [
    "Problem", "SchemaError", "Spec", "Map", "List", "Int", "Float", "Bool", "Str", "Enum", "Quantity",
    "AnyValue", "OneOf", "load_yaml", "validate", "Doc", "quote",
]

_MISSING = object()


@dataclass
class Problem:
    file: str
    line: int | None
    path: str
    expected: str
    found: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.path or '(top level)'}: expected {self.expected}, found {self.found}"
        return text + (f" ({self.hint})" if self.hint else "")


class SchemaError(EmulatorError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__()

    def __str__(self) -> str:  # built on demand: callers may refine the problems' paths
        n = len(self.problems)
        return f"{n} problem{'s' if n != 1 else ''}:\n" + "\n".join(f"  {p}" for p in self.problems)


class Doc:
    """A loaded YAML document: the value plus where each key path came from.

    ``lines`` maps a key path to a line number in ``file``; ``origins`` maps a
    key path to ``(file, line)`` for values merged in from elsewhere (machine
    profile overrides, ``--set`` on the command line).
    """

    def __init__(self, value: Any, lines: dict[tuple, int], file: str):
        self.value = value
        self.lines = lines
        self.file = file
        self.origins: dict[tuple, tuple[str, int | None]] = {}

    def where(self, path: tuple) -> tuple[str, int | None]:
        while True:
            if path in self.origins:
                return self.origins[path]
            if path in self.lines:
                return self.file, self.lines[path]
            if not path:
                return self.file, None
            path = path[:-1]


#: Input limits (issue 15): every file the tool reads is checked against them
#: before it is parsed, so a hostile file is a clear error, never a traceback or a hang.
MAX_FILE_BYTES = 4 * 2**20      # scenario, profile, fault list, sweep spec, .pasm: text files of a few KiB
MAX_DEPTH = 64                  # nesting of maps and lists (the shipped files use < 8)
MAX_NODES = 200_000             # values after alias expansion (a billion-laughs bomb needs 9**9)
#: Integers and quantities must fit the engine's 64-bit integer picoseconds with
#: room to add: a single value is at most 2**62, a virtual time at most 10**15 ps
#: (1000 s), so thousands of them can be summed without leaving int64 (msgpack).
MAX_INT = 2**62

_BAD_CHAR = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")


def read_text(path: str, *, what: str = "a UTF-8 text file", max_bytes: int = MAX_FILE_BYTES) -> str:
    """A text file's content within the input limits; any violation is a :class:`SchemaError` naming the file.

    Checked: the size (``max_bytes``), the encoding (UTF-8) and the characters
    (no NUL or other control characters YAML cannot hold), each reported with
    the line and what was found.
    """
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            raise SchemaError([Problem(str(path), None, "", f"{what} of at most {max_bytes} bytes",
                                       f"{size} bytes")])
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise SchemaError([Problem(str(path), None, "", "a readable file", e.strerror or str(e))]) from None
    return decode_text(raw, str(path), what=what)


def decode_text(raw: bytes, file: str, *, what: str = "a UTF-8 text file") -> str:
    """``raw`` as UTF-8 text without control characters, or a :class:`SchemaError` at the first bad byte."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise SchemaError([Problem(file, line, "", what, f"byte 0x{raw[e.start]:02x} at offset {e.start}, "
                                   "which is not UTF-8")]) from None
    check_characters(text, file)
    return text


def check_characters(text: str, file: str, origin_line: int | None = None) -> None:
    """Reject NUL and the other control characters YAML cannot hold (``yaml.reader`` would raise)."""
    m = _BAD_CHAR.search(text)
    if m:
        line = origin_line or text.count("\n", 0, m.start()) + 1
        name = "a NUL byte" if m.group() == "\0" else f"control character U+{ord(m.group()):04X}"
        raise SchemaError([Problem(file, line, "", "printable text", f"{name} at column "
                                   f"{m.start() - text.rfind(chr(10), 0, m.start())}")])


class _YamlShape(Exception):
    def __init__(self, line, path, expected, found):
        self.line, self.path, self.expected, self.found = line, path, expected, found


class _LimitedLoader(yaml.SafeLoader):
    """A safe loader that refuses nesting deeper than :data:`MAX_DEPTH` while composing.

    PyYAML composes recursively: a flow sequence 20,000 deep would end in a
    ``RecursionError``; counting the depth here stops it at the limit.
    """

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _YamlShape(mark.line + 1, (), f"at most {MAX_DEPTH} levels of nested maps and lists",
                                 f"more than {MAX_DEPTH}")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_yaml(text: str, file: str) -> Doc:
    """Parse YAML keeping line numbers; a syntax error becomes a :class:`SchemaError`.

    Also rejected, each as a clear problem: duplicate keys in a map (YAML would
    silently keep the last), recursive aliases (``&a [*a]``), control
    characters (NUL), nesting deeper than :data:`MAX_DEPTH`, and documents that
    expand to more than :data:`MAX_NODES` values through aliases (an alias bomb
    fails after MAX_NODES steps instead of expanding 9**9 values).
    """
    check_characters(text, file)
    if len(text) > MAX_FILE_BYTES:
        raise SchemaError([Problem(file, None, "", f"a text of at most {MAX_FILE_BYTES} bytes", f"{len(text)}")])
    loader = _LimitedLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[tuple, int] = {}
        value = _construct(loader, node, (), lines, set(), [0]) if node is not None else {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise SchemaError([Problem(file, line, "", "valid YAML", str(getattr(e, "problem", None) or e))]) from None
    except _YamlShape as e:
        raise SchemaError([Problem(file, e.line, _fmt_path(e.path), e.expected, e.found)]) from None
    except (RecursionError, MemoryError, OverflowError, ValueError) as e:  # last resort: never a traceback
        raise SchemaError([Problem(file, None, "", "a YAML document within the input limits",
                                   f"{type(e).__name__}: {str(e)[:80]}")]) from None
    finally:
        loader.dispose()
    return Doc(value, lines, file)


def _construct(loader, node, path, lines, active, count):
    line = node.start_mark.line + 1
    lines[path] = line
    count[0] += 1
    if count[0] > MAX_NODES:
        raise _YamlShape(line, path, f"at most {MAX_NODES} values after alias expansion",
                         "more (an alias bomb?)")
    if len(path) > MAX_DEPTH:
        raise _YamlShape(line, path, f"at most {MAX_DEPTH} levels of nesting after alias expansion",
                         "more")
    if id(node) in active:
        raise _YamlShape(line, path, "no recursive alias", "an alias that contains itself")
    if isinstance(node, yaml.MappingNode):
        active.add(id(node))
        out = {}
        for knode, vnode in node.value:
            if not isinstance(knode, yaml.ScalarNode):
                raise _YamlShape(knode.start_mark.line + 1, path, "a scalar key (a name)", "a map or list as a key")
            key = loader.construct_object(knode, deep=True)
            if key in out:
                raise _YamlShape(knode.start_mark.line + 1, path + (key,), "each key once in a map",
                                 f"{key!r} again (first at line {lines[path + (key,)]})")
            lines[path + (key,)] = knode.start_mark.line + 1
            out[key] = _construct(loader, vnode, path + (key,), lines, active, count)
        active.discard(id(node))
        return out
    if isinstance(node, yaml.SequenceNode):
        active.add(id(node))
        out = [_construct(loader, v, path + (i,), lines, active, count) for i, v in enumerate(node.value)]
        active.discard(id(node))
        return out
    return loader.construct_object(node, deep=True)


def _fmt_path(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


#: the most characters of a file's content an error quotes: the offending field, never a whole line
QUOTE_CHARS = 60


def quote(value, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters (``'...'`` marks the cut): how an error quotes a field."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _found(value) -> str:
    if value is _MISSING:
        return "nothing (the key is missing)"
    if value is None:
        return "null"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "map"}.get(
        type(value), type(value).__name__)
    return f"{kind} {quote(value)}" if kind not in ("list", "map") else kind


class _Ctx:
    def __init__(self, doc: Doc):
        self.doc = doc
        self.problems: list[Problem] = []

    def fail(self, path, expected, value, hint="", *, verbatim=False):
        file, line = self.doc.where(path)
        found = value if verbatim else _found(value)
        self.problems.append(Problem(file, line, _fmt_path(path), expected, found, hint))


class Spec:
    """Base of all schema nodes."""

    def __init__(self, *, default: Any = _MISSING, doc: str = "", required: bool | None = None):
        self.default = default
        self.doc = doc
        self.required = (default is _MISSING) if required is None else required

    expected = "a value"

    def check(self, value, path, ctx: _Ctx):  # -> normalised value
        return value

    def describe(self) -> str:
        return self.expected


class AnyValue(Spec):
    expected = "any value"


class _Number(Spec):
    """A number in an optional closed range; subclasses say which kind."""

    noun = "a number"
    types: tuple = (int, float)

    def __init__(self, *, min=None, max=None, **kw):
        super().__init__(**kw)
        self.min, self.max = min, max
        rng = [f">= {min}"] * (min is not None) + [f"<= {max}"] * (max is not None)
        self.expected = self.noun + (f" {' and '.join(rng)}" if rng else "")

    def convert(self, value):
        return value

    def check(self, value, path, ctx):
        if (isinstance(value, bool) or not isinstance(value, self.types)
                or (isinstance(value, float) and not math.isfinite(value))):
            ctx.fail(path, self.expected, value)
            return None
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            ctx.fail(path, self.expected, value)
            return None
        if abs(value) > MAX_INT:   # the engine's integer range, with room to add (see MAX_INT)
            ctx.fail(path, f"{self.expected} of magnitude at most 2**62 (the engine's integer range)", value)
            return None
        return self.convert(value)


class Int(_Number):
    noun = "an integer"
    types = (int,)


class Float(_Number):
    noun = "a finite number"

    def convert(self, value):
        return float(value)


class Bool(Spec):
    expected = "true or false"

    def check(self, value, path, ctx):
        if not isinstance(value, bool):
            ctx.fail(path, self.expected, value)
        return value


class Str(Spec):
    expected = "a string"

    def check(self, value, path, ctx):
        if not isinstance(value, str):
            ctx.fail(path, self.expected, value)
        return value


class Enum(Spec):
    def __init__(self, choices, **kw):
        super().__init__(**kw)
        self.choices = list(choices)
        self.expected = "one of " + ", ".join(repr(c) for c in self.choices)

    def check(self, value, path, ctx):
        if value not in self.choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in self.choices], n=1)
            ctx.fail(path, self.expected, value, f"did you mean {close[0]!r}?" if close else "")
        return value


class Quantity(Spec):
    """A string with a unit, parsed to the engine's integer unit of ``kind``."""

    def __init__(self, kind: str, *, high: int | None = None, **kw):
        """``high``: a bound other than the kind's virtual-time range (e.g. a wall-clock limit)."""
        super().__init__(**kw)
        self.kind = kind
        self.high = high
        self.expected = {"time": "a time like '30ns'", "frequency": "a frequency like '1.2GHz'",
                         "size": "a size like '64KiB'",
                         "bandwidth": "a bandwidth like '256GB/s' or 'unlimited'",
                         "energy": "an energy like '0.4pJ'", "energy_per_bit": "an energy per bit like '3.9pJ/bit'",
                         "power": "a power like '25mW'"}[kind]

    def check(self, value, path, ctx):
        if self.kind == "bandwidth" and value == UNLIMITED:
            return 0          # the engine's "no serialisation delay"
        try:
            out = parse_quantity(value, self.kind)
        except UnitError as e:
            hint = "the unit is missing" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
            msg = str(e)
            if "not a whole number" in msg or "negative" in msg or "is a" in msg:
                hint = msg.split(", found ")[-1] if ", found " in msg else msg
            ctx.fail(path, self.expected, value, hint)
            return None
        low, high = QUANTITY_RANGE[self.kind]
        if self.high is not None:
            high = self.high
        if out < low:
            hint = "write 'unlimited' for a link without serialisation delay" if self.kind == "bandwidth" else ""
            ctx.fail(path, f"{self.expected} of at least {format_quantity(low, self.kind)}", value, hint)
            return None
        if out > high:
            why = "" if self.high is not None else \
                " (virtual time must fit the engine's integer picoseconds with room to add)"
            ctx.fail(path, f"{self.expected} of at most {format_quantity(high, self.kind)}{why}", value)
            return None
        return out


class List(Spec):
    def __init__(self, item: Spec, *, min_len: int = 0, max_len: int | None = None, **kw):
        kw.setdefault("default", [])
        super().__init__(**kw)
        self.item = item
        self.min_len = min_len
        self.max_len = max_len
        self.expected = f"a list of {item.describe()}"

    def check(self, value, path, ctx):
        if not isinstance(value, list):
            ctx.fail(path, self.expected, value)
            return []
        if len(value) < self.min_len or (self.max_len is not None and len(value) > self.max_len):
            count = (f"exactly {self.min_len}" if self.max_len == self.min_len else
                     f"at least {self.min_len}" if self.max_len is None else f"{self.min_len} to {self.max_len}")
            ctx.fail(path, f"{count} item(s)", f"{len(value)} item(s)", verbatim=True)
        return [self.item.check(v, path + (i,), ctx) for i, v in enumerate(value)]


class OneOf(Spec):
    """The first spec whose check passes (e.g. a quantity or an integer)."""

    def __init__(self, *specs: Spec, **kw):
        super().__init__(**kw)
        self.specs = specs
        self.expected = " or ".join(s.describe() for s in specs)

    def check(self, value, path, ctx):
        for spec in self.specs:
            trial = _Ctx(ctx.doc)
            out = spec.check(value, path, trial)
            if not trial.problems:
                return out
        ctx.fail(path, self.expected, value)
        return None


class Map(Spec):
    """A mapping with known keys (``open=True`` accepts any key, values checked by ``values``)."""

    def __init__(self, fields: dict[str, Spec] | None = None, *, open: bool = False, values: Spec | None = None,
                 check: Callable | None = None, **kw):
        kw.setdefault("default", _MISSING)
        super().__init__(**kw)
        self.fields = fields or {}
        self.open = open
        self.values = values
        self.extra_check = check
        self.expected = "a map"

    def check(self, value, path, ctx):
        if value is None and not self.required:
            value = {}
        before = len(ctx.problems)
        if not isinstance(value, dict):
            ctx.fail(path, self.expected + (f" with keys {', '.join(self.fields)}" if self.fields else ""), value)
            return {}
        out = {}
        for key, v in value.items():
            spec = self.fields.get(key)
            if spec is None:
                if self.values is not None:
                    out[key] = self.values.check(v, path + (key,), ctx)
                    continue
                if self.open:
                    out[key] = v
                    continue
                close = difflib.get_close_matches(str(key), list(self.fields), n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(self.fields)}"
                ctx.fail(path + (key,), "a known key", key, hint)
                continue
            out[key] = spec.check(v, path + (key,), ctx)
        for key, spec in self.fields.items():
            if key in out:
                continue
            if spec.default is not _MISSING:
                d = spec.default
                # a default is written as in a file ("4KiB", ["4KiB"]): normalise it the same way
                out[key] = spec.check(d, path + (key,), ctx) if isinstance(d, (str, dict, list)) else d
            elif isinstance(spec, Map) and not spec.required:
                out[key] = spec.check({}, path + (key,), ctx)
            elif spec.required:
                ctx.fail(path + (key,), spec.describe(), _MISSING)
            else:
                out[key] = None
        if self.extra_check is not None and len(ctx.problems) == before:
            for p_path, expected, found in self.extra_check(out) or []:
                # a cross-field check describes what it found in words
                ctx.fail(path + tuple(p_path), expected, found, verbatim=isinstance(found, str))
        return out


def with_units(spec: Spec, value: Any) -> Any:
    """A validated ``value`` written back as a file would state it: quantities with their units
    (``20000`` ps -> ``'20ns'``), maps and lists element by element (for ``emu explain``)."""
    if isinstance(spec, Quantity) and isinstance(value, int) and not isinstance(value, bool):
        return format_quantity(value, spec.kind)
    if isinstance(spec, Map) and isinstance(value, dict):
        return {k: with_units(spec.fields.get(k) or spec.values, v) if (k in spec.fields or spec.values) else v
                for k, v in value.items()}
    if isinstance(spec, List) and isinstance(value, list):
        return [with_units(spec.item, v) for v in value]
    if isinstance(spec, OneOf):
        for option in spec.specs:
            if isinstance(option, Quantity):
                return with_units(option, value)
    return value


def validate(spec: Spec, doc: Doc, root: tuple = ()) -> Any:
    """Check ``doc.value`` against ``spec``; return the normalised value or raise :class:`SchemaError`."""
    ctx = _Ctx(doc)
    out = spec.check(doc.value, root, ctx)
    if ctx.problems:
        raise SchemaError(ctx.problems)
    return out


def describe_schema(spec: Spec, indent: int = 0, notes: dict | None = None, path: str = "") -> list[str]:
    """Human-readable listing of a schema (for ``emu validate --schema`` and docs); ``notes``: text appended
    to the line of a dotted key path (which components read it, tools/run/components.py)."""
    lines = []
    notes = notes or {}
    if isinstance(spec, Map):
        for key, sub in spec.fields.items():
            req = "required" if sub.required else (f"default {sub.default!r}" if sub.default is not _MISSING else "optional")
            lines.append(f"{'  ' * indent}{key}: {sub.describe()} [{req}]{' - ' + sub.doc if sub.doc else ''}"
                         f"{notes.get(path + key, '')}")
            if isinstance(sub, Map):
                lines += describe_schema(sub, indent + 1, notes, f"{path}{key}.")
            elif isinstance(sub, List) and isinstance(sub.item, Map):
                lines += describe_schema(sub.item, indent + 1, notes, f"{path}{key}.")
    return lines

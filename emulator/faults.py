"""Fault and delay injection, declared in the scenario: one class per fault kind.

Each entry of a scenario's ``faults:`` list targets links or actors by name
glob and acts inside a virtual-time window, with a probability, drawn from its
own seeded random stream (``faults/<index>``), so a fault plan is reproducible
and adding one fault never changes the draws of another.

Every kind is one subclass of :class:`FaultKind` registered in :data:`KINDS`
under ``(kind, target)``: it declares its target (``link`` or ``actor``), its
own keys with their schema and the range a fault campaign draws them from
(:class:`Param`), and its hook (``on_send`` for links, ``on_busy`` for actors,
``install`` for anything else).  The scenario schema (:data:`FAULT_SCHEMA`),
``emu validate --schema`` and ``emu faults campaign`` are all derived from the
registry, so a new kind is one class.

=========  ======  ==========================================================
kind       target  effect
=========  ======  ==========================================================
delay      link    each message sent in the window arrives ``delay`` later
                   (links stay FIFO: later messages queue behind it)
drop       link    the message is lost (its credit is returned; the receiver
                   never sees it -- typically ending in a deadlock report)
corrupt    link    ``bits`` random bits of the encoded payload are flipped;
                   the receiver decodes what arrives (a payload that no
                   longer decodes ends the run with a protocol error naming
                   the link and message)
slow       link    serialisation at ``bandwidth / factor``
slow       actor   busy spans starting in the window take ``factor`` times longer
stall      actor   the actor makes no progress in the window: a busy span that
                   starts inside it is held until the window's end (the trace
                   shows one span labelled ``<label> (stalled)`` from its start
                   to the end of the work), and messages it sends inside it
                   leave at the window's end
kill       actor   at ``at``, the actor's task is cancelled for good (messages
                   for it pile up, its senders and receivers end up in the
                   deadlock report)
=========  ======  ==========================================================

``probability`` and ``count`` apply per message (link kinds) or per busy span
(``slow`` on an actor); a stall always holds everything in its window and a
kill happens once.  ``slow`` needs a link of finite bandwidth (on an
``unlimited`` one it could not act: use ``delay``).

Every time a fault takes effect it is recorded as a ``fault`` event in the
trace and in the run's fault log; :func:`fault_summary` condenses the log per
fault (count by target) and names the faults that never fired.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from emulator.errors import BuildError
from emulator.link import FaultEffect
from emulator.rng import stream
from emulator.schema import Enum, Float, Int, Map, Quantity, Spec, Str
from emulator.trace import FAULT

__all__ = ["FAULT_SCHEMA", "KINDS", "FaultKind", "Param", "install_faults", "resolve_targets", "fault_summary", "describe_matches",
           "killer"]


@dataclass(frozen=True)
class Param:
    """A kind-specific key: its schema, whether it is required, and the range a campaign draws it from.

    ``low``/``high`` lie inside what the schema accepts; a campaign draws
    log-uniformly between them (quantities in engine units).
    """

    spec: Spec
    required: bool
    low: float
    high: float
    doc: str = ""


#: every kind, by (kind name, target); filled by :func:`register`
KINDS: dict[tuple[str, str], type["FaultKind"]] = {}


def register(cls):
    KINDS[(cls.kind, cls.target)] = cls
    return cls


class FaultKind:
    """One fault of a scenario: window, probability, count and its seeded stream.

    Subclasses set ``kind``, ``target``, ``params`` (:class:`Param` by key) and
    implement a hook: ``on_send(link, t, seq, msg_name, data, nbytes)`` (link
    kinds, returns a :class:`~emulator.link.FaultEffect` or None) or
    ``on_busy(actor, t, duration, label)`` (actor kinds), or override
    :meth:`install` for anything else.
    """

    kind = ""
    target = ""          # "link" or "actor"
    params: dict[str, Param] = {}
    summary = ""
    needs_window_end = False

    def __init__(self, index: int, spec: dict, system):
        self.index = index
        self.spec = spec
        self.start = spec["start"]
        self.end = spec["end"]
        self.prob = spec["probability"]
        self.left = spec["count"]
        self.rng = stream(system.seed, f"faults/{index}")
        self.system = system
        self.label = spec["name"] or f"{self.kind}@{spec.get('link') or spec.get('actor')}"

    @classmethod
    def check(cls, f: dict) -> list:
        """Cross-field problems of one entry, as ``(path, expected, found)``."""
        return []

    def install(self, targets: list) -> None:
        for t in targets:
            t.faults.append(self)

    def active(self, t: int) -> bool:
        if t < self.start or (self.end is not None and t >= self.end):
            return False
        if self.left is not None and self.left <= 0:
            return False
        if self.prob < 1.0 and self.rng.random() >= self.prob:
            return False
        if self.left is not None:
            self.left -= 1
        return True

    def log(self, t: int, target: str, detail) -> None:
        self.system.fault_log.append({"t_ps": t, "fault": self.label, "index": self.index, "kind": self.kind,
                                      "target": target, "detail": detail})


# --------------------------------------------------------------------------- link kinds
@register
class DelayFault(FaultKind):
    kind, target = "delay", "link"
    summary = "each message arrives `delay` later"
    params = {"delay": Param(Quantity("time", default=None, doc="extra delay (delay)"), True, 10**3, 10**7)}

    def on_send(self, link, t, seq, msg_name, data, nbytes):
        if not self.active(t):
            return None
        self.log(t, link.name, {"seq": seq, "message": msg_name, "delay_ps": self.spec["delay"]})
        return FaultEffect(self.label, extra_delay=self.spec["delay"])


@register
class DropFault(FaultKind):
    kind, target = "drop", "link"
    summary = "the message is lost"

    def on_send(self, link, t, seq, msg_name, data, nbytes):
        if not self.active(t):
            return None
        self.log(t, link.name, {"seq": seq, "message": msg_name})
        return FaultEffect(self.label, drop=True)


@register
class CorruptFault(FaultKind):
    kind, target = "corrupt", "link"
    summary = "`bits` random bits of the encoded payload are flipped"
    params = {"bits": Param(Int(min=1, max=4096, default=None, doc="bits to flip per message (corrupt)"),
                            True, 1, 64)}

    def on_send(self, link, t, seq, msg_name, data, nbytes):
        if not self.active(t):
            return None
        buf = bytearray(data)
        flipped = []
        for _ in range(self.spec["bits"]):
            pos = int(self.rng.integers(0, len(buf) * 8))
            buf[pos // 8] ^= 1 << (pos % 8)
            flipped.append(pos)
        self.log(t, link.name, {"seq": seq, "message": msg_name, "bits": flipped})
        return FaultEffect(self.label, data=bytes(buf))


class _SlowFault(FaultKind):
    """``slow`` on a link or an actor: the ``factor`` key and its check."""

    kind = "slow"
    params = {"factor": Param(Float(min=0.0, max=10**6, default=None, doc="slow-down factor (slow), > 1 is slower"),
                              True, 1.5, 100)}

    @classmethod
    def check(cls, f: dict) -> list:
        if f.get("factor") is not None and f["factor"] <= 0:
            return [(("factor",), "a slow-down factor > 0 (2 = twice as slow)", f"{f['factor']}")]
        return []


@register
class SlowLinkFault(_SlowFault):
    target = "link"
    summary = "serialisation at bandwidth / `factor`"

    def install(self, targets):
        if all(l.bandwidth == 0 for l in targets):
            raise BuildError(f"faults[{self.index}]: a slow fault scales serialisation, but "
                             f"{self.spec['link']!r} matches only links of unlimited bandwidth; "
                             "use a delay fault instead")
        super().install(targets)

    def on_send(self, link, t, seq, msg_name, data, nbytes):
        if not self.active(t):
            return None
        self.log(t, link.name, {"seq": seq, "message": msg_name, "factor": self.spec["factor"]})
        return FaultEffect(self.label, bandwidth_factor=1.0 / self.spec["factor"])


# --------------------------------------------------------------------------- actor kinds
@register
class SlowActorFault(_SlowFault):
    target = "actor"
    summary = "busy spans take `factor` times longer"

    def on_busy(self, actor, t, duration, label):
        if not self.active(t):
            return duration, label
        new = int(round(duration * self.spec["factor"]))
        self.log(t, actor.name, {"label": label, "from_ps": duration, "to_ps": new})
        self.system.recorder.emit((FAULT, t, actor.name, self.label, new - duration))
        return new, label


class _StallSend(FaultKind):
    """The out-links of a stalled actor hold messages sent inside the window until its end."""

    kind, target = "stall", "link"

    def on_send(self, link, t, seq, msg_name, data, nbytes):
        if not (self.start <= t < self.end):
            return None
        self.log(t, link.name, {"seq": seq, "message": msg_name, "held_ps": self.end - t})
        return FaultEffect(self.label, extra_delay=self.end - t)


@register
class StallFault(FaultKind):
    kind, target = "stall", "actor"
    summary = "no progress in [start, end): busy spans and sends wait for the window's end"
    needs_window_end = True

    def install(self, targets):
        send = _StallSend(self.index, self.spec, self.system)
        for actor in targets:
            actor.faults.append(self)
            for port in actor.outputs.values():
                if port.link is not None:
                    port.link.faults.append(send)

    def on_busy(self, actor, t, duration, label):
        if self.start <= t < self.end:
            wait = self.end - t
            self.log(t, actor.name, {"label": label, "held_ps": wait})
            self.system.recorder.emit((FAULT, t, actor.name, self.label, wait))
            return duration + wait, f"{label} (stalled)"
        return duration, label


@register
class KillFault(FaultKind):
    kind, target = "kill", "actor"
    summary = "the actor's task is cancelled for good at `at`"
    params = {"at": Param(Quantity("time", default=None, doc="kill time"), True, 0, 10**7)}

    def install(self, targets):
        self.system.kills.append((self.spec["at"], self, targets))


# --------------------------------------------------------------------------- schema
LINK_KINDS = sorted(k for k, t in KINDS if t == "link")
ACTOR_KINDS = sorted(k for k, t in KINDS if t == "actor")


def _check_fault(f: dict):
    kind = f["kind"]
    has_link, has_actor = f.get("link") is not None, f.get("actor") is not None
    if has_link == has_actor:
        return [(("link",), "exactly one of 'link: GLOB' or 'actor: GLOB'", "both" if has_link else "neither")]
    target = "link" if has_link else "actor"
    cls = KINDS.get((kind, target))
    if cls is None:
        names = LINK_KINDS if has_link else ACTOR_KINDS
        article = "an" if target == "actor" else "a"
        return [(("kind",), f"{article} {target} fault kind ({', '.join(names)}) for a '{target}:' target", kind)]
    problems = []
    for key, param in cls.params.items():
        if param.required and f.get(key) is None:
            problems.append(((key,), f"'{key}' for a {kind} fault", "nothing (the key is missing)"))
    for key, other in _PARAM_SPECS.items():
        if f.get(key) is not None and key not in cls.params:
            problems.append(((key,), f"no '{key}' on a {kind} fault (it has: "
                             f"{', '.join(cls.params) or 'no own keys'})", f"{key}: {f[key]!r}"))
    if cls.needs_window_end and f.get("end") is None:
        problems.append((("end",), f"'end' (the {kind} window's end) for a {kind} fault",
                         "nothing (the key is missing)"))
    if f.get("end") is not None and f["end"] <= f["start"]:
        problems.append((("end",), f"a time after start ({f['start']} ps)", f"{f['end']} ps"))
    return problems + cls.check(f)


_PARAM_SPECS: dict[str, Spec] = {}
for _cls in KINDS.values():
    for _key, _param in _cls.params.items():
        _PARAM_SPECS.setdefault(_key, _param.spec)

FAULT_SCHEMA = Map({
    "kind": Enum(sorted({k for k, _ in KINDS}, key=["delay", "drop", "corrupt", "stall", "slow", "kill"].index)),
    "link": Str(default=None, doc="glob over link names (e.g. 'cube05/pe3.up->*')"),
    "actor": Str(default=None, doc="glob over actor names (e.g. 'cube05/*')"),
    "start": Quantity("time", default="0ps", doc="window start"),
    "end": Quantity("time", default=None, doc="window end (default: end of run)"),
    "at": _PARAM_SPECS["at"],
    "probability": Float(min=0.0, max=1.0, default=1.0, doc="chance per message / per busy span"),
    **{k: v for k, v in _PARAM_SPECS.items() if k != "at"},
    "count": Int(min=1, default=None, doc="at most this many injections"),
    "name": Str(default=None, doc="label in the trace and result (default: kind@target)"),
}, check=_check_fault)


# --------------------------------------------------------------------------- installing
def resolve_targets(system, spec: dict) -> tuple[str, list]:
    """``("link" | "actor", the links or actors of ``system`` that ``spec``'s glob matches)``."""
    if spec.get("link") is not None:
        return "link", [l for l in system.links if fnmatch.fnmatchcase(l.name, spec["link"])]
    return "actor", [a for a in system.actors.values() if fnmatch.fnmatchcase(a.name, spec["actor"])]


def install_faults(system, faults: list[dict], *, skip_unmatched: bool = False) -> None:
    """Attach every fault of the scenario to the links and actors it targets.

    A glob that matches nothing is a scenario error (a typo would otherwise
    silently inject nothing), unless ``skip_unmatched``: ``emu trace replay``
    installs the scenario's faults into a system holding one actor, where the
    faults aimed elsewhere are expected not to match.  Fault ``i`` always
    draws from stream ``faults/<i>``, so skipping one changes no other.
    ``system.fault_plan`` records what each fault matched (for the summary).
    """
    plan = []
    for i, spec in enumerate(faults):
        target, targets = resolve_targets(system, spec)
        glob = spec[target]
        if not targets and skip_unmatched:
            continue
        if not targets:
            known = [l.name for l in system.links] if target == "link" else list(system.actors)
            raise BuildError(f"faults[{i}].{target}: no {target} matches {glob!r} (e.g. {', '.join(known[:3])})")
        fault = KINDS[(spec["kind"], target)](i, spec, system)
        fault.install(targets)
        plan.append({"index": i, "fault": fault.label, "kind": spec["kind"], target: glob,
                     "matched": len(targets), "targets": [t.name for t in targets]})
    system.fault_plan = plan


def fault_summary(plan: list[dict], log: list[dict]) -> list[dict]:
    """Per fault of the plan: what it matched, how often it fired, on which targets; ``fired: false`` if never."""
    by_index: dict[int, dict[str, int]] = {}
    for entry in log:
        counts = by_index.setdefault(entry.get("index", -1), {})
        counts[entry["target"]] = counts.get(entry["target"], 0) + 1
    out = []
    for p in plan:
        counts = by_index.get(p["index"], {})
        row = {k: v for k, v in p.items() if k != "targets"}
        row.update(fired=bool(counts), injected=sum(counts.values()), by_target=dict(sorted(counts.items())))
        out.append(row)
    return out


def describe_matches(plan: list[dict], limit: int = 8) -> list[str]:
    """Lines for ``emu explain --faults`` / ``emu validate``: what each fault of the plan matches."""
    lines = []
    for p in plan:
        target = "link" if "link" in p else "actor"
        names = p["targets"]
        shown = ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
        lines.append(f"faults[{p['index']}] {p['fault']} ({p['kind']}): {target} glob {p[target]!r} matches "
                     f"{len(names)} {target}(s): {shown}")
    return lines


async def killer(system, at: int, fault: FaultKind, targets) -> None:
    """Cancel the targets' tasks at virtual time ``at`` (a kill fault)."""
    from emulator.clock import sleep_until

    await sleep_until(at, weak=True)
    for actor in targets:
        if actor.finished_at is None and actor.cancel_scope is not None:
            actor.cancel_scope.cancel()
            actor.killed = True
            fault.log(at, actor.name, {})
            system.recorder.emit((FAULT, at, actor.name, fault.label, None))

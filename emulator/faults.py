"""Fault and delay injection, declared in the scenario.

Each entry of a scenario's ``faults:`` list targets links or actors by name
glob and acts inside a virtual-time window, with a probability, drawn from its
own seeded random stream (``faults/<index>``), so a fault plan is reproducible
and adding one fault never changes the draws of another.

Kinds (``link:`` targets links, ``actor:`` targets actors):

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
kill happens once.  ``slow`` needs ``factor > 0`` and a link of finite
bandwidth (on an infinite one it could not act: use ``delay``).

Every time a fault takes effect it is recorded as a ``fault`` event in the
trace and listed in the run's result.
"""
from __future__ import annotations

import fnmatch

from emulator.errors import BuildError
from emulator.link import FaultEffect
from emulator.rng import stream
from emulator.schema import Enum, Float, Int, Map, Quantity, Str
from emulator.trace import FAULT

__all__ = ["FAULT_SCHEMA", "install_faults", "LinkFault", "ActorFault"]

LINK_KINDS = {"delay", "drop", "corrupt", "slow"}
ACTOR_KINDS = {"slow", "stall", "kill"}


def _check_fault(f: dict):
    problems = []
    kind = f["kind"]
    has_link, has_actor = f.get("link") is not None, f.get("actor") is not None
    if has_link == has_actor:
        problems.append((("link",), "exactly one of 'link: GLOB' or 'actor: GLOB'",
                         "both" if has_link else "neither"))
        return problems
    if has_link and kind not in LINK_KINDS:
        problems.append((("kind",), f"a link fault kind ({', '.join(sorted(LINK_KINDS))}) for a 'link:' target", kind))
    if has_actor and kind not in ACTOR_KINDS:
        problems.append((("kind",), f"an actor fault kind ({', '.join(sorted(ACTOR_KINDS))}) for an 'actor:' target",
                         kind))
    needs = {"delay": "delay", "corrupt": "bits", "slow": "factor", "kill": "at"}
    if kind in needs and f.get(needs[kind]) is None:
        problems.append(((needs[kind],), f"'{needs[kind]}' for a {kind} fault", "nothing (the key is missing)"))
    if kind == "slow" and f.get("factor") is not None and f["factor"] <= 0:
        problems.append((("factor",), "a slow-down factor > 0 (2 = twice as slow)", f"{f['factor']}"))
    if kind == "stall" and f.get("end") is None:
        problems.append((("end",), "'end' (the stall window's end) for a stall fault", "nothing (the key is missing)"))
    if f.get("end") is not None and f["end"] <= f["start"]:
        problems.append((("end",), f"a time after start ({f['start']} ps)", f"{f['end']} ps"))
    return problems


FAULT_SCHEMA = Map({
    "kind": Enum(["delay", "drop", "corrupt", "stall", "slow", "kill"]),
    "link": Str(default=None, doc="glob over link names (e.g. 'cube05/pe3.up->*')"),
    "actor": Str(default=None, doc="glob over actor names (e.g. 'cube05/*')"),
    "start": Quantity("time", default="0ps", doc="window start"),
    "end": Quantity("time", default=None, doc="window end (default: end of run)"),
    "at": Quantity("time", default=None, doc="kill time"),
    "probability": Float(min=0.0, max=1.0, default=1.0, doc="chance per message / per busy span"),
    "delay": Quantity("time", default=None, doc="extra delay (delay)"),
    "bits": Int(min=1, max=4096, default=None, doc="bits to flip per message (corrupt)"),
    "factor": Float(min=0.0, default=None, doc="slow-down factor (slow), > 1 is slower"),
    "count": Int(min=1, default=None, doc="at most this many injections"),
    "name": Str(default=None, doc="label in the trace and result (default: kind@target)"),
}, check=_check_fault)


class _Fault:
    def __init__(self, index: int, spec: dict, system):
        self.index = index
        self.spec = spec
        self.kind = spec["kind"]
        self.start = spec["start"]
        self.end = spec["end"]
        self.prob = spec["probability"]
        self.left = spec["count"]
        self.rng = stream(system.seed, f"faults/{index}")
        self.system = system
        self.label = spec["name"] or f"{self.kind}@{spec.get('link') or spec.get('actor')}"

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
        self.system.fault_log.append({"t_ps": t, "fault": self.label, "kind": self.kind, "target": target,
                                      "detail": detail})


class LinkFault(_Fault):
    """Link hook: see :class:`emulator.link.FaultEffect`."""

    def on_send(self, link, t, seq, msg_name, data, nbytes):
        if not self.active(t):
            return None
        kind = self.kind
        if kind == "delay":
            self.log(t, link.name, {"seq": seq, "message": msg_name, "delay_ps": self.spec["delay"]})
            return FaultEffect(self.label, extra_delay=self.spec["delay"])
        if kind == "drop":
            self.log(t, link.name, {"seq": seq, "message": msg_name})
            return FaultEffect(self.label, drop=True)
        if kind == "corrupt":
            buf = bytearray(data)
            flipped = []
            for _ in range(self.spec["bits"]):
                pos = int(self.rng.integers(0, len(buf) * 8))
                buf[pos // 8] ^= 1 << (pos % 8)
                flipped.append(pos)
            self.log(t, link.name, {"seq": seq, "message": msg_name, "bits": flipped})
            return FaultEffect(self.label, data=bytes(buf))
        if kind == "slow":
            self.log(t, link.name, {"seq": seq, "message": msg_name, "factor": self.spec["factor"]})
            return FaultEffect(self.label, bandwidth_factor=1.0 / self.spec["factor"])
        return None


class StallSendFault(_Fault):
    """The out-links of a stalled actor hold messages sent inside the window until its end."""

    def on_send(self, link, t, seq, msg_name, data, nbytes):
        if not (self.start <= t < self.end):
            return None
        self.log(t, link.name, {"seq": seq, "message": msg_name, "held_ps": self.end - t})
        return FaultEffect(self.label, extra_delay=self.end - t)


class ActorFault(_Fault):
    """Actor hook on :meth:`emulator.actor.Actor.busy`."""

    def on_busy(self, actor, t, duration, label):
        if self.kind == "stall":
            if self.start <= t < self.end:
                wait = self.end - t
                self.log(t, actor.name, {"label": label, "held_ps": wait})
                self.system.recorder.emit((FAULT, t, actor.name, self.label, wait))
                return duration + wait, f"{label} (stalled)"
            return duration, label
        if self.kind == "slow" and self.active(t):
            new = int(round(duration * self.spec["factor"]))
            self.log(t, actor.name, {"label": label, "from_ps": duration, "to_ps": new})
            self.system.recorder.emit((FAULT, t, actor.name, self.label, new - duration))
            return new, label
        return duration, label


def install_faults(system, faults: list[dict], *, skip_unmatched: bool = False) -> None:
    """Attach every fault of the scenario to the links and actors it targets.

    A glob that matches nothing is a scenario error (a typo would otherwise
    silently inject nothing), unless ``skip_unmatched``: ``emu trace replay``
    installs the scenario's faults into a system holding one actor, where the
    faults aimed elsewhere are expected not to match.  Fault ``i`` always
    draws from stream ``faults/<i>``, so skipping one changes no other.
    """
    for i, spec in enumerate(faults):
        if spec.get("link") is not None:
            glob = spec["link"]
            targets = [l for l in system.links if fnmatch.fnmatchcase(l.name, glob)]
            if not targets and skip_unmatched:
                continue
            if not targets:
                raise BuildError(f"faults[{i}].link: no link matches {glob!r} "
                                 f"(e.g. {', '.join(l.name for l in system.links[:3])})")
            if spec["kind"] == "slow" and all(l.bandwidth == 0 for l in targets):
                raise BuildError(f"faults[{i}]: a slow fault scales serialisation, but {glob!r} matches only links "
                                 "of infinite bandwidth (bandwidth 0); use a delay fault instead")
            fault = LinkFault(i, spec, system)
            for link in targets:
                link.faults.append(fault)
            continue
        glob = spec["actor"]
        targets = [a for a in system.actors.values() if fnmatch.fnmatchcase(a.name, glob)]
        if not targets and skip_unmatched:
            continue
        if not targets:
            raise BuildError(f"faults[{i}].actor: no actor matches {glob!r} "
                             f"(e.g. {', '.join(list(system.actors)[:3])})")
        if spec["kind"] == "kill":
            fault = _Fault(i, spec, system)
            system.kills.append((spec["at"], fault, targets))
            continue
        fault = ActorFault(i, spec, system)
        for actor in targets:
            actor.faults.append(fault)
            if spec["kind"] == "stall":
                send_fault = StallSendFault(i, spec, system)
                for port in actor.outputs.values():
                    if port.link is not None:
                        port.link.faults.append(send_fault)


async def killer(system, at: int, fault: _Fault, targets) -> None:
    """Cancel the targets' tasks at virtual time ``at`` (a kill fault)."""
    from emulator.clock import sleep_until

    await sleep_until(at, weak=True)
    for actor in targets:
        if actor.finished_at is None and actor.cancel_scope is not None:
            actor.cancel_scope.cancel()
            actor.killed = True
            fault.log(at, actor.name, {})
            system.recorder.emit((FAULT, at, actor.name, fault.label, None))

"""``emu run --stop-on CONDITION``: stop a run at the time step where something first happens.

The condition is one line of a small language over the run's events (docs/trace-format.md has the event
kinds); the run stops at the end of the time step in which the matching event is emitted -- exactly as
``--stop-at`` that step's time would -- and writes the same state snapshot (emulator/snapshot.py):

=============================  ==================================================================
``send KIND [on GLOB]``        a message of record ``KIND`` (``IpcqData``, ``DmaCmd``; ``*`` any) is
                               accepted by a link whose name matches ``GLOB`` (default ``*``)
``deliver KIND [on GLOB]``     such a message is placed in its receiver's in-port
``busy ACTOR [LABEL]``         an actor whose path matches ``ACTOR`` records a busy span (its label
                               matching ``LABEL``: ``busy */gemm 'gemm 8x*'``); a span an engine
                               schedules ahead (``fidelity: pipeline``) is seen when it is scheduled
``done ACTOR``                 an actor's task returns (a PE's kernel ends, a host finishes)
``fault [TARGET]``             an injected fault takes effect on a target matching ``TARGET``
``mark NAME [on ACTOR]``       an actor records the trace mark ``NAME`` (a workload's own events:
                               the pccx driver's steps, the demo's ``round_done``)
=============================  ==================================================================

Any condition may end with ``#N``: the N-th matching event (``send IpcqData on *ipcq.tx_* #4``).  Globs
are shell patterns (``fnmatch``), quoted with ``'...'`` when they hold spaces.  A condition that never
matches lets the run end as usual, and ``emu run`` says so (exit 2).

How: the condition taps the recorder (``Recorder.tap``: every event passes it as it is emitted), so it is
installed before the machine is built; a match pulls the clock's limit down to the current time, and the
run ends there the way a ``--stop-at`` does.  Names are resolved on first use per link or actor id, and a
``send``/``deliver`` condition decodes only the payloads of the links its glob matches.
"""
from __future__ import annotations

import fnmatch
import shlex

from emulator.trace import BUSY, DELIVER, DONE, FAULT, MARK, SEND

__all__ = ["StopCondition", "parse_condition", "CONDITION_FORMS"]

#: verb -> (the event kind it watches, its argument forms), for the parser and its error messages
CONDITION_FORMS = {
    "send": "send KIND [on LINKGLOB]",
    "deliver": "deliver KIND [on LINKGLOB]",
    "busy": "busy ACTORGLOB [LABELGLOB]",
    "done": "done ACTORGLOB",
    "fault": "fault [TARGETGLOB]",
    "mark": "mark NAME [on ACTORGLOB]",
}


class StopCondition:
    """A parsed condition (:func:`parse_condition`); :meth:`install` taps a system's recorder."""

    def __init__(self, text: str, verb: str, what: str, where: str, nth: int):
        self.text, self.verb, self.what, self.where, self.nth = text, verb, what, where, nth
        self.seen = 0
        self.matched_at: int | None = None     # the virtual time of the matching event (None: not yet)
        self.matched: str | None = None        # the event, in words
        self._links: dict = {}                 # link id -> glob matched (bool)
        self._actors: dict = {}                # actor id -> name
        self._kinds: dict = {}                 # (link id, seq) -> record name, for deliver conditions

    def install(self, system) -> None:
        """Watch ``system``'s events (before its actors and links are added: they bind the emitter then)."""
        self.system = system
        system.recorder.tap(self._event)

    # -- names, resolved on first use --------------------------------------------------------------
    def _link_ok(self, i: int) -> bool:
        ok = self._links.get(i)
        if ok is None:
            ok = self._links[i] = fnmatch.fnmatchcase(self.system.links[i].name, self.where)
        return ok

    def _actor(self, i: int) -> str:
        name = self._actors.get(i)
        if name is None:
            names = list(self.system.actors)
            self._actors.update(enumerate(names))
            name = self._actors.get(i, str(i))
        return name

    @staticmethod
    def _kind(payload) -> str:
        from protocols.codec import decode
        try:
            return type(decode(payload)).__name__
        except Exception:       # a corrupted payload (a fault): no kind
            return "?"

    def _event(self, ev) -> None:
        if self.matched_at is not None:
            return
        k, verb = ev[0], self.verb
        hit = None
        if verb == "send" and k == SEND and self._link_ok(ev[2]):
            kind = self._kind(ev[5])
            if fnmatch.fnmatchcase(kind, self.what):
                hit = f"{kind} #{ev[3]} sent on {self.system.links[ev[2]].name}"
        elif verb == "deliver" and k == SEND and self._link_ok(ev[2]):
            self._kinds[(ev[2], ev[3])] = self._kind(ev[5])
        elif verb == "deliver" and k == DELIVER and self._link_ok(ev[2]):
            kind = self._kinds.pop((ev[2], ev[3]), "?")
            if fnmatch.fnmatchcase(kind, self.what):
                hit = f"{kind} #{ev[3]} delivered on {self.system.links[ev[2]].name}"
        elif verb == "busy" and k == BUSY:
            name = self._actor(ev[2])
            if fnmatch.fnmatchcase(name, self.what) and fnmatch.fnmatchcase(str(ev[4]), self.where):
                hit = f"{name} busy [{ev[4]}]"
        elif verb == "done" and k == DONE:
            name = self._actor(ev[2])
            if fnmatch.fnmatchcase(name, self.what):
                hit = f"{name} done"
        elif verb == "fault" and k == FAULT and fnmatch.fnmatchcase(str(ev[2]), self.what):
            hit = f"fault {ev[3]} on {ev[2]}"
        elif verb == "mark" and k == MARK and ev[3] == self.what:
            name = self._actor(ev[2])
            if fnmatch.fnmatchcase(name, self.where):
                hit = f"mark {ev[3]} by {name}"
        if hit is None:
            return
        self.seen += 1
        if self.seen < self.nth:
            return
        clock = self.system.clock
        self.matched_at, self.matched = clock.now, hit
        if clock.limit > clock.now:
            clock.limit = clock.now     # the rest of this time step runs; the run stops before the next


def parse_condition(text: str) -> StopCondition:
    """``text`` as a :class:`StopCondition`; ``ValueError`` naming the forms for anything else."""
    forms = "; ".join(CONDITION_FORMS.values())
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"--stop-on {text!r}: {e} (forms: {forms})") from None
    nth = 1
    if words and words[-1].startswith("#"):
        n = words.pop()[1:]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--stop-on {text!r}: #N must be a whole number from 1, found #{n}")
        nth = int(n)
    if not words or words[0] not in CONDITION_FORMS:
        raise ValueError(f"--stop-on {text!r}: expected one of: {forms}")
    verb, args = words[0], words[1:]
    if verb in ("send", "deliver", "mark"):
        if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "on"):
            raise ValueError(f"--stop-on {text!r}: expected {CONDITION_FORMS[verb]}")
        return StopCondition(text, verb, args[0], args[2] if len(args) == 3 else "*", nth)
    if verb == "busy":
        if len(args) not in (1, 2):
            raise ValueError(f"--stop-on {text!r}: expected {CONDITION_FORMS[verb]}")
        return StopCondition(text, verb, args[0], args[1] if len(args) == 2 else "*", nth)
    if verb == "done":
        if len(args) != 1:
            raise ValueError(f"--stop-on {text!r}: expected {CONDITION_FORMS[verb]}")
        return StopCondition(text, verb, args[0], "*", nth)
    if len(args) > 1:
        raise ValueError(f"--stop-on {text!r}: expected {CONDITION_FORMS[verb]}")
    return StopCondition(text, verb, args[0] if args else "*", "*", nth)

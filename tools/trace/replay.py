"""Replay one actor of a recorded run alone and check it sends what the trace says.

Why: when a run misbehaves, the question is often "is it this component, or
what it was fed?".  Replaying one actor against its recorded inputs answers
it, and a changed parameter (``--set workload.params.merge=16ns``) shows
exactly where that actor's behaviour departs from the recording.

How (public engine API only: :meth:`Actor.detach`, :meth:`Recorder.tap`; the
actor object itself is the real one):

1. the scenario is rebuilt from the trace header (``scenario_resolved``); with
   ``--set``, the resolved scenario is written back as a scenario document
   (quantities in base units), the edits are applied and it is validated again
   like any scenario -- so the recorded run's own ``--set`` edits are kept and
   a bad edit is reported like ``emu run`` would; the whole machine is then
   built with :func:`tools.run.runner.build_system`;
2. the actor named NAME is taken out of that system (``Actor.detach``) and put
   alone in a fresh :class:`System` with the same seed and mode;
3. each of its peers (an actor at the other end of one of its links) is
   replaced by a *stand-in* of the same name, so the wiring keeps its shape;
   on each link from the peer, the stand-in sends the messages the trace shows
   (the SEND payloads, decoded), each at its recorded DELIVER time, over a link
   with the original name and capacity, latency 0 and infinite bandwidth -- so
   every message arrives exactly when it did, in the recorded order;
4. each link from the actor to a peer keeps its original parameters (and the
   scenario's faults on it); the stand-in takes the k-th message at the
   recorded TAKE time of the k-th message -- so back-pressure (credits) is
   reproduced;
5. the actor's SEND events on its out-links (time, payload bytes) and its
   completion time are compared, in order, with the recording.

Messages dropped by a fault on an in-link were never delivered, so they are
not fed.  The trace must hold payloads (``trace: {payloads: true}``, the default).
"""
from __future__ import annotations

import difflib
import fnmatch
import os
from dataclasses import dataclass, field

from emulator.actor import Actor
from emulator.errors import EmulatorError
from emulator.faults import install_faults
from emulator.system import System
from emulator.trace import DELIVER, DONE, SEND, TAKE, TraceFile
from emulator.units import format_time
from protocols.codec import ProtocolError, decode

__all__ = ["replay_actor", "ReplayResult", "ReplayError"]


class ReplayError(EmulatorError):
    """The replay could not be set up (unknown actor, no payloads, missing scenario file...)."""


@dataclass
class ReplayResult:
    actor: str
    ok: bool
    matched: int                       # messages compared and equal
    expected: int                      # messages the trace shows the actor sending
    status: str                        # the replay run's status
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(self.lines)


class _Peer(Actor):
    """Stands in for one peer of the replayed actor, under the peer's own name.

    It owns the ends of the peer's links to and from the actor, so the wiring keeps its shape
    (the replayed actor may check that a completion link comes from the engine it commands).
    On each link from the actor it takes the k-th message no earlier than the recorded TAKE time
    of the k-th message, so credits (back-pressure) come back as they did.  The messages *to* the
    actor are sent on its out-ports by the :class:`_Feeder`.
    """

    def __init__(self, name: str):
        super().__init__(name)
        self.take_times: dict[str, list[int]] = {}               # in-port -> [time]

    async def _drain(self, port: str) -> None:
        inp = self.inputs[port]
        for t in self.take_times[port]:
            if t > self.now:
                await self.sleep_until(t)
            await inp.recv()

    async def run(self) -> None:
        import trio

        async with trio.open_nursery() as nursery:
            for port in self.take_times:
                nursery.start_soon(self._drain, port)


class _Feeder(Actor):
    """Sends every recorded message to the replayed actor at its recorded delivery time.

    One task for all the actor's in-links, in the recorded delivery order: messages that arrived at
    the same instant on different links (a DMA write and a CPU read of the TCM) arrive in the same
    order again.  It sends on the stand-ins' out-ports (zero latency, infinite bandwidth).
    """

    def __init__(self, name: str, script: list):
        super().__init__(name)
        self.script = script          # [(time, OutPort, message)] in delivery order

    async def run(self) -> None:
        for t, port, msg in self.script:
            if t > self.now:
                await self.sleep_until(t)
            await port.send(msg)


_UNIT = {"time": "ps", "frequency": "Hz", "size": "B", "bandwidth": "B/s"}


def _unparse(spec, value):
    """A resolved value back in scenario-file form (quantities as '<int><base unit>'), guided by ``spec``."""
    from emulator.schema import List, Map, Quantity

    if value is None:
        return None
    if isinstance(spec, Quantity) and isinstance(value, int) and not isinstance(value, bool):
        return f"{value}{_UNIT[spec.kind]}"
    if isinstance(spec, Map) and isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if v is None:
                continue
            out[k] = _unparse(spec.fields.get(k) or spec.values, v)
        return out
    if isinstance(spec, List) and isinstance(value, (list, tuple)):
        return [_unparse(spec.item, x) for x in value]
    if isinstance(value, tuple):
        return list(value)
    return value


def _load_scenario(trace: TraceFile, sets: list[str] | None, roots: dict | None):
    """The recorded scenario; with ``sets``, the recorded scenario *as resolved* (so the edits the
    recorded run itself was made with are kept) with the ``--set`` edits on top, validated again.  The files
    it names (its profile, workload inputs) must lie under ``roots`` (None: the recorded ones)."""
    import tempfile

    import yaml

    from actors import registry
    from emulator.faults import FAULT_SCHEMA
    from emulator.input_paths import confined_file
    from emulator.scenario import load_scenario
    from tools.run.runner import scenario_from_resolved

    resolved = trace.header.get("scenario_resolved")
    if not isinstance(resolved, dict) or "machine" not in resolved:
        raise ReplayError("the trace header holds no resolved scenario (was it written by `emu run`?)")
    if not sets:
        return scenario_from_resolved(resolved, roots)
    roots = roots if roots is not None else resolved.get("input_roots") or {}
    m = resolved["machine"]
    profile_file = m.get("profile_file")
    if not profile_file or not os.path.isfile(profile_file):
        raise ReplayError(f"--set needs the machine profile file of the recorded run, {profile_file!r}, "
                          "which does not exist any more")
    profile_file = confined_file([profile_file], "machine.profile_file", profile_file, roots)
    try:
        family = registry.family(m["family"])
        params_spec = family.WORKLOADS[resolved["workload"]["kind"]].params
    except KeyError as e:
        raise ReplayError(f"the recorded machine family or workload is not available here ({e})") from None
    doc = {
        "name": resolved["name"], "seed": resolved["seed"], "mode": resolved["mode"],
        "machine": {"profile": str(profile_file), "overrides": _unparse(family.PROFILE_SCHEMA, m["resolved"])},
        "workload": {"kind": resolved["workload"]["kind"],
                     "params": _unparse(params_spec, resolved["workload"]["params"])},
        "faults": [_unparse(FAULT_SCHEMA, f) for f in resolved.get("faults") or []],
    }
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "recorded-scenario.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        sc = load_scenario(path, registry, sets, allow=tuple(roots))
    sc.file, sc.input_roots = resolved.get("file", sc.file), roots
    return sc


@dataclass
class _Recording:
    """What the trace says of one actor: its links, what it received (with payloads), what it sent, when its
    peers took its messages, when it finished."""
    in_links: list
    out_links: list
    payload: dict                 # (in-link, seq) -> the message's bytes
    delivers: list                # DELIVER events on its in-links, in trace order
    takes: dict                   # out-link -> the times its peer took each message
    sends: dict                   # out-link -> its SEND events
    done_at: int | None


def _recording(trace: TraceFile, name: str) -> _Recording:
    links = trace.links
    in_links = [i for i, l in enumerate(links) if l["dst"] == name]
    out_links = [i for i, l in enumerate(links) if l["src"] == name]
    rec = _Recording(in_links, out_links, {}, [], {i: [] for i in out_links}, {i: [] for i in out_links}, None)
    aid = trace.actors.index(name)
    in_set, out_set = set(in_links), set(out_links)
    for ev in trace.events:
        k = ev[0]
        if k == SEND:
            if ev[2] in in_set:
                rec.payload[(ev[2], ev[3])] = ev[5]
            elif ev[2] in out_set:
                rec.sends[ev[2]].append(ev)
        elif k == DELIVER and ev[2] in in_set:
            rec.delivers.append(ev)
        elif k == TAKE and ev[2] in out_set:
            rec.takes[ev[2]].append(ev[1])
        elif k == DONE and ev[2] == aid:
            rec.done_at = ev[1]
    return rec


def _check_replayable(trace: TraceFile, name: str, rec: _Recording) -> None:
    """The trace holds everything a replay of ``name`` needs (payloads, event kinds, its links and events)."""
    links = trace.links
    missing = [(li, seq) for _, _, li, seq, _ in rec.delivers if rec.payload.get((li, seq)) is None]
    if missing:
        li, seq = missing[0]
        raise ReplayError(f"the trace has no payload for message #{seq} on {links[li]['name']}: replay needs the "
                          "messages an actor received (record with trace: {payloads: true} and no filter that "
                          "drops its in-links' send events)")
    topts = (trace.header.get("scenario_resolved") or {}).get("trace") or {}
    kinds = topts.get("kinds")
    need = {"send", "deliver", "take", "done"}
    if kinds is not None and not need <= set(kinds):
        raise ReplayError(f"replay needs the {', '.join(sorted(need - set(kinds)))} events, which this trace "
                          f"does not record (trace.kinds: {', '.join(kinds)})")
    if topts.get("links") is not None:
        lost = [links[i]["name"] for i in rec.in_links + rec.out_links
                if not any(fnmatch.fnmatchcase(links[i]["name"], g) for g in topts["links"])]
        if lost:
            raise ReplayError(f"the trace's link filter left out {lost[0]} (a link of {name}); "
                              "record the actor's links to replay it")
    if topts.get("actors") is not None and not any(fnmatch.fnmatchcase(name, g) for g in topts["actors"]):
        raise ReplayError(f"the trace's actor filter ({', '.join(topts['actors'])}) left out {name}'s own events; "
                          "record the actor to replay it")


def _alone(trace: TraceFile, name: str, rec: _Recording, sets, roots) -> tuple[System, object, list]:
    """The actor rebuilt from the trace's scenario, taken out of its machine and wired to stand-ins: a feeder
    that delivers what it received at the recorded times, peers that take its messages at the recorded times.
    Returns the system, the actor and the list its trace events are tapped into."""
    from tools.run.runner import build_system

    links = trace.links
    scenario = _load_scenario(trace, sets, roots)
    scenario.trace = {}
    old, _ = build_system(scenario)
    actor = old.actors.get(name)
    if actor is None:
        raise ReplayError(f"the rebuilt machine has no actor {name!r} (did --set change the machine?)")
    blocker = actor.replay_blocker()
    if blocker:
        raise ReplayError(f"{name} cannot be replayed alone: {blocker}")
    actor.detach()

    system = System(f"replay:{name}", seed=scenario.seed, mode=scenario.mode, scenario=scenario.resolved())
    got: list = []
    system.recorder.tap(got.append)
    system.add(actor)
    peers: dict[str, _Peer] = {}

    def peer(pname: str) -> _Peer:
        if pname not in peers:
            peers[pname] = system.add(_Peer(pname))
        return peers[pname]

    ports = {}
    for li in rec.in_links:
        l = links[li]
        if l["dst_port"] not in actor.inputs:
            raise ReplayError(f"actor {name} has no in-port {l['dst_port']!r} any more (the trace's link "
                              f"{l['name']} ends there)")
        ports[li] = peer(l["src"]).out_port(f"l{li}")
        system.connect(ports[li], actor.inputs[l["dst_port"]], capacity=l["capacity"], latency=0, bandwidth=0,
                       name=l["name"])
    script = []
    for _, t, li, seq, _ in rec.delivers:
        try:
            script.append((t, ports[li], decode(rec.payload[(li, seq)])))
        except ProtocolError as e:
            raise ReplayError(f"message #{seq} on {links[li]['name']} does not decode: {e}") from None
    system.add(_Feeder("replay/feeder", script))
    for li in rec.out_links:
        l = links[li]
        port = actor.outputs.get(l["src_port"])
        if port is None:
            raise ReplayError(f"actor {name} has no out-port {l['src_port']!r} any more (trace link {l['name']})")
        p = peer(l["dst"])
        p.take_times[f"l{li}"] = rec.takes[li]
        system.connect(port, p.in_port(f"l{li}"), capacity=l["capacity"], latency=l["latency_ps"],
                       bandwidth=l["bandwidth_Bps"], name=l["name"])
    install_faults(system, scenario.faults, skip_unmatched=True)
    return system, actor, got


def _first_divergence(links, rec: _Recording, got_sends: dict) -> tuple[tuple | None, int]:
    """``((time, text) of the earliest message that differs or None, messages matched before it)``."""
    first, matched = None, 0
    for li in rec.out_links:
        exp, new = rec.sends[li], got_sends[li]
        for k in range(max(len(exp), len(new))):
            why = _differs(links[li]["name"], k, exp[k] if k < len(exp) else None, new[k] if k < len(new) else None,
                           len(exp), len(new))
            if why is not None:
                if first is None or why[0] < first[0]:
                    first = why
                break
            matched += 1
    return first, matched


def _differs(link: str, k: int, e, g, n_exp: int, n_got: int) -> tuple | None:
    """How the k-th message on ``link`` differs between the trace (``e``) and the replay (``g``), or None."""
    if e is None:
        return g[1], (f"on {link}, message {k}: expected no message (the trace has {n_exp}),"
                      f" got one at {format_time(g[1])} ({g[4]} bytes)")
    if g is None:
        return e[1], (f"on {link}, message {k}: expected a send at {format_time(e[1])} "
                      f"({e[1]} ps, {e[4]} bytes), got none (the replay sent {n_got})")
    if e[1] != g[1]:
        return min(e[1], g[1]), (f"on {link}, message {k}: expected at {format_time(e[1])} "
                                 f"({e[1]} ps), got at {format_time(g[1])} ({g[1]} ps)")
    if e[4] != g[4] or (e[5] is not None and e[5] != g[5]):
        diff = ""
        if isinstance(e[5], bytes) and isinstance(g[5], bytes):
            off = next((j for j in range(min(len(e[5]), len(g[5]))) if e[5][j] != g[5][j]), min(len(e[5]), len(g[5])))
            diff = f", payloads differ first at byte {off}"
        return e[1], (f"on {link}, message {k} at {format_time(e[1])}: content differs "
                      f"(expected {e[4]} bytes, got {g[4]} bytes{diff})")
    return None


def replay_actor(trace: TraceFile, name: str, *, sets: list[str] | None = None,
                 input_roots: dict | None = None) -> ReplayResult:
    """Replay actor ``name`` of ``trace`` alone; see the module docstring.  ``input_roots``: where the files
    the recorded scenario names may lie (``emu trace replay``: the trace's folder, emulator/input_paths.py);
    None trusts the roots the trace records (a trace this process wrote)."""
    if name not in trace.actors:
        close = difflib.get_close_matches(name, trace.actors, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ReplayError(f"no actor named {name!r} in this trace{hint}")
    links = trace.links
    rec = _recording(trace, name)
    _check_replayable(trace, name, rec)
    system, actor, got = _alone(trace, name, rec, sets, input_roots)

    status = trace.footer.get("status")
    end = trace.footer.get("end_time_ps")
    result = system.run(until=None if status == "finished" or end is None else int(end))

    new_id = {l.name: l.id for l in system.links}
    got_sends = {li: [e for e in got if e[0] == SEND and e[2] == new_id[links[li]["name"]]] for li in rec.out_links}
    got_done = next((e[1] for e in got if e[0] == DONE and e[2] == actor.id), None)
    first, matched = _first_divergence(links, rec, got_sends)

    lines = []
    ok = first is None
    if ok and rec.done_at != got_done:
        ok = False
        exp = "never finished" if rec.done_at is None else f"finished at {format_time(rec.done_at)} ({rec.done_at} ps)"
        gotw = "did not finish" if got_done is None else f"finished at {format_time(got_done)} ({got_done} ps)"
        lines.append(f"replay of {name}: {matched} messages match, but the trace says it {exp} and the replay "
                     f"{gotw}")
    elif ok:
        lines.append(f"replay of {name}: {matched} messages match" +
                     (f", finished at {format_time(rec.done_at)}" if rec.done_at is not None else ""))
    else:
        lines.append(f"replay of {name}: diverges {first[1]} ({matched} earlier message(s) matched)")
    if result.status == "error":
        ok = False
        lines.append(f"the replay ended with an error: {result.error}")
    elif result.status == "deadlock" and status == "finished":
        lines.append(str(result.deadlock))
    expected = sum(len(v) for v in rec.sends.values())
    return ReplayResult(actor=name, ok=ok, matched=matched, expected=expected, status=result.status, lines=lines)

"""A run's state at one instant: what every actor is doing, what waits in its queues, what is in flight.

``emu run --stop-at T`` stops a run at virtual time ``T`` (every time step at or before ``T`` has run, none
after) and :func:`snapshot` reads the machine as it stands, before the run's tasks are ended: the answer
to "what was every PE doing at 2.3 us?" (docs/outputs.md "The state at a stop", ``state.json`` in the
bundle; ``emu inspect BUNDLE`` prints it).

Per actor (only what is not at rest, unless ``full``):

* ``state``: ``finished`` (its task returned), ``killed``, ``not started`` (a server its first message
  starts), ``busy`` (in a service time: ``busy_until_ps`` and ``busy_label``, the span's label -- the
  command it serves), ``waiting`` (parked until a time: ``until_ps``), ``recv`` (parked on in-ports:
  ``waits_on``), ``send`` (blocked for a link credit: ``waits_on``), ``idle`` (a server with nothing
  to do), or ``other`` (a workload actor parked outside the engine's ports and clock);
* ``queues``: each in-port holding messages: ``length`` and the first few heads (``kind``, ``bytes``,
  ``delivered_ps``, ``from``);
* the component's own state: the values of the attributes its class names in ``STATE`` (a tuple of
  attribute names, the one declared hook: a new component gets a snapshot by declaring what matters;
  containers are shown by their length, numpy arrays by shape, other objects by type name) and whatever
  its ``state()`` method adds (emulator/actor.py); a class with ``STATE_AT_REST`` (a memory) is listed
  at rest too, when its ``state()`` says anything (a TCM that holds buffers).

Per link with something in flight or a credit used: ``in_flight`` (``seq``, ``kind``, ``bytes``,
``deliver_ps``), ``credits_used`` of ``capacity``.

The **state digest** (:func:`state_digest`) hashes the snapshot's canonical JSON; with the trace digest
of the events up to the stop it identifies the instant (two runs with equal digests at ``T`` are in the
same state there).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sized

import numpy as np
import xxhash

__all__ = ["snapshot", "state_digest", "value_summary", "HEADS"]

#: how many queued or in-flight messages are listed per port or link (the count is always complete)
HEADS = 4


def value_summary(v):
    """A JSON-able summary of one piece of actor state (numbers and strings as they are)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return v.item()
    if isinstance(v, np.ndarray):
        return {"shape": list(v.shape), "dtype": str(v.dtype)}
    if isinstance(v, (tuple, list)) and len(v) <= 8 and all(isinstance(x, (bool, int, float, str)) for x in v):
        return list(v)
    if isinstance(v, Mapping) and len(v) <= 16 and all(isinstance(x, (bool, int, float, str)) for x in v.values()):
        return {str(k): x for k, x in v.items()}
    if isinstance(v, Sized):
        return {"length": len(v)}
    return type(v).__name__


def _kind(msg, data) -> str:
    """A message's record name (``DmaCmd``), from the object or, still encoded, from its bytes."""
    if msg is not None and msg is not False:
        return type(msg).__name__
    from protocols.codec import decode
    try:
        return type(decode(data)).__name__
    except Exception:    # a corrupted payload (a fault) still shows up, by its size
        return "?"


def _parked(system) -> dict:
    """Trio task -> the virtual time its earliest live clock wake-up is due."""
    out = {}
    for t, bucket in system.clock._buckets.items():
        for entries in bucket:
            for e in entries:
                task = e[1]
                if task is not None and e[2] is None and (task not in out or t < out[task]):
                    out[task] = t
    return out


def _actor(actor, now: int, tasks: list, parked: dict, full: bool) -> dict | None:
    from emulator.link import waits_of

    d: dict = {}
    if actor.killed:
        state = "killed"
    elif actor.finished_at is not None:
        state = "finished"
        d["finished_at_ps"] = actor.finished_at
    elif actor.starts_on is not None and getattr(actor.inputs.get(actor.starts_on), "unstarted", False):
        state = "not started"
    else:
        waits = waits_of(actor)
        until = min((parked[t] for t in tasks if t in parked), default=None)
        if getattr(actor, "busy_until", -1) > now:
            state = "busy"
            d["busy_until_ps"] = actor.busy_until
            d["busy_label"] = actor.busy_label
        elif until is not None and not waits:
            state = "waiting"
            d["until_ps"] = until
        elif waits:
            direction, what = waits[0]
            state = direction
            d["waits_on"] = ([p.path for p in what] if direction == "recv" else [what.path])
            if direction == "recv" and actor.daemon and all(p.idle for p in what):
                state = "idle"
        elif actor.daemon:
            state = "idle"            # a server parked outside the engine (a trace track's sleep_forever)
        else:
            state = "other"           # parked outside the engine's ports and clock (a Trio primitive)
    d = {"type": type(actor).__name__, "state": state, **d}
    queues = {}
    for name, port in actor.inputs.items():
        if port.buf:
            queues[name] = {"length": len(port.buf),
                            "heads": [{"kind": _kind(m, None), "delivered_ps": at, "from": link.src.owner.name}
                                      for m, link, _, _, at in list(port.buf)[:HEADS]]}
    if queues:
        d["queues"] = queues
    own = actor.state()
    if own:
        d["component"] = own
    if actor.busy_ps:
        d["busy_ps"] = actor.busy_ps
    if not full and state in ("idle", "not started", "finished") and not queues and not (actor.STATE_AT_REST and own):
        return None
    return d


def _link(link) -> dict | None:
    used = link.outstanding
    if not link.inflight and not used:
        return None
    return {"src": link.src.path, "dst": link.dst.path, "credits_used": used, "capacity": link.capacity,
            "in_flight_count": len(link.inflight),
            "in_flight": [{"seq": seq, "kind": _kind(msg, data), "bytes": len(data), "deliver_ps": at}
                          for at, seq, data, msg in list(link.inflight)[:HEADS]]}


def snapshot(system, *, full: bool = False) -> dict:
    """The running ``system``'s state now (module docstring); call it while its tasks are still parked.

    ``full``: every actor, at rest or not (by default idle servers, finished and unstarted actors with
    empty queues are only counted)."""
    now = system.clock.now
    system.recorder.flush()             # the digest covers every event up to now (flushing moves no event)
    parked = _parked(system)
    tasks = system.actor_tasks()
    actors, at_rest = {}, 0
    for a in system.actors.values():
        d = _actor(a, now, tasks.get(a.name, []), parked, full)
        if d is None:
            at_rest += 1
        else:
            actors[a.name] = d
    links = {}
    for l in system.links:
        d = _link(l)
        if d is not None:
            links[l.name] = d
    counts: dict = {}
    for d in actors.values():
        counts[d["state"]] = counts.get(d["state"], 0) + 1
    return {"t_ps": now, "trace_digest": system.recorder.digest, "events": system.recorder.count, "actors_total": len(system.actors), "actors_at_rest": at_rest,
            "states": counts, "actors": actors, "links_total": len(system.links),
            "links_in_use": len(links), "messages_in_flight": sum(d["in_flight_count"] for d in links.values()),
            "links": links}


def state_digest(snap: dict) -> str:
    """xxh3-128 of the snapshot's canonical JSON, without the digest fields themselves."""
    body = {k: v for k, v in snap.items() if k not in ("state_digest",)}
    return xxhash.xxh3_128_hexdigest(json.dumps(body, sort_keys=True, default=str).encode())

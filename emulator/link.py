"""Ports and links: the only way actors talk.

An :class:`OutPort` of one actor is wired to an :class:`InPort` of another by a
:class:`Link` (one per direction).  The link is an actor-like Trio task with:

* **bounded capacity** in messages, enforced with credits: a message holds a
  credit from the moment the sender hands it over until the receiver takes it
  out of its in-port.  A sender with no credit blocks (back-pressure);
* **bandwidth**: a message occupies the link for ``ceil(nbytes * 1e12 / B)`` ps
  after the previous one leaves it (FIFO serialisation); ``nbytes`` is the
  msgpack-encoded size plus the full size of any tensor descriptor it carries;
* **latency**: a fixed flight time after serialisation.

So a message entering an idle link at ``t`` is delivered at
``t + bytes/bandwidth + latency``, and a back-to-back burst is delivered at
``t + k*bytes/bandwidth + latency`` for the k-th message.  Messages are
msgpack-encoded when they enter the link: the bytes are charged, recorded in
the trace and hashed into the digest, and a fault may corrupt them.  Unless a
fault changed the bytes, the receiver is handed :func:`protocols.codec.receiver_copy`
of the sender's record (equal to decoding the bytes, made the cheapest way: a
record with arrays is rebuilt around them, shared read-only, a scalar-only one is a
fresh shell, the rest is decoded right away), else the bytes are decoded when
they leave the link.  ``STRICT_DECODE`` (environment ``EMU_STRICT_DECODE=1``) decodes every
message instead; the digests are the same either way (tests/test_links.py).

Fast paths, as measured in reference/engine-perf.md §1 and §8: entering a link
is a synchronous method (encode, compute the arrival time, append), so a send
with a credit never switches tasks; the link task sleeps on the clock
until the earliest arrival and delivers *every* message that is due in one
wake-up; a waiting receiver gets the message handed over directly.  No
``trio.sleep``, cancel scope or memory channel on the hot path.

Public read-only statistics of a link: ``busy_ps`` (serialisation time charged
so far), ``free_at`` (when the last message's serialisation ends), ``messages``,
``bytes``, ``delivered``, ``dropped``.  Engine hooks for senders that model the
wire themselves: :meth:`Link.serialise_at_sender`, :meth:`Link.charge_occupancy`;
for clients that count credits: :meth:`InPort.capacity_from`, :attr:`OutPort.peer`.

Fault hooks: ``Link.faults`` is a list of objects with ``on_send(link, t, seq,
msg_name, data, nbytes)`` returning ``None`` (no effect) or a
:class:`FaultEffect`; see ``emulator/faults.py``.
"""
from __future__ import annotations

import itertools
import os
from collections import deque
from heapq import heappush
from typing import TYPE_CHECKING

from trio._core._run import GLOBAL_RUN_CONTEXT
from trio.lowlevel import enable_ki_protection

from emulator.clock import park
from emulator.trace import BLOCK, CHUNK, DELIVER, FAULT, SEND, TAKE
from emulator.units import PS_PER_S
from protocols.codec import ProtocolError, decode, encode, peek_name, receiver_copy, type_name

if TYPE_CHECKING:
    from emulator.actor import Actor

__all__ = ["InPort", "OutPort", "Link", "FaultEffect", "select", "select_until", "STRICT_DECODE", "waits_of"]

#: decode every message at the receiving end instead of handing over the sender's record
STRICT_DECODE = bool(os.environ.get("EMU_STRICT_DECODE"))


class FaultEffect:
    """What a link fault does to one message."""

    __slots__ = ("drop", "data", "extra_delay", "bandwidth_factor", "label")

    def __init__(self, label: str, *, drop=False, data=None, extra_delay=0, bandwidth_factor=1.0):
        self.label = label
        self.drop = drop
        self.data = data
        self.extra_delay = extra_delay
        self.bandwidth_factor = bandwidth_factor


#: stamps every wait (receive or credit) in the order it began, for :func:`waits_of`
_WAIT_ORDER = itertools.count()


def waits_of(actor) -> list[tuple[str, object]]:
    """What ``actor``'s parked tasks wait on, in the order they began: ``("recv", ports)`` or ``("send", port)``.

    A receive is found from the waiter on its in-ports (a receive keeps no
    other record: nothing to add and remove on every message); a sender
    waiting for a credit is in ``actor.blocked`` (rare, so it keeps one).
    """
    waits, seen = [], set()
    for port in actor.inputs.values():
        w = port.waiter
        if w is not None and w.task not in seen:
            seen.add(w.task)
            waits.append((w.order, "recv", w.ports))
    for order, port in actor.blocked.values():
        waits.append((order, "send", port))
    waits.sort(key=lambda w: w[0])
    return [(direction, what) for _, direction, what in waits]


class _Waiter:
    """A task parked in :meth:`InPort.recv` or :func:`select` on one or more ports.

    ``entry`` is the co-scheduled clock entry (see :func:`select`), or None
    when the waiter relies on a direct hand-over by the delivering link.
    """

    __slots__ = ("task", "ports", "entry", "got", "order")

    def __init__(self, task, ports):
        self.task = task
        self.ports = ports
        self.entry = None
        self.got = None
        self.order = next(_WAIT_ORDER)   # when it began waiting (deadlock reports list waits in this order)

    def release(self) -> None:
        for p in self.ports:
            p.waiter = None

    def abort_wait(self, task) -> None:
        """The parked receiver was cancelled: disarm its wake-up and free its ports."""
        if self.entry is not None:
            self.entry[1] = None
        self.release()


class InPort:
    """A named input of an actor; fed by one or more links (fan-in)."""

    __slots__ = ("owner", "name", "buf", "waiter", "links", "taken", "max_depth", "idle", "own", "unstarted")

    def __init__(self, owner: "Actor", name: str, idle: bool = False):
        self.owner = owner
        self.name = name
        #: waiting here means "nothing to do" (a server's request queue): a
        #: deadlock report counts such waits instead of listing them
        self.idle = idle
        self.buf: deque = deque()
        self.waiter: _Waiter | None = None
        self.own: _Waiter | None = None    # the waiter recv re-arms (select makes its own)
        self.links: list[Link] = []
        self.taken = 0
        self.max_depth = 0
        #: the owner's task is not started yet; the first message sent here starts it (Actor.starts_on)
        self.unstarted = False

    @property
    def path(self) -> str:
        return f"{self.owner.name}.{self.name}"

    def __repr__(self) -> str:
        return f"<InPort {self.path}>"

    def __len__(self) -> int:
        return len(self.buf)

    def capacity_from(self, sender: "Actor") -> int | None:
        """Capacity (messages) of the link into this port from actor ``sender``; ``None`` if none is wired.

        A client that keeps its own credit count for a reply queue (a PE CPU's
        completion queues, actors/ahbm/cpu.py) reads the queue's depth here
        instead of walking the wiring."""
        for link in self.links:
            if link.src.owner is sender:
                return link.capacity
        return None

    # called by the link task at delivery time
    def _deliver(self, msg, link: "Link", seq: int, now: int) -> None:
        waiter = self.waiter
        emit = link.emit
        if waiter is not None:
            # The receiver is parked: it consumes the message now.
            entry = waiter.entry
            for p in waiter.ports:     # waiter.release(), inlined
                p.waiter = None
            emit((DELIVER, now, link.id, seq, 1))
            emit((TAKE, now, link.id, seq, 0))
            self.taken += 1
            if link.blocked:           # link._credit_return(), inlined
                link.clock.wake(link.blocked.popleft())
            else:
                link.credits += 1
            if entry is None or entry[1] is not None:
                # hand it over (cancelling a co-scheduled wake-up that would come later)
                if entry is not None:
                    entry[1] = None
                link.clock.wake(waiter.task, (self, msg))
            else:
                # its co-scheduled wake-up already fired at this instant: it runs
                # after us in this batch and finds the message in waiter.got
                waiter.got = (self, msg)
            return
        buf = self.buf
        link.system.deliveries += 1
        buf.append((msg, link, seq, link.system.deliveries, now))
        depth = len(buf)
        if depth > self.max_depth:
            self.max_depth = depth
        emit((DELIVER, now, link.id, seq, depth))

    def _take(self):
        msg, link, seq, _, _ = self.buf.popleft()
        link.emit((TAKE, link.clock.now, link.id, seq, len(self.buf)))
        self.taken += 1
        link._credit_return()
        return msg

    def arm_for(self, task) -> None:
        """Register ``task`` (just spawned, not run yet) as parked in :meth:`recv` on this port.

        For an actor started by its first message (``Actor.starts_on``): the
        port is in the state a receive made at the start of the run would have
        left it in (a waiter with no co-scheduled entry: no message was in
        flight to it), before the sender's link looks at it; the task's first
        :meth:`recv` then parks on this waiter instead of arming a new one.
        """
        waiter = self.own
        if waiter is None:
            waiter = self.own = _Waiter(task, (self,))
        waiter.task = task
        waiter.entry = waiter.got = None
        waiter.order = next(_WAIT_ORDER)
        self.waiter = waiter

    def detach(self) -> None:
        """Forget the links and queued messages (the owner leaves its system, e.g. to be replayed alone)."""
        self.links = []
        self.buf.clear()
        self.waiter = None
        self.taken = 0
        self.max_depth = 0

    def head_delivered(self) -> int | None:
        """When the first waiting message was delivered (ps), ``None`` if none waits: for an actor that orders
        commands it knows of by their arrival (the MATH engine's runs, actors/ahbm/mathunit.py)."""
        return self.buf[0][4] if self.buf else None

    def poll(self):
        """Take a message if one is waiting, else return ``None`` (never blocks)."""
        if self.buf:
            return self._take()
        return None

    @enable_ki_protection
    async def recv(self):
        """Receive the next message (FIFO across this port's links by delivery order)."""
        if self.buf:
            return self._take()
        if not self.links:
            raise RuntimeError(f"in-port {self.path} is not connected to any link")
        # select's park inlined (one coroutine frame fewer on every wake-up of a receiver), with this
        # port's own waiter re-armed: only the owner's one receiving task parks here, and it
        # has read ``got`` before it can park again
        waiter = self.own
        if waiter is None:
            waiter = self.own = _Waiter(None, (self,))
        # _arm((self,), self.owner, waiter), inlined for one port
        if self.waiter is not None:
            if self.waiter is waiter and waiter.task is GLOBAL_RUN_CONTEXT.task:
                # the first receive of an actor started by its first message: armed by arm_for
                got = await park(waiter) or waiter.got or await _rewait(waiter)
                return got[1]
            raise RuntimeError(f"in-port {self.path}: two tasks of {self.owner.name} receive on it at once; "
                               "give each task its own port")
        task = waiter.task = GLOBAL_RUN_CONTEXT.task
        waiter.entry = waiter.got = None
        waiter.order = next(_WAIT_ORDER)
        self.waiter = waiter
        for l in self.links:
            wake = l.wake
            if wake is not None and wake[1] is not None and l.inflight and l.inflight[0][0] == wake[0]:
                entry = waiter.entry
                if entry is None or wake[0] < entry[0]:
                    if entry is not None:
                        entry[1] = None
                    waiter.entry = l.clock.schedule(wake[0], task)
        got = await park(waiter) or waiter.got or await _rewait(waiter)
        return got[1]


def _earliest(ports):
    best = None
    for p in ports:
        if p.buf and (best is None or p.buf[0][3] < best.buf[0][3]):
            best = p
    return best


def _arm(ports, owner, waiter: _Waiter | None = None) -> _Waiter:
    """Register the current task as the waiter of ``ports`` (see :func:`select`); ``waiter``: one to re-arm."""
    task = GLOBAL_RUN_CONTEXT.task
    for p in ports:
        if p.waiter is not None:
            raise RuntimeError(f"in-port {p.path}: two tasks of {owner.name} receive on it at once; "
                               "give each task its own port")
    if waiter is None:
        waiter = _Waiter(task, ports)
    else:
        waiter.task = task
        waiter.entry = waiter.got = None
        waiter.order = next(_WAIT_ORDER)
    for p in ports:
        p.waiter = waiter
        for l in p.links:
            wake = l.wake
            if wake is not None and wake[1] is not None and l.inflight and l.inflight[0][0] == wake[0]:
                if waiter.entry is None or wake[0] < waiter.entry[0]:
                    if waiter.entry is not None:
                        waiter.entry[1] = None
                    waiter.entry = l.clock.schedule(wake[0], task)
    return waiter


async def _rewait(waiter: _Waiter):
    """A co-scheduled wake-up found nothing: wait for a hand-over (rare)."""
    while True:
        waiter.entry = None
        got = await park(waiter) or waiter.got
        if got is not None:
            return got


@enable_ki_protection
async def select(*ports: InPort):
    """Receive from whichever port has a message first; returns ``(port, message)``.

    If several already hold messages, the one delivered earliest (lowest
    delivery order) wins, so the choice is deterministic.  Otherwise the task
    parks until one of ``ports`` has a message, woken one of two ways, both
    exact in time:

    * hand-over: the delivering link reschedules us with the message;
    * co-scheduling: when a link already has a pending wake-up for the earliest
      arrival, we put our own entry on the clock at the same time *after*
      it.  Both then run in the same pass of Trio's loop, the link first, and we
      take the message from ``waiter.got``.  This halves the run-loop passes per
      hop (reference/engine-perf.md §1: a pass costs ~4 µs).
    """
    best = _earliest(ports)
    if best is not None:
        return best, best._take()
    waiter = _arm(ports, ports[0].owner)
    return await park(waiter) or waiter.got or await _rewait(waiter)


@enable_ki_protection
async def select_until(ports, t: int):
    """:func:`select` with a deadline: ``(port, message)`` if one of ``ports`` delivers before virtual time
    ``t`` (or at ``t``, before this task's turn at that instant), else ``None`` at ``t``.

    For an actor that knows when its next own event is due and must still react to messages meanwhile
    (the PE scheduler at ``fidelity: pipeline``, actors/ahbm/scheduler.py).  The deadline is one more
    clock entry of the waiter, so it is ordered like :func:`sleep_until` (time, then scheduling order),
    never by Trio's deadlines."""
    best = _earliest(ports)
    if best is not None:
        return best, best._take()
    owner = ports[0].owner
    while True:
        waiter = _arm(ports, owner)
        entry = waiter.entry
        if entry is None or entry[0] > t:     # no delivery due before t: wake at t at the latest
            if entry is not None:
                entry[1] = None
            waiter.entry = owner.system.clock.schedule(t, waiter.task)
        got = await park(waiter) or waiter.got
        if got is not None:
            return got
        waiter.release()                      # woken by our own entry (the deadline, or a co-scheduled
        best = _earliest(ports)               # delivery that found nothing: rare, wait again)
        if best is not None:
            return best, best._take()
        if owner.system.clock.now >= t:
            return None


class OutPort:
    """A named output of an actor, wired to exactly one link."""

    __slots__ = ("owner", "name", "link")

    def __init__(self, owner: "Actor", name: str):
        self.owner = owner
        self.name = name
        self.link: Link | None = None

    @property
    def path(self) -> str:
        return f"{self.owner.name}.{self.name}"

    def __repr__(self) -> str:
        return f"<OutPort {self.path}>"

    @property
    def peer(self) -> "Actor | None":
        """The actor at the other end of this port's link (``None`` while unwired)."""
        return self.link.dst.owner if self.link is not None else None

    def detach(self) -> None:
        """Forget the link (the owner leaves its system, e.g. to be replayed alone)."""
        self.link = None

    @enable_ki_protection
    async def send(self, msg) -> None:
        """Hand ``msg`` to the link; blocks only while the link has no credit."""
        link = self.link
        if link is None:
            raise RuntimeError(f"out-port {self.path} is not connected to any link")
        if link.credits > 0 and not link.blocked:
            link.credits -= 1
        else:
            await link._wait_credit(self.owner)
        link._accept(msg)

    def try_send(self, msg) -> bool:
        """Send without blocking if a credit is available; return whether it was sent."""
        link = self.link
        if link is None:
            raise RuntimeError(f"out-port {self.path} is not connected to any link")
        if link.credits > 0 and not link.blocked:
            link.credits -= 1
            link._accept(msg)
            return True
        return False


class Link:
    """One direction of a modelled physical link (see the module docstring)."""

    # slotted: a 4-SIP machine builds ~37 k of them (issue #13, idle fixed cost)
    __slots__ = ("system", "id", "name", "src", "dst", "capacity", "latency", "bandwidth", "credits", "blocked",
                 "inflight", "free_at", "last_arrival", "seq", "faults", "sender_bandwidth", "task", "wake",
                 "clock", "emit", "messages", "bytes", "busy_ps", "delivered", "dropped", "blocked_count",
                 "ser_nbytes", "ser_bandwidth", "ser_ps", "undecoded")

    def __init__(self, system, id: int, name: str, src: OutPort, dst: InPort, *,
                 capacity: int, latency: int, bandwidth: int):
        if capacity < 1:
            raise ValueError(f"link {name}: capacity must be >= 1 message, found {capacity}")
        if latency < 0 or bandwidth < 0:
            raise ValueError(f"link {name}: latency and bandwidth must be >= 0")
        self.system = system
        self.id = id
        self.name = name
        self.src = src
        self.dst = dst
        self.capacity = capacity
        self.latency = latency
        self.bandwidth = bandwidth
        self.credits = capacity
        self.blocked: deque = deque()
        self.inflight: deque = deque()
        self.free_at = 0
        self.last_arrival = 0
        self.seq = 0
        self.faults: list = []
        #: modelled bandwidth while the sender serialises (:meth:`serialise_at_sender`), else None
        self.sender_bandwidth: int | None = None
        self.task = None
        self.wake = None
        self.clock = None
        self.emit = None
        self.ser_nbytes = self.ser_bandwidth = self.ser_ps = -1   # the last serialisation time (_accept)
        self.undecoded = 0          # messages in flight that the link's task must decode (can_deliver_here)
        # statistics
        self.messages = 0
        self.bytes = 0
        self.busy_ps = 0
        self.delivered = 0
        self.dropped = 0
        self.blocked_count = 0

    def __repr__(self) -> str:
        return f"<Link {self.name}>"

    def describe(self) -> dict:
        return {
            "name": self.name, "src": self.src.owner.name, "src_port": self.src.name,
            "dst": self.dst.owner.name, "dst_port": self.dst.name, "capacity": self.capacity,
            "latency_ps": self.latency, "bandwidth_Bps": self.bandwidth,
        }

    @property
    def outstanding(self) -> int:
        """Messages holding a credit: in flight plus waiting in the receiver's in-port."""
        return self.capacity - self.credits

    # -- sender-side serialisation ---------------------------------------------
    def serialise_at_sender(self) -> int:
        """Let the sender serialise this link itself; returns the link's modelled bandwidth.

        From now on the link charges no serialisation (its ``bandwidth`` is 0) but
        keeps its latency, FIFO order, credits and faults other than
        ``bandwidth_factor``.  The sender times each message with the returned
        bandwidth (a cut-through router, actors/ahbm/noc.py, overlaps a packet's
        serialisation on consecutive links) and reports the occupancy with
        :meth:`charge_occupancy` so ``busy_ps`` still reads right.  Idempotent
        (a system run again keeps the modelled figure).  The normal send path is
        unchanged: it only sees ``bandwidth == 0``.
        """
        if self.sender_bandwidth is None:
            self.sender_bandwidth = self.bandwidth
            self.bandwidth = 0
        return self.sender_bandwidth

    def charge_occupancy(self, ps: int) -> None:
        """A sender-serialised link was busy ``ps`` more (statistics only, timing unchanged)."""
        self.busy_ps += ps

    # -- sender side ----------------------------------------------------------
    async def _wait_credit(self, owner) -> None:
        task = GLOBAL_RUN_CONTEXT.task
        self.blocked.append(task)
        self.blocked_count += 1
        self.emit((BLOCK, self.clock.now, self.id, self.seq + 1))
        owner.blocked[task] = (next(_WAIT_ORDER), self.src)
        try:
            await park(self)
        finally:
            owner.blocked.pop(task, None)

    def abort_wait(self, task) -> None:
        """A task parked on this link was cancelled: the link task's delivery wait or a sender's credit wait."""
        if task is self.task:
            if self.wake is not None:
                self.wake[1] = None
            return
        try:
            self.blocked.remove(task)
        except ValueError:
            pass

    def _credit_return(self) -> None:
        if self.blocked:
            self.clock.wake(self.blocked.popleft())  # the credit passes straight to it
        else:
            self.credits += 1

    def _accept(self, msg) -> None:
        clock = self.clock
        now = clock.now
        try:
            data, nbytes = encode(msg)
        except ProtocolError as e:
            raise e.at(link=self.name, msg=type_name(msg)) from None
        seq = self.seq = self.seq + 1
        if self.faults:
            sent = data
            data, bandwidth, extra, drop = self._apply_faults(msg, now, seq, data, nbytes)
            handed = None if data is not sent or STRICT_DECODE else False
        else:
            bandwidth = self.bandwidth
            extra = 0
            drop = False
            handed = None if STRICT_DECODE else False   # False: the receiver's copy is made below
        start = self.free_at if self.free_at > now else now
        # transfer_ps(nbytes, bandwidth) inlined (a call fewer per message); the last size's
        # result is kept: a link mostly carries one message size, and nbytes * 1e12 is a
        # multi-digit Python integer whose floor division is the dearest line here
        if nbytes == self.ser_nbytes and bandwidth == self.ser_bandwidth:
            ser = self.ser_ps
        else:
            ser = -((-nbytes * PS_PER_S) // bandwidth) if bandwidth > 0 and nbytes > 0 else 0
            self.ser_nbytes, self.ser_bandwidth, self.ser_ps = nbytes, bandwidth, ser
        end = start + ser
        self.free_at = end
        self.busy_ps += ser
        self.messages += 1
        self.bytes += nbytes
        self.emit((SEND, now, self.id, seq, nbytes, data))
        if drop:
            self.dropped += 1
            self._credit_return()
            return
        arrival = end + self.latency + extra
        if arrival < self.last_arrival:
            arrival = self.last_arrival  # a link is FIFO: nothing overtakes
        self.last_arrival = arrival
        if handed is False:
            handed = receiver_copy(msg, data)
        if handed is None:
            self.undecoded += 1
        self.inflight.append((arrival, seq, data, handed))
        if self.wake is None:
            task = self.task
            if task is None and self.system.lazy_links:
                task = self.task = self.system._spawn_link(self)   # first message: start the link's task
                if self.dst.unstarted:                             # and its receiver's (Actor.starts_on)
                    self.system._start_on_first_message(self.dst)
            if task is not None:
                # clock.schedule_delivery(arrival, task, self), inlined (the hot path of every message)
                self.wake = [arrival, task, self]
                bucket = clock._buckets.get(arrival)
                if bucket is None:
                    bucket = clock._buckets[arrival] = ([], [])
                    heappush(clock._times, arrival)
                bucket[0].append(self.wake)
                waiter = self.dst.waiter
                if waiter is not None:
                    entry = waiter.entry
                    if entry is None or (entry[1] is not None and entry[0] > arrival):
                        if entry is not None:
                            entry[1] = None
                        waiter.entry = clock.schedule(arrival, waiter.task)

    def _apply_faults(self, msg, now: int, seq: int, data: bytes, nbytes: int):
        """What this link's faults do to one message: ``(bytes on the wire, bandwidth, extra delay, drop)``."""
        bandwidth = self.bandwidth
        extra = 0
        drop = False
        for fault in self.faults:
            eff = fault.on_send(self, now, seq, type_name(msg), data, nbytes)
            if eff is None:
                continue
            self.emit((FAULT, now, self.name, eff.label, seq))
            if eff.drop:
                drop = True
            if eff.data is not None:
                data = eff.data
            extra += eff.extra_delay
            if eff.bandwidth_factor != 1.0 and bandwidth:
                bandwidth = max(1, int(bandwidth * eff.bandwidth_factor))
        return data, bandwidth, extra, drop

    # -- delivery inside the clock ----------------------------------------------
    def can_deliver_here(self, now: int) -> bool:
        """Whether :meth:`deliver_due` may stand in for this link's task at ``now``.

        Yes unless a message due now has to be decoded (a fault changed its bytes,
        or ``STRICT_DECODE``): a decode error belongs to the link's task, which
        reports it as the link's error.  (The clock asks only while ``undecoded``
        messages are in flight.)
        """
        for arrival, _, _, msg in self.inflight:
            if arrival > now:
                return True
            if msg is None:
                return False
        return True

    def deliver_due(self, now: int) -> None:
        """One wake-up of :meth:`run`, done by the clock while the task stays parked.

        The clock calls it for a due delivery when :meth:`can_deliver_here`
        (emulator/clock.py, ``_run_instant``): the same deliveries, events, credit
        returns and next wake-up as the task's loop body, without a task step.
        """
        self.wake = None
        inflight = self.inflight
        dst = self.dst
        while inflight and inflight[0][0] <= now:
            _, seq, _, msg = inflight.popleft()
            self.delivered += 1
            dst._deliver(msg, self, seq, now)
        if inflight:
            self.wake = self.clock.schedule_delivery(inflight[0][0], self.task, self)

    # -- the link task --------------------------------------------------------
    @enable_ki_protection
    async def run(self) -> None:
        self.task = GLOBAL_RUN_CONTEXT.task
        clock = self.clock
        inflight = self.inflight
        dst = self.dst
        name = self.name

        events = self.system.recorder.events
        flush = self.system.recorder.flush
        while True:
            if inflight and self.wake is None:
                self.wake = clock.schedule_delivery(inflight[0][0], self.task, self)
            if len(events) >= CHUNK:   # bounded memory even when virtual time stands still
                flush()
            await park(self)
            self.wake = None
            now = clock.now
            while inflight and inflight[0][0] <= now:
                _, seq, data, msg = inflight.popleft()
                if msg is None:
                    self.undecoded -= 1
                    try:
                        msg = decode(data)
                    except ProtocolError as e:
                        raise e.at(link=name, msg=f"{e.msg or peek_name(data) or '?'} #{seq}") from None
                self.delivered += 1
                dst._deliver(msg, self, seq, now)

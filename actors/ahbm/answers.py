"""Request/answer matching for an actor with several accesses in flight on one reply port.

An actor that sends requests (each with an id) and gets the answers back on
one in-port, while several of its accesses are in flight (the DMA engine's
data phases, dma.py), routes each answer to the access that waits for it:
:class:`Answers` is the port's reader task, :class:`Mailbox` one access's
queue.  :class:`Direct` is the same interface over the in-port itself, for an
actor with one access at a time (the HBM port, hbmport.py).
"""
from __future__ import annotations

from collections import deque

from emulator.actor import Actor
from emulator.waitqueue import WaitQueue

__all__ = ["Answers", "Mailbox", "Direct"]


class Answers:
    """Routes the answers arriving on one in-port to the access waiting for them, by request id.

    :meth:`expect` registers an id for a :class:`Mailbox` before the request is
    sent; :meth:`run` (a task of the owning actor) delivers each answer to its
    mailbox.  An answer nobody expects is a clear error.
    """

    def __init__(self, actor: Actor, port):
        self.actor = actor
        self.port = port
        self.owner: dict[int, "Mailbox"] = {}

    def expect(self, rid: int, box: "Mailbox") -> None:
        self.owner[rid] = box

    async def run(self) -> None:
        while True:
            self.port.idle = not self.owner   # waiting with no request in flight = nothing to do
            r = await self.port.recv()
            box = self.owner.pop(r.id, None)
            if box is None:
                raise RuntimeError(f"{self.actor.name}: answer {type(r).__name__} {r.id} on {self.port.name}"
                                   f" matches no request in flight")
            box.items.append(r)
            box.lot.unpark()


class Mailbox:
    """The answers of one access (filled by :class:`Answers`)."""

    def __init__(self, answers: Answers | None = None):
        self.answers = answers
        self.items: deque = deque()
        self.lot = WaitQueue()

    def expect(self, rid: int) -> None:
        self.answers.expect(rid, self)

    async def recv(self):
        while not self.items:
            await self.lot.park()
        return self.items.popleft()


class Direct:
    """A response source that is the in-port itself (one access at a time: hbmport.py)."""

    def __init__(self, port):
        self.port = port

    def expect(self, rid: int) -> None:
        pass

    async def recv(self):
        return await self.port.recv()

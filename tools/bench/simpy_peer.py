"""The demo workloads as SimPy models of the same structure, for ``emu bench engine``.

Same structure as the emulator's demo machine (actors/demo/machine.py): one
SimPy process per ring node / reduce PE, **one process per link** that takes a
message, msgpack-encodes it with the same codec (protocols.codec), charges the
same serialisation ``ceil(bytes*1e12/bandwidth)`` after the previous message
(FIFO) plus the same latency, and delivers the decoded message into the
receiver's store at that time.  The service times (``service``, ``produce``,
``merge``) and the numpy log-sum-exp merge are the same too, so both models
must end at the same virtual time; the benchmark checks that.

Differences, stated: a SimPy link's input store bounds only the messages not yet
taken by the link process (the emulator's credits also count messages in flight
and waiting at the receiver).  The benchmark workloads never fill a link, so the
two bound nothing differently there.
"""
from __future__ import annotations

import time

import numpy as np
import simpy

from actors.demo.machine import merge, partial_inputs, reduce_topology, ring_plan
from emulator.units import transfer_ps
from protocols.codec import TensorDesc, decode, encode
from protocols.demo import Partial, Token

__all__ = ["SimpyLink", "run_ring", "run_reduce"]


class SimpyLink:
    """A link as a SimPy process: take, encode, serialise FIFO, deliver after latency, decode."""

    def __init__(self, env: simpy.Environment, dst: simpy.Store, *, capacity: int, latency: int, bandwidth: int):
        self.env = env
        self.inbox = simpy.Store(env, capacity=capacity)
        self.dst = dst
        self.latency = latency
        self.bandwidth = bandwidth
        self.free_at = 0
        self.delivered = 0
        env.process(self.run())

    def run(self):
        env = self.env
        while True:
            msg = yield self.inbox.get()
            data, nbytes = encode(msg)
            start = max(env.now, self.free_at)
            self.free_at = start + transfer_ps(nbytes, self.bandwidth)
            ev = env.timeout(self.free_at + self.latency - env.now, value=data)
            ev.callbacks.append(self._deliver)

    def _deliver(self, ev) -> None:
        self.delivered += 1
        self.dst.put(decode(ev.value))


def run_ring(profile: dict, p: dict) -> dict:
    env = simpy.Environment()
    n = p["nodes"]
    starts, arrivals = ring_plan(n, p["tokens"], p["hops"])
    inboxes = [simpy.Store(env) for _ in range(n)]
    link = profile["pe_link"]
    links = [SimpyLink(env, inboxes[(i + 1) % n], capacity=link["capacity"], latency=link["latency"],
                       bandwidth=link["bandwidth"]) for i in range(n)]
    service = p["service"]

    def node(i):
        out = links[i].inbox
        for tok in starts.get(i, []):
            yield out.put(tok)
        for _ in range(arrivals[i]):
            tok = yield inboxes[i].get()
            if service:
                yield env.timeout(service)
            if tok.hops > 1:
                yield out.put(Token(tok.token, tok.hops - 1))

    for i in range(n):
        env.process(node(i))
    t0, c0 = time.perf_counter(), time.process_time()
    env.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"end_time_ps": env.now, "messages": sum(l.delivered for l in links), "wall_s": wall, "cpu_s": cpu}


def run_reduce(profile: dict, p: dict, mode: str, seed: int) -> dict:
    env = simpy.Environment()
    cx, cy, P = profile["cubes_x"], profile["cubes_y"], profile["pes_per_cube"]
    parent, mesh_edges = reduce_topology(cx, cy, P, tuple(p["root"]))
    children = {name: 0 for name in parent}
    for name, up in parent.items():
        if up is not None:
            children[up] += 1
    inbox = {name: simpy.Store(env) for name in parent}
    links = {}
    for name, up in parent.items():
        if up is not None:
            lk = profile["mesh_link"] if name in mesh_edges else profile["pe_link"]
            links[name] = SimpyLink(env, inbox[up], capacity=lk["capacity"], latency=lk["latency"],
                                    bandwidth=lk["bandwidth"])
    total = len(parent)
    out = {}
    G, d = p["G"], p["d"]

    def pe(name):
        early: dict[int, list] = {}
        for rnd in range(p["rounds"]):
            start = rnd * p["period"]
            if mode == "data":
                m, l, O = partial_inputs(seed, name, rnd, G, d)
            else:
                m, l, O = TensorDesc.of((G,), "f4"), TensorDesc.of((G,), "f4"), TensorDesc.of((G, d), "f4")
            acc = Partial(rnd, 1, m, l, O)
            yield env.timeout(max(start, env.now) + p["produce"] - env.now)
            for _ in range(children[name]):
                if early.get(rnd):
                    child = early[rnd].pop(0)
                else:
                    while True:
                        child = yield inbox[name].get()
                        if child.round == rnd:
                            break
                        early.setdefault(child.round, []).append(child)
                yield env.timeout(p["merge"])
                if mode == "data":
                    mm, ll, OO = merge((acc.m, acc.l, acc.O), (child.m, child.l, child.O))
                    acc = Partial(rnd, acc.count + child.count, mm, ll, OO)
                else:
                    acc = Partial(rnd, acc.count + child.count, acc.m, acc.l, acc.O)
            if parent[name] is None:
                assert acc.count == total
                if mode == "data":
                    out["output"] = acc.O / acc.l[:, None]
            else:
                yield links[name].inbox.put(acc)

    for name in parent:
        env.process(pe(name))
    t0, c0 = time.perf_counter(), time.process_time()
    env.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"end_time_ps": env.now, "messages": sum(l.delivered for l in links.values()), "wall_s": wall, "cpu_s": cpu,
            "output": out.get("output")}

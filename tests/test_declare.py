"""Declared ports and parameters (emulator/declare.py): complete for every family, enforced at build and at
run time, and what ``emu explain`` / ``emu validate --schema`` print."""
from __future__ import annotations

import collections
import copy
import pickle

import pytest

from actors import registry
from actors.demo.machine import ReducePE, RingNode
from conftest import ROOT
from emulator import link as link_module
from emulator.actor import Actor
from emulator.declare import In, Out, Param, check_system, declared_port, params_for, params_of, ports_of
from emulator.errors import BuildError
from emulator.scenario import load_scenario
from emulator.system import System
from protocols.demo import Partial, Token
from tools.run.components import family_components
from tools.run.runner import build_system, run_scenario

#: small runs that, together, create every declared port of every family (``--set`` overrides switch on the
#: optional ones: the pccx GEMV->SFU FIFO, the Gemma 3N driver's host DDR port, shared weight FIFOs)
RUNS = {
    "demo": [("demo/reduce.yaml", ["workload.params.rounds=1"]), ("demo/ring.yaml", ["workload.params.hops=20"])],
    "ahbm": [("ahbm/microbench.yaml", []), ("ahbm/attention_decode.yaml", []),
             ("ahbm/microbench.yaml", ["workload.params.fidelity=pipeline"])],   # the HBM stack (memory.HbmStack)
    "pccx": [("pccx/program.yaml", ["machine.overrides.cvo.gemv_fifo_words=64"]),
             ("pccx/gemma3n/tiny-timing.yaml", ["workload.params.tokens=1",
                                                 "machine.overrides.gemv.lane_ports=[2, 2, 3, 3]"])],
}


@pytest.fixture(scope="module")
def observed():
    """Run every RUNS scenario through the real runner, recording each message an actor sends: returns
    ``{family: (ports created per class, [(class, out-port, message type, receiver class, in-port)])}``."""
    sends = []
    real_send, real_try = link_module.OutPort.send, link_module.OutPort.try_send

    def note(port, msg):
        dst = port.link.dst
        sends.append((type(port.owner), port.name, type(msg), type(dst.owner), dst.name))

    async def send(self, msg):
        note(self, msg)
        return await real_send(self, msg)

    def try_send(self, msg):
        note(self, msg)
        return real_try(self, msg)

    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(link_module.OutPort, "send", send)
        mp.setattr(link_module.OutPort, "try_send", try_send)
        for family, runs in RUNS.items():
            created = collections.defaultdict(set)
            start = len(sends)
            for path, sets in runs:
                res, system, _ = run_scenario(load_scenario(str(ROOT / "scenarios" / path), registry, sets))
                assert res["status"] == "finished", (path, res.get("error"))
                for a in system.actors.values():
                    created[type(a)] |= {("in", n) for n in a.inputs} | {("out", n) for n in a.outputs}
            out[family] = (created, sends[start:])
    return out


@pytest.mark.parametrize("family", sorted(RUNS))
def test_every_declared_port_is_created_and_every_created_port_is_declared(observed, family):
    created, _ = observed[family]
    classes = family_components(registry.family(family))
    assert set(classes) <= set(created), f"classes never built: {set(classes) - set(created)}"
    for cls in classes:
        for direction, name in created[cls]:
            assert declared_port(cls, direction, name) is not None, f"{cls.__name__}: {direction} {name}"
        for p in ports_of(cls).values():
            assert any(d == p.direction and p.matches(n) for d, n in created[cls]), \
                f"{cls.__name__} declares {p.direction}-port {p.name!r}, never created"


@pytest.mark.parametrize("family", sorted(RUNS))
def test_every_message_sent_is_declared_by_sender_and_receiver(observed, family):
    _, sends = observed[family]
    assert sends
    for src_cls, src_port, msg, dst_cls, dst_port in set(sends):
        out, inp = declared_port(src_cls, "out", src_port), declared_port(dst_cls, "in", dst_port)
        assert msg in out.messages, f"{src_cls.__name__}.{src_port} sent an undeclared {msg.__name__}"
        assert msg in inp.messages, f"{dst_cls.__name__}.{dst_port} received an undeclared {msg.__name__}"


@pytest.mark.parametrize("family", sorted(RUNS))
def test_every_declared_parameter_names_keys_of_its_schema(family):
    """A declaration's key paths exist in the family's profile schema (or the workload's), so the schema
    listing and the defaults shown by ``emu explain`` come from the one place the values are defined."""
    from emulator.declare import WORKLOAD_PREFIX, schema_spec
    mod = registry.family(family)
    for cls in family_components(mod):
        for p in params_of(cls).values():
            for key in p.keys:
                if key.startswith(WORKLOAD_PREFIX):
                    rest = key.removeprefix(WORKLOAD_PREFIX)
                    assert any(rest in wl.params.fields for wl in mod.WORKLOADS.values()), (cls, key)
                else:
                    assert schema_spec(mod.PROFILE_SCHEMA, key) is not None, (cls.__name__, key)


# -- the mechanism ---------------------------------------------------------------------------------------------------
class _Sender(Actor):
    PORTS = (Out("out", Token, doc="tokens"),)

    def __init__(self, name, extra_port=False):
        super().__init__(name)
        self.out = self.out_port("out")
        if extra_port:
            self.out_port("spare")

    async def run(self):
        await self.out.send(Token(0, 1))


class _PartialSink(Actor):
    PORTS = (In("in", Partial, doc="partials only"),)

    def __init__(self, name):
        super().__init__(name)
        self.inp = self.in_port("in")

    async def run(self):
        await self.inp.recv()


class _TokenSink(_PartialSink):
    """A subclass states only what differs: the same port, accepting tokens."""

    PORTS = (In("in", Token, doc="tokens"),)


def test_an_undeclared_port_fails_the_build_check():
    s = System("t")
    s.connect(s.add(_Sender("a", extra_port=True)).out, s.add(_TokenSink("b")).inp, capacity=1)
    with pytest.raises(BuildError, match=r"out-port 'spare' is not declared in _Sender.PORTS"):
        check_system(s)


def test_a_link_whose_receiver_does_not_accept_the_senders_messages_fails_the_build_check():
    s = System("t")
    s.connect(s.add(_Sender("a")).out, s.add(_PartialSink("b")).inp, capacity=1)
    with pytest.raises(BuildError, match=r"_Sender.out sends Token, which _PartialSink.in does not accept"):
        check_system(s)
    ok = System("t")
    ok.connect(ok.add(_Sender("a")).out, ok.add(_TokenSink("b")).inp, capacity=1)
    check_system(ok)
    assert ports_of(_TokenSink)["in"].messages == (Token,)


def test_a_server_started_by_its_first_message_must_name_an_idle_port_of_a_daemon_class():
    """Actor.starts_on is checked at the build: a typo, a port not made idle, or a workload actor is an error."""
    class _Lazy(_TokenSink):
        daemon = True
        starts_on = "in"

        def __init__(self, name, idle=True):
            Actor.__init__(self, name)
            self.inp = self.in_port("in", idle=idle)

    def build(sink):
        s = System("t")
        s.connect(s.add(_Sender("a")).out, s.add(sink).inp, capacity=1)
        return s

    check_system(build(_Lazy("b")))
    with pytest.raises(BuildError, match=r"_Typo.starts_on = 'inp' needs a daemon class and an in-port of that name"
                                         r" made with idle=True; found daemon=True, in-ports in \(idle=True\)"):
        check_system(build(type("_Typo", (_Lazy,), {"starts_on": "inp"})("b")))
    with pytest.raises(BuildError, match=r"in-ports in \(idle=False\)"):
        check_system(build(_Lazy("b", idle=False)))
    with pytest.raises(BuildError, match=r"found daemon=False"):
        check_system(build(type("_Worker", (_Lazy,), {"daemon": False})("b")))


def test_a_component_reading_an_undeclared_parameter_fails_loudly():
    class Src:
        a, b = 1, 2

        @property
        def total(self):
            return self.a + self.b

    class Reader(Actor):
        PARAMS = (Param("a", "x.a", "count", "declared"),)

    prm = params_for(Reader, Src())
    assert prm.a == 1 and prm["a"] == 1 and prm.kwargs() == {"a": 1}
    assert copy.deepcopy(prm).kwargs() == {"a": 1}
    ring = params_for(RingNode, {"service": 5})      # a view pickles (by class) with its values
    assert pickle.loads(pickle.dumps(ring)).kwargs() == {"service": 5}
    with pytest.raises(AttributeError, match=r"Reader reads parameter 'b', which it does not declare"):
        prm.b
    with pytest.raises(AttributeError, match=r"reads parameter 'b'"):
        prm.total          # a property of the source runs against the view: its inputs must be declared too


def test_a_parameter_is_computed_by_its_declaration_from_a_profile():
    class Unit(Actor):
        PARAMS = (Param("depth", "q.depth", "count", "from the key path"),
                  Param("ps", ("q.cycles", "clk"), "ps", "derived", lambda p: p["q"]["cycles"] * p["clk"]))

    assert params_for(Unit, {"q": {"depth": 4, "cycles": 3}, "clk": 10}).kwargs() == {"depth": 4, "ps": 30}
    with pytest.raises(BuildError, match="Unit: a declared parameter is missing"):
        params_for(Unit, {"q": {}})


def test_the_engine_runs_declared_actors_unchanged():
    s = System("t")
    s.connect(s.add(_Sender("a")).out, s.add(_TokenSink("b")).inp, capacity=1)
    check_system(s)
    assert s.run().status == "finished"


# -- the CLI ---------------------------------------------------------------------------------------------------------
def _port_line(p):
    return f"{p.direction:<3} {p.name:<16} {' | '.join(p.message_names)}"


@pytest.mark.parametrize("scenario", ["ahbm/microbench.yaml", "pccx/program.yaml", "demo/reduce.yaml"])
def test_explain_prints_every_built_class_from_its_declarations(emu, scenario):
    out = emu("explain", ROOT / "scenarios" / scenario, check=0).stdout
    system, _ = build_system(load_scenario(str(ROOT / "scenarios" / scenario), registry))
    built = {type(a) for a in system.actors.values()}
    assert built & set(family_components(registry.family(scenario.split("/")[0])))
    for cls in built:
        assert f"{cls.__name__} ({cls.__module__})" in out
        for p in ports_of(cls).values():
            assert _port_line(p) in out, (cls.__name__, p.name)
        for p in params_of(cls).values():
            assert f"{p.name:<18} {p.unit:<8} {', '.join(p.keys)}" in out, (cls.__name__, p.name)


def test_explain_shows_a_parameters_value_default_and_doc(emu):
    out = emu("explain", ROOT / "scenarios" / "pccx" / "program.yaml", check=0).stdout
    assert ("beat_bytes         B        hp.beat_bytes [default 16] = 16 - bytes per AXI beat") in out
    out = emu("explain", ROOT / "scenarios" / "ahbm" / "microbench.yaml", check=0).stdout
    assert "dma_setup          ps       dma.setup_cycles, clock.pe = 20000 - DMA descriptor setup" in out


@pytest.mark.parametrize("scenario", ["ahbm/microbench.yaml", "pccx/program.yaml", "demo/reduce.yaml"])
def test_validate_schema_lists_components_and_who_reads_each_key(emu, scenario):
    out = emu("validate", "--schema", ROOT / "scenarios" / scenario, check=0).stdout
    assert "components (family" in out
    for cls in family_components(registry.family(scenario.split("/")[0])):
        assert f"{cls.__name__} ({cls.__module__})" in out
        for p in ports_of(cls).values():
            assert _port_line(p) in out
    if scenario.startswith("ahbm"):
        assert "access_latency: a time like '30ns' [required] - closed-page access latency" in out
        # the HBM stack (fidelity pipeline) and the PE scheduler (fidelity stream, pipeline.HeldDma) read it too
        assert "(read by HbmChannel, HbmStack, PeScheduler)" in out


def test_explain_json_carries_the_declarations(emu):
    import json
    out = json.loads(emu("explain", ROOT / "scenarios" / "demo" / "reduce.yaml", "--json", check=0).stdout)
    decl = out["components"]["ReducePE"]
    assert decl["ports"] == [{"name": p.name, "direction": p.direction, "messages": p.message_names, "doc": p.doc}
                             for p in ports_of(ReducePE).values()]
    assert [p["name"] for p in decl["params"]] == list(params_of(ReducePE))

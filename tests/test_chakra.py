"""Chakra execution traces: ``emu trace chakra`` read back with the schema's generated classes.

The export of the validation-scale GQA decode with sequence parallelism (IPCQ and NOC reduction
messages) is checked against the run's own trace, recomputed here from the raw events: node counts
per type, every engine node's start and end equal to the engine's completion report, acyclic graphs
whose dependencies end before their dependants start, and every receive matched by exactly one send
of the same size and tag.
"""
from __future__ import annotations

import glob
import os
from collections import Counter

import pytest

import protocols.ahbm  # noqa: F401 -- the AHBM records, for decode
from emulator.trace import SEND, TAKE, read_trace
from protocols.chakra.io import EtFileError, attrs_of, pb, read_et, write_et
from protocols.codec import decode
from tools.trace.chakra import ChakraExportError, export_chakra

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODE_SP = os.path.join(ROOT, "scenarios/ahbm/gqa/decode_sp.yaml")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The GQA decode-with-SP bundle (``emu run --out``) and its export (``emu trace chakra``), through the CLI
    (the ``emu`` fixture's command; module-scoped so the tests share one run)."""
    import subprocess

    from tests.conftest import EMU

    base = tmp_path_factory.mktemp("chakra")
    bundle, out = base / "run", base / "et"
    for args in (["run", DECODE_SP, "--out", bundle], ["trace", "chakra", bundle, "--out", out]):
        proc = subprocess.run([*EMU, *map(str, args)], capture_output=True, text=True,
                              cwd=base, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Chakra ET files" in proc.stdout
    files = sorted(glob.glob(str(out / "chakra.*.et")), key=lambda f: int(f.split(".")[-2]))
    graphs = [read_et(f) for f in files]
    return read_trace(str(bundle / "trace.emutrace")), graphs


def _expected(tr):
    """Per PE, from the raw trace: the engines' (kind, start, end) completion reports, IPCQ commands by op, NOC
    packets sent and taken."""
    done, ipcq, noc = Counter(), Counter(), Counter()
    sends = {}
    for ev in tr.events:
        if ev[0] == SEND:
            l = tr.links[ev[2]]
            src, dst = l["src"].rsplit("/", 1), l["dst"].rsplit("/", 1)
            if src[1] in ("gemm", "math", "dma") and l["dst_port"] == "done":
                m = decode(ev[5])
                done[(src[0], src[1], m.start, m.end)] += 1
            elif dst[1] == "ipcq" and l["dst_port"] == "cmd":
                ipcq[(dst[0], decode(ev[5]).op)] += 1
            elif src[1] == "cpu" and l["src_port"] == "noc_out":
                noc[(src[0], "send")] += 1
            if l["dst_port"] == "noc_in":
                sends[(ev[2], ev[3])] = l["dst"].rsplit("/", 1)[0]
        elif ev[0] == TAKE and (ev[2], ev[3]) in sends:
            noc[(sends[(ev[2], ev[3])], "recv")] += 1
    return done, ipcq, noc


def test_nodes_match_the_trace(exported):
    tr, graphs = exported
    done, ipcq, noc = _expected(tr)
    got_done, got_comm = Counter(), Counter()
    for meta, nodes in graphs:
        pe = attrs_of(meta)["pe"]
        assert meta.version == "1.0.0"
        for n in nodes:
            a = attrs_of(n)
            eng = a["engine"]
            if eng in ("gemm", "math", "dma"):
                want = pb.COMP_NODE if eng != "dma" else (pb.MEM_LOAD_NODE if a["op"] == "load" else pb.MEM_STORE_NODE)
                assert n.type == want, n
                got_done[(pe, eng, a["start_ps"], a["start_ps"] + a["duration_ps"])] += 1
                assert n.duration_micros == round(a["duration_ps"] / 1e6)
            else:
                op = "send" if n.type == pb.COMM_SEND_NODE else "recv"
                assert n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
                got_comm[(pe, a["via"], op)] += 1
            if n.type == pb.COMP_NODE:
                assert a["num_ops"] > 0 and a["tensor_size"] > 0
            if eng == "gemm":
                assert a["num_ops"] == 2 * a["m"] * a["k"] * a["n"]
    assert got_done == done                             # every engine command, with the engine's own start and end
    assert sum(v for (_, via, _), v in got_comm.items() if via == "ipcq") == sum(ipcq.values()) > 0
    assert Counter({(pe, op): v for (pe, via, op), v in got_comm.items() if via == "ipcq"}) == ipcq
    assert Counter({(pe, op): v for (pe, via, op), v in got_comm.items() if via == "noc"}) == noc
    assert sum(noc.values()) > 0


def test_graphs_are_acyclic_and_deps_precede(exported):
    _, graphs = exported
    for meta, nodes in graphs:
        by_id = {n.id: n for n in nodes}
        assert len(by_id) == len(nodes)
        start = {n.id: attrs_of(n)["start_ps"] for n in nodes}
        end = {i: start[i] + attrs_of(by_id[i])["duration_ps"] for i in by_id}
        indeg = {i: 0 for i in by_id}
        for n in nodes:
            for d in (*n.data_deps, *n.ctrl_deps):
                assert d in by_id, f"rank {attrs_of(meta)['rank']}: node {n.id} depends on missing {d}"
                assert end[d] <= start[n.id], (by_id[d], n)
                indeg[n.id] += 1
        children = {i: [] for i in by_id}
        for n in nodes:
            for d in (*n.data_deps, *n.ctrl_deps):
                children[d].append(n.id)
        ready, seen = [i for i, k in indeg.items() if k == 0], 0
        while ready:                                    # Kahn: every node is reached only in an acyclic graph
            i = ready.pop()
            seen += 1
            for c in children[i]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        assert seen == len(nodes)
    assert sum(len(n.data_deps) for _, nodes in graphs for n in nodes) > 0


def test_every_recv_has_its_send(exported):
    _, graphs = exported
    sends, recvs = Counter(), Counter()
    for r, (meta, nodes) in enumerate(graphs):
        assert attrs_of(meta)["rank"] == r
        for n in nodes:
            a = attrs_of(n)
            if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                key = (a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"])
                assert r == (a["comm_src"] if n.type == pb.COMM_SEND_NODE else a["comm_dst"])
                assert a["comm_size"] > 0
                (sends if n.type == pb.COMM_SEND_NODE else recvs)[key] += 1
    assert recvs == sends and max(recvs.values()) == 1 and len(recvs) == 90


def test_chakra_package_reads_the_files(exported, tmp_path):
    """Optional: the MLCommons Chakra tools' own classes.  Chakra is not published on PyPI (no
    ``mlcommons-chakra``; ``chakra`` there is an unrelated package; its metadata depends on a git URL, which
    PyPI refuses), so this runs only where it was installed from its repository."""
    real = pytest.importorskip("chakra.schema.protobuf.et_def_pb2",
                               reason="the MLCommons Chakra package is not on PyPI; install it from its repository")
    _, graphs = exported
    meta, nodes = graphs[1]
    path = tmp_path / "chakra.1.et"
    write_et(str(path), meta, nodes)
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    f = openFileRd(str(path))
    m = real.GlobalMetadata()
    assert decodeMessage(f, m) and m.version == meta.version
    got = []
    n = real.Node()
    while decodeMessage(f, n):
        got.append((n.id, n.type, list(n.data_deps)))
        n = real.Node()
    assert got == [(x.id, x.type, list(x.data_deps)) for x in nodes]


def test_export_errors(tmp_path, emu):
    p = emu("trace", "chakra", tmp_path / "nothing", "--out", tmp_path / "o", check=2)
    assert "no such trace file or bundle" in p.stderr and "Traceback" not in p.stderr
    (tmp_path / "b").mkdir()
    p = emu("trace", "chakra", tmp_path / "b", "--out", tmp_path / "o", check=2)
    assert "without trace.emutrace" in p.stderr
    with pytest.raises(ChakraExportError, match="no such"):
        export_chakra(str(tmp_path / "x.emutrace"), str(tmp_path / "o"))


def test_reader_errors(tmp_path):
    good = tmp_path / "g.et"
    write_et(str(good), pb.GlobalMetadata(version="1.0.0"), [pb.Node(id=0, name="n", type=pb.COMP_NODE)])
    data = good.read_bytes()
    (tmp_path / "t.et").write_bytes(data[:-2])
    with pytest.raises(EtFileError, match=r"t\.et: message 1: truncated"):
        read_et(str(tmp_path / "t.et"))
    (tmp_path / "e.et").write_bytes(b"")
    with pytest.raises(EtFileError, match="empty file"):
        read_et(str(tmp_path / "e.et"))
    (tmp_path / "j.et").write_bytes(b"\x05\xff\xff\xff\xff\xff")
    with pytest.raises(EtFileError, match="message 0: not a Chakra GlobalMetadata"):
        read_et(str(tmp_path / "j.et"))
    meta, nodes = read_et(str(good))
    assert nodes[0].name == "n" and meta.version == "1.0.0"


# --------------------------------------------------------------------------- import: the chakra workload
EXAMPLE = os.path.join(ROOT, "scenarios/ahbm/chakra/allreduce_4rank.yaml")


def _scenario(path, graph, mode="timing", ranks=None) -> str:
    params = {"graph": str(graph), **({"ranks": ranks} if ranks is not None else {})}
    import yaml

    path.write_text(yaml.safe_dump({"name": "chakra-test", "seed": 1, "mode": mode,
                                    "machine": {"profile": "ahbm-1sip"},
                                    "workload": {"kind": "chakra", "params": params}}))
    return str(path)


def _pairs(et_dir) -> Counter:
    """``(src PE, dst PE, bytes)`` of every send/recv pair of an export: the run's message structure."""
    graphs = [read_et(f) for f in glob.glob(os.path.join(et_dir, "chakra.*.et"))]
    pe = {attrs_of(m)["rank"]: attrs_of(m)["pe"] for m, _ in graphs}
    return Counter((pe[a["comm_src"]], pe[a["comm_dst"]], a["comm_size"]) for _, nodes in graphs for n in nodes
                   if n.type == pb.COMM_SEND_NODE for a in [attrs_of(n)])


def test_example_graph_with_a_collective(emu, tmp_path):
    """The hand-written 4-rank graph: an all-reduce (a binomial reduce to rank 0 and a broadcast back) and a ring
    exchange become exactly those messages on the machine, seen in the run's own trace."""
    emu("run", EXAMPLE, "--out", tmp_path / "b", check=0)
    import json

    res = json.loads((tmp_path / "b" / "result.json").read_text())
    assert res["status"] == "finished" and res["graph_ranks"] == 4 and res["graph_messages"] == 10
    export_chakra(str(tmp_path / "b"), str(tmp_path / "et"))
    pe = [f"sip0/cube00/pe{r}" for r in range(4)]
    tree = [(1, 0), (3, 2), (2, 0), (0, 2), (0, 1), (2, 3)]             # reduce rounds, then broadcast rounds
    ring = [(r, (r + 1) % 4) for r in range(4)]
    want = Counter([(pe[a], pe[b], 4096) for a, b in tree] + [(pe[a], pe[b], 1024) for a, b in ring])
    assert _pairs(tmp_path / "et") == want


@pytest.mark.parametrize("scenario,tolerance", [pytest.param("decode.yaml", 0.01, marks=pytest.mark.slow),
                                                 ("decode_sp.yaml", 0.01),
                                                 pytest.param("llama70b_decode_8k_1sip.yaml", 0.02,
                                                             marks=pytest.mark.slow)])
def test_round_trip_gqa_decode(emu, tmp_path, scenario, tolerance):
    """Export a timing-mode GQA decode, run the graph as a workload: the same messages between the same PEs
    (the reduction's rounds and hops), and the end time within the error measured for this path
    (docs/chakra.md: decode +0.14 %, decode with SP +0.05 %, the 8K Llama3-70B shape +1.45 %)."""
    import json

    emu("run", os.path.join(ROOT, "scenarios/ahbm/gqa", scenario), "--set", "mode=timing", "--out", tmp_path / "a",
        check=0)
    emu("trace", "chakra", tmp_path / "a", "--out", tmp_path / "ea", check=0)
    emu("run", _scenario(tmp_path / "rt.yaml", tmp_path / "ea" / "chakra.0.et"), "--out", tmp_path / "b", check=0)
    emu("trace", "chakra", tmp_path / "b", "--out", tmp_path / "eb", check=0)
    end_a = json.loads((tmp_path / "a" / "result.json").read_text())["end_time_ps"]
    end_b = json.loads((tmp_path / "b" / "result.json").read_text())["end_time_ps"]
    assert abs(end_b / end_a - 1) < tolerance, (end_a, end_b)
    assert _pairs(tmp_path / "eb") == _pairs(tmp_path / "ea")


def _graph(tmp_path, nodes_of, ranks=2) -> str:
    d = tmp_path / f"g{len(list(tmp_path.glob('g*')))}"          # a fresh directory per graph
    d.mkdir()
    for r in range(ranks):
        write_et(str(d / f"chakra.{r}.et"), pb.GlobalMetadata(version="1.0.0"), nodes_of(r))
    return str(d / "chakra.0.et")


def _n(i, typ, deps=(), **attrs):
    from protocols.chakra.io import attr

    n = pb.Node(id=i, name=f"n{i}", type=typ, data_deps=list(deps))
    n.attr.extend(attr(k, v, "int32_val" if k in ("comm_src", "comm_dst", "comm_tag") else None)
                  for k, v in attrs.items())
    return n


def _refused(emu, tmp_path, graph, *, ranks=None) -> str:
    p = emu("run", _scenario(tmp_path / "s.yaml", graph, ranks=ranks), "--no-bundle", check=2)
    assert "Traceback" not in p.stderr
    return p.stderr


def test_import_errors(emu, tmp_path):
    gemm = dict(m=8, k=8, n=8)
    # a cyclic graph
    g = _graph(tmp_path, lambda r: [_n(0, pb.COMP_NODE, [1], **gemm), _n(1, pb.COMP_NODE, [0], **gemm)], ranks=1)
    assert "chakra.0.et: the dependencies have a cycle (nodes 0, 1" in _refused(emu, tmp_path, g)
    # an unmatched receive (rank 1 waits for a message rank 0 never sends)
    g = _graph(tmp_path, lambda r: [_n(0, pb.COMP_NODE, **gemm)] + ([_n(1, pb.COMM_RECV_NODE, [0], comm_src=0,
                                    comm_dst=1, comm_tag=7, comm_size=64)] if r == 1 else []))
    err = _refused(emu, tmp_path, g)
    assert "chakra.1.et: node 1" in err and "no COMM_SEND_NODE in chakra.0.et matches this receive" in err
    assert "comm_tag 7" in err
    # a rank map that does not fit the machine, or the graph
    g = _graph(tmp_path, lambda r: [_n(0, pb.COMP_NODE, **gemm)])
    assert "workload.params.ranks[1]: no PE [0, 99, 0] in this machine" in _refused(emu, tmp_path, g,
                                                                                   ranks=[[0, 0, 0], [0, 99, 0]])
    assert "workload.params.ranks: the graph has 2 ranks" in _refused(emu, tmp_path, g, ranks=[[0, 0, 0]])
    assert "workload.params.ranks[1]: PE [0, 0, 0] already runs rank 0" in _refused(emu, tmp_path, g,
                                                                                   ranks=[[0, 0, 0], [0, 0, 0]])
    # a malformed file, a dependency on a missing node, a node the machine cannot run
    open(g.replace(".0.et", ".1.et"), "wb").write(b"\x09garbage")
    err = _refused(emu, tmp_path, g)
    assert "workload.params.graph: " in err and "chakra.1.et: message 0: truncated" in err
    g = _graph(tmp_path, lambda r: [_n(0, pb.COMP_NODE, [5], **gemm)], ranks=1)
    assert "node 0 ('n0') depends on node 5, which the file does not have" in _refused(emu, tmp_path, g)
    g = _graph(tmp_path, lambda r: [_n(0, pb.COMP_NODE, num_ops=10)], ranks=1)
    assert "a COMP_NODE runs as a GEMM (attributes m, k, n) or a MATH op" in _refused(emu, tmp_path, g)
    g = _graph(tmp_path, lambda r: [_n(0, pb.COMM_COLL_NODE, comm_type=pb.ALL_TO_ALL, comm_size=64)])
    assert "collective ALL_TO_ALL is not decomposed here" in _refused(emu, tmp_path, g)
    assert "not a rank-0 Chakra ET file" in _refused(emu, tmp_path, str(tmp_path / "s.yaml"))


def test_bundle_reruns_the_graph(emu, tmp_path):
    """A bundle carries every rank's file, so its scenario runs the same graph anywhere (same digest)."""
    import json
    import shutil

    emu("run", EXAMPLE, "--out", tmp_path / "b", check=0)
    assert sorted(p.name for p in (tmp_path / "b").glob("*.et")) == [f"input.chakra.{r}.et" for r in range(4)]
    shutil.copytree(tmp_path / "b", tmp_path / "moved")
    emu("run", tmp_path / "moved" / "scenario.yaml", "--out", tmp_path / "c", check=0)
    digest = [json.loads((tmp_path / d / "result.json").read_text())["digest"] for d in ("b", "c")]
    assert digest[0] == digest[1]

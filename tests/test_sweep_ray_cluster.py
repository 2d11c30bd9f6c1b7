"""A sweep on a Ray cluster of two nodes (both on this machine, started here with ``ray start``) gives the
process pool's rows, per-point digests and ``best.csv``, and its points ran on both nodes."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tools.sweep.local_cluster import ClusterError, LocalRayCluster, read_rows
from tools.sweep.results import HOST_COLUMNS

pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]'); the Ray cluster is untested")

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "scenarios/sweeps/reduce-cluster.yaml"     # points of a second (every node gets some), a best.csv


@pytest.fixture(scope="module")
def cluster():
    c = LocalRayCluster(nodes=2, cpus_per_node=1, pythonpath=str(ROOT))
    try:
        c.start()
    except ClusterError as e:
        c.stop()
        pytest.skip(f"a two-node local Ray cluster did not start: {e}")
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.slow      # 21-26 s: two Ray nodes start (7 s) and stop (3-5 s); the one-node Ray run is tests/test_sweep_ray.py's
def test_two_node_cluster_gives_the_pool_results(tmp_path, emu, cluster, monkeypatch):
    for k, v in cluster.env.items():          # the token and the tree the sweep's driver needs too
        monkeypatch.setenv(k, v)
    pool, ray = tmp_path / "pool", tmp_path / "ray"
    emu("sweep", SPEC, "--out", pool, "--no-plots", "-q", check=0)
    shown = emu("sweep", SPEC, "--out", ray, "--backend", "ray", "--address", cluster.address, "--no-plots", "-q",
                check=0).stdout
    by_pool, by_ray = read_rows(pool), read_rows(ray)
    assert len(by_pool) == 4 and {r["status"] for r in by_pool} == {"finished"}
    assert [r["digest"] for r in by_ray] == [r["digest"] for r in by_pool]
    assert [{k: v for k, v in r.items() if k not in HOST_COLUMNS} for r in by_ray] == \
        [{k: v for k, v in r.items() if k not in HOST_COLUMNS} for r in by_pool]
    assert (ray / "best.csv").read_bytes() == (pool / "best.csv").read_bytes()
    # every point says where it ran: on the pool this host, on the cluster both of its nodes
    assert {r["node"] for r in by_pool} == {socket.gethostname()}
    assert {r["node"].rpartition("/")[2] for r in by_ray} == {i[:8] for i in cluster.node_ids}
    assert len(cluster.node_ids) == 2
    assert "node" in shown.splitlines()[1].split()     # the table shows the node column when there are several
    # the workers imported this tree, and sent each bundle back (no shared file system is assumed)
    for r in by_ray:
        record = json.loads((ray / r["bundle"] / "point.json").read_text())
        assert record["result"]["project"] == str(ROOT)
        assert (ray / r["bundle"] / "result.json").is_file()

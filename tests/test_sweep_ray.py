"""The Ray backend gives the same rows (and digests) as the process pool, on a local Ray started here: for a
sweep (``emu sweep``) and for the variants of ``emu whatif`` (tools/explain/whatif.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tools.cli import main
from tools.sweep.results import HOST_COLUMNS

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]'); the Ray backend is untested")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


def rows(directory: Path) -> list[dict]:
    with open(directory / "results.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k not in HOST_COLUMNS} for r in csv.DictReader(f)]


def test_ray_and_pool_give_identical_rows(tmp_path, local_ray):
    spec = str(ROOT / "scenarios/sweeps/ring-with-deadlock.yaml")   # finished and deadlocked points
    assert main(["sweep", spec, "--out", str(tmp_path / "pool"), "--no-plots", "-q"]) == 0
    assert main(["sweep", spec, "--out", str(tmp_path / "ray"), "--backend", "ray", "--no-plots", "-q"]) == 0
    pool, by_ray = rows(tmp_path / "pool"), rows(tmp_path / "ray")
    assert len(pool) == 6 and {r["status"] for r in pool} == {"finished", "deadlock"}
    assert by_ray == pool                     # row for row: values, status, metrics, digests
    # the Ray workers sent their bundles back to the sweep directory
    for r in by_ray:
        assert (tmp_path / "ray" / r["bundle"] / "result.json").is_file()


@pytest.mark.slow      # the pool/Ray equality is checked on the sweep above; this is emu whatif's use of it
def test_whatif_on_ray_gives_the_pool_rows(capsys, local_ray):
    """``emu whatif --backend ray``: the same variants, measured changes and key factors as on the pool (one
    resource of the small decode, one KV head in timing mode: baseline + 2 variants; the pool's own numbers are tests/test_explain_whatif.py's)."""
    scenario = str(ROOT / "scenarios/ahbm/gqa/decode_sp.yaml")
    out = {}
    for backend in ("pool", "ray"):
        assert main(["whatif", scenario, "--set", "mode=timing", "--set", "workload.params.heads=1", "--only", "MATH",
                     "--backend", backend, "-j", "2", "--json"]) == 0
        out[backend] = json.loads(capsys.readouterr().out)
    pool, by_ray = out["pool"], out["ray"]
    assert by_ray.pop("backend") == "ray" and pool.pop("backend") == "pool"
    (row,) = pool["rows"]
    assert row["resource"] == "MATH" and {v["status"] for v in row["variants"].values()} == {"finished"}
    assert row["variants"]["faster"]["measured"] < 0 < row["variants"]["slower"]["measured"]
    assert by_ray == pool

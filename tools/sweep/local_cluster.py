"""A Ray cluster of several nodes on this one machine, for trying ``emu sweep --backend ray --address``.

``python -m tools.sweep.local_cluster [SPEC]`` (``make sweep-ray-cluster``) starts a head and a second
node, runs the sweep ``SPEC`` (default ``scenarios/sweeps/reduce-cluster.yaml``: points of a second, so that
every node gets some, and a ``best.csv``) on the process pool and on the cluster through the ``emu`` command, prints the comparison
(rows without the host columns, per-point digests, ``best.csv``, the nodes that ran points) and stops the
cluster.  Exit status 0 when the two runs agree and every node ran a point.

Why each option of ``ray start`` (docs/sweep.md "A Ray cluster"):

* every node gets ``--block``, in a session of its own: the ``ray start`` process stays the parent of its
  node's processes, so stopping the cluster signals those process groups and nothing else.  ``ray stop``
  would stop *every* Ray process of the machine, other users' too;
* the nodes share one ``--temp-dir`` (Ray keeps one session directory per host: a second node on the same
  host joins the head's) -- a short path of its own here, since Ray's Unix sockets live below it;
* ``--port`` is a free port; the other ports (node manager, object manager, workers) are Ray's choice,
  free ones by default, so two nodes on one host do not collide;
* token authentication (``RAY_AUTH_MODE=token``, the token in a file of the temporary directory) for every
  process, the sweep's included: Ray's servers listen on every interface of the host;
* ``--num-cpus 1`` per node, so points cannot all fit on one node, and the sweep spreads its tasks
  (tools.sweep.backends).  Ray's spreading is best effort: points of a millisecond can all end on one
  node (its view of the other node's free CPU lags), points of a second do not.

The workers import the project their node's Python has (``make`` installs this checkout into .venv);
``pythonpath`` puts a tree first for checkouts that are not the installed one (a git worktree).
"""
from __future__ import annotations

import csv
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["LocalRayCluster", "ClusterError", "free_port"]

ROOT = Path(__file__).resolve().parents[2]


class ClusterError(RuntimeError):
    """A node did not start (the reason and the end of its log in the message)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_command() -> str:
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


class LocalRayCluster:
    """``with LocalRayCluster(nodes=2) as c:`` -- ``c.address`` to join, ``c.env`` for the clients' environment."""

    START_TIMEOUT_S = 90

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1, pythonpath: str | None = None):
        self.nodes, self.cpus = nodes, cpus_per_node
        self.dir = Path(tempfile.mkdtemp(prefix="emu-ray-", dir="/tmp"))
        token = self.dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
        if pythonpath:
            self.env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._procs: list[tuple[subprocess.Popen, Path]] = []
        self.node_ids: list[str] = []      # as ``ray status`` lists them (hex), once every node is active

    def __enter__(self) -> "LocalRayCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        common = ["--block", f"--num-cpus={self.cpus}", f"--temp-dir={self.dir / 'ray'}", "--disable-usage-stats",
                  "--object-store-memory=100000000"]
        self._node("head", ["--head", f"--port={self.port}", "--include-dashboard=false", *common])
        for i in range(1, self.nodes):
            self._node(f"node{i}", [f"--address={self.address}", *common])
        self._wait_for_nodes()

    def _node(self, name: str, args: list[str]) -> None:
        log = self.dir / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([_ray_command(), "start", *args], stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, **self.env}, start_new_session=True)
        self._procs.append((proc, log))
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while "block forever" not in log.read_text():
            if proc.poll() is not None:
                raise ClusterError(f"ray start of the {name} ({self.address}) exited with {proc.returncode}: "
                                   + self._tail(log))
            if time.monotonic() > deadline:
                raise ClusterError(f"ray start of the {name} ({self.address}) not up after "
                                   f"{self.START_TIMEOUT_S} s: " + self._tail(log))
            time.sleep(0.2)

    def _wait_for_nodes(self) -> None:
        """Until ``ray status`` lists every node as active (a node's raylet registers after its start)."""
        deadline = time.monotonic() + self.START_TIMEOUT_S
        text = ""
        while time.monotonic() < deadline:
            proc = subprocess.run([_ray_command(), "status", f"--address={self.address}"], capture_output=True,
                                  text=True, env={**os.environ, **self.env}, timeout=60)
            text = proc.stdout + proc.stderr
            active = text.partition("Active:")[2].partition("Pending:")[0]
            ids = re.findall(r"node_([0-9a-f]+)", active)
            if len(ids) >= self.nodes:
                self.node_ids = ids
                return
            time.sleep(0.5)
        raise ClusterError(f"the cluster at {self.address} has not {self.nodes} active nodes after "
                           f"{self.START_TIMEOUT_S} s: {text[-1500:]}")

    @staticmethod
    def _tail(log: Path) -> str:
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
        return "\n".join(lines[-12:])

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to each node's process group (second nodes first), SIGKILL what is left after ``grace_s``."""
        for proc, _ in reversed(self._procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc, _ in self._procs:
            while _group_alive(proc) and time.monotonic() < deadline:
                time.sleep(0.2)
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        self._procs = []
        shutil.rmtree(self.dir, ignore_errors=True)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()                      # reap the leader: a zombie leader keeps the group "alive"
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def read_rows(directory: Path) -> list[dict]:
    with open(directory / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def compare(pool_dir: Path, ray_dir: Path) -> tuple[bool, list[str]]:
    """Whether the Ray run equals the pool's (rows without the host columns, digests, best.csv) and took
    every node, with the lines that say so."""
    from tools.sweep.results import HOST_COLUMNS

    pool, ray = read_rows(pool_dir), read_rows(ray_dir)
    lines = [f"  {'point':>5}  {'pool digest':<32}  {'ray digest':<32}  {'same':<4}  ray node"]
    for p, r in zip(pool, ray):
        lines.append(f"  {p['point']:>5}  {p['digest']:<32}  {r['digest']:<32}  "
                     f"{'yes' if p['digest'] == r['digest'] else 'NO':<4}  {r['node']}")
    strip = [[{k: v for k, v in row.items() if k not in HOST_COLUMNS} for row in rows] for rows in (pool, ray)]
    same_rows = len(pool) == len(ray) and strip[0] == strip[1]
    best = [(d / "best.csv").read_bytes() if (d / "best.csv").exists() else None for d in (pool_dir, ray_dir)]
    same_best = best[0] is not None and best[0] == best[1]
    nodes = sorted({r["node"] for r in ray})
    lines += [f"rows without {', '.join(HOST_COLUMNS)}: {'identical' if same_rows else 'DIFFERENT'} "
              f"({len(pool)} pool, {len(ray)} ray)",
              "best.csv: " + ("identical" if same_best else "missing" if best[0] is None else "DIFFERENT"),
              f"nodes that ran points: {len(nodes)} ({', '.join(nodes)})"]
    return same_rows and same_best and len(nodes) >= 2, lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tools.sweep.local_cluster", description=__doc__.split("\n")[0])
    ap.add_argument("spec", nargs="?", default=str(ROOT / "scenarios/sweeps/reduce-cluster.yaml"))
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args(argv)
    emu = [sys.executable, "-m", "tools.cli", "sweep", args.spec, "--no-plots", "-q"]
    with tempfile.TemporaryDirectory(prefix="emu-ray-sweep-") as out:
        pool_dir, ray_dir = Path(out) / "pool", Path(out) / "ray"
        subprocess.run([*emu, "--out", str(pool_dir)], check=True, stdout=subprocess.DEVNULL)
        t0 = time.monotonic()
        try:
            cluster = LocalRayCluster(args.nodes, pythonpath=str(ROOT)).__enter__()
        except ClusterError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        try:
            print(f"{args.nodes}-node Ray cluster at {cluster.address} up in {time.monotonic() - t0:.1f} s")
            env = {**os.environ, **cluster.env}
            subprocess.run([*emu, "--out", str(ray_dir), "--backend", "ray", "--address", cluster.address],
                           check=True, env=env)
        finally:
            cluster.stop()
        ok, lines = compare(pool_dir, ray_dir)
    print(f"pool vs Ray cluster: {Path(args.spec).name}")
    print("\n".join(lines))
    print("same results on the cluster as on the pool" if ok else "the runs differ (or one node ran nothing)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

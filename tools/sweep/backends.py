"""Where sweep points run: a local process pool (default) or a Ray cluster.

Both backends take the same tasks and report to the same two callbacks
(``events.running(n)``, ``events.done(task, record)``); a record is what
:mod:`tools.sweep.point` returns.  The results do not depend on the backend:
each point is an independent deterministic run of its resolved scenario.

**Pool.** One fresh process per point, at most ``jobs`` at a time, forked from a
``forkserver`` that has already imported the emulator (a point starts in
milliseconds, not after a second of imports).  ``concurrent.futures`` is not used
on purpose: when one of its workers dies (out of memory, a crash in C code)
every pending future fails with ``BrokenProcessPool``, and it cannot stop one
overrunning point.  Here a dead worker fails only its own point, and a point
still running ``kill_after_s`` after it started is killed and recorded as
``wall-timeout``.

**Ray.** Each point is a Ray task (``num_cpus=1``; ``max_retries=0`` so a failing
point is reported, not re-run; workers are reused, and the point resets the
peak-memory counter, see tools.sweep.point).  The tasks are spread over the
cluster's nodes (``scheduling_strategy="SPREAD"``): Ray's default packs tasks on
the node that submits them until it is busy, so a sweep of short points could
leave the other nodes idle.  Without ``address`` a local Ray instance
with ``jobs`` CPUs is started (and shut down at the end); with ``address`` the
sweep joins that cluster.  A task returns its bundle's files, so the workers
need no shared file system -- only the project installed.  An already
initialised Ray (e.g. by a test) is used as it is.

**Where a point ran.** Each backend stamps the point's result with ``node`` (the
pool: the host name; Ray: the node's IP address and the first 8 hex digits of its
node id, as ``ray status`` lists them -- two nodes on one host differ by the id)
and ``project`` (the directory the worker imported the emulator from), so a
cluster run shows that every node took part and ran the intended checkout.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from multiprocessing.connection import wait

__all__ = ["PoolBackend", "RayBackend", "make_backend", "default_jobs"]


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _failure(status: str, error: str) -> dict:
    return {"result": {"status": status, "error": error}}


def _ran_on(record: dict, node: str) -> dict:
    """``record`` with where its point ran: ``node`` and ``project`` in its result (host facts, not results)."""
    import tools
    record["result"]["node"] = node
    record["result"]["project"] = os.path.dirname(os.path.dirname(os.path.abspath(tools.__file__)))
    return record


def _sweep_point(task: dict) -> dict:
    from tools.sweep.point import run_point
    return _ran_on(run_point(task, task["dir"]), socket.gethostname())


def _ray_point(task: dict) -> dict:
    """A sweep point as a Ray task: the bundle's files come back with the record (no shared file system)."""
    import ray

    from tools.sweep.point import run_point_collect
    return _ran_on(run_point_collect(task), ray.get_runtime_context().get_node_id())


def _child(work, task: dict, conn) -> None:
    conn.send(work(task))
    conn.close()


class PoolBackend:
    """``work(task) -> record`` runs in the child (default: a sweep point); it must be a
    module-level function (it is pickled by name), ``preload`` the modules it needs."""
    name = "pool"

    def __init__(self, jobs: int | None = None, work=_sweep_point, preload=("tools.sweep.point",)):
        self.jobs = jobs or default_jobs()
        self.work, self.preload = work, list(preload)

    def run(self, tasks: list[dict], events) -> None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(self.preload)
        queue = list(tasks)
        running: dict = {}          # pipe end -> (task, process, start time)
        try:
            while queue or running:
                while queue and len(running) < self.jobs:
                    task = queue.pop(0)
                    r, w = ctx.Pipe(duplex=False)
                    p = ctx.Process(target=_child, args=(self.work, task, w), name=f"emu-sweep-point-{task['index']}",
                                    daemon=True)
                    p.start()
                    w.close()
                    running[r] = (task, p, time.monotonic())
                events.running(len(running))
                for r in wait(list(running), timeout=0.25):
                    task, p, _ = running.pop(r)
                    try:
                        record = r.recv()
                    except EOFError:
                        p.join()
                        record = _failure("error", f"the worker process died (exit code {p.exitcode})")
                    r.close()
                    p.join()
                    events.done(task, record)
                now = time.monotonic()
                for r, (task, p, t0) in list(running.items()):
                    limit = task.get("kill_after_s")
                    if limit is not None and now - t0 > limit:
                        p.kill()
                        p.join()
                        r.close()
                        del running[r]
                        events.done(task, _failure("wall-timeout", f"killed by the sweep after {limit:.0f} s"))
                events.running(len(running))
        finally:
            for r, (task, p, _) in running.items():
                p.kill()
                p.join()
                r.close()


class RayBackend:
    name = "ray"

    def __init__(self, jobs: int | None = None, address: str | None = None, work=None):
        self.jobs = jobs or default_jobs()
        self.address = address
        self.work = work          # ``work(task) -> record`` (default: a sweep point with its bundle's files)
        self._ips: dict[str, str] = {}      # Ray node id -> its IP address

    def run(self, tasks: list[dict], events) -> None:
        import logging

        import ray

        started_here = not ray.is_initialized()
        if started_here:
            if self.address:
                ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)
            else:
                ray.init(address="local", num_cpus=self.jobs, include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING)
        try:
            remote = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(self.work or _ray_point)
            refs = {remote.remote(task): task for task in tasks}
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            pending = list(refs)
            events.running(min(len(pending), cpus))
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                for ref in ready:
                    try:
                        record = self._named_node(ray, ray.get(ref))
                    except Exception as e:  # noqa: BLE001 -- a lost worker fails its point only
                        record = _failure("error", f"the Ray task failed: {type(e).__name__}: {e}")
                    events.done(refs[ref], record)
                events.running(min(len(pending), cpus))
        finally:
            if started_here:
                ray.shutdown()

    def _named_node(self, ray, record: dict) -> dict:
        """The record's node id (stamped by :func:`_ray_point`) as ``IP/first 8 hex digits of the id``, the IP
        the node registered with (``ray.nodes()``, asked again when a node is new); a record of other work
        without one is left as it is."""
        result = record.get("result") if isinstance(record, dict) else None
        if not (isinstance(result, dict) and result.get("node")):
            return record
        node_id = result["node"]
        if node_id not in self._ips:
            self._ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        result["node"] = f"{self._ips.get(node_id, '?')}/{node_id[:8]}"
        return record


def make_backend(name: str, jobs: int | None, address: str | None, work=None, preload=()):
    """The backend ``name`` (``--backend``), checking its options; ``work`` (a module-level function, default: a
    sweep point) and ``preload`` (the modules it needs, for the pool's workers) serve the other fan-outs (emu
    interval, emu calibrate, emu fork --variants)."""
    if name == "pool":
        if address:
            raise ValueError("--address is for --backend ray")
        return PoolBackend(jobs) if work is None else PoolBackend(jobs, work=work, preload=preload)
    if name == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError("--backend ray needs Ray: pip install -e '.[ray]'") from None
        return RayBackend(jobs, address, work=work)
    raise ValueError(f"unknown backend {name!r} (known: pool, ray)")


def add_backend_arguments(p, runs: str, address_help: str = "a Ray cluster to join (--backend ray)") -> None:
    """``--backend``, ``-j/--jobs`` and ``--address`` of a command that fans ``runs`` (e.g. "samples") out on
    the sweep backends (emu interval, emu calibrate, emu whatif): one definition, :func:`make_backend` checks them."""
    p.add_argument("--backend", default="pool", choices=["pool", "ray"], help=f"where the {runs} run")
    p.add_argument("-j", "--jobs", type=int, default=None, help=f"{runs} at once (default: the cores)")
    p.add_argument("--address", help=address_help)

"""``emu profile RUN_OR_TRACE``: where a run's time went, by kernel source line (AHBM ``tl``) or by
program stage, layer and opcode (pccx).

The trace does not carry source lines, so the profile **re-runs** the run's scenario (from a
trace header's ``scenario_resolved``, a bundle's ``scenario.resolved.yaml`` or a scenario file)
with the attribution below installed, and checks that the re-run's digest equals the recorded
one (the attribution only observes: it adds no event).

**AHBM ``tl`` kernels** (:class:`LineProfiler`).  Virtual time passes in a kernel only inside
the PE CPU's backend calls (actors/ahbm/tl/backend.py; Python control flow is free), so every
picosecond of a PE's kernel falls into exactly one call, made from one kernel source line (the
innermost frame that is kernel code: actors/ahbm/tl/errors.py's rule, ``kernels/`` included).
Per line (and per call stack, for the folded file) it adds:

* ``calls``: the ``tl`` calls made there (one per backend call that charged time or issued);
* ``issue_ps``: CPU issue time, the dispatch cost (``cpu.dispatch_cycles``) and the CPU's own
  work (fills, transposes);
* ``queue_ps``: time an issue waited for the engine's completion credit or its link
  (``<engine> queue``), a NOC send entering the attach link;
* ``tcm_ps``: the CPU's TCM accesses;
* ``wait_ps``: time blocked waiting for a command, by what it waited on: the engine
  (``gemm``, ``math``, ``dma``, ``sched`` = a composite), or the IPCQ / NOC peer
  (``ipcq recv W``, ``noc recv from [0, 1, 2]``);
* ``engine_ps``: engine busy time *caused* by the commands issued there, by engine
  (the completion's ``end - start``; for IPCQ / NOC receives, completion minus issue).

``issue + queue + tcm + wait`` over a PE's lines is that PE's kernel time exactly (a kernel's
end, waiting for what is still outstanding, is the line ``(kernel end)``); the profile gives
the sums over every PE and for the **critical PE** (the PE whose kernel finished last).
``engine_ps`` overlaps the CPU's time and is not part of the sum.

**pccx programs** (:func:`pccx_profile`): per retired instruction (the AXI-Lite status block's
records: ``start``, ``end``, opcode) attributed to the compiler's ``(token, layer, stage)``
(``Compiler.where``): engine time (``end - start``) and ``idle before`` time (from the previous
retirement of the same opcode's engine to this one's start: how long that engine sat waiting for
this instruction, its operands or its issue; the status records carry no issue time, so this is
the stall as the engine saw it), per stage, per layer and per opcode; the host's own
spans (``HostDriver.host_spans``) per stage.

Output: a table sorted by cost, and a folded-stack file (``frame;frame;frame value`` lines,
value in ns; flamegraph.pl, speedscope and inferno read it) of virtual time.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from actors.ahbm.costs import dispatch_ps
from emulator.input_paths import add_allow_path_argument
from emulator.units import format_time

__all__ = ["LineProfiler", "profile_run", "pccx_profile", "format_lines", "format_pccx", "folded_lines",
           "add_parser", "main"]

#: the stack of time spent after the kernel function returned (tl.finish: waiting for what is outstanding)
KERNEL_END = ("tl.finish", "(kernel end)")
_ENGINE_CALLS = ("dma", "gemm", "math", "composite", "ipcq", "noc_recv")
_ENGINE = {"dma": "dma", "gemm": "gemm", "math": "math", "composite": "sched", "ipcq": "ipcq", "noc_recv": "noc"}


def _new_row() -> dict:
    return {"calls": 0, "issue_ps": 0, "queue_ps": 0, "tcm_ps": 0, "wait_ps": defaultdict(int),
            "engine_ps": defaultdict(int), "ops": defaultdict(int)}


class LineProfiler:
    """Attribution of every PE CPU's kernel time to kernel source lines (module docstring).

    :meth:`install` wraps, on each :class:`~actors.ahbm.cpu.PeCpu` instance of a built system, the
    backend methods the ``tl`` runtime awaits; the wrappers read the clock before and after and
    walk the Python stack for the calling kernel line.  Nothing is sent, no event is added."""

    def __init__(self):
        self.rows: dict[str, dict[tuple, dict]] = defaultdict(dict)   # pe -> stack -> row
        self.kernel: dict[str, list] = defaultdict(list)               # pe -> [(start, end)]
        self.cmd: dict[str, dict] = defaultdict(dict)                  # pe -> cid -> (stack, engine, issued, what)
        self._handlers = None

    # -- the call site ----------------------------------------------------------------------
    @staticmethod
    def _stack() -> tuple:
        """The kernel's frames, outermost first, each ``(function, file:line)``, the last one with the ``tl``
        call it made (``tl.composite``); ``KERNEL_END`` when no kernel frame is on the stack."""
        from actors.ahbm.tl.errors import _ROOT, _skipped_cached

        f = sys._getframe(2)
        callee = None
        frames = []
        while f is not None:
            fn = f.f_code.co_filename
            if fn.endswith("kernel_registry.py"):
                break
            if not _skipped_cached(fn):
                rel = os.path.relpath(fn, _ROOT) if fn.startswith(_ROOT) else fn
                frames.append((f.f_code.co_name, f"{rel}:{f.f_lineno}",
                               f"tl.{callee.f_code.co_name}" if not frames and callee is not None else None))
            elif not frames:
                callee = f
            f = f.f_back
        if not frames:
            return (KERNEL_END + (None,),)
        return tuple(reversed(frames))

    def _row(self, pe: str, stack: tuple) -> dict:
        r = self.rows[pe].get(stack)
        if r is None:
            r = self.rows[pe][stack] = _new_row()
        return r

    # -- installing ---------------------------------------------------------------------------
    def install(self, system) -> None:
        from actors.ahbm.cpu import PeCpu

        for a in system.actors.values():
            if isinstance(a, PeCpu):
                self._wrap(a)
        self._wrap_launch()

    def uninstall(self) -> None:
        if self._handlers is not None:
            from actors.ahbm.cpu import PeCpu
            PeCpu.launch_handlers.clear()
            PeCpu.launch_handlers.update(self._handlers)
            self._handlers = None

    def _wrap_launch(self) -> None:
        from actors.ahbm.cpu import PeCpu

        self._handlers = dict(PeCpu.launch_handlers)
        prof = self

        def wrap(handler):
            async def timed(cpu, launch):
                t0 = cpu.now
                done = await handler(cpu, launch)
                prof.kernel[cpu.pe].append((t0, cpu.now))
                prof.cmd.pop(cpu.pe, None)   # the launch's commands are all complete
                return done
            return timed

        for k, h in self._handlers.items():
            PeCpu.launch_handlers[k] = wrap(h)

    def _wrap(self, cpu) -> None:
        prof, pe = self, cpu.pe

        def timed(name, kind):
            orig = getattr(cpu, name)

            async def call(*a, **kw):
                t0 = cpu.now
                stack = prof._stack()
                out = await orig(*a, **kw)
                dt = cpu.now - t0
                r = prof._row(pe, stack)
                r["calls"] += 1
                r["ops"][stack[-1][2] or name] += 1
                if kind == "issue":
                    r["issue_ps"] += dt
                elif kind == "tcm":
                    r["tcm_ps"] += dt
                elif kind == "queue":
                    r["queue_ps"] += dt
                    if name in _ENGINE_CALLS:
                        eng = _ENGINE[name]
                        what = eng
                        if name == "ipcq":
                            what = f"ipcq {a[0]} {a[1]}"
                        elif name == "noc_recv":
                            what = "noc recv from " + ("any" if a[0] is None else ",".join(map(str, a[0])))
                        prof.cmd[pe][out] = (stack, eng, cpu.now, what)
                elif kind == "wait":
                    cids = a[0] if name == "wait_any" else [a[0]]
                    mine = prof.cmd[pe]
                    info = mine.get(cids[0])
                    what = info[3] if info else "?"
                    if name == "wait_any":
                        engines = sorted({(mine.get(c) or (0, "?"))[1] for c in cids})
                        what = f"first of {len(cids)} {'/'.join(engines)}"
                    if dt:
                        r["wait_ps"][what] += dt
                return out

            setattr(cpu, name, call)

        reserve, run = cpu.reserve_id, cpu.math_run

        def reserve_id():   # a MATH op held back for a run (fidelity pipeline): its line, issued later in math_run
            cid = reserve()
            stack = prof._stack()
            r = prof._row(pe, stack)
            r["calls"] += 1
            r["ops"][stack[-1][2] or "math"] += 1
            prof.cmd[pe][cid] = (stack, "math", None, "math")
            return cid

        async def math_run(first, ops):   # each op's dispatch to its own line, as when they left one by one
            t0 = cpu.now
            await run(first, ops)
            gap = dispatch_ps("math", cpu.prm)
            for j in range(len(ops)):
                stack, eng, _, what = prof.cmd[pe][first + j]
                r = prof._row(pe, stack)
                r["calls"] += 1
                r["issue_ps"] += gap
                if j == 0:
                    r["queue_ps"] += cpu.now - t0 - len(ops) * gap
                prof.cmd[pe][first + j] = (stack, eng, t0 + (j + 1) * gap, what)

        cpu.reserve_id, cpu.math_run = reserve_id, math_run
        for name in ("dispatch", "cpu_busy"):
            timed(name, "issue")
        for name in (*_ENGINE_CALLS, "noc_send"):
            timed(name, "queue")
        for name in ("wait", "wait_any"):
            timed(name, "wait")
        for name in ("tcm_read", "tcm_write", "tcm_free", "tcm_free_all"):
            timed(name, "tcm")
        cpu.completed = _Completions(self, pe, cpu.completed)

    def _completed(self, pe: str, cid: int, info: dict) -> None:
        c = self.cmd[pe].get(cid)
        if c is None:
            return
        stack, eng, issued, _ = c
        start = info.get("start")
        self._row(pe, stack)["engine_ps"][eng] += info["end"] - (start if start is not None else issued)

    # -- results --------------------------------------------------------------------------------
    def result(self) -> dict:
        """Per line and per stack, over every PE and for the critical PE; the sums checked against kernel time."""
        kernel_ps = {pe: sum(e - s for s, e in v) for pe, v in self.kernel.items()}
        crit = max(self.kernel, key=lambda pe: (max(e for _, e in self.kernel[pe]), pe)) if self.kernel else None
        outside = {}
        for pe, k in kernel_ps.items():
            got = sum(_cpu(r) for r in self.rows[pe].values())
            outside[pe] = k - got
        lines_all, lines_crit = _by_line(self.rows.values()), _by_line([self.rows.get(crit, {})])
        return {"kernel_ps_sum": sum(kernel_ps.values()), "pes": len(kernel_ps), "critical_pe": crit,
                "critical_kernel_ps": kernel_ps.get(crit, 0),
                "critical_span_ps": list(self.kernel[crit][0]) if crit else None,
                "unattributed_ps": sum(outside.values()),
                "lines": lines_all, "critical_lines": lines_crit,
                "stacks": _by_stack(self.rows.values()), "critical_stacks": _by_stack([self.rows.get(crit, {})])}


class _Completions(dict):
    """The PE CPU's ``completed`` map (command id -> completion info), observed as completions arrive."""

    def __init__(self, prof: LineProfiler, pe: str, init: dict):
        super().__init__(init)
        self.prof, self.pe = prof, pe

    def __setitem__(self, cid, info):
        super().__setitem__(cid, info)
        self.prof._completed(self.pe, cid, info)


def _cpu(r: dict) -> int:
    return r["issue_ps"] + r["queue_ps"] + r["tcm_ps"] + sum(r["wait_ps"].values())


def _merge(into: dict, r: dict) -> None:
    into["calls"] += r["calls"]
    for k in ("issue_ps", "queue_ps", "tcm_ps"):
        into[k] += r[k]
    for k in ("wait_ps", "engine_ps", "ops"):
        for kk, v in r[k].items():
            into[k][kk] += v


def _finish(key: dict, r: dict) -> dict:
    return {**key, "calls": r["calls"], "time_ps": _cpu(r), "issue_ps": r["issue_ps"], "queue_ps": r["queue_ps"],
            "tcm_ps": r["tcm_ps"], "wait_ps": dict(sorted(r["wait_ps"].items(), key=lambda kv: -kv[1])),
            "engine_ps": dict(sorted(r["engine_ps"].items(), key=lambda kv: -kv[1])),
            "ops": dict(sorted(r["ops"].items(), key=lambda kv: -kv[1]))}


def _by_line(pe_rows) -> list[dict]:
    acc: dict[tuple, dict] = {}
    for rows in pe_rows:
        for stack, r in rows.items():
            fn, where, _ = stack[-1]
            _merge(acc.setdefault((where, fn), _new_row()), r)
    out = [_finish({"line": where, "function": fn}, r) for (where, fn), r in acc.items()]
    out.sort(key=lambda d: (-d["time_ps"], -sum(d["engine_ps"].values()), d["line"]))
    return out


def _by_stack(pe_rows) -> list[dict]:
    acc: dict[tuple, dict] = {}
    for rows in pe_rows:
        for stack, r in rows.items():
            _merge(acc.setdefault(stack, _new_row()), r)
    return [{"stack": [f"{fn} ({where})" + (f" {op}" if op else "") for fn, where, op in stack],
             "time_ps": _cpu(r), "wait_ps": dict(r["wait_ps"]), "issue_ps": r["issue_ps"],
             "queue_ps": r["queue_ps"], "tcm_ps": r["tcm_ps"]} for stack, r in acc.items()]


def folded_lines(stacks: list[dict], *, split: bool = True) -> list[str]:
    """Folded-stack lines (``a;b;c value``, value in ns of virtual time), one per stack and, with ``split``,
    per what the time was (``issue``, ``wait gemm``, ...) as the leaf frame."""
    out = []
    for s in stacks:
        base = ";".join(f.replace(";", ",").replace(" ", "_") for f in s["stack"])
        parts = {"issue": s["issue_ps"], "queue": s["queue_ps"], "tcm": s["tcm_ps"],
                 **{f"wait {k}": v for k, v in s["wait_ps"].items()}} if split else {"": s["time_ps"]}
        for leaf, ps in parts.items():
            ns = round(ps / 1000)
            if ns > 0:
                out.append(f"{base};{leaf.replace(' ', '_')} {ns}" if leaf else f"{base} {ns}")
    return sorted(out)


# -- pccx -------------------------------------------------------------------------------------------------
def stage_path(system, context, trace_path: str, end: int) -> dict:
    """Per stage (the run partitioned by what finishes next, actors/pccx/gemma3n/phases.py): its time and
    the critical path's time inside it per resource class (tools/explain/limits.py): what the stage waited on."""
    from actors.pccx.gemma3n.phases import stage_segments
    from tools.explain.limits import classified_steps

    comp = context.compiler
    driver = system.actors["pccx/driver"]
    segs = stage_segments(system.actors["pccx/axil_stat"].records, driver.host_spans, comp.where, 0, end)
    steps, _ = classified_steps(trace_path, "pccx")
    acc: dict = defaultdict(lambda: defaultdict(int))
    total: dict = defaultdict(int)
    for s, e, st in segs:
        total[st] += e - s
    i = 0
    for step in steps:   # both in time order: a two-pointer sweep of the overlaps
        a, b = step["start_ps"], step["end_ps"]
        while i < len(segs) and segs[i][1] <= a:
            i += 1
        j = i
        while j < len(segs) and segs[j][0] < b:
            s, e, st = segs[j]
            acc[st][step["class"]] += min(b, e) - max(a, s)
            j += 1
    out = []
    for st, ps in sorted(total.items(), key=lambda kv: -kv[1]):
        on = dict(sorted(acc[st].items(), key=lambda kv: -kv[1]))
        out.append({"stage": st, "time_ps": ps, "share": round(ps / end, 4) if end else 0.0, "waited_on": on})
    return {"stages": out, "end_ps": end}


def pccx_profile(system, context) -> dict:
    """Per stage, layer and opcode of a pccx program run (module docstring); needs the compiler's ``where``."""
    comp = getattr(context, "compiler", None)
    stat = system.actors.get("pccx/axil_stat")
    if comp is None or stat is None:
        return {"missing": "a pccx program without compiler stages (only the gemma3n workload names them)"}
    where = comp.where
    by = {"stage": defaultdict(lambda: defaultdict(int)), "layer": defaultdict(lambda: defaultdict(int)),
          "opcode": defaultdict(lambda: defaultdict(int)), "stage_opcode": defaultdict(lambda: defaultdict(int))}
    last_end: dict[str, int] = {}
    for r in sorted((r for r in stat.records if r["kind"] == "retire"), key=lambda r: (r["start"], r["seq"])):
        seq, op = r["seq"], r["op"]
        tok, layer, stage = where[seq] if 0 <= seq < len(where) else (None, None, "?")
        eng = r["end"] - r["start"]
        stall = max(0, r["start"] - last_end.get(op, r["start"]))
        last_end[op] = max(last_end.get(op, 0), r["end"])
        for key, k in (("stage", stage), ("layer", "-" if layer is None or layer < 0 else layer), ("opcode", op),
                       ("stage_opcode", (stage, op))):
            d = by[key][k]
            d["instructions"] += 1
            d["engine_ps"] += eng
            d["stall_ps"] += stall
    driver = system.actors.get("pccx/driver")
    for s, e, lab in (driver.host_spans if driver is not None else []):
        by["stage"][lab.split(":")[0]]["host_ps"] += e - s

    def rows(d, name):
        out = [{name: k if not isinstance(k, tuple) else "/".join(map(str, k)), **{f: int(v.get(f, 0)) for f in
               ("instructions", "engine_ps", "stall_ps", "host_ps")}} for k, v in d.items()]
        out.sort(key=lambda x: (-(x["engine_ps"] + x["host_ps"]), str(x[name])))
        return out

    return {"stages": rows(by["stage"], "stage"), "layers": rows(by["layer"], "layer"),
            "opcodes": rows(by["opcode"], "opcode"), "stage_opcodes": rows(by["stage_opcode"], "stage/opcode")}


def pccx_folded(p: dict) -> list[str]:
    """Folded lines of a pccx profile: ``stage;class value`` (ns) from the stage partition and the critical path
    (they sum to the run's time); without it ``stage;opcode;engine|idle value`` plus ``stage;host``."""
    out = []
    if p.get("stage_path"):
        for r in p["stage_path"]["stages"]:
            for c, ps in r["waited_on"].items():
                if ps >= 1000:
                    out.append(f"{r['stage']};{c.replace(' ', '_')} {round(ps / 1000)}")
        return sorted(out)
    for r in p["stage_opcodes"]:
        stage, op = r["stage/opcode"].split("/", 1)
        for leaf, ps in (("engine", r["engine_ps"]), ("idle", r["stall_ps"])):
            if ps >= 1000:
                out.append(f"{stage};{op};{leaf} {round(ps / 1000)}")
    for r in p["stages"]:
        if r["host_ps"] >= 1000:
            out.append(f"{r['stage']};host {round(r['host_ps'] / 1000)}")
    return sorted(out)


# -- running ----------------------------------------------------------------------------------------------
def _scenario_of(path: str, sets, allow=()):
    """(scenario, recorded digest or None) of a trace file, a bundle directory or a scenario file.  A recorded
    run is confined to its own folder: its files, and the files its scenario names, must lie under it (or the
    shipped scenarios/, or ``allow``; emulator/input_paths.py)."""
    from actors import registry
    from emulator.input_paths import bundle_file, input_roots
    from emulator.scenario import load_scenario, scenario_path
    from emulator.schema import load_yaml, read_text
    from emulator.trace import iter_trace
    from tools.run.runner import scenario_from_resolved

    p = Path(path)
    if p.is_dir():
        roots = input_roots(p, allow=allow, own="the bundle's folder")
        res = bundle_file(p, "result.json", roots)
        digest = json.loads(res.read_text()).get("digest") if res else None
        if sets:
            raise ValueError("emu profile: --set applies to a scenario file, not to a recorded run")
        resolved = bundle_file(p, "scenario.resolved.yaml", roots)
        if resolved is None:
            raise ValueError(f"{path}: a bundle directory without scenario.resolved.yaml")
        return scenario_from_resolved(load_yaml(read_text(str(resolved)), str(resolved)).value, roots), digest
    if p.suffix == ".emutrace":
        if sets:
            raise ValueError("emu profile: --set applies to a scenario file, not to a recorded trace")
        header = footer = None
        for obj in iter_trace(str(p)):   # streamed: the header is the first object, the footer the last
            if header is None:
                header = obj
            footer = obj
        d = header.get("scenario_resolved") if isinstance(header, dict) else None
        if not d:
            raise ValueError(f"{path}: not a trace, or its header holds no scenario_resolved; profile the scenario file")
        roots = input_roots(p.parent, allow=allow, own="the trace's folder")
        return scenario_from_resolved(d, roots), footer.get("digest") if isinstance(footer, dict) else None
    return load_scenario(str(scenario_path(str(p))), registry, sets, allow=allow), None


def profile_run(path: str, sets=(), allow=()) -> dict:
    """Re-run ``path``'s scenario with the attribution installed; the profile and the digest check.
    ``allow``: ``--allow-path`` folders (emulator/input_paths.py)."""
    from tools.run.runner import plan_run, _build, final_status

    sc, digest = _scenario_of(path, list(sets), allow)
    tmp = tempfile.TemporaryDirectory(prefix="emu-profile-") if sc.family == "pccx" else None
    plan = plan_run(sc, bundle=False, trace_path=str(Path(tmp.name) / "t.emutrace") if tmp else None)
    system, workload, context = _build(plan)
    prof = LineProfiler() if sc.family == "ahbm" else None
    if prof is not None:
        prof.install(system)
    try:
        result = system.run(until=plan.max_time, footer=False, wall_timeout=plan.wall_timeout_s)
        checks = workload.check(system, sc.profile, sc.params, result) or {} if workload.check else {}
    finally:
        if prof is not None:
            prof.uninstall()
    status, _ = final_status(result, dict(checks), None)
    out = {"scenario": sc.name, "family": sc.family, "status": status, "end_time_ps": result.end_time_ps,
           "digest": result.digest, "recorded_digest": digest,
           "digest_matches": None if digest is None else digest == result.digest,
           "latency_ps": checks.get("latency_ps")}
    if prof is not None and prof.kernel:
        out["kernel"] = prof.result()
    elif prof is not None:
        out["missing"] = "no tl kernel ran in this run (its PEs ran command scripts: the trace has their spans)"
    elif sc.family == "pccx":
        out["pccx"] = pccx_profile(system, context)
        if tmp is not None:
            system.finish_trace(status, result.end_time_ps)
            if "missing" not in out["pccx"]:
                out["pccx"]["stage_path"] = stage_path(system, context, plan.trace.path, result.end_time_ps)
            tmp.cleanup()
    else:
        out["missing"] = f"no source attribution for the {sc.family} family (its actors run no kernel or program)"
    return out


# -- printing ---------------------------------------------------------------------------------------------
def _t(ps) -> str:
    return format_time(int(ps)) if ps else "0"


def format_lines(k: dict, rows: int = 15, critical: bool = True) -> str:
    lines = k["critical_lines"] if critical else k["lines"]
    total = k["critical_kernel_ps"] if critical else k["kernel_ps_sum"]
    who = f"critical PE {k['critical_pe']}" if critical else f"summed over {k['pes']} PEs"
    out = [f"kernel time by source line, {who}: {_t(total)} (lines sum to {_t(sum(r['time_ps'] for r in lines))}, "
           f"unattributed {_t(k['unattributed_ps'])})",
           f"  {'share':>6} {'time':>10} {'calls':>6} {'issue':>9} {'wait':>9}  {'waited on':<28} {'engine busy caused':<26} line"]
    for r in lines[:rows]:
        w = ", ".join(f"{n} {_t(v)}" for n, v in list(r["wait_ps"].items())[:2])
        e = ", ".join(f"{n} {_t(v)}" for n, v in list(r["engine_ps"].items())[:2])
        op = next(iter(r["ops"]), "")
        share = 100 * r["time_ps"] / total if total else 0.0
        out.append(f"  {share:5.1f}% {_t(r['time_ps']):>10} {r['calls']:6d} {_t(r['issue_ps'] + r['queue_ps'] + r['tcm_ps']):>9} "
                   f"{_t(sum(r['wait_ps'].values())):>9}  {w:<28} {e:<26} {r['line']} {r['function']} {op}")
    if len(lines) > rows:
        out.append(f"  ... {len(lines) - rows} more line(s) (--json lists all)")
    return "\n".join(out)


def format_pccx(p: dict, rows: int = 12) -> str:
    if "missing" in p:
        return f"no program profile: {p['missing']}"
    out = []
    sp = p.get("stage_path")
    if sp:
        out.append("time by stage (the run partitioned by what finishes next) and what the critical path did in it:")
        out.append(f"  {'stage':<16} {'time':>11} {'share':>6}  critical path in the stage, by resource class")
        for r in sp["stages"][:rows]:
            tot = r["time_ps"] or 1
            on = ", ".join(f"{c} {100 * v / tot:.0f} %" for c, v in list(r["waited_on"].items())[:3])
            out.append(f"  {r['stage']:<16} {_t(r['time_ps']):>11} {100 * r['share']:5.1f}%  {on}")
        if len(sp["stages"]) > rows:
            out.append(f"  ... {len(sp['stages']) - rows} more")
        out.append("")
    for key, name in (("stages", "stage"), ("opcodes", "opcode"), ("layers", "layer")):
        total = sum(r["engine_ps"] + r["host_ps"] for r in p[key]) or 1
        out.append(f"by {name} (engine = retire end - start; idle = the same engine idle before it; host = driver spans):")
        out.append(f"  {name:<16} {'instr':>7} {'engine':>11} {'idle':>11} {'host':>11} {'share':>6}")
        for r in p[key][:rows]:
            out.append(f"  {str(r[name]):<16} {r['instructions']:7d} {_t(r['engine_ps']):>11} {_t(r['stall_ps']):>11} "
                       f"{_t(r['host_ps']):>11} {100 * (r['engine_ps'] + r['host_ps']) / total:5.1f}%")
        if len(p[key]) > rows:
            out.append(f"  ... {len(p[key]) - rows} more")
        out.append("")
    return "\n".join(out).rstrip()


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="where a run's time went: by tl kernel line (AHBM) or program stage (pccx)")
    p.add_argument("run", help="a trace (.emutrace), a result bundle directory or a scenario file")
    from tools.cli_help import add_set_argument
    add_set_argument(p, what="scenario (when RUN is a scenario file)")
    p.add_argument("--json", action="store_true", help="print the whole profile as JSON")
    p.add_argument("--folded", metavar="FILE",
                   help="write a folded-stack file (flame graph of virtual time); default: no file")
    p.add_argument("--all-pes", action="store_true", help="AHBM: the table summed over every PE, not the critical PE")
    p.add_argument("--rows", type=int, default=15, help="rows of each table (the costliest first)")
    add_allow_path_argument(p)
    p.set_defaults(func=main)


def main(args) -> int:
    out = profile_run(args.run, args.set, args.allow_path)
    folded = None
    if "kernel" in out:
        k = out["kernel"]
        folded = folded_lines(k["stacks"] if args.all_pes else k["critical_stacks"])
    elif "pccx" in out and "missing" not in out["pccx"]:
        folded = pccx_folded(out["pccx"])
    if args.folded and folded is not None:
        Path(args.folded).write_text("\n".join(folded) + "\n")
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        dig = {True: "same digest as recorded", False: "DIGEST DIFFERS from the recorded run",
               None: "no recorded digest to compare"}[out["digest_matches"]]
        print(f"{out['scenario']}: {out['status']}, end {_t(out['end_time_ps'])}, re-run digest {out['digest']} ({dig})")
        if "kernel" in out:
            if out.get("latency_ps"):
                k = out["kernel"]
                print(f"latency {_t(out['latency_ps'])} = launch flight + critical PE {k['critical_pe']} kernel "
                      f"{_t(k['critical_kernel_ps'])} + completion flight")
            print(format_lines(out["kernel"], args.rows, critical=not args.all_pes))
        elif "pccx" in out:
            print(format_pccx(out["pccx"], args.rows))
        else:
            print(out["missing"])
        if args.folded and folded is not None:
            print(f"folded stacks: {args.folded} ({len(folded)} lines, ns of virtual time)")
    if out["digest_matches"] is False:
        return 1
    return 0

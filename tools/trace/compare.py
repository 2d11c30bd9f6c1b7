"""Compare two runs: result deltas, per-link and per-actor deltas, first diverging event.

Why: the question after a change (a fault, a parameter, a kernel variant) is
"what did it cost, and where?" -- not only "where does the event stream first
differ" (``emu trace diff``).  A run is reduced to a :class:`RunRecord`:

* ``result``: status, end time, messages, events, digest, seed;
* ``actors``: per actor ``busy_ps`` and ``spans`` (busy spans);
* ``links``: per link ``messages``, ``bytes``, ``sender_blocked``,
  ``max_depth`` (the definitions of docs/outputs-links.md) and ``flight_ps``,
  the summed send -> delivery time of its messages (from a trace; 0 without
  one) -- where a delay or contention shows when the traffic is unchanged.

A record comes from a result bundle directory (``result.json``, ``actors.csv``,
``links.csv``), a trace file (``.emutrace``, counted from its events), or an
in-process run (:func:`record_from_run`, what the pytest plugin's
``emu_sim.compare`` uses).  :func:`compare_runs` pairs the rows by name;
a row that exists on one side only (a different machine) is reported as such.
Deltas are ``b - a``.
"""
from __future__ import annotations

import csv
import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path

from emulator.units import format_time

__all__ = ["RunRecord", "Comparison", "record_from_run", "load_record", "compare_runs", "format_comparison",
           "ACTOR_METRICS", "LINK_METRICS"]

ACTOR_METRICS = ("busy_ps", "spans")
LINK_METRICS = ("messages", "bytes", "sender_blocked", "max_depth", "flight_ps")
RESULT_KEYS = ("status", "end_time_ps", "messages", "events", "digest", "seed")


@dataclass
class RunRecord:
    """One run reduced to what a comparison needs."""

    label: str
    result: dict
    actors: dict[str, dict]
    links: dict[str, dict]
    trace_path: str | None = None


def _flights(trace) -> dict[str, int]:
    """Per link name, the summed send -> delivery time of its delivered messages."""
    from emulator.trace import DELIVER, SEND

    sent: dict[tuple[int, int], int] = {}
    total = [0] * len(trace.links)
    for ev in trace.events:
        if ev[0] == SEND:
            sent[(ev[2], ev[3])] = ev[1]
        elif ev[0] == DELIVER:
            t = sent.pop((ev[2], ev[3]), None)
            if t is not None:
                total[ev[2]] += ev[1] - t
    return {l["name"]: total[i] for i, l in enumerate(trace.links)}


def _add_flights(links: dict[str, dict], trace) -> None:
    for name, f in _flights(trace).items():
        if name in links:
            links[name]["flight_ps"] = f


def record_from_run(label: str, system, result, trace_path: str | None = None, trace=None) -> RunRecord:
    """A record of an in-process run (a built :class:`System` and its :class:`RunResult`)."""
    end = result.end_time_ps
    res = {"status": result.status, "end_time_ps": end, "messages": result.messages, "events": result.events,
           "digest": result.digest, "seed": result.seed}
    actors = {r["actor"]: {"busy_ps": r["busy_ps"], "spans": r["spans"]} for r in system.actor_metrics(end)}
    links = {r["link"]: {k: r.get(k, 0) for k in LINK_METRICS} for r in system.link_metrics(end)}
    if trace is not None:
        _add_flights(links, trace)
    return RunRecord(label, res, actors, links, trace_path)


def _int(x) -> int:
    return int(float(x)) if x not in ("", None) else 0


def _from_bundle(d: Path) -> RunRecord:
    """A bundle's record; its files must lie in its folder (no symlink out of it: emulator/input_paths.py)."""
    from emulator.input_paths import bundle_file

    res_path = bundle_file(d, "result.json")
    if res_path is None:
        raise ValueError(f"{d}: not a result bundle (no result.json)")
    try:
        res = json.loads(res_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{res_path}: not valid JSON ({e})") from None
    actors, links = {}, {}
    if (path := bundle_file(d, "actors.csv")) is not None:
        for r in csv.DictReader(open(path, newline="")):
            actors[r["actor"]] = {k: _int(r.get(k)) for k in ACTOR_METRICS}
    if (path := bundle_file(d, "links.csv")) is not None:
        for r in csv.DictReader(open(path, newline="")):
            links[r["link"]] = {k: _int(r.get(k)) for k in LINK_METRICS}
    trace = bundle_file(d, "trace.emutrace")
    if trace is not None:
        from emulator.trace import read_trace

        _add_flights(links, read_trace(str(trace)))
    record = {k: res.get(k) for k in RESULT_KEYS}
    record["energy_j"] = (res.get("energy") or {}).get("total_j")   # docs/energy.md
    return RunRecord(str(d), record, actors, links, str(d / "trace.emutrace") if trace is not None else None)


def _from_trace(path: Path) -> RunRecord:
    from emulator.trace import read_trace
    from tools.trace.summary import summarise

    tr = read_trace(str(path))
    s = summarise(tr, top=0, critical=False)
    if s["actors"] is None or s["links"] is None:
        raise ValueError(f"{path}: recorded with filters ({'; '.join(s['missing'].values())}); "
                         "compare the bundles or record whole traces")
    res = {"status": s["status"], "end_time_ps": s["end_time_ps"], "messages": sum(r["messages"] for r in s["links"]),
           "events": tr.footer.get("events"), "digest": tr.footer.get("digest"), "seed": s["seed"]}
    actors = {r["actor"]: {"busy_ps": r["busy_ps"], "spans": r["spans"]} for r in s["actors"]}
    links = {r["link"]: {"messages": r["messages"], "bytes": r["bytes"], "sender_blocked": r["sender_blocked"],
                         "max_depth": r["max_depth"], "flight_ps": 0} for r in s["links"]}
    _add_flights(links, tr)
    return RunRecord(str(path), res, actors, links, str(path))


def load_record(path) -> RunRecord:
    """A record from a bundle directory or a trace file (``ValueError`` with a clear message otherwise)."""
    p = Path(path)
    if p.is_dir():
        return _from_bundle(p)
    if p.is_file():
        return _from_trace(p)
    raise ValueError(f"{p}: no such bundle directory or trace file")


@dataclass
class Comparison:
    """``b`` against ``a``: result pairs, and per-link / per-actor rows with deltas (``b - a``)."""

    a: RunRecord
    b: RunRecord
    result: dict                      # key -> (a, b)
    actors: list[dict]                # {"actor", "only_in"?, metric: (a, b, delta)}, most changed first
    links: list[dict]                 # {"link", ...} likewise
    divergence: str | None = None     # first diverging trace event (when both have a trace)
    notes: list[str] = field(default_factory=list)

    @property
    def end_time_delta(self) -> int:
        """``b``'s end time minus ``a``'s, in ps."""
        a, b = self.result["end_time_ps"]
        return int(b or 0) - int(a or 0)

    @property
    def identical(self) -> bool:
        return self.result["digest"][0] == self.result["digest"][1] is not None

    def _total(self, rows: list[dict], key: str, glob: str, metrics) -> dict:
        picked = [r for r in rows if fnmatch.fnmatchcase(r[key], glob)]
        if not picked:
            raise KeyError(f"no {key} matches {glob!r}")
        out = {}
        for m in metrics:
            a = sum(r[m][0] for r in picked if m in r)
            b = sum(r[m][1] for r in picked if m in r)
            out[m] = (a, b, b - a)
        out["matched"] = len(picked)
        return out

    def link(self, glob: str) -> dict:
        """Summed ``(a, b, delta)`` per link metric over the links matching ``glob`` (``max_depth`` summed too)."""
        return self._total(self.links, "link", glob, LINK_METRICS)

    def actor(self, glob: str) -> dict:
        """Summed ``(a, b, delta)`` of ``busy_ps`` and ``spans`` over the actors matching ``glob``."""
        return self._total(self.actors, "actor", glob, ACTOR_METRICS)

    def as_dict(self) -> dict:
        return {"a": self.a.label, "b": self.b.label, "identical": self.identical,
                "end_time_delta_ps": self.end_time_delta,
                "result": {k: list(v) for k, v in self.result.items()},
                "actors": [{k: (list(v) if isinstance(v, tuple) else v) for k, v in r.items()} for r in self.actors],
                "links": [{k: (list(v) if isinstance(v, tuple) else v) for k, v in r.items()} for r in self.links],
                "first_divergence": self.divergence, "notes": self.notes}


def _rows(a: dict, b: dict, key: str, metrics, main: str) -> list[dict]:
    rows = []
    for name in sorted(set(a) | set(b)):
        ra, rb = a.get(name), b.get(name)
        row = {key: name}
        if ra is None or rb is None:
            row["only_in"] = "b" if ra is None else "a"
        for m in metrics:
            va = (ra or {}).get(m, 0) or 0
            vb = (rb or {}).get(m, 0) or 0
            row[m] = (va, vb, vb - va)
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r[main][2]), -sum(abs(r[m][2]) for m in metrics), r[key]))
    return rows


def compare_runs(a: RunRecord, b: RunRecord, *, divergence: bool = True) -> Comparison:
    """Compare two records (see the module docstring)."""
    result = {k: (a.result.get(k), b.result.get(k)) for k in RESULT_KEYS + ("energy_j",)}
    c = Comparison(a, b, result, _rows(a.actors, b.actors, "actor", ACTOR_METRICS, "busy_ps"),
                   _rows(a.links, b.links, "link", LINK_METRICS, "bytes"))
    only = [r for r in c.actors if "only_in" in r]
    if only:
        c.notes.append(f"{len(only)} actor(s) exist in one run only (different machines?)")
    if divergence and a.trace_path and b.trace_path and not c.identical:
        from emulator.trace import read_trace
        from tools.trace.diff import diff_traces, format_diff

        res = diff_traces(read_trace(a.trace_path), read_trace(b.trace_path), context=0)
        c.divergence = format_diff(res)
    elif divergence and not c.identical:
        c.notes.append("no trace on both sides: first diverging event not shown")
    return c


def _signed(v: int, fmt=str) -> str:
    return ("+" if v > 0 else "-" if v < 0 else "") + fmt(abs(v)) if v else "0"


def format_comparison(c: Comparison, *, rows: int = 10) -> str:
    """The text ``emu compare`` prints."""
    out = [f"A: {c.a.label}", f"B: {c.b.label}"]
    if c.identical:
        out.append(f"identical runs (digest {c.result['digest'][0]})")
    (sa, sb), (ea, eb) = c.result["status"], c.result["end_time_ps"]
    out.append("")
    out.append(f"{'':<12} {'A':>16} {'B':>16} {'B - A':>16}")
    out.append(f"{'status':<12} {str(sa):>16} {str(sb):>16}")
    if ea is not None and eb is not None:
        pct = f" ({100 * (eb - ea) / ea:+.2f} %)" if ea else ""
        out.append(f"{'end time':<12} {format_time(ea):>16} {format_time(eb):>16} "
                   f"{_signed(eb - ea, format_time):>16}{pct}")
    for k in ("messages", "events"):
        va, vb = c.result[k]
        if va is not None and vb is not None:
            out.append(f"{k:<12} {va:>16} {vb:>16} {_signed(vb - va):>16}")
    ja, jb = c.result.get("energy_j", (None, None))
    if ja is not None and jb is not None:   # bundles of machines with an energy model (docs/energy.md)
        pct = f" ({100 * (jb - ja) / ja:+.2f} %)" if ja else ""
        out.append(f"{'energy':<12} {ja * 1e6:>13.4g} uJ {jb * 1e6:>13.4g} uJ {(jb - ja) * 1e6:>+13.4g} uJ{pct}")
    changed = [r for r in c.actors if r["busy_ps"][2] or r["spans"][2] or "only_in" in r]
    out.append("")
    out.append(f"actors whose busy time changed: {len(changed)} of {len(c.actors)}"
               + (f", the {min(rows, len(changed))} largest:" if changed else ""))
    for r in changed[:rows]:
        a, b, d = r["busy_ps"]
        only = f"  (only in {r['only_in'].upper()})" if "only_in" in r else ""
        out.append(f"  {r['actor']:<40} busy {format_time(a):>10} -> {format_time(b):>10} "
                   f"({_signed(d, format_time)}), spans {_signed(r['spans'][2])}{only}")
    changed = [r for r in c.links if any(r[m][2] for m in LINK_METRICS) or "only_in" in r]
    out.append("")
    out.append(f"links whose traffic or flight time changed: {len(changed)} of {len(c.links)}"
               + (f", the {min(rows, len(changed))} largest:" if changed else ""))
    for r in changed[:rows]:
        only = f"  (only in {r['only_in'].upper()})" if "only_in" in r else ""
        parts = ", ".join(f"{m} {r[m][0]}->{r[m][1]}" for m in LINK_METRICS if r[m][2] and m != "flight_ps")
        if r["flight_ps"][2]:
            parts += (", " if parts else "") + f"flight time {_signed(r['flight_ps'][2], format_time)}"
        out.append(f"  {r['link']:<52} {parts or 'same'}{only}")
    for n in c.notes:
        out.append(f"note: {n}")
    if c.divergence:
        out.append("")
        out.append("first diverging trace event:")
        out += ["  " + line for line in c.divergence.splitlines()]
    return "\n".join(out)


# -- the command line: emu compare A B ---------------------------------------------------
def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="compare two runs (bundles or traces): result, per-link, per-actor deltas")
    c.add_argument("a", help="result bundle directory or .emutrace file (the baseline)")
    c.add_argument("b", help="result bundle directory or .emutrace file (the variant)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--rows", type=int, default=10, help="rows per table (default 10)")
    c.set_defaults(func=main)


def main(args) -> int:
    """Exit status 0: compared (identical or not); bad input is reported like every ``emu`` error."""
    c = compare_runs(load_record(args.a), load_record(args.b))
    if args.json:
        print(json.dumps(c.as_dict(), indent=1))
    else:
        print(format_comparison(c, rows=max(1, args.rows)))
    return 0

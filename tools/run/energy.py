"""The run's energy (docs/energy.md): the family's action map over the finished system, summed exactly.

A machine family opts in with two functions in its family module (actors/registry.py):
``energy_inventory(system, profile, end_ps) -> (charges, leaks)`` and
``energy_per(params, checks) -> (unit, n)``, and optionally ``energy_report(res, energy)`` and
``energy_caveat(params, mode) -> str | None`` (what a coarser model leaves out: ``caveat`` in the summary).
The runner calls :func:`run_energy` once the run and its check are over, then
:func:`report_energy`: a check's own tables are built before the energy exists, so a family
that reports energy inside them (the Gemma 3N budget's tokens per joule) adds it there, to the
finished result; the bundle adds the per-component columns to ``actors.csv`` / ``links.csv``
(:func:`energy_columns`).
"""
from __future__ import annotations

from emulator.energy import AJ_PER_J, account, energy_summary

__all__ = ["run_energy", "report_energy", "energy_columns"]


def run_energy(family, system, profile: dict, params: dict, checks: dict, end_ps: int):
    """(account, result.json summary) of a run, or (None, None) for a family without an energy model."""
    inventory = getattr(family, "energy_inventory", None)
    if inventory is None or system is None or "energy" not in profile:
        return None, None
    charges, leaks = inventory(system, profile, end_ps)
    acc = account(charges, leaks, end_ps)
    per = family.energy_per(params, checks) if hasattr(family, "energy_per") else None
    summary = energy_summary(acc, per=per)
    caveat = getattr(family, "energy_caveat", None)
    note = caveat(params, system.mode) if caveat is not None else None
    if note:
        summary["caveat"] = note    # what a coarser model leaves out of this account
    return acc, summary


def report_energy(family, res: dict) -> None:
    """Let the family put the run's energy into its own report (``energy_report(res, res["energy"])``)."""
    hook = getattr(family, "energy_report", None)
    if hook is not None and res.get("energy"):
        hook(res, res["energy"])


def energy_columns(rows: list[dict], key: str, acc) -> list[dict]:
    """``rows`` (actors.csv or links.csv, named by ``key``) with ``energy_class`` (empty: no energy),
    ``energy_j``, ``dynamic_j``, ``static_j``."""
    if acc is None:
        return rows
    comps = acc.components
    for r in rows:
        c = comps.get(r[key])
        d, s = (c["dynamic_aj"], c["static_aj"]) if c else (0, 0)
        r["energy_class"] = c["cls"] if c else ""
        r["energy_j"] = (d + s) / AJ_PER_J
        r["dynamic_j"] = d / AJ_PER_J
        r["static_j"] = s / AJ_PER_J
    return rows


def explain_energy(scenario, schema) -> list[str]:
    """``emu explain``'s energy block: every coefficient with its unit, where it is set and the comment
    that gives its source (the profile line and the comment lines under it)."""
    from pathlib import Path

    from emulator.scenario import read_profile
    from emulator.schema import with_units

    e = scenario.profile.get("energy")
    if not e:
        return []
    spec = schema.fields["energy"]
    shown = with_units(spec, e)
    doc = read_profile(Path(scenario.profile_file), roots=scenario.input_roots or None) if scenario.profile_file \
        else None
    texts: dict[str, list[str]] = {}

    def origin(path):
        if doc is None:
            return None, None
        if path in doc.origins:
            return doc.origins[path]
        return doc.file, doc.lines.get(path)

    def source(path) -> str:
        f, line = origin(path)
        if not f or not line or not Path(str(f)).is_file():
            return f"(set by {f})" if f else ""
        lines = texts.setdefault(str(f), Path(str(f)).read_text().splitlines())
        notes = []
        if "#" in lines[line - 1]:
            notes.append(lines[line - 1].split("#", 1)[1].strip())
        for nxt in lines[line:]:
            if not nxt.strip().startswith("#"):
                break
            notes.append(nxt.strip()[1:].strip())
        return f"{Path(str(f)).name}:{line}: {' '.join(notes)}" if notes else f"{Path(str(f)).name}:{line}"

    out = ["energy model (docs/energy.md): energy = sum(actions x energy per action) + static power x time"]

    def walk(node, path):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, path + (k,))
            else:
                p = path + (k,)
                out.append(f"  {'.'.join(p)} = {v}   {source(p)}".rstrip())
    walk(shown, ("energy",))
    return out


def write_power(directory, series: dict | None, res: dict) -> None:
    """``power.csv`` (one row per window: start, total W, W per class) and the peak in ``res['energy']``."""
    import csv

    if series is None or "energy" not in res:
        return
    en = res["energy"]
    en["power"] = {"window_ps": series["window_ps"], "peak_w": series["peak_w"], "peak_at_ps": series["peak_at_ps"],
                   "file": "power.csv"}
    classes = list(series["by_class_w"])
    with open(directory / "power.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_ps", "total_w", *classes])
        for i, t in enumerate(series["t_ps"]):
            w.writerow([t, series["total_w"][i], *(series["by_class_w"][c][i] for c in classes)])

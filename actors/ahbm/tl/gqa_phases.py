"""Where a GQA decode's latency sits: launch, K/V sweep, each reduction hop, store, completion.

Read from what the run already reports (no extra event): the host's per-PE kernel ``start_ps`` /
``end_ps`` (relative to ``launch_ps``, host.py), and each PE's own ``tl.report`` values of the kernel
(kernels/gqa_attention.py): ``partial_done_ps`` (its sweep's partial ``(m, l, O)`` is final),
``merge_order`` (each child's name and when its ``l`` arrived) and, at a Group root,
``root_done_ps`` (the final ``O / l`` store issued).

The **critical chain** starts at the Group root whose kernel ended last and walks down the
reduction tree, at each PE to the child whose ``l`` arrived last (``merge_order``), until a PE
whose children all arrived before its own partial was final (or that has none): the chain's
*leaf*, whose sweep is the one the latency waited for.  Then, over ``[launch, last completion]``:

* ``launch``: ``start(leaf)``, the launch's flight to the leaf;
* ``sweep``: ``partial_done(leaf) - start(leaf)``;
* one ``reduction`` phase per chain edge, bottom up, ``child -> parent`` and its level (``L2``:
  a PE child over IPCQ, ``L1``: a CUBE child over the NOC): from the child's end (the leaf's
  partial) to the parent's (its kernel end after sending ``O`` on, for the root ``root_done_ps``),
  the hop and the parent's merges;
* ``store``: the root's kernel end minus ``root_done_ps`` (the ``O / l`` store and the
  kernel's final waits);
* ``completion``: the host's last completion minus the root's kernel end.

The phases telescope: they sum to the kernel latency exactly.  A run without reductions (no SP,
prefill, ring) has no ``merge_order`` and gets ``launch``, ``kernel`` (``end - start`` of the PE that
ended last) and ``completion``.
"""
from __future__ import annotations

__all__ = ["decode_phases"]


def decode_phases(host: dict, cpus: dict) -> list[dict]:
    """``[{"phase", "where", "ps"}]`` in time order, summing to ``host["kernel_latency_ps"]`` (module docstring).

    ``host``: the ``io/host`` report; ``cpus``: PE name (``sip0/cube01/pe1``) -> its CPU's report."""
    t0 = host.get("launch_ps", 0)
    pes = host.get("pes") or {}
    if not pes:
        return []
    span = {pe: (t0 + v["start_ps"], t0 + v["end_ps"]) for pe, v in pes.items()}
    last = host.get("last_done_ps", max(e for _, e in span.values()))
    roots = [pe for pe in pes if cpus.get(pe, {}).get("group_root")]
    top = max(roots or pes, key=lambda pe: (span[pe][1], pe))
    rep = cpus.get(top, {})
    if "partial_done_ps" not in rep:
        s, e = span[top]
        return [{"phase": "launch", "where": top, "ps": s - t0}, {"phase": "kernel", "where": top, "ps": e - s},
                {"phase": "completion", "where": top, "ps": last - e}]

    def child_pe(pe: str, name: str) -> str:
        sip, cube, _ = pe.split("/")
        if name.startswith("cube"):     # a CUBE root of the same SIP, at the same PE index (gqa_attention._reduce)
            return f"{sip}/cube{int(name[4:]):02d}/{pe.split('/')[2]}"
        return f"{sip}/{cube}/pe{int(name[2:])}"

    chain = [top]
    edges = []
    while True:
        pe = chain[-1]
        r = cpus.get(pe, {})
        order = r.get("merge_order") or []
        if not order:
            break
        name, t = max(order, key=lambda x: (x[1], x[0]))
        if t <= r.get("partial_done_ps", 0):
            break
        child = child_pe(pe, name)
        if child not in span:
            break
        edges.append(("L1" if name.startswith("cube") else "L2", child, pe))
        chain.append(child)
    leaf = chain[-1]
    lrep = cpus.get(leaf, {})
    out = [{"phase": "launch", "where": leaf, "ps": span[leaf][0] - t0},
           {"phase": "sweep", "where": leaf, "ps": lrep["partial_done_ps"] - span[leaf][0]}]
    prev = lrep["partial_done_ps"]
    for level, child, parent in reversed(edges):
        done = cpus.get(parent, {}).get("root_done_ps", span[parent][1]) if parent == top else span[parent][1]
        out.append({"phase": f"reduction {level}", "where": f"{child} -> {parent}", "ps": done - prev})
        prev = done
    root_done = rep.get("root_done_ps")
    if root_done is not None and not edges:   # no reduction on the chain: the root's own merges, if any
        out.append({"phase": "reduction (own merges)", "where": top, "ps": root_done - prev})
        prev = root_done
    out.append({"phase": "store", "where": top, "ps": span[top][1] - prev})
    out.append({"phase": "completion", "where": top, "ps": last - span[top][1]})
    return out

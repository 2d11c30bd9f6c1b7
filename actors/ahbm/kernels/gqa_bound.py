"""Analytic lower bound of the GQA kernel's latency, from the machine profile alone.

Used by the GQA workload's report (``bound_ps``, ``ratio_to_bound``) and reusable
by a sweep.  Every term is a time no schedule can beat on the modelled machine:

* ``launch``: the IO die -> PE command path, ``io.launch_latency`` (host.py);
* ``first_access``: one DMA setup + one closed-page HBM access before the first
  K byte reaches the PE (``dma.setup_cycles`` + ``hbm.access_latency``, costs.dma_ps);
* ``kv``: the K/V bytes the busiest-path rank must read, at the usable HBM
  bandwidth of one PE, ``pcs_per_pe x pc_bandwidth x efficiency`` (costs.pc_ps:
  8 x 32 GB/s x 0.8 = 204.8 GB/s by default);
* ``gemm``: the MAC-array core cycles of the GEMM commands the kernel really sends the
  engine, each charged as the engine charges it (costs.gemm_core_cycles: ``ceil(m/R)
  ceil(n/C) k`` with ``charge_padded``), without the fill/drain (back-to-back commands
  overlap it).  A ``tl.dot`` is one command of the whole ``[m, k] @ [k, n]``; a
  ``tl.composite`` is cut by the PE scheduler into the tiles of its plan (tiles.plan,
  ``gemm.tile_m x tile_k x tile_n``), one command each (:func:`gemm_core_cycles_sent`).
  The cut matters when a tile is narrower than the array: a composite tile of
  ``tile_n = 32`` columns on a 128-column array pays a whole array pass for 32 columns,
  and the 96 others do no work, so charging the GEMM as one ``ceil(n/128)`` pass would
  put the bound below what the run can do.  ``gemm_tiling`` names the rule used, and
  ``note`` says when the tiles leave array rows or columns idle (tools/explain/limits.py
  shows it on the ``limits`` line);
* ``reduction``: per Level-2 tree level one IPCQ hop carrying ``O`` (``ipcq.fixed_overhead``
  + O bytes / ``ipcq.bandwidth``), per Level-1 level one CUBE-to-CUBE crossing
  (intra-SIP UCIe ``2 x port_latency + link`` + O bytes / UCIe bandwidth); a chunked-O ring level
  (``l*_chunks = n``) has ``n - 1 + n div 2`` levels (rounds) of one hop carrying ``O / n`` each
  (the smallest chunk, rounded down).

``bound = launch + first_access + max(kv, gemm) + reduction``: K/V streaming and
the GEMMs may overlap perfectly, so only the larger one counts; the reduction
needs the last partial.  An emulated latency below this bound is a model bug
(tests/test_gqa_kernel.py asserts ratio >= 1).

:func:`critical_path_bound` is a second, tighter bound for decode SP: the issue's
bound plus the work the kernel's data dependencies force onto the critical path
after the last GEMM, which the first bound ignores, each from the engines' closed
forms (costs.py):

* ``drain``: the last GEMM's result leaves the array ``fill_drain`` cycles after
  its core cycles (costs.gemm_cycles - costs.gemm_core_cycles);
* ``fold_tail``: the last ``O = O * corr + O_j`` add needs ``O_j`` (merge.fold_tile):
  one MATH dispatch + ``add`` on ``[M, d]``;
* ``merge``: per reduction level (Level-2 and Level-1) the part of the parent's log-sum-exp
  merge that needs the child's ``O`` (merge.lse_merge, its MATH ops recorded by running it on
  a shape recorder that marks what depends on ``O_b``: ``O_b s_b`` and the add; the ``[M]``
  half and ``O s_a`` need only ``m, l`` and the running ``O``, which arrive or are final
  earlier, gqa_attention._reduce), then the one ``O`` send dispatch to the next level (``m, l``
  go ahead of it).  The CPU dispatches and the MATH engine runs the chain one op at a time,
  so it costs at least ``max(sum dispatch, sum math) + min(one dispatch, one op)``;
* ``hop``: what a level's ``O`` message costs beyond the issue's ``reduction`` term, from the
  interconnect closed forms (closed_forms.ipcq_model, closed_forms.noc_model over one CUBE link,
  noc.py docstring): the message header on IPCQ and, on the NOC, the two PE attach links and
  the two router pipelines (``noc.switching: store_and_forward``: each link serialises the
  whole packet, ``2 (S / B_att + L_att) + 2 alpha``; cut-through: ``2 L_att + 2 alpha``);
Not counted (so it stays a lower bound): the softmax chain between a tile's Q·Kᵀ
and its P·V (another tile's GEMM could fill it), the ``m, l`` path of the reduction
(it runs ahead of ``O``), NOC queueing behind other packets.
"""
from __future__ import annotations

from emulator.units import transfer_ps

from actors.ahbm.closed_forms import ipcq_model, noc_model
from actors.ahbm.costs import dispatch_ps, dma_ps, gemm_core_cycles, gemm_cycles, math_ps, stripe
from actors.ahbm.kernels.merge import lse_merge
from actors.ahbm.pipeline import plan_cached

__all__ = ["attention_bound", "critical_path_bound", "gemm_core_cycles_sent", "tiling_note", "merge_ops", "hop1_ps",
           "hop2_ps"]


def gemm_core_cycles_sent(m: int, k: int, n: int, prm, gemm: str) -> int:
    """Core cycles the engine charges for ``[m, k] @ [k, n]`` as the kernel sends it (module docstring): one
    command (``gemm="dot"``) or one per tile of the PE scheduler's plan (``"composite"``)."""
    if gemm == "dot":
        return gemm_core_cycles(m, k, n, prm)
    return sum(gemm_core_cycles(s.tm, s.tk, s.tn, prm) for s in plan_cached(m, k, n, tuple(prm.tile)))


def tiling_note(prm, gemm: str) -> str | None:
    """What the composite tiles leave unused of the array (module docstring), or None."""
    if gemm == "dot":
        return None
    (tm, _, tn), R, C = prm.tile, prm.array_rows, prm.array_cols
    idle = [f"{key} = {t} of the array's {a} {name}" for key, t, a, name in
            (("tile_m", tm, R, "rows"), ("tile_n", tn, C, "columns")) if t % a]
    if not idle:
        return None
    return (f"the kernel's composite tiles fill gemm.{' and gemm.'.join(idle)}: the gemm term charges each tile"
            f" a whole array pass, as the engine does")


def attention_bound(prm, *, M: int, d: int, tiles: list[int], kv_keys: int, l2_depth: int, l1_depth: int,
                    l2_chunks: int = 1, l1_chunks: int = 1, gemm: str = "composite") -> dict:
    """Terms and total (ps) for one rank sweeping ``tiles`` (keys per KV tile, M query rows) over ``kv_keys``
    keys of K and V, followed by ``l2_depth`` IPCQ and ``l1_depth`` CUBE-NOC reduction levels; ``gemm``: how the
    kernel issues its two GEMMs a tile (``composite`` or ``dot``, the workload's ``gemm`` parameter)."""
    kv_bytes = 2 * kv_keys * d * 2
    hbm_bw = prm.pcs * prm.pc_bw_eff
    cycles = sum(gemm_core_cycles_sent(M, d, n, prm, gemm) + gemm_core_cycles_sent(M, n, d, prm, gemm)
                 for n in tiles)   # Q·Kᵀ [M, d] @ [d, n] and P·V [M, n] @ [n, d], as the engine is sent them
    o_bytes = M * d * 4
    hop2, hop1 = hop2_ps(o_bytes // l2_chunks, prm), hop1_ps(o_bytes // l1_chunks, prm)
    terms = {"launch_ps": prm.launch_latency, "first_access_ps": prm.dma_setup + prm.hbm_latency,
             "kv_ps": transfer_ps(kv_bytes, hbm_bw), "gemm_ps": prm.pe_clk.ps(cycles),
             "reduction_ps": l2_depth * hop2 + l1_depth * hop1}
    terms["bound_ps"] = (terms["launch_ps"] + terms["first_access_ps"] + max(terms["kv_ps"], terms["gemm_ps"])
                         + terms["reduction_ps"])
    terms["kv_bytes_per_rank"] = kv_bytes
    terms["gemm_tiling"] = ("dot: one command a GEMM" if gemm == "dot" else
                            f"composite: tiles of {'x'.join(map(str, prm.tile))} (gemm.tile_m/k/n)")
    note = tiling_note(prm, gemm)
    if note:
        terms["note"] = note
    return terms


def hop2_ps(nbytes: int, prm) -> int:
    """The issue's Level-2 hop: ``ipcq.fixed_overhead + bytes / ipcq.bandwidth``."""
    return prm.ipcq_overhead + transfer_ps(nbytes, prm.ipcq_bw)


def hop1_ps(nbytes: int, prm) -> int:
    """The issue's Level-1 hop: one CUBE-to-CUBE UCIe crossing, ``2 x port_latency + link + bytes / bandwidth``."""
    return prm.cube_link_latency + transfer_ps(nbytes, prm.cube_link_bw)


class _Shape:
    """Stand-in for a tensor in :func:`merge_ops`: element count, whether it depends on the
    child's ``O``; records the MATH ops applied."""

    def __init__(self, rec: list, n: int, on_o: bool = False):
        self.rec, self.n, self.on_o = rec, n, on_o

    def _op(self, op: str, o) -> "_Shape":
        other = o if isinstance(o, _Shape) else None
        n = max(self.n, other.n if other else 1)
        on_o = self.on_o or bool(other and other.on_o)
        self.rec.append((op, n, on_o))
        return _Shape(self.rec, n, on_o)

    def __add__(self, o):
        return self._op("add", o)

    def __sub__(self, o):
        return self._op("sub", o)

    def __mul__(self, o):
        return self._op("mul", o)


class _Recorder:
    """The two ``tl`` calls lse_merge makes, recorded instead of dispatched."""

    def maximum(self, a, b):
        return a._op("maximum", b)

    def exp(self, x):
        return x._op("exp", None)


def merge_ops(M: int, d: int, needs_o: bool = False) -> list[tuple[str, int]]:
    """(MATH op, elements) of one log-sum-exp merge of ``[M]`` m/l and ``[M, d]`` O states (merge.lse_merge);
    ``needs_o``: only the ops that depend on the child's ``O``."""
    rec: list = []
    a = (_Shape(rec, M), _Shape(rec, M), _Shape(rec, M * d))
    b = (_Shape(rec, M), _Shape(rec, M), _Shape(rec, M * d, on_o=True))
    lse_merge(_Recorder(), a, b)
    return [(op, n) for op, n, on_o in rec if on_o or not needs_o]


def _chain_ps(ops: list[tuple[str, int]], prm) -> int:
    """Lower bound of a dependent chain of MATH ops, each dispatched by the CPU then run on the engine."""
    disp = dispatch_ps("math", prm)
    maths = [math_ps(op, n, prm) for op, n in ops]
    return max(len(ops) * disp + maths[-1], disp + sum(maths))


def critical_path_bound(prm, *, M: int, d: int, tiles: list[int], kv_keys: int, l2_depth: int,
                        l1_depth: int, gemm: str = "composite") -> dict:
    """The issue's bound (:func:`attention_bound`) plus the dependent tail terms of the module docstring."""
    terms = attention_bound(prm, M=M, d=d, tiles=tiles, kv_keys=kv_keys, l2_depth=l2_depth, l1_depth=l1_depth,
                            gemm=gemm)
    last = tiles[-1] if tiles else 0
    o_bytes = M * d * 4
    per_pc = [sum(n for _, n in pc) for pc in stripe(0, 1, o_bytes, o_bytes, prm.burst, prm.pcs)]
    extra = {
        "drain_ps": prm.pe_clk.ps(gemm_cycles(M, last, d, prm) - gemm_core_cycles(M, last, d, prm)) if last else 0,
        "fold_tail_ps": _chain_ps([("add", M * d)], prm) if last else 0,
        "merge_ps": (l2_depth * (_chain_ps(merge_ops(M, d, needs_o=True), prm) + dispatch_ps("ipcq", prm))
                     + l1_depth * (_chain_ps(merge_ops(M, d, needs_o=True), prm) + dispatch_ps("noc", prm))),
        "hop_ps": (l2_depth * (ipcq_model(o_bytes, prm) - hop2_ps(o_bytes, prm))
                   + l1_depth * (noc_model(o_bytes, 1, prm) - hop1_ps(o_bytes, prm))),
        "finalize_ps": _chain_ps([("div", M * d)], prm) + dispatch_ps("dma", prm) + dma_ps(per_pc, prm),
        "completion_ps": prm.launch_latency,
    }
    out = {**terms, **extra}
    out["critical_bound_ps"] = terms["bound_ps"] + sum(extra.values())
    return out

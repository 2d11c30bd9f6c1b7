"""The critical-path bound of GQA decode SP (actors/ahbm/kernels/gqa_bound.py): tighter than the issue's
bound by exactly its dependent-tail terms, and still below what the emulator measures."""
from emulator.units import transfer_ps
from protocols.ahbm import NocPacket, payload
from protocols.codec import TensorDesc, encode

from actors.ahbm.closed_forms import BF16, ipcq_model, noc_model
from actors.ahbm.costs import dispatch_ps, math_ps
from actors.ahbm.cpu import PKT_ID0
from actors.ahbm.kernels.gqa_bound import _chain_ps, attention_bound, critical_path_bound, hop1_ps, hop2_ps, merge_ops
from actors.ahbm.params import Params
from actors.ahbm.testkit import profile


def noc_model_bytes(payload_bytes):
    """The packet size noc_model charges (closed_forms.noc_model)."""
    return encode(NocPacket(PKT_ID0, [0, 0, 0], [0, 0, 0], 0, payload(TensorDesc.of((payload_bytes // 2,), BF16))))[1]


def test_merge_ops_are_the_lse_merge_ops():
    ops = merge_ops(8, 128)
    # maximum of m; two exps of [M]; l update on [M]; O update on [M, d] (merge.lse_merge)
    assert [op for op, _ in ops].count("exp") == 2 and ops[0] == ("maximum", 8)
    assert sum(1 for _, n in ops if n == 8 * 128) == 3 and len(ops) == 11
    # only O_b s_b and the add need the child's O (O s_a needs the running O)
    assert merge_ops(8, 128, needs_o=True) == [("mul", 1024), ("add", 1024)]


def test_critical_bound_adds_the_tail_terms_to_the_issue_bound():
    prm = Params.of(profile())
    kw = dict(M=8, d=128, tiles=[64, 64], kv_keys=128, l2_depth=3, l1_depth=3)
    b, c = attention_bound(prm, **kw), critical_path_bound(prm, **kw)
    extra = c["drain_ps"] + c["fold_tail_ps"] + c["merge_ps"] + c["hop_ps"] + c["finalize_ps"] + c["completion_ps"]
    assert c["completion_ps"] == prm.launch_latency
    assert c["critical_bound_ps"] == b["bound_ps"] + extra > b["bound_ps"]
    level = max(2 * dispatch_ps("math", prm) + math_ps("add", 1024, prm),
                dispatch_ps("math", prm) + math_ps("mul", 1024, prm) + math_ps("add", 1024, prm))
    assert c["merge_ps"] == 3 * (dispatch_ps("ipcq", prm) + level) + 3 * (dispatch_ps("noc", prm) + level)
    # the O message: IPCQ header bytes; NOC store-and-forward: two attach links and two routers on top
    o = 8 * 128 * 4
    assert c["hop_ps"] == 3 * (ipcq_model(o, prm) - hop2_ps(o, prm)) + 3 * (noc_model(o, 1, prm) - hop1_ps(o, prm))
    att = transfer_ps(noc_model_bytes(o), prm.attach_bw) + prm.link_ps
    assert noc_model(o, 1, prm) == 2 * att + 2 * prm.router_ps + prm.cube_link_latency + transfer_ps(
        noc_model_bytes(o), prm.cube_link_bw)
    assert critical_path_bound(prm, **{**kw, "l2_depth": 0, "l1_depth": 0})["merge_ps"] == 0


def _run_decode_sp():
    from actors.ahbm.testkit import build_workload
    from actors.ahbm.tl.gqa_workload import WORKLOAD
    params = {"case": "decode", "C": 2, "P": 8, "G": 8, "d": 128, "context": 2048, "tile": 64, "gemm": "composite"}
    system, prof, _, ctx = build_workload(WORKLOAD, params, name="gqa", mode="timing")
    result = system.run()
    assert result.status == "finished", result.error
    return system, result, ctx.layout.info, Params.of(prof)


def test_emulated_decode_sp_is_not_below_the_critical_bound():
    _, result, info, prm = _run_decode_sp()
    keys = 2048 // 16
    c = critical_path_bound(prm, M=8, d=128, tiles=[64] * (keys // 64), kv_keys=keys,
                            l2_depth=info["l2_depth"], l1_depth=info["l1_depth"])
    assert info["l2_depth"] == 3 and info["l1_depth"] >= 1
    assert result.end_time_ps >= c["critical_bound_ps"], (result.end_time_ps, c)


def test_reduction_merges_while_o_is_in_flight():
    """gqa_attention._reduce starts a merge on the child's m, l: the reduction beats a merge that waits for O
    (per level: three send dispatches, the whole lse chain, then O's hop)."""
    system, _, info, prm = _run_decode_sp()
    cpus = {k: v for k, v in system.reports.items() if k.endswith("/cpu") and "partial_done_ps" in v}
    root = next(v for v in cpus.values() if v.get("group_root"))
    reduction = root["root_done_ps"] - max(v["partial_done_ps"] for v in cpus.values())
    o = 8 * 128 * 4
    chain = _chain_ps(merge_ops(8, 128), prm)
    waits_for_o = (info["l2_depth"] * (3 * dispatch_ps("ipcq", prm) + chain + ipcq_model(o, prm))
                   + info["l1_depth"] * (3 * dispatch_ps("noc", prm) + chain + noc_model(o, 1, prm)))
    assert reduction < waits_for_o, (reduction, waits_for_o)


def test_the_gemm_term_charges_the_tiles_the_kernel_sends():
    """A composite is cut into the scheduler's tiles (gemm.tile_m/k/n = 32/64/32): on a 128-column array each
    32-column tile still pays a whole pass, so a 4x wider array does not shrink the gemm term; a tl.dot is one
    command and does use the width."""
    from actors.ahbm.kernels.gqa_bound import gemm_core_cycles_sent
    wide = Params.of(profile({"gemm": {"array_cols": 128}}))
    kw = dict(M=8, d=128, tiles=[64, 64], kv_keys=128, l2_depth=0, l1_depth=0)
    # per KV tile: Q·Kᵀ [8,128]@[128,64] = 2 N tiles x 2 K steps of 64; P·V [8,64]@[64,128] = 4 N tiles x 64
    per_tile = 2 * 2 * 64 + 4 * 64
    b = attention_bound(wide, **kw)
    assert b["gemm_ps"] == wide.pe_clk.ps(2 * per_tile)
    assert b["gemm_ps"] == attention_bound(Params.of(profile()), **kw)["gemm_ps"]   # the 32-column array's
    assert "gemm.tile_n = 32 of the array's 128 columns" in b["note"]
    assert "note" not in attention_bound(Params.of(profile()), **kw)
    # dot: one command of the whole GEMM, ceil(64/128) = 1 pass of 128 K; ceil(128/128) = 1 pass of 64 K
    assert gemm_core_cycles_sent(8, 128, 64, wide, "dot") == 128
    assert attention_bound(wide, **kw, gemm="dot")["gemm_ps"] == wide.pe_clk.ps(2 * (128 + 64))
    # tiles as wide as the array fill it: the term shrinks with it
    full = Params.of(profile({"gemm": {"array_cols": 128, "tile_n": 128}}))
    assert attention_bound(full, **kw)["gemm_ps"] == full.pe_clk.ps(2 * (2 * 64 + 64))

"""Gemma 3N on pccx: configs, KV ring, compiler (layout errors, KV sharing, refused SCALE), emu pccx compile."""
from __future__ import annotations

import pytest

from actors.pccx.gemma3n.compiler import CompileError, Compiler
from actors.pccx.gemma3n.config import global_layer, kv_source, load_config
from actors.pccx.gemma3n.kv import KvRing
from actors.pccx.profile import load_profile
from emulator.schema import SchemaError
from protocols import pccx_isa as isa


def test_e4b_config_structure():
    c = load_config("e4b")
    assert (c["hidden"], c["num_layers"], c["num_heads"], c["num_kv_heads"], c["head_dim"]) == (2048, 35, 8, 2, 256)
    assert [i for i in range(35) if global_layer(c, i)] == [4, 9, 14, 19, 24, 29, 34]
    src = [kv_source(c, i) for i in range(35)]
    assert src[:20] == list(range(20))
    assert all(src[i] == (19 if global_layer(c, i) else 18) for i in range(20, 35))


def test_bad_config_names_the_key():
    with pytest.raises(SchemaError) as e:
        load_config("tiny", {"kv": {"dtype": "int2"}})
    assert "kv.dtype" in str(e.value) and "int2" in str(e.value)
    with pytest.raises(SchemaError) as e:
        load_config("tiny", {"num_kv_heads": 3})
    assert "num_kv_heads" in str(e.value)


def test_kv_ring_wraps_keeping_sinks():
    r = KvRing(8, 2)
    for _ in range(8):
        r.append()
    assert r.valid() == list(range(8))
    for _ in range(5):          # 13 tokens: 5 evictions of the oldest non-sink entries
        r.append()
    assert r.written == 13
    assert r.slots[:2] == [0, 1]                       # the sinks survive
    assert sorted(r.valid()) == [0, 1] + list(range(7, 13))   # sinks + the last max_tokens - sink positions
    assert r.attended() == 8
    assert r.valid(window=4) == [p for p in r.valid() if p >= 9]
    with pytest.raises(ValueError):
        KvRing(4, 4)


def _compile(model="micro", profile="pccx-v002-documented", tokens=1, context=0, **over):
    comp = Compiler(load_config(model, over or None), load_profile(profile))
    for _ in range(context):
        comp.ring.append()
    steps = comp.setup()
    for t in range(context, context + tokens):
        steps += comp.token(t)
    return comp, steps


def test_shared_layers_issue_no_kv_gemvs_and_read_their_producer():
    comp, _ = _compile("tiny", tokens=2, context=3)
    c = comp.c
    first = c["num_layers"] - c["num_kv_shared_layers"]
    assert {layer for _, layer, _ in comp.kv_gemvs} == set(range(first))
    for t, layer, src in comp.kv_reads:
        assert src == kv_source(c, layer)
        assert (src == layer) == (layer < first)
    # the attention of a shared layer streams its producer's ring region
    assert {layer for layer, _h in comp.kvl.k} == set(range(first)) == {layer for layer, _h, _b in comp.kvl.v}
    assert len(set(comp.kvl.k.values())) == first * c["num_kv_heads"]


def test_l2_overflow_names_the_tensor():
    with pytest.raises(CompileError, match="'scores'.*CVO addresses"):
        _compile("tiny", kv={"max_tokens": 40000})
    with pytest.raises(CompileError, match=r"tensor '[^']+' \(\d+ elements, \d+ words\) does not fit"):
        _compile("tiny", vocab=1_000_000)


def test_recip_scale_with_possible_zero_scalar_is_refused():
    comp, _ = _compile()
    with pytest.raises(CompileError, match="recip_scale"):
        comp.cvo("SCALE", 8, 64, 9, recip_scale=1)
    comp.cvo("SCALE", 8, 64, 9, recip_scale=1, scalar_nonzero=True)   # the softmax sum (>= 1) is allowed


def test_stages_and_prefetch_placement():
    comp, steps = _compile()
    stages = {s for (s, _op) in comp.counts}
    assert {"embed", "ple", "altup_router", "qkv", "attention", "ffn_up", "ffn_down", "lm_head"} <= stages
    # rule 1: every GEMV after the first finds its weight stream already issued before the previous GEMV's push
    gemv_ix = [i for i, s in enumerate(steps) if s[0] == "push" and s[1] >> 60 == isa.OPCODES["GEMV"]]
    hp_ix = {}
    for i, s in enumerate(steps):
        if s[0] == "hp":
            hp_ix.setdefault(s[2], i)
    first_stream = sorted(hp_ix.values())
    assert len(first_stream) == len(gemv_ix)
    early = sum(1 for n in range(1, len(gemv_ix)) if first_stream[n] < gemv_ix[n - 1] + 3)
    assert early > len(gemv_ix) // 2
    off, steps_off = Compiler(comp.c, comp.profile, prefetch=False), None
    steps_off = off.setup() + off.token(0)
    for n, g in enumerate(i for i, s in enumerate(steps_off) if s[0] == "push" and s[1] >> 60 == 0):
        prev_wait = max(i for i in range(g) if steps_off[i][0] == "wait")
        assert all(steps_off[j][0] != "push" or steps_off[j][1] >> 60 == 3 for j in range(prev_wait + 1, g))


def test_rtl_profile_uses_only_wired_lanes():
    comp, steps = _compile(profile="pccx-v002-rtl")
    assert comp.parallel_lane == 2
    assert {s[5] for s in steps if s[0] == "hp"} == {0, 1}


def test_cli_compile(tmp_path, capsys):
    from tools.cli import main

    out = tmp_path / "p.pasm"
    assert main(["pccx", "compile", "micro", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "attention" in text and "total" in text
    words = [ln.split("#")[0] for ln in out.read_text().splitlines() if ln and not ln.startswith(("#", "wait"))]
    assert words and all(isa.assemble_line(w) is not None for w in words)
    assert main(["pccx", "compile", str(tmp_path / "missing.yaml")]) == 2


def test_host_sampling_top_p_and_repetition_penalty():
    import numpy as np

    from actors.pccx.gemma3n.hostmath import HostMath

    c = load_config("micro", {"softcap": 0.0})
    z = np.linspace(-1, 1, c["vocab"]).astype(np.float32)          # token 63 is the argmax, 62 the runner-up
    h = HostMath(c, 1, {"mode": "top_p", "top_p": 1e-9, "repetition_penalty": 1.15})
    assert h.sample(z) == 63                                        # top-p that small keeps only the best
    h.tokens = [63]
    assert h.sample(z) == 62                                        # 1/1.15 of the best falls below the next
    wide = [HostMath(c, s, {"mode": "top_p", "top_p": 0.9, "repetition_penalty": 1.0}).sample(z) for s in range(8)]
    assert len(set(wide)) > 1 and wide == [HostMath(c, s, {"mode": "top_p", "top_p": 0.9,
                                                            "repetition_penalty": 1.0}).sample(z) for s in range(8)]
    assert HostMath(c, 1).sample(z) == 63                            # greedy by default


def _e4b(profile: str, context: int, **over):
    comp = Compiler(load_config("e4b", over or None), load_profile(profile))
    for _ in range(context):
        comp.ring.append()
    steps = comp.setup() + comp.token(context)
    return comp, steps


@pytest.mark.parametrize("context", [1023, 8191])
def test_e4b_streams_each_kv_head_once_and_only_the_attended_slots(context):
    """E4B, one token at the end of the context: documented (head-parallel lanes), every layer's K and V are
    streamed once per KV head and only the L valid slots, so the KV bytes are the read-once figure (35 layers
    x 2 KV heads x (K, V) x L x 256 x 0.5 B) plus the K per-token and V^T per-row scales and the V^T sum row,
    no re-read and no padding; as built (one fmap LUT, no head axis) each of the 4 query heads streams them."""
    L = context + 1
    once = 35 * 2 * 2 * L * 256 // 2
    overhead = 35 * 2 * (2 * L + 2 * 257) + 35 * 2 * L // 2      # scales (K per slot, V^T per row) + sum row
    doc, _ = _e4b("pccx-v002-documented", context)
    assert doc.kv_bytes == once + overhead
    assert doc.kv_once == once and doc.kv_pad_bytes == 0 and doc.pass_heads == 4
    rtl, _ = _e4b("pccx-v002-rtl", context)
    assert rtl.kv_bytes == 4 * (once + overhead) and rtl.kv_once == once and rtl.pass_heads == 1


def _attention_pieces(comp, steps, layer: int) -> list[tuple[int, int]]:
    """(DDR address, bytes) of the DataMover commands of layer ``layer``'s attention GEMVs, in order."""
    sids = {sid for sid, (_t, lay, st) in enumerate(comp.stream_where) if lay == layer and st == "attention"}
    return [(s[3], s[4]) for s in steps if s[0] == "hp" and s[2] in sids]


def test_sliding_window_streams_the_newest_slots():
    """kv.sliding_window at 8K: a local layer attends (and streams) slots 7680-8191, the newest 512; its first
    K piece starts at slot 7680 of slice 0 and its V^T piece at slice 240 (slot 7680 / 32); global layers
    still stream the whole ring."""
    comp, steps = _e4b("pccx-v002-documented", 8191, kv={"sliding_window": True})
    att = comp.attended_ranges()
    assert att == {"local": {"ranges": [[7680, 8192]], "slots": 512}, "full": {"ranges": [[0, 8192]], "slots": 8192}}
    assert comp.kv_once == (7 * 8192 + 28 * 512) * 2 * 2 * 128
    pieces = _attention_pieces(comp, steps, 0)
    kv = comp.kvl
    assert pieces[0] == (kv.k[(0, 0)] + 7680 * 16, 512 * 16)
    vbase = kv.v[(0, 0, 0)] + 240 * 257 * 16
    assert [p for p in pieces if kv.v[(0, 0, 0)] <= p[0] < kv.v[(0, 0, 0)] + kv.vc * 257 * 16][0][0] == vbase


def test_sliding_window_after_the_ring_wrapped_zeroes_the_slots_it_does_not_write():
    """tiny (ring of 32, sinks 4, window 16), position 33: the window's slots are 4-5 and 18-31 (the newest 16
    positions); the V^T slices hold other slots too, so the EXP output goes to the zeroed exp_window."""
    comp, steps = _compile("tiny", tokens=4, context=30, kv={"sliding_window": True})
    assert comp.attended_ranges()["local"] == {"ranges": [[4, 6], [18, 32]], "slots": 16}
    assert sum(1 for s in steps if s[0] == "wait" and s[1].endswith("exp_window")) == 6 * 4   # local: 0-3, 5, 6

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

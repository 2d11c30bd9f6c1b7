"""Data mode: emulated Gemma 3N decode (micro config) vs an independent float64 numpy reference.

The reference below is written from the model's definition (HF Gemma3nTextDecoderLayer structure:
AltUp predict/correct with tanh routers, LAuReL, QK-norm + rotate-half RoPE, V-norm, unscaled GQA
softmax attention over the KV ring, Gaussian top-k sparsity, tanh GELU, PLE gating, AltUp
unembedding, final softcap).  It shares no code with the compiler or its host math: only the
parameters (the seeded INT4 weights, their BF16 scales and the norm weights) are read from the run.
It quantises K/V to INT4 like the cache does (K: per token, scale max|k|/7; V: static 4/7), since that
is part of the model being run, checks that every entry the run stored is within one INT4 level of its
own, then attends over the stored entries (a level flipped by BF16 noise would otherwise be amplified
token after token); everything else is float64 without BF16 rounding.

The KV check has two parts.  The quantiser: every stored entry is exactly the quantisation of the value
the emulated host computed (its K scale the BF16 of max|k|/7).  The stored entry against the reference's
own quantisation: each is within half a step of its value, so they differ by at most half a step of
each scale plus the values' difference, ``0.5 s_emu + 0.5 s_ref + |k_emu - k_ref|`` (in the reference's
steps).  On ``micro`` the values agree to ~0.5 % and that is one INT4 level (<= 1.05 steps, measured
1.01).  On ``tiny`` the random model's attention at position 1 (two slots whose scores are 1.7 apart in
layer 2) amplifies the BF16 activation error to ~10 % by layer 4: an entry then sits 1.22 steps from the
reference's (the K scale itself 7 % smaller), not a quantiser error (the emulator's attention on its own
q and stored K/V matches float64 to 0.5 %).
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from emulator import numerics
from actors import registry
from emulator.scenario import load_scenario

PROMPT = [5, 9, 3]
STEPS = 10


def _bf16_to_f64(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


class Weights(np.ndarray):
    """A float64 weight matrix whose ``@`` sums in a fixed order (emulator.numerics), never through BLAS: the
    reference gives the same numbers under any OpenBLAS kernel (tests/test_cpu_independence.py)."""

    def __matmul__(self, other):
        return numerics.matmul(np.asarray(self), np.asarray(other), acc=np.float64)


class Reference:
    def __init__(self, c, W, gamma, kv_log=None):
        self.c = c
        self.kv_log = {(pos, i, h): e for pos, i, h, *e in (kv_log or [])}
        self.kv_steps: list[float] = []   # per write: largest |ref - stored| in quantisation steps
        self.kv_bound: list[float] = []   # per write: what the emulator's value difference allows (module doc)
        self.W = {k: (v[0].astype(np.float64) * _bf16_to_f64(v[1])[:, None]).view(Weights) for k, v in W.items()}
        self.g = {k: ([np.asarray(x, np.float64) for x in v] if isinstance(v, list) else np.asarray(v, np.float64))
                  for k, v in gamma.items()}
        T, hd = c["kv"]["max_tokens"], c["head_dim"]
        self.K, self.V, self.pos = {}, {}, 0
        self.sink = c["kv"]["sink"]
        self.slots = [None] * T

    def norm(self, x, w=None):
        y = x / np.sqrt(np.mean(x * x) + self.c["rms_eps"])
        return y * w if w is not None else y

    @staticmethod
    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    def rope(self, x, theta):
        half = x.size // 2
        ang = self.pos * theta ** (-np.arange(half) * 2.0 / x.size)
        x1, x2 = x[:half], x[half:]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)])

    def slot(self):
        T = self.c["kv"]["max_tokens"]
        p = self.pos
        return p if p < T else self.sink + (p - self.sink) % (T - self.sink)

    def step(self, tok):
        c = self.c
        D, A, NL, P = c["hidden"], c["altup_inputs"], c["num_layers"], c["ple_dim"]
        H, KVH, hd = c["num_heads"], c["num_kv_heads"], c["head_dim"]
        s = self.slot()
        self.slots[s] = self.pos
        x0 = self.W["embed"][tok] * np.sqrt(D)
        pli_raw = (self.W["ple_table"][tok] * np.sqrt(P)).reshape(NL, P)
        proj = (self.W["ple_proj"] @ x0).reshape(NL, P) / np.sqrt(D)
        pli = (np.stack([self.norm(r, self.g["ple_proj_norm"]) for r in proj]) + pli_raw) / np.sqrt(2)
        rms = lambda v: np.sqrt(np.mean(v * v))   # noqa: E731
        xs = [x0] + [(self.W[f"altup_proj{k}"] @ x0) for k in range(1, A)]
        xs = [xs[0]] + [u * rms(x0) / max(rms(u), np.sqrt(1e-5)) for u in xs[1:]]
        for i in range(NL):
            L = f"L{i}."
            mod = np.tanh(self.W[L + "router"] @ (self.norm(xs[0], self.g["router"][i]) / D))
            C = (self.W[L + "pred"] @ mod).reshape(A, A)
            pred = [xs[j] + sum(C[j, k] * xs[k] for k in range(A)) for j in range(A)]
            xn = self.norm(pred[0], self.g["input"][i])
            glob = (i + 1) % c["global_every"] == 0
            theta = c["rope_theta_global"] if glob else c["rope_theta_local"]
            q = (self.W[L + "q"] @ xn).reshape(H, hd)
            q = [self.rope(self.norm(q[h], self.g["q"][i]), theta) for h in range(H)]
            first_shared = c["num_layers"] - c["num_kv_shared_layers"]
            src = i if i < first_shared else max(j for j in range(first_shared) if ((j + 1) % c["global_every"] == 0) == glob)
            if src == i:
                k = (self.W[L + "k"] @ xn).reshape(KVH, hd)
                v = (self.W[L + "v"] @ xn).reshape(KVH, hd)
                for g in range(KVH):
                    kr = self.rope(self.norm(k[g], self.g["k"][i]), theta)
                    ks = max(np.abs(kr).max(), 1e-6) / 7.0
                    kq = np.clip(np.round(kr / ks), -8, 7) * ks
                    vq = np.clip(np.round(self.norm(v[g]) / (4.0 / 7.0)), -8, 7) * (4.0 / 7.0)
                    if self.kv_log:
                        # the cache entry the run stored: within one INT4 step of ours (a value computed from
                        # BF16 inputs may round to the neighbouring level); attend over the stored entry so
                        # that one flipped level is not amplified over the following steps
                        ek, eks, ev, kr_e, vn_e = self.kv_log[(self.pos, i, g)]
                        s_e = _bf16_to_f64(eks)
                        ek = ek * s_e
                        ev = ev * (4.0 / 7.0)
                        self.kv_steps.append(max(np.abs(ek - kq).max() / ks, np.abs(ev - vq).max() / (4.0 / 7.0)))
                        vr = self.norm(v[g])
                        self.kv_bound.append(max(0.5 * s_e / ks + 0.5 + np.abs(kr_e - kr).max() / ks,
                                                 1.0 + np.abs(vn_e - vr).max() / (4.0 / 7.0)))
                        kq, vq = ek, ev
                    self.K.setdefault((i, g), {})[s] = kq
                    self.V.setdefault((i, g), {})[s] = vq
            valid = [sl for sl, p in enumerate(self.slots) if p is not None]
            out = []
            for h in range(H):
                g = h // (H // KVH)
                Ks = np.stack([self.K[(src, g)][sl] for sl in valid])
                Vs = np.stack([self.V[(src, g)][sl] for sl in valid])
                sc = numerics.matmul(Ks, q[h], acc=np.float64)
                p = np.exp(sc - sc.max())
                out.append(numerics.matmul(p / p.sum(), Vs, acc=np.float64))
            attn = self.W[L + "o"] @ np.concatenate(out)
            laurel = xn + self.norm(self.W[L + "laurel_r"] @ (self.W[L + "laurel_l"] @ xn), self.g["laurel"][i])
            al = (pred[0] + self.norm(attn, self.g["post_attn"][i]) + laurel) / np.sqrt(2)
            xf = self.norm(al, self.g["pre_ffn"][i])
            gate = self.W[L + "gate"] @ xf
            if i < c["sparse_layers"]:
                gate = np.maximum(gate - (gate.mean() + c["sparsity_z"] * gate.std()), 0)
            act = al + self.norm(self.W[L + "down"] @ (self.gelu(gate) * (self.W[L + "up"] @ xf)), self.g["post_ffn"][i])
            mod = np.tanh(self.W[L + "corr_router"] @ (self.norm(act, self.g["router"][i]) / D))
            cc = self.W[L + "corr"] @ mod + 1
            xs = [pred[k] + cc[k] * (act - pred[0]) for k in range(A)]
            fp = self.gelu(self.W[L + "ple_gate"] @ (xs[0] * self.g["correct_scale"][i])) * pli[i]
            y = self.norm(self.W[L + "ple_proj"] @ fp, self.g["ple_post"][i])
            xs = [xs[0]] + [x + y for x in xs[1:]]
        us = [self.W[f"altup_unproj{k}"] @ xs[k] for k in range(1, A)]
        us = [u * rms(xs[0]) / max(rms(u), np.sqrt(1e-5)) for u in us]
        h = self.norm((xs[0] + sum(us)) / A, self.g["final"])
        z = self.W["embed"] @ h
        self.pos += 1
        return c["softcap"] * np.tanh(z / c["softcap"])


def _data_run(run_with_context, path, model: str, steps: int):
    path.write_text(textwrap.dedent(f"""\
        name: gemma3n-{model}-data
        seed: 3
        mode: data
        machine:
          profile: pccx-v002-documented
          overrides: {{cvo: {{gelu_form: tanh}}}}
        workload:
          kind: gemma3n
          params: {{model: {model}, tokens: {steps}, prompt: {PROMPT}}}
        """))
    res, _, ctx = run_with_context(load_scenario(str(path), registry, []))
    assert res["status"] == "finished", res.get("error")
    return res, ctx.compiler.hm


@pytest.fixture(scope="module")
def emulated(run_with_context, tmp_path_factory):
    return _data_run(run_with_context, tmp_path_factory.mktemp("d") / "d.yaml", "micro", STEPS)


def _check_quantiser(hm):
    """Every stored K/V entry is exactly the quantisation of the value the emulated host computed."""
    from actors.pccx.numerics import from_bf16, to_bf16
    for _pos, _i, _h, kq, ks, vq, kr, vn in hm.kv_log:
        assert ks == int(to_bf16(np.float32(max(np.abs(kr).max(), 1e-6) / 7.0)))
        assert np.array_equal(kq, np.clip(np.round(kr / from_bf16(np.uint16(ks))), -8, 7))
        assert np.array_equal(vq, np.clip(np.round(vn / np.float32(4.0 / 7.0)), -8, 7))


def test_logits_and_greedy_tokens_match_the_reference(emulated):
    res, hm = emulated
    ref = Reference(hm.c, hm.W, hm.gamma, hm.kv_log)
    fed = list(PROMPT)
    errs = []
    assert len(hm.logits) == STEPS
    for step in range(STEPS):
        z = ref.step(fed[step])
        got = hm.logits[step].astype(np.float64)
        # tolerance: BF16 activations (2^-9 relative per rounding) through ~40 rounded stages of 4 layers
        # plus INT4 re-quantisation of K/V entries computed from BF16-rounded inputs: ~2 % of the logit range
        errs.append(np.abs(got - z).max() / np.abs(z).max())
        assert int(np.argmax(got)) == int(np.argmax(z)), f"step {step}: greedy token differs"
        if step + 1 >= len(fed):
            fed.append(int(np.argmax(z)))
    assert max(errs) < 0.03, errs
    assert len(ref.kv_steps) == STEPS * 3 and max(ref.kv_steps) <= 1.05   # 3 KV-owning layers x 1 KV head
    assert all(d <= b + 1e-9 for d, b in zip(ref.kv_steps, ref.kv_bound))
    _check_quantiser(hm)
    assert res["token_ids"] == fed[1:STEPS + 1]


def test_tiny_kv_entries_are_quantised_right(run_with_context, tmp_path):
    """``tiny`` (GQA 4:1 on the lanes, 5 KV-owning layers), 2 steps: the quantiser is exact on the host's own
    values, every stored entry is within the bound its value difference allows (module docstring; measured up
    to 1.22 steps where the values differ by ~10 %), and the logits stay within 3 % with the same greedy
    tokens."""
    res, hm = _data_run(run_with_context, tmp_path / "t.yaml", "tiny", 2)
    _check_quantiser(hm)
    ref = Reference(hm.c, hm.W, hm.gamma, hm.kv_log)
    for step in range(2):
        z = ref.step(PROMPT[step])
        got = hm.logits[step].astype(np.float64)
        assert np.abs(got - z).max() / np.abs(z).max() < 0.03
        assert int(np.argmax(got)) == int(np.argmax(z))
    assert len(ref.kv_steps) == 2 * 5 and max(ref.kv_steps) > 1.05   # position 1: the 1.22-step entry
    assert all(d <= b + 1e-9 for d, b in zip(ref.kv_steps, ref.kv_bound)), list(zip(ref.kv_steps, ref.kv_bound))


def test_reference_detects_a_broken_model(emulated):
    """The comparison can fail: the same reference with one norm weight changed disagrees."""
    _, hm = emulated
    gamma = dict(hm.gamma)
    gamma["final"] = np.asarray(hm.gamma["final"]) * 1.5
    ref = Reference(hm.c, hm.W, gamma, hm.kv_log)
    z = ref.step(PROMPT[0])
    got = hm.logits[0].astype(np.float64)
    assert np.abs(got - z).max() / np.abs(z).max() > 0.03

"""The driver's host-side math of the Gemma 3N program (data mode), and the model's parameters.

Everything the CVO cannot do (compiler.py docstring) runs here, in float32 on
the BF16 vectors the host reads back from the MEMCPY staging area; results are
rounded to BF16 when they go back to L2.  The block structure follows HF
``Gemma3nTextDecoderLayer`` (AltUp predict / correct, LAuReL, QK/V-norm, RoPE
rotate-half, Gaussian top-k sparsity, ``gelu_pytorch_tanh``, PLE gating).

Parameters (seeded): every GEMV matrix is INT4 with one BF16 scale per row
(scale ~ 1 / (4.6 sqrt(K)) so rows have unit gain), norm weights ~ 1 + 0.1 N(0,1),
the tied embedding is the LM head.  KV cache: K rows INT4 with a per-token
BF16 scale ``max|k| / 7``; V INT4 with a static per-channel scale
``V_SCALE`` (V is RMS-normalised, so |v| <~ 4 at 7 steps of 0.57), stored
transposed below a row of ones (the softmax sum, compiler docstring).
"""
from __future__ import annotations

import math

import numpy as np

from actors.pccx import numerics as numerics_pccx
from actors.pccx.numerics import from_bf16, pack_int4, to_bf16
from emulator import numerics
from emulator.rng import stream as rng_stream

__all__ = ["HostMath", "V_SCALE", "rms_norm", "gelu_tanh"]

V_SCALE = 4.0 / 7.0


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    y = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + eps)
    return (y * w if w is not None else y).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return numerics_pccx.gelu_tanh(x).astype(np.float32)


class HostMath:
    """Model parameters + the host functions of each round trip (data mode)."""

    def __init__(self, c: dict, seed: int, sampling: dict | None = None):
        self.c = c
        self.sampling = sampling or {"mode": "greedy"}
        self.sample_rng = rng_stream(seed, "pccx/gemma3n/sampling")
        self.rng = rng_stream(seed, "pccx/gemma3n/params")
        self.W: dict[str, tuple[np.ndarray, np.ndarray]] = {}    # name -> (int4 values [N, K], BF16 scale bits [N])
        D, NL, P, H, KVH, hd = c["hidden"], c["num_layers"], c["ple_dim"], c["num_heads"], c["num_kv_heads"], c["head_dim"]
        g = lambda n: (1 + 0.1 * self.rng.normal(size=n)).astype(np.float32)   # noqa: E731
        self.gamma = {"router": [g(D) for _ in range(NL)], "input": [g(D) for _ in range(NL)],
                      "q": [g(hd) for _ in range(NL)], "k": [g(hd) for _ in range(NL)],
                      "post_attn": [g(D) for _ in range(NL)], "laurel": [g(D) for _ in range(NL)],
                      "pre_ffn": [g(D) for _ in range(NL)], "post_ffn": [g(D) for _ in range(NL)],
                      "correct_scale": [g(D) for _ in range(NL)], "ple_post": [g(D) for _ in range(NL)],
                      "ple_proj_norm": g(P), "final": g(D)}
        self.embed = self.matrix("embed", c["vocab"], D)
        self.ple_table = self.matrix("ple_table", c["ple_vocab"], NL * P)
        T = c["kv"]["max_tokens"]
        self.kv_k = {}    # (layer, kv head) -> (int4 [T, hd], scale bits [T])
        self.kv_v = {}    # (layer, kv head) -> int4 [1 + hd, T]  (the sum row, then V transposed)
        self.pos = 0
        self.kv_log: list[tuple] = []    # per write: (position, layer, kv head, K int4, K scale bits, V int4,
                                         #             K and V before quantisation, float32)
        self.tokens: list[int] = []
        self.logits: list[np.ndarray] = []
        self.x0 = self.pli = None

    def matrix(self, name: str, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
        W = self.rng.integers(-8, 8, (N, K)).astype(np.int8)
        s = to_bf16(self.rng.uniform(0.8, 1.2, N).astype(np.float32) / (4.6 * np.sqrt(K)))
        self.W[name] = (W, s)
        return W, s

    def dequant(self, name: str) -> np.ndarray:
        W, s = self.W[name]
        return (W.astype(np.float32) * from_bf16(s)[:, None]).astype(np.float32)

    # -- per token ---------------------------------------------------------------------------------------
    def embed_token(self, token: int):
        c = self.c
        self.tokens.append(token)
        E = self.dequant("embed")[token] * np.float32(np.sqrt(c["hidden"]))
        self.x0 = from_bf16(to_bf16(E))
        T = self.dequant("ple_table")[token] * np.float32(np.sqrt(c["ple_dim"]))
        self.pli_raw = T.reshape(c["num_layers"], c["ple_dim"])
        return [self.x0, T.astype(np.float32)]

    def altup_magnitude(self, outs):
        tgt = np.sqrt(np.mean(self.x0.astype(np.float64) ** 2))
        return [(u * (tgt / np.sqrt(max(np.mean(u.astype(np.float64) ** 2), 1e-5)))).astype(np.float32) for u in outs]

    def ple_combine(self, outs):
        c = self.c
        proj = outs[0].reshape(c["num_layers"], c["ple_dim"]) * np.float32(1.0 / math.sqrt(c["hidden"]))
        normed = np.stack([rms_norm(r, self.gamma["ple_proj_norm"], c["rms_eps"]) for r in proj])
        self.pli = ((normed + self.pli_raw) * np.float32(math.sqrt(0.5))).astype(np.float32)
        return [self.pli.reshape(-1)]

    def router_input(self, i: int, outs):
        return [rms_norm(outs[0], self.gamma["router"][i], self.c["rms_eps"]) * np.float32(1.0 / self.c["hidden"])]

    @staticmethod
    def tanh(outs):
        return [numerics.tanh(outs[0]).astype(np.float32)]

    def predict(self, i: int, outs):
        A = self.c["altup_inputs"]
        xs, coefs = outs[:A], outs[A].reshape(A, A)
        pred = [(xs[j] + sum(coefs[j, k] * xs[k] for k in range(A))).astype(np.float32) for j in range(A)]
        return pred + [rms_norm(pred[0], self.gamma["input"][i], self.c["rms_eps"])]

    def _rope(self, x: np.ndarray, theta: float) -> np.ndarray:
        hd = x.size
        inv = numerics.power(theta, -np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = self.pos * inv
        cos, sin = numerics.cos(np.concatenate([ang, ang])), numerics.sin(np.concatenate([ang, ang]))
        rot = np.concatenate([-x[hd // 2:], x[:hd // 2]])
        return (x * cos + rot * sin).astype(np.float32)

    def qkv(self, i: int, theta: float, owns: bool, slot: int, outs):
        """QK-norm + RoPE on Q (and K), V-norm; quantise K/V into the ring (host mirror; the writes go to DDR)."""
        c = self.c
        H, KVH, hd, eps = c["num_heads"], c["num_kv_heads"], c["head_dim"], c["rms_eps"]
        q = outs[0].reshape(H, hd)
        qr = np.concatenate([self._rope(rms_norm(q[h], self.gamma["q"][i], eps), theta) for h in range(H)])
        self.kv_written = []
        if owns:
            k, v = outs[1].reshape(KVH, hd), outs[2].reshape(KVH, hd)
            T = c["kv"]["max_tokens"]
            for h in range(KVH):
                kr = self._rope(rms_norm(k[h], self.gamma["k"][i], eps), theta)
                ks = to_bf16(np.float32(max(np.abs(kr).max(), 1e-6) / 7.0))
                kq = np.clip(np.round(kr / from_bf16(ks)), -8, 7).astype(np.int8)
                vn = rms_norm(v[h], None, eps)
                vq = np.clip(np.round(vn / np.float32(V_SCALE)), -8, 7).astype(np.int8)
                K, S = self.kv_k.setdefault((i, h), (np.zeros((T, hd), np.int8), np.zeros(T, np.uint16)))
                K[slot], S[slot] = kq, ks
                Vt = self.kv_v.setdefault((i, h), np.zeros((hd + 1, T), np.int8))
                Vt[0, slot] = 1          # the softmax-sum row (compiler docstring)
                Vt[1:, slot] = vq
                self.kv_written.append((i, h))
                self.kv_log.append((self.pos, i, h, kq.copy(), int(ks), vq.copy(), kr.copy(), vn.copy()))
        return [qr]

    def kv_writes(self, kvl, slot: int) -> list:
        """DDR writes of the entries :meth:`qkv` just made (the ring's layout: ``kvl``, a KvLayout): the K row's
        beats + its scale, the byte of every V^T row that holds the slot (with its pair slot)."""
        out = []
        for (i, h) in self.kv_written:
            K, S = self.kv_k[(i, h)]
            beats, saddr = kvl.k_cells(i, h, slot)
            row = np.zeros(32 * len(beats), np.int8)
            row[:K.shape[1]] = K[slot]
            out += [(a, pack_int4(row[32 * c:32 * c + 32][None, :])) for c, a in enumerate(beats)]
            out.append((saddr, np.frombuffer(S[slot:slot + 1].tobytes(), np.uint8)))
            Vt = self.kv_v[(i, h)]
            b = slot // 2
            out += [(a, pack_int4(Vt[ch, 2 * b:2 * b + 2][None, :])) for a, ch in kvl.v_cells(i, h, slot)]
        return out

    def merge(self, i: int, outs):
        attn_proj, laurel2, pred0, xn = outs
        eps = self.c["rms_eps"]
        gated = pred0 + rms_norm(attn_proj, self.gamma["post_attn"][i], eps)
        laurel = xn + rms_norm(laurel2, self.gamma["laurel"][i], eps)
        al = ((gated + laurel) * np.float32(math.sqrt(0.5))).astype(np.float32)
        return [al, rms_norm(al, self.gamma["pre_ffn"][i], eps)]

    def sparse_act(self, outs):
        gate, up = outs
        cut = gate.mean() + np.float32(self.c["sparsity_z"]) * gate.std()
        return [(gelu_tanh(np.maximum(gate - cut, 0)) * up).astype(np.float32)]

    @staticmethod
    def mul(outs):
        return [(outs[0] * outs[1]).astype(np.float32)]

    def post_ffn(self, i: int, outs):
        mlp, al = outs
        return [(al + rms_norm(mlp, self.gamma["post_ffn"][i], self.c["rms_eps"])).astype(np.float32)]

    def correct(self, i: int, outs):
        A = self.c["altup_inputs"]
        pred, coefs, act = outs[:A], outs[A], outs[A + 1]
        innov = act - pred[0]
        corr = [(pred[k] + (coefs[k] + 1) * innov).astype(np.float32) for k in range(A)]
        return corr + [(corr[0] * self.gamma["correct_scale"][i]).astype(np.float32)]

    def ple_gate(self, i: int, outs):
        return [(gelu_tanh(outs[0]) * self.pli[i]).astype(np.float32)]

    def ple_inject(self, i: int, outs):
        y = rms_norm(outs[0], self.gamma["ple_post"][i], self.c["rms_eps"])
        return [(x + y).astype(np.float32) for x in outs[1:]]

    def unembed(self, outs):
        c = self.c
        A, D = c["altup_inputs"], c["hidden"]
        x0, u = outs[0], outs[1].reshape(A - 1, D)
        tgt = np.sqrt(np.mean(x0.astype(np.float64) ** 2))
        us = [uk * (tgt / np.sqrt(max(np.mean(uk.astype(np.float64) ** 2), 1e-5))) for uk in u]
        h = (x0 + sum(us)) / A
        return [rms_norm(h.astype(np.float32), self.gamma["final"], c["rms_eps"])]

    def sample(self, logits: np.ndarray) -> int:
        """Softcap, then greedy, or seeded top-p with a repetition penalty (pccx docs: 1.15, 0.9): logits of
        tokens already seen are divided (if > 0) or multiplied (if < 0) by the penalty."""
        cap = self.c["softcap"]
        z = (cap * numerics.tanh(logits / cap)).astype(np.float32) if cap else logits
        self.logits.append(z.astype(np.float32))
        sm = self.sampling
        if sm["mode"] == "greedy":
            return int(np.argmax(z))
        z = z.astype(np.float64).copy()
        for t in set(self.tokens):
            z[t] = z[t] / sm["repetition_penalty"] if z[t] > 0 else z[t] * sm["repetition_penalty"]
        p = numerics.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), sm["top_p"])) + 1]
        q = p[keep] / p[keep].sum()
        return int(keep[self.sample_rng.choice(keep.size, p=q)])

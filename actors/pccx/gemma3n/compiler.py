"""Compile a Gemma 3N config into a pccx v002 program: layouts, shape RAMs, one decode token per call.

**Host DDR** (byte addresses, :class:`DdrLayout`): every weight matrix as INT4
+ one BF16 scale per row, laid out per GEMV lane in the lane's chunk-major beat
order (actors/pccx/gemv.py; each lane's rows are one contiguous block, the block
one DataMover command streams); the embedding / PLE / LM head tables (LM head =
tied embedding, read as GEMV weights); the KV ring of every KV-producing layer
(actors/pccx/gemma3n/kvlayout.py: per KV head K rows, one per slot, with one BF16
scale per token — the GEMV's per-row ``w_scale`` — and V^T rows, one per channel
over the slots, with static per-row scales, so ``scores = K q`` and ``ctx = V^T
p`` are both plain GEMVs, and a set of slots is a few contiguous pieces); the
ACP staging area for the round trips and the logits (first 2 MiB: MEMCPY
``aux_addr`` reach).

**L2** (128-bit words, :class:`L2Layout`): the seed §1 working set.  Tensors a
CVO touches must lie in the first 8,192 words (CVO addresses are 16-bit
element addresses, reference §1.6); everything must fit the 114,688 words.
Either failure is a :class:`CompileError` naming the tensor.  The EXP and the
GELU write their results in place (a KV group's scores take 4,096 words of the
window at 8K).

**Shape RAMs**: GEMV K and MEMCPY lengths in the fmap RAM, GEMV N (and a
head-parallel GEMV's result stride in Z) in the weight RAM (64 slots each,
reference §1.6); a slot cache issues a MEMSET when a value is missing; the
model's common shapes are preloaded at setup.  The seed's §2 step 3 constants
(RoPE θ, the sparsity z = 1.6448536, the LAuReL 1/√2) are not: the RTL's
constant memory holds shapes only (reference §1.6: no scale/θ/cutoff registers)
and every operation that uses them runs on the host here (RoPE, the sparsity
cutoff, the LAuReL merge: see below), so the host holds them.

**Stages** (seed §3, reference §4.2), per token :meth:`Compiler.token`:
``embed`` (host dequantises the embedding + PLE rows, MEMCPY in, 3 AltUp
projection GEMVs), ``ple`` (PLE projection GEMV, once per token), per layer
``altup_router``, ``altup_predict``, ``qkv`` (K/V GEMVs only for layers that
own a cache), ``qk_norm_rope``, ``attention``, ``o_laurel``, ``ffn_up``,
``ffn_act``, ``ffn_down``, ``altup_correct``, ``ple_inject``; then ``unembed``,
``lm_head`` (+ ``softcap``) and ``sample``.

**Attention** (grouped-query: the ``num_heads / num_kv_heads`` query heads of a KV
head read the same K and V).  Per KV head, passes of ``pass_heads`` query heads:
with ``gemv.head_parallel`` (documented profile; pccx docs ``gemv_core.rst`` §4)
one pass holds up to ``gemv.lanes`` heads, one per lane, so K and V are streamed
once per KV head and reused by its query heads; without it (the RTL: one fmap LUT
for all lanes) a pass is one head and a KV head is streamed once per query head.
Only the attended slots are streamed (:meth:`KvRing.ranges`: the valid part of the
ring; a local layer's sliding window, ``kv.sliding_window``, the newest
``sliding_window`` positions): K their rows, V^T the 32-slot slices that hold them.
A pass: the scores GEMV (``findemax``: one e_max per head) writes each head's
scores at a 32-slot-aligned stride; per head the EXP (``sub_emax``, chunks of
``cvo.max_length``) writes in place; the ``[1; V^T] p`` GEMV (a row of ones before
the channels: its first output is the softmax sum, the rest the unnormalised
context; the REDUCE_SUMs the SFU would take, 2 cycles per element and serial in
front of the next pass's instructions, are not needed); per head a CVO SCALE with
``recip_scale`` by that sum (the normalisation after ``·V``: head_dim elements
instead of L; the sum is >= 1 because ``exp(max - max) = 1``, so the compiler can
prove the SCALE scalar non-zero — a SCALE with ``recip_scale`` whose scalar it
cannot prove non-zero is refused with a ``CompileError``).  A slot range that does
not start at slot 0 (a window) has V slice positions the EXP does not write: the
EXP then writes into ``exp_window`` at the slots' slice positions, zeroed by a
MEMCPY from a zero area after a DONE poll (its previous reader must be done).

**What the CVO lacks** (reference §1.3: no TANH, MAX, ADD, MUL), decided per use:

* MAX: the softmax max comes from the scores GEMV's ``findemax`` (no CVO op).
* RMSNorm: mean-of-squares needs MUL -> **host round trip** (poll, MEMCPY
  L2->host, host compute, MEMCPY host->L2); the host applies γ too (it
  computes the norm anyway).  QK/V-norm and RoPE go in one round trip
  (the rotation needs MUL; the SFU's SIN/COS would also need host range
  reduction, reference §1.3, so the host computes the phases too), which also
  quantises the new K/V and writes them to the KV ring.
* TANH (AltUp router x2 per layer, softcap): host round trip, or the what-if
  SFU TANH (profile ``cvo.tanh``).  Softcap with TANH: the LM head is computed in
  chunks that fit the CVO window, 1/30 folded into the LM-head scales, the x30
  applied by the host sampler (argmax/top-p of ``30 tanh(z)`` needs it only for
  temperature).
* ADD (residuals, LAuReL merge, AltUp/PLE updates) and element-wise MUL (GeGLU
  ``gelu(gate) * up``, AltUp coefficient mixing, PLE gating): host round trips.
  A residual cannot be fused into ``accm`` because Gemma normalises each
  branch (post-attention / post-FFN RMSNorm) before the add.
* GELU: CVO GELU on dense layers (as built it is the sigmoid form, a finding);
  sparse layers (mean + 1.645 std cutoff needs sum of squares) do the whole
  activation on the host.

Every round trip's cost is charged: two DONE polls, two ACP transfers and
``host.call_overhead + elements x host.element_time`` of host CPU.

**Dependencies**: the RTL has no hazard tracking (reference §1.5 item 4), so
where an engine consumes another engine's output (GEMV -> CVO, CVO -> GEMV,
anything -> MEMCPY out) the program polls DONE first; host->L2 MEMCPYs are
synchronous (``async=0``).  Same-engine chains are safe (in-order engines).

**Weight prefetch** (seed §3.2 rule 1): with ``prefetch`` on, the DataMover
commands of GEMV n+1 are issued right after GEMV n is pushed (and never before
a host step that writes their data, i.e. the KV write-back); the 64 KB FIFOs
and the DataMover command FIFOs bound how far they run ahead.  With it off,
the driver polls DONE before issuing a GEMV's weight stream (no overlap).

**SFU FIFO** (seed §3.2 rule 2, profile ``cvo.gemv_fifo_words`` > 0: documented 1024, RTL 0): the
scheduler makes a CVO that reads the last GEMV's output wait for it (direct
FIFO, actors/pccx/compute.py), so the polls between the scores GEMV and its EXPs
(when a head's scores fit the FIFO) and between the V GEMV and its SCALEs are
dropped; in the reverse direction the V GEMV waits for the EXPs that write its
operand (the scheduler's CVO scoreboard), so the poll between the softmax and ·V
goes too.

**PLE off the critical path** (seed §3.2 rule 3, ``ple_overlap``): ``pli_all``
is computed once per token (layer 0); layer i's PLE injection (shadow streams
only) is emitted inside layer i+1's AltUp router: its gate GEMV is pushed after
the router norm's input reached the host (it runs under the host's norm), its
GELU x pli shares the router-TANH round trip, its projection GEMV precedes the
prediction GEMV and its norm + add precede the prediction in one round trip.
The gate reads its own buffer (``ple_gate_in``): the router's ``x_norm`` MEMCPY
may land while it runs (no hazard tracking).  The last layer keeps the serial
order.  Off: the injection follows the AltUp correction, as the seed's table.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from actors.pccx.gemma3n.config import global_layer, kv_source
from actors.pccx.gemma3n.kv import KvRing, kv_elem_bits
from actors.pccx.gemma3n.kvlayout import KvLayout, deal, row_blocks
from actors.pccx.gemma3n.hostmath import V_SCALE
from actors.pccx.gemv import MULTICAST, gemv_ports, k_chunks, lane_blob, lane_bytes, lane_rows, lanes_used, port_split
from actors.pccx.numerics import from_bf16, round_bf16, to_bf16
from protocols import pccx_isa as isa

import numpy as np

__all__ = ["CompileError", "Compiler", "L2Layout", "DdrLayout", "STAGES", "CVO_WINDOW_WORDS"]

CVO_WINDOW_WORDS = 8192          # 16-bit CVO element addresses >> 3 (reference §1.6)

STAGES = ["setup", "embed", "ple", "altup_router", "altup_predict", "qkv", "qk_norm_rope", "attention", "o_laurel",
          "ffn_up", "ffn_act", "ffn_down", "altup_correct", "ple_inject", "unembed", "lm_head", "softcap", "sample"]


class CompileError(ValueError):
    """The config cannot be mapped onto the machine (names the tensor / field)."""


class L2Layout:
    """Word allocator over L2 with the CVO-reachable window at the bottom."""

    def __init__(self, words: int):
        self.words = words
        self.cvo_top = 0                      # next free word inside the CVO window
        self.top = CVO_WINDOW_WORDS           # next free word above it
        self.tensors: dict[str, tuple[int, int, bool]] = {}

    def alloc(self, name: str, elems: int, *, cvo: bool = False, pad_before: int = 0) -> int:
        w = -(-elems // 8) + pad_before
        if cvo:
            if self.cvo_top + w > CVO_WINDOW_WORDS:
                raise CompileError(f"L2 layout: tensor {name!r} ({elems} elements, {w} words) must be reachable by "
                                   f"CVO addresses (the first {CVO_WINDOW_WORDS} words) but only "
                                   f"{CVO_WINDOW_WORDS - self.cvo_top} words are left there")
            addr, self.cvo_top = self.cvo_top + pad_before, self.cvo_top + w
        else:
            if self.top + w > self.words:
                raise CompileError(f"L2 layout: tensor {name!r} ({elems} elements, {w} words) does not fit: "
                                   f"{self.top} of {self.words} words ({self.words * 16 / 2**20:.2f} MiB) in use")
            addr, self.top = self.top + pad_before, self.top + w
        self.tensors[name] = (addr, elems, cvo)
        return addr

    def used_words(self) -> int:
        return self.cvo_top + (self.top - CVO_WINDOW_WORDS)


class DdrLayout:
    """Byte allocator over host DDR (16-byte aligned regions)."""

    def __init__(self):
        self.top = 0
        self.regions: dict[str, tuple[int, int]] = {}

    def alloc(self, name: str, nbytes: int) -> int:
        addr = self.top
        self.top += -(-nbytes // 16) * 16
        self.regions[name] = (addr, nbytes)
        return addr


@dataclass
class Matrix:
    """A GEMV weight matrix in DDR: ``N x K`` INT4 + per-row scales; one block per lane in use."""
    name: str
    N: int
    K: int
    blocks: list = field(default_factory=list)   # (lane, port, addr, nbytes)

    @property
    def nbytes(self) -> int:
        return sum(b[3] for b in self.blocks)


class Compiler:
    """Lays out the machine for config ``c`` on ``profile`` and emits driver steps token by token."""

    def __init__(self, c: dict, profile: dict, *, prefetch: bool = True, data: bool = False, seed: int = 0,
                 prompt: list[int] | None = None, sampling: dict | None = None, ple_overlap: bool = True):
        self.c, self.profile, self.prefetch = c, profile, prefetch
        self.ple_overlap = ple_overlap
        self.ple_pending: int | None = None      # layer whose PLE injection rides on the next layer's router
        self.data = data
        self.prompt = list(prompt or [0])
        self.ddr_init: dict[int, bytes] = {}
        if data:
            if c["kv"]["dtype"] != "int4" or c["kv"]["sliding_window"]:
                raise CompileError("data mode needs kv.dtype int4 and kv.sliding_window false")
            if profile["cvo"]["tanh"]:
                raise CompileError("data mode is built without the what-if SFU TANH (cvo.tanh: false)")
            from actors.pccx.gemma3n.hostmath import HostMath
            self.hm = HostMath(c, seed, sampling)
        g = profile["gemv"]
        wired = 0
        while wired < g["lanes"] and g["lane_ports"][wired] is not None:
            wired += 1
        if wired == 0:
            raise CompileError("profile gemv.lane_ports: lane 0 has no weight port; no GEMV can be fed")
        # lanes without a weight port compute zeros (as built: C/D): use only the leading wired lanes
        self.parallel_lane = 0 if wired == g["lanes"] else wired
        self.lanes = lanes_used(self.parallel_lane, g["lanes"])
        self.ports = gemv_ports(g)
        # GQA on the lanes: a head-parallel GEMV per KV head and pass of up to `lanes` of its query heads
        group = c["num_heads"] // c["num_kv_heads"]
        self.head = bool(g["head_parallel"]) and group > 1 and wired == g["lanes"]
        self.pass_heads = min(group, self.lanes) if self.head else 1
        self.tanh = profile["cvo"]["tanh"]
        self.sfu_fifo = profile["cvo"]["gemv_fifo_words"] * 8   # elements; 0: no direct GEMV->SFU FIFO
        self.cvo_max = profile["cvo"]["max_length"]
        host = profile["host"]
        self.host_ps = lambda n: host["call_overhead"] + n * host["element_time"]
        self.ring = KvRing(c["kv"]["max_tokens"], c["kv"]["sink"])
        self.kv_bits = kv_elem_bits(c["kv"]["dtype"])
        self.steps: list = []
        self.where: list[tuple[int, int, str]] = []          # per pushed instruction: (token, layer, stage)
        self.counts: Counter = Counter()                    # (stage, op) -> instructions
        self.stream_bytes: Counter = Counter()              # stage -> HP bytes
        self.kv_bytes = 0                                   # HP bytes of KV reads (all of them)
        self.kv_once = 0                                    # K/V element bytes of every attended slot, once per
                                                            # layer and KV head (the read-once figure)
        self.kv_scale_bytes = 0                             # HP bytes of K / V quantisation scales
        self.kv_pad_bytes = 0                               # HP bytes of V slice / K beat padding
        self.kv_sum_bytes = 0                               # HP bytes of the V^T softmax-sum row
        self.kv_scale_once = 0                              # the scales of one read of every attended entry
        self.weight_min = 0                                 # INT4 + row-scale bytes of the weight matrices used
        self.macs = 0                                       # GEMV multiply-accumulates (real K)
        self.l2_bytes = 0                                   # L2 activation traffic (GEMV x/y, CVO in/out, MEMCPY)
        self.stream_where: list[tuple[int, int, str]] = []  # per weight stream id: (token, layer, stage)
        self.stream_seq: list[int] = []                     # per weight stream id: its GEMV's instruction number
        self.kv_gemvs: list[tuple[int, int, str]] = []      # (token, layer, "K"/"V" projection) issued
        self.kv_reads: list[tuple[int, int, int]] = []      # (token, layer, source layer) attention reads
        self.attended: dict[tuple[int, str], list] = {}     # (token, "full" / "local" window) -> slot ranges
        self.token_ix, self.layer, self.stage = -1, -1, "setup"
        self.sid = 0
        self.slots = {0: {}, 1: {}}
        self.slot_next = {0: 0, 1: 0}
        self._layout()

    # -- layout ------------------------------------------------------------------------------------------
    def _matrix(self, name: str, N: int, K: int, tied: tuple | None = None) -> Matrix:
        """A GEMV matrix in DDR; data mode: seeded INT4 values + scales (``tied``: rows of another matrix)."""
        m = Matrix(name, N, K)
        g = self.profile["gemv"]
        if self.data:
            W, sc = tied if tied is not None else self.hm.matrix(name, N, K)
        for lane, (r0, n) in enumerate(lane_rows(N, self.lanes)):
            if n:
                nb = lane_bytes(n, K, True)
                addr = self.ddr.alloc(f"{name}.lane{lane}", nb)
                m.blocks.append((lane, g["lane_ports"][lane], addr, nb))
                if self.data:
                    self.ddr_init[addr] = lane_blob(W[r0:r0 + n], sc[r0:r0 + n])
        self.mats[name] = m
        return m

    def _layout(self) -> None:
        c = self.c
        D, F, A, R, P, NL = c["hidden"], c["ffn"], c["altup_inputs"], c["laurel_rank"], c["ple_dim"], c["num_layers"]
        H, KVH, hd, V = c["num_heads"], c["num_kv_heads"], c["head_dim"], c["vocab"]
        T = c["kv"]["max_tokens"]
        self.ddr, self.mats = DdrLayout(), {}
        # MEMCPY aux_addr is 17 bits of 16-byte units: the ACP staging area must sit in the first 2 MiB
        self.host_stage = self.ddr.alloc("host_staging", 2 * max(V, 2 * F, NL * P, A * D + A * A) + 4096)
        if c["kv"]["sliding_window"]:   # zeros for the window's V activation (see _attention), words per head
            self.win_words = 4 * (k_chunks(c["sliding_window"] * self.kv_bits // 4) + 2)
            self.zeros = self.ddr.alloc("zeros", self.pass_heads * 16 * self.win_words)
        if self.ddr.top > (1 << 17) * 16:
            raise CompileError(f"host staging and zero areas ({self.ddr.top} bytes) exceed the 2 MiB MEMCPY "
                               f"aux_addr reach")
        for k in range(1, A):
            self._matrix(f"altup_proj{k}", D, D)
            self._matrix(f"altup_unproj{k}", D, D)
        self._matrix("ple_proj", NL * P, D)
        for i in range(NL):
            L = f"L{i}."
            self._matrix(L + "router", A, D)
            self._matrix(L + "pred", A * A, A)
            self._matrix(L + "corr_router", A, D)
            self._matrix(L + "corr", A, A)
            self._matrix(L + "q", H * hd, D)
            if kv_source(c, i) == i:
                self._matrix(L + "k", KVH * hd, D)
                self._matrix(L + "v", KVH * hd, D)
            self._matrix(L + "o", D, H * hd)
            self._matrix(L + "laurel_l", R, D)
            self._matrix(L + "laurel_r", D, R)
            self._matrix(L + "gate", F, D)
            self._matrix(L + "up", F, D)
            self._matrix(L + "down", D, F)
            self._matrix(L + "ple_gate", P, D)
            self._matrix(L + "ple_proj", D, P)
        chunk = self._lm_chunk()
        for r0 in range(0, V, chunk):
            n = min(chunk, V - r0)
            tied = (self.hm.W["embed"][0][r0:r0 + n], self.hm.W["embed"][1][r0:r0 + n]) if self.data else None
            self._matrix(f"lm_head.{r0}", n, D, tied=tied)
        self.ddr.alloc("embed_table", (V * D) // 2 + 2 * V)             # INT4 rows + scales (host dequantises)
        self.ddr.alloc("ple_table", (c["ple_vocab"] * NL * P) // 2 + 2 * c["ple_vocab"])
        # KV ring per producing layer and KV head (K rows + per-token scales, V^T rows + per-channel scales)
        producers = [i for i in range(NL) if kv_source(c, i) == i]
        self.kvl = KvLayout(self.ddr, c, self.kv_bits, row_blocks(hd + 1, self.lanes, self.head), producers)
        if self.data:   # static per-row V^T scales (1 for the sum row 0), written once at load
            scales = np.full(hd + 1, V_SCALE, np.float32)
            scales[0] = 1.0
            for i in producers:
                for h in range(KVH):
                    for addr, r0, n in self.kvl.v_scale_addr(i, h):
                        self.ddr_init[addr] = to_bf16(scales[r0:r0 + n]).tobytes()
        # L2: the CVO window first, then the rest
        l2 = self.l2 = L2Layout(self.profile["l2"]["words"])
        Lmax = T   # a global layer's scores span the whole ring
        G = self.pass_heads
        self.a = a = {}
        # a pass's scores, one head per 32-slot-aligned stride; the EXP writes them in place (the V GEMV's input)
        a["scores"] = l2.alloc("scores", G * 32 * k_chunks(Lmax), cvo=True)
        if c["kv"]["sliding_window"]:   # a window's EXP output on the V slices' positions, zeroed first
            a["exp_win"] = l2.alloc("exp_window", G * 8 * self.win_words, cvo=True)
        a["ctx"] = l2.alloc("ctx", 8 * H * -(-(hd + 1) // 8), cvo=True)   # per head [sum, context vector]
        a["attn_out"] = l2.alloc("attn_out", H * hd, cvo=True)
        a["router"] = l2.alloc("router", 8 * A, cvo=True)
        a["router_tanh"] = l2.alloc("router_tanh", 8 * A, cvo=True)
        a["gate_raw"] = l2.alloc("gate_raw", F, cvo=True)     # the GELU writes it in place
        if self.tanh and c["softcap"]:
            a["logits_win"] = l2.alloc("logits_window", chunk, cvo=True)
            a["logits_tanh"] = l2.alloc("logits_tanh", chunk, cvo=True)
        for k in range(A):
            a[f"xs{k}"] = l2.alloc(f"xs[{k}]", D)
        a["x_norm"] = l2.alloc("x_norm", D)
        a["q"] = l2.alloc("Q", H * hd)
        a["k"] = l2.alloc("K", KVH * hd)
        a["v"] = l2.alloc("V", KVH * hd)
        a["attn_proj"] = l2.alloc("attn_proj", D)
        a["laurel1"] = l2.alloc("laurel_left_out", R)
        a["laurel2"] = l2.alloc("laurel_right_out", D)
        a["x_ffn"] = l2.alloc("x_ffn", D)
        a["up_out"] = l2.alloc("up_out", F)
        a["hidden"] = l2.alloc("hidden", F)
        a["mlp_out"] = l2.alloc("mlp_out", D)
        a["coefs"] = l2.alloc("altup_coefs", A * A)
        a["pli_all"] = l2.alloc("pli_all", NL * P)
        a["ple_proj_out"] = l2.alloc("ple_proj_out", NL * P)
        a["ple_in"] = l2.alloc("ple_gate_in", D)    # own buffer: the next router's x_norm MEMCPY may land
        a["ple_g"] = l2.alloc("ple_gate_out", P)     # while the PLE gate GEMV still reads its input (rule 3)
        a["ple_y"] = l2.alloc("ple_proj_layer_out", D)
        a["u"] = l2.alloc("altup_unproj_out", (A - 1) * D)
        a["logits"] = l2.alloc("logits", V)

    def _lm_chunk(self) -> int:
        """LM-head rows per GEMV: N fits the 16-bit weight-shape X; with the SFU TANH also the CVO window."""
        c = self.c
        chunk = min(c["vocab"], 65535)
        if self.tanh and c["softcap"]:
            chunk = min(chunk, 2 * self.cvo_max)   # two window buffers of this size must fit beside attention's
        return chunk

    # -- emission helpers --------------------------------------------------------------------------------
    def _push(self, op: str, **f) -> None:
        self.steps.append(("push", isa.encode(op, **f)))
        self.where.append((self.token_ix, self.layer, self.stage))
        self.counts[(self.stage, op)] += 1

    def _slot(self, cache: int, value: int) -> int:
        """Shape-RAM slot holding ``value`` (fmap: X*Y*Z; weight: X); MEMSET on a miss (round-robin)."""
        s = self.slots[cache]
        if value in s:
            return s[value]
        slot = self.slot_next[cache]
        self.slot_next[cache] = (slot + 1) % 64
        for v in [v for v, sl in s.items() if sl == slot]:
            del s[v]
        z = 1
        if cache == 1:   # weight shape: N, or (N, Z = a head-parallel GEMV's result stride in words)
            (a, z), b = (value if isinstance(value, tuple) else (value, 1)), 1
        else:
            a, b = (value, 1) if value <= 0xFFFF else (8, -(-value // 8))
            if b > 0xFFFF:
                raise CompileError(f"length {value} does not fit a shape tuple (16-bit X, Y)")
        self._push("MEMSET", dest_cache=cache, dest_addr=slot, a_value=a, b_value=b, c_value=z)
        s[value] = slot
        return slot

    def wait(self, label: str) -> None:
        self.steps.append(("wait", f"t{self.token_ix}.L{self.layer}.{self.stage}.{label}"))

    def host(self, label: str, elems: int, reads=(), fn=None) -> None:
        """A host compute step: ``reads`` [(DDR addr, bytes)]; ``fn(arrays) -> [(addr, uint8 array)]`` in data
        mode; in timing mode the writes are the byte counts ``fn`` declares via ``fn(None)``."""
        self.steps.append(("host", f"{self.stage}:{label}", self.host_ps(elems), list(reads), fn))

    @staticmethod
    def _words_bytes(n: int) -> int:
        return 16 * -(-n // 8)

    def _staged(self, tensors: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """(staging addr, elements) of each tensor laid out one after another in the staging area."""
        out, off = [], self.host_stage
        for _w, n in tensors:
            out.append((off, n))
            off += self._words_bytes(n)
        return out

    def _host_fn(self, outs: list[tuple[int, int]], backs: list[tuple[int, int]], math, extra=None):
        """Wrap ``math(list of float32 vectors) -> list of float32 vectors`` into a host-step function."""
        staged_back = self._staged(backs)

        def fn(got):
            if got is None or not self.data:
                return [(a, self._words_bytes(n)) for a, n in staged_back] + (extra(None) if extra else [])
            vecs = [from_bf16(np.asarray(g, np.uint8).view(np.uint16))[:n] for g, (_w, n) in zip(got, outs)]
            res = math(vecs) if math is not None else []
            writes = []
            for (a, n), v in zip(staged_back, res):
                buf = np.zeros(8 * -(-n // 8), np.uint16)
                buf[:n] = to_bf16(np.asarray(v, np.float32).reshape(-1)[:n])
                writes.append((a, buf.view(np.uint8)))
            return writes + (extra(True) if extra else [])
        return fn

    def gemv(self, m: Matrix | tuple, src: int, dst: int, *, findemax: int = 0, accm: int = 0,
             kv: tuple | None = None, real_k: int | None = None, heads: int = 0, stride: int = 0) -> None:
        """Push one GEMV; its weight stream is queued per the prefetch rule (module docstring).

        ``m`` is a Matrix or, for attention, ``(N, K_slots, [(TDEST, port, addr, nbytes)])``.  ``heads`` > 0: a
        head-parallel GEMV on that many lanes (lane i: activation at ``src + i * ceil(K/8)``, result at ``dst + i *
        stride`` words; actors/pccx/gemv.py), else row-parallel over the compiler's lanes."""
        if isinstance(m, Matrix):
            N, K, blocks = m.N, m.K, m.blocks
            self.weight_min += (N * K + 1) // 2 + 2 * N
        else:
            N, K, blocks = m
        G = max(heads, 1)
        sid = self.sid
        self.sid += 1
        self.stream_where.append((self.token_ix, self.layer, self.stage))
        self.macs += G * N * (real_k or K)
        self.l2_bytes += 2 * G * ((real_k or K) + N * (1 + accm))
        nbytes = sum(b[3] for b in blocks)
        self.stream_bytes[self.stage] += nbytes
        if kv is not None:
            self.kv_bytes += nbytes
        kslot = self._slot(0, K)
        nslot = self._slot(1, (N, stride) if heads else N)
        tag = len(self.where)                    # this GEMV's instruction number: the DataMover commands' TAG
        early, late = self._dm_split([("hp", port, sid, addr, nb, dest, tag) for dest, port, addr, nb in blocks])
        if self.prefetch:
            self.steps.append(("_hp", early))   # placed by _place_prefetch (rule 1)
        else:
            self.wait("no_prefetch")
            self.steps.extend(early)
        self.stream_seq.append(tag)
        self._push("GEMV", dest_reg=dst, src_addr=src, findemax=findemax, accm=accm, w_scale=1,
                   size_ptr_addr=nslot, shape_ptr_addr=kslot,
                   parallel_lane=(isa.HEAD_AXIS | heads) if heads else self.parallel_lane)
        self.steps.extend(late)

    def _dm_split(self, hp: list) -> tuple[list, list]:
        """A stream's DataMover commands before its GEMV's push and after it.  A port takes ``hp.dm_cmd_depth``
        commands into its FIFO and one more into its fetcher; the driver blocks on the next one until the port
        has room, and a port whose weight FIFO is full waits for the GEMV.  So at most depth + 1 commands per
        port may precede the push: the rest (a K stream of FP16 entries: 32 slices of up to 128 KB each) go
        right after it, or the driver would wait for a GEMV it has not pushed."""
        room = self.profile["hp"]["dm_cmd_depth"] + 1
        seen: Counter = Counter()
        early, late = [], []
        for st in hp:
            seen[st[1]] += 1
            (early if seen[st[1]] <= room else late).append(st)
        return early, late

    def cvo(self, func: str, src: int, dst: int, length: int, *, sub_emax: int = 0, recip_scale: int = 0,
            sync: int = 0, scalar_nonzero: bool = False) -> None:
        """Push a CVO op (element addresses).  A SCALE with ``recip_scale`` needs ``scalar_nonzero``: the
        compiler must prove its scalar cannot be 0 (seed §5: the SFU returns 0, a programmer error)."""
        if func == "SCALE" and recip_scale and not scalar_nonzero:
            raise CompileError(f"CVO SCALE with recip_scale at element {src} (stage {self.stage}, layer "
                               f"{self.layer}): the scalar may be 0 and the SFU would return 0 (seed §5)")
        code = isa.CVO_EXT_FUNCS["TANH"] if func == "TANH" else isa.CVO_FUNCS[func]
        self.l2_bytes += 2 * (length + (1 if func == "REDUCE_SUM" else length))
        for what, addr, n in (("src", src, length), ("dst", dst, length)):
            if addr + n > CVO_WINDOW_WORDS * 8:
                raise CompileError(f"CVO {func} {what} [{addr}, {addr + n}) beyond the CVO-addressable "
                                   f"{CVO_WINDOW_WORDS * 8} elements (stage {self.stage})")
        self._push("CVO", cvo_func=code, src_addr=src, dst_addr=dst, length=length, sub_emax=sub_emax,
                   recip_scale=recip_scale, **{"async": 0 if sync else 1})

    def memcpy_in(self, word: int, elems: int, host_addr: int) -> None:
        self.l2_bytes += 2 * elems
        slot = self._slot(0, elems)
        self._push("MEMCPY", from_device=1, to_device=0, dest_addr=word, aux_addr=host_addr // 16,
                   shape_ptr_addr=slot, **{"async": 0})

    def memcpy_out(self, word: int, elems: int, host_addr: int) -> None:
        self.l2_bytes += 2 * elems
        slot = self._slot(0, elems)
        self._push("MEMCPY", from_device=0, to_device=1, src_addr=word, aux_addr=host_addr // 16,
                   shape_ptr_addr=slot, **{"async": 0})

    def round_trip(self, label: str, out: list[tuple[int, int]], work: int, back: list[tuple[int, int]],
                   math=None, extra=None, during=None) -> None:
        """Host computes what the CVO cannot: poll, MEMCPY ``out`` to the host, compute ``work`` elements
        (``math`` in data mode; ``extra`` adds DDR writes, e.g. the KV entries), MEMCPY ``back`` into L2
        (each a ``(word, elements)``).  ``during()`` pushes independent engine work after the outputs
        reached the host and before the host computes: it runs on the engines while the host works."""
        self.wait(label)
        staged = self._staged(out)
        for (w, n), (a, _) in zip(out, staged):
            self.memcpy_out(w, n, a)
        self.wait(label + ".out")
        if during is not None:
            during()
        self.host(label, work, [(a, self._words_bytes(n)) for a, n in staged], self._host_fn(out, back, math, extra))
        for (w, n), (a, _) in zip(back, self._staged(back)):
            self.memcpy_in(w, n, a)

    @staticmethod
    def _place_prefetch(steps: list) -> list:
        """Rule 1: each GEMV's stream (``_hp`` marker, emitted just before its push) moves up to right after
        the previous GEMV's push (and the commands of its stream that follow the push, :meth:`_dm_split`),
        never above a ``_barrier`` (a host write of data it streams)."""
        out: list = []
        anchor = 0
        for st in steps:
            if st[0] == "_hp":
                # a trace mark on the driver track right after the previous GEMV's push: "prefetch of stream s"
                ins = ([("mark", "prefetch", {"stream": st[1][0][2], "bytes": sum(h[4] for h in st[1])})]
                       if st[1] else []) + st[1]
                out[anchor:anchor] = ins
                anchor += len(ins)
            elif st[0] == "_barrier":
                anchor = len(out)
            else:
                out.append(st)
                if (st[0] == "push" and (st[1] >> 60) == isa.OPCODES["GEMV"]) or (st[0] == "hp" and anchor == len(out) - 1):
                    anchor = len(out)   # after a GEMV's push and the DataMover commands that follow it
        return out

    # -- the program -------------------------------------------------------------------------------------
    def setup(self) -> list:
        """``pccx_open``, ``pccx_kv_init``, ``pccx_start``, the common shapes' MEMSETs (seed §2; module docstring:
        the seed's step 3 constants are the host's)."""
        c = self.c
        self.steps = [("open",), ("kv_init", c["kv"]["max_tokens"]), ("start",)]
        self.stage = "setup"
        for v in sorted({c["hidden"], c["ffn"], c["altup_inputs"], c["laurel_rank"], c["ple_dim"],
                         c["num_heads"] * c["head_dim"]}):
            self._slot(0, v)
            self._slot(1, v)
        return self._take()

    def _take(self) -> list:
        out, self.steps = self.steps, []
        return self._place_prefetch(out) if self.prefetch else [st for st in out if st[0] != "_barrier"]

    def token(self, t: int) -> list:
        """The driver steps of decode token ``t`` (position t)."""
        c = self.c
        D, A, P, NL = c["hidden"], c["altup_inputs"], c["ple_dim"], c["num_layers"]
        V = c["vocab"]
        a = self.a
        hm = self.hm if self.data else None
        self.token_ix, self.layer = t, -1
        self.slot = self.ring.append()
        self.stage = "embed"
        x0_at, pli_at = self.host_stage, self.host_stage + self._words_bytes(D)

        def embed(got):
            if got is None or hm is None:
                return [(x0_at, self._words_bytes(D)), (pli_at, self._words_bytes(NL * P))]
            hm.pos = t
            tok = self.prompt[t] if t < len(self.prompt) else self.next_token
            x0, pli = hm.embed_token(tok)
            return [(x0_at, to_bf16(x0).view(np.uint8)), (pli_at, to_bf16(pli).view(np.uint8))]
        self.host("token_id+dequant_rows", D + NL * P, [], embed)
        self.memcpy_in(a["xs0"], D, x0_at)
        self.memcpy_in(a["pli_all"], NL * P, pli_at)
        for k in range(1, A):
            self.gemv(self.mats[f"altup_proj{k}"], a["xs0"], a[f"xs{k}"])
        xs = [(a[f"xs{k}"], D) for k in range(1, A)]
        self.round_trip("altup_magnitude", xs, 3 * D, xs, hm and hm.altup_magnitude)
        for i in range(NL):
            self.layer = i
            self._layer(i, t)
        self.layer = NL
        self.stage = "unembed"
        for k in range(1, A):
            self.gemv(self.mats[f"altup_unproj{k}"], a[f"xs{k}"], a["u"] + (k - 1) * (D // 8))
        self.round_trip("altup_unembed+final_norm", [(a["xs0"], D), (a["u"], (A - 1) * D)], 8 * D, [(a["x_norm"], D)],
                        hm and hm.unembed)
        self.stage = "lm_head"
        chunk = self._lm_chunk()
        win = self.tanh and c["softcap"]
        for r0 in range(0, V, chunk):
            m = self.mats[f"lm_head.{r0}"]
            if win:
                self.gemv(m, a["x_norm"], a["logits_win"])
                self.stage = "softcap"
                self.wait("lm_chunk")
                for e0 in range(0, m.N, self.cvo_max):
                    n = min(self.cvo_max, m.N - e0)
                    self.cvo("TANH", a["logits_win"] * 8 + e0, a["logits_tanh"] * 8 + e0, n)
                self.wait("tanh_chunk")
                self.memcpy_out(a["logits_tanh"], m.N, self.host_stage + 2 * r0)
                self.stage = "lm_head"
            else:
                self.gemv(m, a["x_norm"], a["logits"] + r0 // 8)
        if not win:
            self.wait("logits")
            self.memcpy_out(a["logits"], V, self.host_stage)
        self.stage = "sample"
        self.wait("logits_back")

        def sample(got):
            if got is not None and hm is not None:
                logits = from_bf16(np.asarray(got[0], np.uint8).view(np.uint16))[:V]
                self.next_token = hm.sample(logits)
            return []
        self.host("softcap+sample" if (c["softcap"] and not win) else "sample",
                  (2 if c["softcap"] and not win else 1) * V, [(self.host_stage, 2 * V)], sample)
        return self._take()

    def _layer(self, i: int, t: int) -> None:
        """One decoder layer of token ``t``, stage by stage as HF ``Gemma3nTextDecoderLayer`` runs them."""
        self._altup_predict(i)
        self._qkv_attention(i, t)
        self._o_laurel(i)
        self._ffn(i)
        self._altup_correct(i)
        self._ple_inject(i)

    def _ctx(self, i: int):
        """What every stage of layer ``i`` names: the config's sizes, the L2 areas, the matrices, the host math
        (data mode) and ``bind`` (a host step's function with its leading arguments), the layer's prefix and
        the AltUp streams."""
        c = self.c
        D, F, A, P = c["hidden"], c["ffn"], c["altup_inputs"], c["ple_dim"]
        H, KVH, hd = c["num_heads"], c["num_kv_heads"], c["head_dim"]
        a, M = self.a, self.mats
        hm = self.hm if self.data else None
        bind = (lambda f, *x: (lambda outs: f(*x, outs))) if hm else (lambda f, *x: None)   # noqa: E731
        pre = f"L{i}."
        xs = [(a[f"xs{k}"], D) for k in range(A)]
        return c, D, F, A, P, H, KVH, hd, a, M, hm, bind, pre, xs

    def _altup_predict(self, i: int) -> None:
        """AltUp router + prediction (with the previous layer's PLE injection riding on it: rule 3)."""
        c, D, F, A, P, H, KVH, hd, a, M, hm, bind, pre, xs = self._ctx(i)
        self.stage = "altup_router"
        ple = self.ple_pending            # rule 3: the previous layer's PLE injection rides on this router
        self.ple_pending = None
        during = None if ple is None else (lambda: self._as_ple(ple, lambda: (
            self.steps.append(("mark", "ple_overlap", {"layer": ple, "under": f"L{i}.router_norm"})),
            self.gemv(M[f"L{ple}.ple_gate"], a["ple_in"], a["ple_g"]))))
        self.round_trip("router_norm", [(a["xs0"], D)], 2 * D, [(a["x_norm"], D)], hm and bind(hm.router_input, i),
                        during=during)
        self.gemv(M[pre + "router"], a["x_norm"], a["router"])
        if i == 0:
            self.stage = "ple"
            self.gemv(M["ple_proj"], a["xs0"], a["ple_proj_out"])
            self.stage = "altup_router"
        if ple is not None and not self.tanh:
            # one round trip for the router's TANH and the PLE gate's GELU x pli (both host math)
            def tanh_gelu(v, _p=ple):
                return hm.tanh(v[:1]) + hm.ple_gate(_p, v[1:])
            self.round_trip("router_tanh+ple_gelu*pli", [(a["router"], A), (a["ple_g"], P)], A + 2 * P,
                            [(a["router_tanh"], A), (a["ple_g"], P)], hm and tanh_gelu)
        else:
            self._tanh("router_tanh", a["router"], a["router_tanh"], A)
            if ple is not None:
                self._as_ple(ple, lambda: self.round_trip("ple_gelu*pli", [(a["ple_g"], P)], 2 * P, [(a["ple_g"], P)],
                                                          hm and bind(hm.ple_gate, ple)))
        self.stage = "altup_predict"
        if ple is not None:
            self._as_ple(ple, lambda: self.gemv(M[f"L{ple}.ple_proj"], a["ple_g"], a["ple_y"]))
        self.gemv(M[pre + "pred"], a["router_tanh"], a["coefs"])
        if ple is None:
            self.round_trip("predict+input_norm", xs + [(a["coefs"], A * A)], A * A * D + 2 * D,
                            xs + [(a["x_norm"], D)], hm and bind(hm.predict, i))
        else:
            # the PLE injection (shadow streams only) is applied first, then the prediction, in one round trip
            def inject_predict(v, _p=ple):
                shadows = [round_bf16(x) for x in hm.ple_inject(_p, [v[0]] + v[2:A + 1])]
                return hm.predict(i, [v[1]] + shadows + [v[A + 1]])
            self.round_trip("ple_norm+inject+predict+input_norm", [(a["ple_y"], D)] + xs + [(a["coefs"], A * A)],
                            5 * D + A * A * D + 2 * D, xs + [(a["x_norm"], D)], hm and inject_predict)

    def _qkv_attention(self, i: int, t: int) -> None:
        """Q/K/V, QK-norm + RoPE + the K/V write into the ring, then attention over the producer layer's ring."""
        c, D, F, A, P, H, KVH, hd, a, M, hm, bind, pre, xs = self._ctx(i)
        self.stage = "qkv"
        self.gemv(M[pre + "q"], a["x_norm"], a["q"])
        src = kv_source(c, i)
        if src == i:
            self.gemv(M[pre + "k"], a["x_norm"], a["k"])
            self.gemv(M[pre + "v"], a["x_norm"], a["v"])
            self.kv_gemvs += [(t, i, "K"), (t, i, "V")]
        self.stage = "qk_norm_rope"
        outs = [(a["q"], H * hd)] + ([(a["k"], KVH * hd), (a["v"], KVH * hd)] if src == i else [])
        theta = c["rope_theta_global"] if global_layer(c, i) else c["rope_theta_local"]
        slot = self.slot
        kvl = self.kvl

        def kv_extra(data):
            if src != i:
                return []
            if data is None:   # timing mode: the same writes, as byte counts
                per = []
                for h in range(KVH):
                    beats, saddr = kvl.k_cells(i, h, slot)
                    per += [(b, 16) for b in beats] + [(saddr, 2)]
                    per += [(b, max(1, kvl.nib // 2)) for b, _ch in kvl.v_cells(i, h, slot)]
                return per
            return hm.kv_writes(kvl, slot)
        work = 4 * H * hd + (8 * KVH * hd if src == i else 0)
        self.round_trip("qkv_norm+rope+kv_write", outs, work, [(a["q"], H * hd)],
                        hm and bind(hm.qkv, i, theta, src == i, slot), kv_extra)
        if src == i:
            self.steps.append(("_barrier",))   # this layer's attention streams the K/V just written
        # attention over the producer layer's ring
        self.stage = "attention"
        self.kv_reads.append((t, i, src))
        self._attention(i, src)

    def _o_laurel(self, i: int) -> None:
        """W_o + LAuReL, merged with the residual, and the pre-FFN norm."""
        c, D, F, A, P, H, KVH, hd, a, M, hm, bind, pre, xs = self._ctx(i)
        self.stage = "o_laurel"
        self.wait("attn_out")
        self.gemv(M[pre + "o"], a["attn_out"], a["attn_proj"])
        self.gemv(M[pre + "laurel_l"], a["x_norm"], a["laurel1"])
        self.gemv(M[pre + "laurel_r"], a["laurel1"], a["laurel2"])
        self.round_trip("post_attn_norm+laurel+merge+pre_ffn_norm",
                        [(a["attn_proj"], D), (a["laurel2"], D), (a["xs0"], D), (a["x_norm"], D)],
                        8 * D, [(a["attn_proj"], D), (a["x_ffn"], D)], hm and bind(hm.merge, i))

    def _ffn(self, i: int) -> None:
        """The FFN: gate and up, the activation (Gaussian top-k sparsity on the first layers), down, residual."""
        c, D, F, A, P, H, KVH, hd, a, M, hm, bind, pre, xs = self._ctx(i)
        self.stage = "ffn_up"
        self.gemv(M[pre + "gate"], a["x_ffn"], a["gate_raw"])
        self.gemv(M[pre + "up"], a["x_ffn"], a["up_out"])
        self.stage = "ffn_act"
        if i < c["sparse_layers"]:
            self.round_trip("sparsity+gelu+mul", [(a["gate_raw"], F), (a["up_out"], F)], 6 * F, [(a["hidden"], F)],
                            hm and hm.sparse_act)
        else:
            self.wait("gate")
            for e0 in range(0, F, self.cvo_max):
                n = min(self.cvo_max, F - e0)
                self.cvo("GELU", a["gate_raw"] * 8 + e0, a["gate_raw"] * 8 + e0, n)   # in place
            self.round_trip("gelu*up", [(a["gate_raw"], F), (a["up_out"], F)], F, [(a["hidden"], F)],
                            hm and hm.mul)
        self.stage = "ffn_down"
        self.gemv(M[pre + "down"], a["hidden"], a["mlp_out"])
        self.round_trip("post_ffn_norm+residual", [(a["mlp_out"], D), (a["attn_proj"], D)], 3 * D,
                        [(a["mlp_out"], D)], hm and bind(hm.post_ffn, i))

    def _altup_correct(self, i: int) -> None:
        """The per-layer DONE poll of the design document's §5, then the AltUp correction."""
        c, D, F, A, P, H, KVH, hd, a, M, hm, bind, pre, xs = self._ctx(i)
        self.stage = "altup_correct"
        self.wait("layer_done")
        self.round_trip("corr_norm", [(a["mlp_out"], D)], 2 * D, [(a["x_norm"], D)], hm and bind(hm.router_input, i))
        self.gemv(M[pre + "corr_router"], a["x_norm"], a["router"])
        self._tanh("corr_tanh", a["router"], a["router_tanh"], A)
        self.gemv(M[pre + "corr"], a["router_tanh"], a["coefs"])
        self.round_trip("altup_correct", xs + [(a["coefs"], A), (a["mlp_out"], D)], 3 * A * D,
                        xs + [(a["ple_in"], D)], hm and bind(hm.correct, i))

    def _ple_inject(self, i: int) -> None:
        """The PLE injection (the per-token PLE table normalised on the host at layer 0); with ``ple_overlap``
        it is deferred into the next layer's AltUp router (rule 3)."""
        c, D, F, A, P, H, KVH, hd, a, M, hm, bind, pre, xs = self._ctx(i)
        self.stage = "ple_inject"
        if i == 0:
            self.stage = "ple"
            self.round_trip("ple_norm+combine", [(a["ple_proj_out"], c["num_layers"] * P)], 4 * c["num_layers"] * P,
                            [(a["pli_all"], c["num_layers"] * P)], hm and hm.ple_combine)
            self.stage = "ple_inject"
        if self.ple_overlap and i + 1 < c["num_layers"]:
            self.ple_pending = i          # rule 3: emitted inside layer i+1's AltUp router (see there)
            return
        self.gemv(M[pre + "ple_gate"], a["ple_in"], a["ple_g"])
        self.round_trip("ple_gelu*pli", [(a["ple_g"], P)], 2 * P, [(a["ple_g"], P)], hm and bind(hm.ple_gate, i))
        self.gemv(M[pre + "ple_proj"], a["ple_g"], a["ple_y"])
        self.round_trip("ple_norm+inject", [(a["ple_y"], D)] + xs[1:], 5 * D, xs[1:], hm and bind(hm.ple_inject, i))


    def _as_ple(self, layer: int, emit) -> None:
        """Emit ``emit()``'s steps as layer ``layer``'s ``ple_inject`` stage (per-stage counts, halt log)."""
        keep = self.layer, self.stage
        self.layer, self.stage = layer, "ple_inject"
        emit()
        self.layer, self.stage = keep

    def _tanh(self, label: str, src: int, dst: int, n: int) -> None:
        if self.tanh:
            self.wait(label)
            self.cvo("TANH", src * 8, dst * 8, n)
            self.wait(label + ".done")
        else:
            self.round_trip(label, [(src, n)], n, [(dst, n)], self.hm.tanh if self.data else None)

    def _ctx_word(self, h: int) -> int:
        """L2 word of query head ``h``'s ``[softmax sum, context vector]`` (the V GEMV's hd + 1 outputs)."""
        return self.a["ctx"] + h * -(-(self.c["head_dim"] + 1) // 8)

    def _attention(self, i: int, src: int) -> None:
        """Layer ``i``'s attention over producer ``src``'s ring (module docstring, "Attention"): per KV head, passes
        of ``pass_heads`` query heads, each streaming the attended K rows and V^T slices once."""
        c = self.c
        H, KVH = c["num_heads"], c["num_kv_heads"]
        window = c["sliding_window"] if (not global_layer(c, i) and c["kv"]["sliding_window"]) else None
        ranges = self.ring.ranges(window)
        self.attended[(self.token_ix, "local" if window else "full")] = ranges
        group = H // KVH
        for g in range(KVH):
            heads = list(range(g * group, (g + 1) * group))
            for p0 in range(0, group, self.pass_heads):
                self._attend(src, g, heads[p0:p0 + self.pass_heads], ranges, window, first=p0 == 0)

    def _kv_stream(self, pieces: list, lanes_of) -> list:
        """TDEST/port blocks of a KV stream: head-parallel, the pieces dealt over the GEMV ports and multicast to
        ``lanes_of`` lanes; row-parallel, ``lanes_of`` = [(lane, pieces of that lane)]."""
        if self.head:
            parts = deal(pieces, port_split(sum(n for _a, n in pieces), len(self.ports)))
            mask = MULTICAST | ((1 << lanes_of) - 1)
            return [(mask, port, a, n) for port, part in zip(self.ports, parts) for a, n in part]
        lp = self.profile["gemv"]["lane_ports"]
        return [(lane, lp[lane], a, n) for lane, ps in lanes_of for a, n in ps]

    def _account(self, blocks: list, elems: int, scales: int, first: bool, sums: int = 0) -> None:
        """KV bytes of one stream: ``elems`` of attended entries (read once on a KV head's first pass, re-read on
        later ones), ``scales``, ``sums`` (the V^T sum row's attended entries) and the rest padding (V slices
        beyond the attended slots, K rows' last beat)."""
        self.kv_scale_bytes += scales
        self.kv_sum_bytes += sums
        self.kv_pad_bytes += sum(b[3] for b in blocks) - elems - scales - sums
        if first:
            self.kv_once += elems
            self.kv_scale_once += scales

    def _attend(self, src: int, g: int, hs: list[int], ranges: list, window, first: bool) -> None:
        """One pass: scores GEMV over the attended K rows (a head-parallel GEMV for the query heads ``hs``, or one
        head), per head the EXPs (``sub_emax``), the ``[1; V^T] p`` GEMV over the V slices, per head the SCALE."""
        c, a, kvl = self.c, self.a, self.kvl
        hd, n = c["head_dim"], len(hs)
        heads = n if self.head else 0
        L = sum(r1 - r0 for r0, r1 in ranges)
        elems = L * hd * self.kv_bits // 8                    # K (or V) bytes of the attended slots
        kslots = hd * self.kv_bits // 4
        slices = kvl.slices(ranges)
        vk = 32 * sum(c1 - c0 for c0, c1 in slices)          # V GEMV's K: nibble slots of the streamed slices
        in_place = len(ranges) == 1 and ranges[0][0] == 0     # score index == V activation position
        s_stride = 4 * k_chunks(L)                            # words per head's scores (32-slot aligned)
        x_stride = -(-vk // 8)                                # words per head's V activation
        # K rows: head-parallel, all of them to every lane; row-parallel, the lanes split them
        if self.head:
            kb = self._kv_stream(kvl.k_pieces(src, g, ranges), n)
        else:
            kb = self._kv_stream([], [(lane, kvl.k_pieces(src, g, _sub(ranges, r0, rows)))
                                      for lane, (r0, rows) in enumerate(lane_rows(L, self.lanes)) if rows])
        self._account(kb, elems, 2 * L, first)
        if not in_place:   # the V activation has slots the EXPs do not write: zero it (after its last reader)
            self.wait("exp_window")
            self.memcpy_in(a["exp_win"], n * x_stride * 8, self.zeros)
        self.gemv((L, kslots, kb), a["q"] + hs[0] * hd // 8, a["scores"], findemax=1, kv=(src, g, "K"), real_k=hd,
                  heads=heads, stride=s_stride)
        if L > self.sfu_fifo:   # rule 2: with the direct FIFO the EXPs take the scores from it, no poll
            self.wait(f"scores{hs[0]}")
        for j in range(n):
            s_base = (a["scores"] + j * s_stride) * 8
            e_base = s_base if in_place else (a["exp_win"] + j * x_stride) * 8
            k = 0
            for r0, r1 in ranges:
                pos = k if in_place else kvl.position(r0, slices)
                for e0 in range(0, r1 - r0, self.cvo_max):
                    self.cvo("EXP", s_base + k + e0, e_base + pos + e0, min(self.cvo_max, r1 - r0 - e0), sub_emax=1)
                k += r1 - r0
        if not self.sfu_fifo:   # with the FIFO's scoreboard the V GEMV waits for the EXPs writing its input
            self.wait(f"softmax{hs[0]}")
        if self.head:
            vb = self._kv_stream(kvl.v_pieces(src, g, 0, slices), n)
        else:
            lp = self.profile["gemv"]["lane_ports"]
            vb = [(b, lp[b], a0, m) for b in range(len(kvl.blocks)) for a0, m in kvl.v_pieces(src, g, b, slices)]
        self._account(vb, elems, 2 * (hd + 1), first, sums=L * self.kv_bits // 8)
        # rows: the sum row (sum p, the SCALE's scalar), then the hd channels (V^T p): [sum, ctx] per head
        self.gemv((hd + 1, vk, vb), a["scores"] if in_place else a["exp_win"], self._ctx_word(hs[0]),
                  kv=(src, g, "V"), real_k=L, heads=heads, stride=-(-(hd + 1) // 8))
        if not self.sfu_fifo:   # with the FIFO the scheduler makes the SCALE wait for this GEMV's result
            self.wait(f"pv{hs[0]}")
        for h in hs:
            # exp(s - max) includes exp(0) = 1: the sum is >= 1, never 0 (SCALE recip_scale is safe)
            self.cvo("SCALE", self._ctx_word(h) * 8, a["attn_out"] * 8 + h * hd, hd + 1, recip_scale=1,
                     scalar_nonzero=True)

    # -- summaries ---------------------------------------------------------------------------------------
    def weight_bytes_per_token(self) -> int:
        return sum(self.stream_bytes.values())

    def attended_ranges(self) -> dict:
        """The last token's attended slot ranges (what its attention streams): ``full`` layers, ``local`` (the
        sliding window, when on), each with the slot count."""
        last = max((t for t, _k in self.attended), default=-1)
        return {k: {"ranges": [list(r) for r in v], "slots": sum(b - a for a, b in v)}
                for (t, k), v in self.attended.items() if t == last}

    def describe(self, t: int) -> str:
        tok, layer, stage = self.where[t]
        return f"token {tok} layer {layer} stage {stage}"


def _sub(ranges: list[tuple[int, int]], r0: int, rows: int) -> list[tuple[int, int]]:
    """The slot ranges of rows ``[r0, r0 + rows)`` of the concatenation of ``ranges``."""
    out, k = [], 0
    for a, b in ranges:
        lo, hi = max(r0, k), min(r0 + rows, k + b - a)
        if lo < hi:
            out.append((a + lo - k, a + hi - k))
        k += b - a
    return out

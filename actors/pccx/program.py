"""Hand-written pccx programs and the builder the driver steps are made with.

The ``program`` workload (scenarios/pccx/program*.yaml) exercises every opcode
the way seed §3 describes a decode step, at small size:

1. MEMSET the shape RAMs (fmap[0] = K, weight[1] = {N, K}, fmap[2..4] = output sizes);
2. MEMCPY host->L2 of the activation x (sync);
3. ``gemvs`` GEMVs ``y_g = W_g x`` with INT4 weights + BF16 per-channel scales,
   split by output rows over the ``parallel_lane`` lanes in use; each lane's rows
   are streamed by a DataMover command (TDEST = the lane) through the HP port
   the lane is wired to (``gemv.lane_ports``: HP2/HP3) into its weight FIFO; the
   driver queues every stream at once, so the prefetch of GEMV n+1 starts as
   soon as the ports and FIFOs allow it (seed §3.2 rule 1) — nothing waits for
   GEMV n explicitly; the last GEMV sets ``findemax``;
4. a GEMM (HP0/HP1 weights, 32 outputs);
5. DONE poll, then the softmax sequence of seed §3.1 on the last GEMV's output:
   CVO EXP (``sub_emax``), REDUCE_SUM (written just before the EXP output),
   SCALE with ``recip_scale`` (scalar = first streamed element);
6. DONE poll, MEMCPY L2->host of all results, DONE poll.

``check`` compares the host-DDR results with a float32/BF16 numpy model (data
mode) and returns the per-opcode latency table and the measured prefetch overlap.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from actors.pccx.builder import build_machine
from actors.pccx.gemv import MULTICAST, gemv_mode, gemv_ports, lane_blob, lane_rows, lanes_used, port_split
from actors.pccx.numerics import from_bf16, pack_int4, round_bf16, to_bf16
from actors.pccx.report import latency_table
from emulator import numerics
from emulator.rng import stream as rng_stream
from emulator.schema import Bool, Int, Map
from protocols import pccx_isa as isa

__all__ = ["ProgramBuilder", "PARAMS", "build", "check", "overlaps"]


class ProgramBuilder:
    """Collects driver steps and host-DDR contents; lays weights out the way the engines read them."""

    def __init__(self, profile: dict, *, kv_max_tokens: int = 8192):
        self.profile = profile
        self.steps: list = [("open",), ("kv_init", kv_max_tokens), ("start",)]
        self.ddr: dict[int, bytes] = {}
        self.top = 0
        self.rr = {"gemm": 0}
        self.streams = 0
        self.burst = profile["hp"]["burst_beats"] * profile["hp"]["beat_bytes"]
        self.pushes = 0                                  # instructions pushed so far (the AXI-Lite push order)
        self.pending = {"GEMV": deque(), "GEMM": deque()}   # streams queued, not yet given their instruction

    def put(self, blob: bytes) -> int:
        """Place ``blob`` in host DDR (16-byte aligned); returns its address."""
        addr = self.top
        self.ddr[addr] = bytes(blob)
        self.top = addr + -(-len(blob) // 16) * 16
        return addr

    def alloc(self, nbytes: int) -> int:
        addr = self.top
        self.top += -(-nbytes // 16) * 16
        return addr

    def push(self, op: str, **fields) -> int:
        w = isa.encode(op, **fields)
        self.raw(w)
        return w

    def raw(self, word: int) -> None:
        """Push ``word``; the k-th GEMV (GEMM) pushed is the instruction the k-th GEMV (GEMM) stream queued is
        for: its DataMover commands get that instruction number as their TAG (protocols.pccx.DmCmd)."""
        op = isa.MNEMONICS.get(word >> 60)
        if op in self.pending and self.pending[op]:
            for i in self.pending[op].popleft():
                self.steps[i] = self.steps[i][:6] + (self.pushes,)
        self.steps.append(("push", word))
        self.pushes += 1

    def wait(self, label: str) -> None:
        self.steps.append(("wait", label))

    def stream_gemv(self, W: np.ndarray, scales_bf16: np.ndarray | None, parallel_lane: int) -> int:
        """Stream the GEMV weights ``W`` [N, K] (+ BF16 scales) for a GEMV using ``parallel_lane``.

        Row-parallel: each lane in use gets its block of rows (actors/pccx/gemv.py
        ``lane_rows``, chunk-major ``lane_blob``) as one DataMover command, TDEST =
        the lane, on the HP port ``gemv.lane_ports`` wires it to; a lane without a
        port (RTL lanes C/D) gets nothing: the hardware computes its rows on zero
        weights.  Head-parallel (``gemv.head_parallel``, parallel_lane bit 4): the
        whole matrix once, dealt over the GEMV ports (``port_split``), TDEST = the
        multicast mask of the lanes in use.  Returns the stream id.
        """
        g = self.profile["gemv"]
        sid = self.streams
        self.streams += 1
        cmds = []
        head, used = gemv_mode(parallel_lane, g["lanes"], g["head_parallel"])
        if head:
            blob = lane_blob(W, scales_bf16)
            addr, ports = self.put(blob), gemv_ports(g)
            for port, n in zip(ports, port_split(len(blob), len(ports))):
                if n:
                    cmds.append(len(self.steps))
                    self.steps.append(("hp", port, sid, addr, n, MULTICAST | ((1 << used) - 1), -1))
                addr += n
        for lane, (r0, n) in ([] if head else enumerate(lane_rows(W.shape[0], used))):
            port = g["lane_ports"][lane]
            if n == 0 or port is None:
                continue
            blob = lane_blob(W[r0:r0 + n], None if scales_bf16 is None else scales_bf16[r0:r0 + n])
            cmds.append(len(self.steps))
            self.steps.append(("hp", port, sid, self.put(blob), len(blob), lane, -1))
        self.pending["GEMV"].append(cmds)
        return sid

    def stream_weights(self, unit: str, blob: bytes) -> int:
        """GEMM: split ``blob`` into bursts dealt round-robin over ``gemm.hp_ports``; one DataMover command per port."""
        if unit != "gemm":
            raise ValueError(f"stream_weights({unit!r}): GEMV weights are laid out per lane, use stream_gemv()")
        ports = self.profile[unit]["hp_ports"]
        per_port: dict[int, list[bytes]] = {p: [] for p in ports}
        i = self.rr[unit]
        for off in range(0, len(blob), self.burst):
            per_port[ports[i % len(ports)]].append(blob[off:off + self.burst])
            i += 1
        self.rr[unit] = i % len(ports)
        sid = self.streams
        self.streams += 1
        cmds = []
        for p in ports:
            if per_port[p]:
                data = b"".join(per_port[p])
                cmds.append(len(self.steps))
                self.steps.append(("hp", p, sid, self.put(data), len(data), 0, -1))
        self.pending["GEMM"].append(cmds)
        return sid


def weight_blob(W: np.ndarray, scales_bf16: np.ndarray | None) -> bytes:
    """Packed INT4 ``W`` row-major followed by the BF16 scales: the GEMM's layout (actors/pccx/numerics.py;
    a GEMV stream is chunk-major, actors/pccx/gemv.py ``lane_blob``)."""
    blob = pack_int4(W).tobytes()
    return blob + (scales_bf16.astype(np.uint16).tobytes() if scales_bf16 is not None else b"")


PARAMS = Map({
    "gemvs": Int(min=1, default=3, doc="GEMVs in a row (weight prefetch of n+1 overlaps compute of n)"),
    "K": Int(min=8, max=16384, default=1024, doc="activation length (elements)"),
    "N": Int(min=2, max=2047, default=64, doc="GEMV output rows (also the softmax length)"),
    "parallel_lane": Int(min=0, max=31, default=1, doc="GEMV parallel_lane field (lanes used; 0 = all)"),
    "gemm": Bool(default=True, doc="include a GEMM (HP0/HP1 weights)"),
    "kv_max_tokens": Int(min=1, default=8192, doc="pccx_kv_init cap (pccx driver API docs, pccxai/pccx)"),
})


def _inputs(seed: int, p: dict):
    rng = rng_stream(seed, "pccx/program")
    K, N = p["K"], p["N"]
    x = to_bf16(rng.normal(0, 1, K).astype(np.float32))
    Ws = [rng.integers(-8, 8, (N, K)) for _ in range(p["gemvs"])]
    ss = [to_bf16(rng.uniform(0.002, 0.02, N).astype(np.float32)) for _ in range(p["gemvs"])]
    Wg = rng.integers(-8, 8, (32, K))
    sg = to_bf16(rng.uniform(0.002, 0.02, 32).astype(np.float32))
    return x, Ws, ss, Wg, sg


def layout(p: dict) -> dict:
    K, N, G = p["K"], p["N"], p["gemvs"]
    wx, wy = -(-K // 8), -(-N // 8)
    L = {"x": 0, "y": [wx + g * wy for g in range(G)]}
    L["gemm"] = wx + G * wy
    L["e_word"] = L["gemm"] + 4
    L["e_elem"] = L["e_word"] * 8 + 1          # EXP output; REDUCE_SUM writes the element just before it
    L["p_word"] = L["e_word"] + -(-(N + 1) // 8)
    return L


def make_program(profile: dict, p: dict, seed: int):
    """(ProgramBuilder, host output addresses) of the ``program`` workload."""
    K, N, G = p["K"], p["N"], p["gemvs"]
    x, Ws, ss, Wg, sg = _inputs(seed, p)
    L = layout(p)
    b = ProgramBuilder(profile, kv_max_tokens=p["kv_max_tokens"])
    x_addr = b.put(x.tobytes())
    wy = -(-N // 8)
    out = {"y": b.alloc(G * wy * 16), "gemm": b.alloc(64), "p": b.alloc(wy * 16)}
    b.push("MEMSET", dest_cache=0, dest_addr=0, a_value=K, b_value=1, c_value=1)
    b.push("MEMSET", dest_cache=1, dest_addr=1, a_value=N, b_value=K, c_value=1)
    b.push("MEMSET", dest_cache=0, dest_addr=2, a_value=8 * G * wy, b_value=1, c_value=1)
    b.push("MEMSET", dest_cache=0, dest_addr=3, a_value=32, b_value=1, c_value=1)
    b.push("MEMSET", dest_cache=0, dest_addr=4, a_value=N, b_value=1, c_value=1)
    b.push("MEMCPY", **{"from_device": 1, "to_device": 0, "dest_addr": L["x"], "aux_addr": x_addr // 16,
                        "shape_ptr_addr": 0, "async": 0})
    for g in range(G):
        b.stream_gemv(Ws[g], ss[g], p["parallel_lane"])
        b.push("GEMV", dest_reg=L["y"][g], src_addr=L["x"], w_scale=1, size_ptr_addr=1, shape_ptr_addr=0,
               parallel_lane=p["parallel_lane"], findemax=int(g == G - 1))
    if p["gemm"]:
        b.stream_weights("gemm", weight_blob(Wg, sg))
        b.push("GEMM", dest_reg=L["gemm"], src_addr=L["x"], w_scale=1, shape_ptr_addr=0)
    b.wait("projections")
    last = L["y"][G - 1] * 8
    b.push("CVO", cvo_func=isa.CVO_FUNCS["EXP"], src_addr=last, dst_addr=L["e_elem"], length=N, sub_emax=1,
           **{"async": 1})
    b.push("CVO", cvo_func=isa.CVO_FUNCS["REDUCE_SUM"], src_addr=L["e_elem"], dst_addr=L["e_elem"] - 1, length=N,
           **{"async": 1})
    b.push("CVO", cvo_func=isa.CVO_FUNCS["SCALE"], src_addr=L["e_elem"] - 1, dst_addr=L["p_word"] * 8,
           length=N + 1, recip_scale=1, **{"async": 0})
    b.wait("softmax")
    b.push("MEMCPY", **{"from_device": 0, "to_device": 1, "src_addr": L["y"][0], "aux_addr": out["y"] // 16,
                        "shape_ptr_addr": 2, "async": 1})
    if p["gemm"]:
        b.push("MEMCPY", **{"from_device": 0, "to_device": 1, "src_addr": L["gemm"], "aux_addr": out["gemm"] // 16,
                            "shape_ptr_addr": 3, "async": 1})
    b.push("MEMCPY", **{"from_device": 0, "to_device": 1, "src_addr": L["p_word"], "aux_addr": out["p"] // 16,
                        "shape_ptr_addr": 4, "async": 0})
    b.wait("results")
    return b, out


def build(system, profile: dict, p: dict) -> dict:
    """Build the machine; returns the context ``check`` receives: ``{result name: DDR address}``."""
    b, out = make_program(profile, p, system.seed)
    if b.top > profile["ddr"]["model_size"]:
        from emulator.errors import BuildError
        raise BuildError(f"program needs {b.top} bytes of host DDR, profile ddr.model_size is "
                         f"{profile['ddr']['model_size']}")
    build_machine(system, profile, b.steps, b.ddr if system.mode == "data" else None)
    return out


def reference(seed: int, p: dict, profile: dict) -> dict:
    """The numpy model of the program's results (BF16 bit patterns).

    GEMV rows: exact dot products (float64), rounded to float32, times the float32
    scale, rounded to BF16 (actors/pccx/gemv.py); lanes C/D of the rtl profile
    (unwired) give 0.
    """
    x, Ws, ss, Wg, sg = _inputs(seed, p)
    xf = from_bf16(x)
    ys = []
    for W, s in zip(Ws, ss):
        y = numerics.matmul(W, xf, acc=np.float64).astype(np.float32) * from_bf16(s)
        for lane, (r0, n) in enumerate(lane_rows(W.shape[0], lanes_used(p["parallel_lane"], profile["gemv"]["lanes"]))):
            if profile["gemv"]["lane_ports"][lane] is None:
                y[r0:r0 + n] = 0
        ys.append(to_bf16(y))
    gemm = to_bf16(numerics.matmul(Wg, xf, acc=np.float32) * from_bf16(sg))
    last = from_bf16(ys[-1])
    emax = from_bf16(to_bf16(last.max()))
    e = round_bf16(numerics.exp(round_bf16(last - emax)).astype(np.float32))
    acc = np.float32(0)
    for v in e:
        acc = round_bf16(np.float32(acc + v))[()]
    prob = to_bf16(e * round_bf16(np.float32(1) / acc)) if acc != 0 else np.zeros_like(e, dtype=np.uint16)
    # each GEMV result occupies whole 8-element L2 words (reference §1.6): pad to the word stride
    stride = -(-ys[0].size // 8) * 8
    y = np.zeros(len(ys) * stride, dtype=np.uint16)
    valid = np.zeros(y.size, dtype=bool)
    for g, yg in enumerate(ys):
        y[g * stride:g * stride + yg.size] = yg
        valid[g * stride:g * stride + yg.size] = True
    return {"y": (y, valid), "gemm": gemm, "p": prob}


def overlaps(system) -> list[dict]:
    """Prefetch overlap from the run's busy records: HP transfer of stream n+1 during GEMV n's compute
    (compute = the MAC spans of every lane on stream n)."""
    rows = []
    lanes = [a for n, a in system.actors.items() if n.startswith("pccx/gemv/lane")]
    hp = [a for n, a in system.actors.items() if n.startswith("pccx/hp")]
    comp: dict[int, list] = {}
    for lane in lanes:
        for (s, e, seq, stream) in lane.spans:
            if stream >= 0:
                comp.setdefault(stream, []).append((s, e))
    streams = sorted(comp)
    for a, b in zip(streams, streams[1:]):
        c0 = min(s for s, _ in comp[a])
        c1 = max(e for _, e in comp[a])
        xfer = [(s, e) for port in hp for (s, e, st) in port.spans if st == b]
        ov = sum(max(0, min(e, c1) - max(s, c0)) for s, e in xfer)
        rows.append({"gemv_stream": a, "compute_ns": f"{(c1 - c0) / 1000:.1f}", "next_stream": b,
                     "next_xfer_during_compute_ns": f"{ov / 1000:.1f}",
                     "next_xfer_total_ns": f"{sum(e - s for s, e in xfer) / 1000:.1f}"})
    return rows


def check(system, profile: dict, p: dict, result, context: dict) -> dict:
    out: dict = {}
    driver = system.actors["pccx/driver"]
    tables = {"pccx per-opcode latency (engine arrival -> retire)": latency_table(system, profile)}
    ov = overlaps(system)
    if ov:
        tables["weight prefetch overlap (HP transfer of GEMV n+1 during GEMV n compute)"] = ov
    out["tables"] = tables
    if driver.halted:
        out["error"] = f"pccx/driver halted at t={driver.halted['at_ps']} ps: {driver.halted['text']}"
    if result.status != "finished" or driver.halted or system.mode != "data":
        return out
    ref = reference(system.seed, p, profile)
    mem = system.actors["pccx/ddr"].mem
    addrs = context
    errs = {}
    for key, want in ref.items():
        if key == "gemm" and not p["gemm"]:
            continue
        valid = None
        if isinstance(want, tuple):        # (padded image, mask of the elements that carry results)
            want, valid = want
        got = mem[addrs[key]:addrs[key] + 2 * want.size].view(np.uint16)
        if valid is not None:
            got, want = got[valid], want[valid]
        d = np.abs(from_bf16(got).astype(np.float64) - from_bf16(want).astype(np.float64))
        errs[key] = float(d.max())
        out[f"exact_{key}"] = bool(np.array_equal(got, want))
    out["max_abs_err"] = max(errs.values())
    return out

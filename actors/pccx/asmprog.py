"""The ``asm`` workload: run a hand-written text program (``.pasm``) on the pccx machine.

A ``.pasm`` file is the ``emu pccx disasm`` text form plus driver directives, one
per line (``#`` starts a comment)::

    data x len=1024 [seed=1]             # host-DDR tensor: len random BF16 values (normal, seeded)
    weights w0 n=64 k=1024 [scale=1] [seed=2]   # INT4 [n, k] (+ n BF16 per-channel scales when scale=1)
    out y bytes=128                      # a host-DDR result area
    stream gemv w0 [parallel_lane=4]     # queue DataMover commands: w0's rows split over the lanes a GEMV with
                                         # this parallel_lane uses (default 0 = all), each lane's rows on the
                                         # HP port gemv.lane_ports wires it to; 'stream gemm w1': HP0/HP1
    MEMCPY from_device=1 to_device=0 dest_addr=0 aux_addr=@x shape_ptr_addr=0 async=0
    GEMV dest_reg=128 src_addr=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0 parallel_lane=4
    kick                                 # write the kick marker (0x008)
    wait softmax                         # per-layer DONE poll
    sleep 10us                           # the driver idles (virtual time)

``@name`` in a field is the named tensor's host-DDR address in 16-byte units
(the MEMCPY ``aux_addr`` unit).  A word may also be given raw as ``word 0x...``
(e.g. to exercise the error paths).  The run reports every ``out`` area (BF16
values) and the per-opcode latency table.
"""
from __future__ import annotations

import re

import numpy as np

from actors.pccx.builder import build_machine
from actors.pccx.numerics import from_bf16, to_bf16
from actors.pccx.program import ProgramBuilder, weight_blob
from actors.pccx.report import latency_table
from actors.registry import workload_file
from emulator.errors import BuildError
from emulator.rng import stream as rng_stream
from emulator.schema import Int, Map, Str, quote, read_text
from emulator.units import parse_time
from protocols import pccx_isa as isa

__all__ = ["PARAMS", "build", "check", "parse_program"]

PARAMS = Map({
    "source": Str(doc="the .pasm file (absolute, or relative to the scenario file, the working directory "
                      "or the repository)"),
    "kv_max_tokens": Int(min=1, default=8192),
})



def _kv(tokens: list[str], where: str) -> dict:
    out = {}
    for t in tokens:
        if "=" not in t:
            raise BuildError(f"{where}: expected key=value, found {quote(t)}")
        k, v = t.split("=", 1)
        out[k] = v
    return out


def _int(v: str, where: str) -> int:
    try:
        return int(v, 0)
    except ValueError:
        raise BuildError(f"{where}: expected an integer, found {quote(v)}") from None


def parse_program(text: str, profile: dict, *, seed: int, name: str = "<program>",
                  kv_max_tokens: int = 8192) -> tuple[ProgramBuilder, dict]:
    """(builder, {out name: (addr, bytes)}) of a ``.pasm`` text."""
    b = ProgramBuilder(profile, kv_max_tokens=kv_max_tokens)
    tensors: dict[str, int] = {}
    blobs: dict[str, tuple] = {}
    outs: dict[str, tuple[int, int]] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        where = f"{name}:{no}"
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        head = parts[0].lower()
        if head in ("data", "weights", "out"):
            if len(parts) < 2 or not re.fullmatch(r"[A-Za-z_]\w*", parts[1]):
                raise BuildError(f"{where}: '{head}' needs a name")
            tname = parts[1]
            if tname in tensors:
                raise BuildError(f"{where}: tensor {tname!r} defined twice")
            kv = _kv(parts[2:], where)
            rng = rng_stream(seed, f"pasm/{tname}/{kv.get('seed', '0')}")
            if head == "data":
                vec = to_bf16(rng.normal(0, 1, _int(kv.get("len", "0"), where)).astype(np.float32))
                tensors[tname] = b.put(vec.tobytes())
            elif head == "weights":
                n, k = _int(kv.get("n", "0"), where), _int(kv.get("k", "0"), where)
                if n <= 0 or k <= 0:
                    raise BuildError(f"{where}: weights need n>0 and k>0")
                W = rng.integers(-8, 8, (n, k))
                sc = to_bf16(rng.uniform(0.002, 0.02, n).astype(np.float32)) if kv.get("scale", "1") != "0" else None
                blobs[tname] = (W, sc)
                tensors[tname] = -1
            else:
                nbytes = _int(kv.get("bytes", "0"), where)
                tensors[tname] = b.alloc(nbytes)
                outs[tname] = (tensors[tname], nbytes)
        elif head == "stream":
            if len(parts) < 3 or parts[1] not in ("gemv", "gemm") or parts[2] not in blobs:
                raise BuildError(f"{where}: expected 'stream gemv|gemm WEIGHTS' with defined weights")
            kv = _kv(parts[3:], where)
            if set(kv) - ({"parallel_lane"} if parts[1] == "gemv" else set()):
                raise BuildError(f"{where}: unknown stream option(s) {sorted(kv)} (gemv takes parallel_lane=)")
            if parts[1] == "gemv":
                b.stream_gemv(*blobs[parts[2]], _int(kv.get("parallel_lane", "0"), where))
            else:
                b.stream_weights("gemm", weight_blob(*blobs[parts[2]]))
        elif head == "wait":
            b.wait(parts[1] if len(parts) > 1 else f"line {no}")
        elif head == "kick":
            b.steps.append(("kick",))
        elif head == "sleep":
            b.steps.append(("sleep", parse_time(parts[1] if len(parts) > 1 else "")))
        elif head == "word":
            b.raw(_int(parts[1] if len(parts) > 1 else "", where))
        else:
            def at(m):
                t = m.group(1)
                if t not in tensors or tensors[t] < 0:
                    raise BuildError(f"{where}: @{t} is not a data/out tensor")
                return str(tensors[t] // 16)
            try:
                word = isa.assemble_line(re.sub(r"@([A-Za-z_]\w*)", at, line))
            except isa.IsaError as e:
                raise BuildError(f"{where}: {e}") from None
            b.raw(word)
    return b, outs


def build(system, profile: dict, p: dict) -> dict:
    """Build the machine; returns the context ``check`` receives: ``{output name: (DDR address, bytes)}``."""
    path = workload_file(p["source"], system, "workload.params.source", "program file")
    text = read_text(str(path), what="a UTF-8 .pasm program")   # the input limits of every file (size, NUL)
    b, outs = parse_program(text, profile, seed=system.seed, name=str(path),
                            kv_max_tokens=p["kv_max_tokens"])
    build_machine(system, profile, b.steps, b.ddr if system.mode == "data" else None)
    return outs


def check(system, profile: dict, p: dict, result, context: dict) -> dict:
    out = {"tables": {"pccx per-opcode latency (engine arrival -> retire)": latency_table(system, profile)}}
    halted = system.actors["pccx/driver"].halted
    if halted:
        out["error"] = f"pccx/driver halted at t={halted['at_ps']} ps: {halted['text']}"
    mem = system.actors["pccx/ddr"].mem
    if mem is not None:
        out["outputs"] = {name: [round(float(v), 6) for v in from_bf16(mem[a:a + n].view(np.uint16))[:16]]
                          for name, (a, n) in context.items()}
    return out

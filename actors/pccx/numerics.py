"""BF16 / INT4 numerics of the pccx data path (data mode).

L2 holds BF16 (``device_pkg.sv FmapType = BF16``, reference §1.6) stored here as
uint16 bit patterns.  Weights are INT4 two's complement, packed two per byte
(low nibble first), row-major ``[N, K]``, followed by ``N`` BF16 per-channel
scales (reference §3: "INT4 + per-channel scale" in host DDR, seed §1).

CVO functions (reference §1.3) are computed in float64 with ``emulator.numerics``
(the same bits on every CPU; numpy's float32 transcendentals differ between SIMD
code paths) from the BF16 inputs, rounded to float32, then to BF16:
EXP, SQRT, GELU in the RTL's sigmoid form ``x * sigmoid(1.702 x)``, SIN/COS with
the CORDIC's angle saturation at +-4 rad, REDUCE_SUM as a serial BF16 add,
SCALE (scalar = first streamed element; ``recip_scale`` divides, a zero scalar
gives 0 as seed §5 states), RECIP.  The RTL's LUT/Newton approximations of
EXP/SQRT/RECIP are not bit-modelled (assumption: the emulator rounds the exact
function to BF16).
"""
from __future__ import annotations

import numpy as np

from emulator import numerics
from protocols.codec import TensorDesc

__all__ = ["to_bf16", "from_bf16", "round_bf16", "pack_int4", "unpack_int4", "cvo_apply", "weight_bytes",
           "gelu_tanh", "CORDIC_LIMIT"]

CORDIC_LIMIT = 4.0   # rad; reference §1.3 "angle saturates at ~+-4 rad"


def to_bf16(x) -> np.ndarray:
    """float -> BF16 bits (round to nearest even; NaN stays NaN)."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded.astype(np.uint16)


def from_bf16(b) -> np.ndarray:
    """BF16 bits -> float32."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x) -> np.ndarray:
    return from_bf16(to_bf16(x))


def pack_int4(w: np.ndarray) -> np.ndarray:
    """int values in [-8, 7], shape [N, K] -> packed uint8 (low nibble = even index), padded to a byte."""
    flat = (np.asarray(w, dtype=np.int8).reshape(-1) & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.size * 2, dtype=np.int8)
    out[0::2] = (p & 0xF).astype(np.int8)
    out[1::2] = (p >> 4).astype(np.int8)
    out = np.where(out > 7, out - 16, out).astype(np.int8)
    return out[:count]


def gelu_tanh(x) -> np.ndarray:
    """``gelu_pytorch_tanh`` in float64: ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + numerics.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * (x * x * x))))


def weight_bytes(n: int, k: int, w_scale: bool) -> int:
    """Bytes of one weight stream: packed INT4 ``[n, k]`` plus ``n`` BF16 scales when ``w_scale``."""
    return (n * k + 1) // 2 + (2 * n if w_scale else 0)


def cvo_apply(func: str, x_bits: np.ndarray, *, emax_bits: int | None, recip_scale: bool,
              gelu_form: str = "sigmoid") -> np.ndarray:
    """Result BF16 bits of CVO ``func`` over the streamed BF16 elements ``x_bits``."""
    x = from_bf16(x_bits)
    if emax_bits is not None:
        x = round_bf16(x - from_bf16(np.uint16(emax_bits)))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
        if func == "EXP":
            y = numerics.exp(x)
        elif func == "SQRT":
            y = np.sqrt(x)
        elif func == "GELU" and gelu_form == "tanh":   # what-if: the model's form (profile cvo.gelu_form)
            y = gelu_tanh(x)
        elif func == "GELU":
            y = x * numerics.sigmoid(1.702 * x)
        elif func == "SIN":
            y = numerics.sin(np.clip(x, -CORDIC_LIMIT, CORDIC_LIMIT))
        elif func == "COS":
            y = numerics.cos(np.clip(x, -CORDIC_LIMIT, CORDIC_LIMIT))
        elif func == "REDUCE_SUM":
            acc = np.float32(0.0)
            for v in x:
                acc = round_bf16(np.float32(acc + v))[()]
            y = np.array([acc], dtype=np.float32)
        elif func == "SCALE":
            if x.size == 0:
                return np.zeros(0, np.uint16)
            s, rest = x[0], x[1:]
            if recip_scale:
                y = np.zeros_like(rest) if s == 0 else rest * round_bf16(np.float32(1.0) / s)
            else:
                y = rest * s
        elif func == "TANH":   # what-if function (profile cvo.tanh), not in the real CVO
            y = numerics.tanh(x)
        elif func == "RECIP":
            y = np.float32(1.0) / x
        else:
            raise ValueError(f"CVO function {func!r} has no data model")
    return to_bf16(np.asarray(y, dtype=np.float32))


WEIGHTS_PER_BEAT = 32   # INT4 weights in one 128-bit beat


def payload_nbytes(data) -> int:
    """Bytes a weight burst stands for: an array's size (data mode) or a descriptor's (timing mode)."""
    return int(data.nbytes) if isinstance(data, (np.ndarray, TensorDesc)) else 0

"""Data-mode arithmetic that gives the same bits on every CPU.

Why: numpy hands ``a @ b`` to the BLAS kernel it picked for the CPU (OpenBLAS's
Haswell, SkylakeX, Prescott ... kernels, with as many threads as it likes), and
its float32 ``exp``, ``tanh``, ``sin``, ``cos`` to SIMD code chosen by the CPU's
features.  Each of those sums or rounds in its own order, so a data-mode result,
and with it every message that carries it and the run's digest, changed with the
machine (issue 26: three digests for one scenario under three OpenBLAS kernels).

How: every function here is built only from IEEE-754 basic operations (``+ - *
/``, ``sqrt``, ``rint``, ``ldexp``, comparisons), each of which is correctly
rounded, hence the same on every CPU, and applied in an order written down here.
numpy does not fuse separate ufunc calls into FMAs, and ``ufunc.accumulate`` is
defined as the running sequence ``r[k] = r[k-1] + x[k]``, so its order is fixed
too.  No BLAS call, no transcendental from libm or numpy's SIMD tables.

* :func:`matmul` sums the K products of each output element **sequentially, in
  increasing k**, in the accumulator type, starting from ``init`` when given: what
  an output-stationary MAC array does (each cell adds one product per cycle into
  its accumulator).  With float16 operands (the AHBM's bf16 stand-in) and a
  float32 accumulator every product is exact (11 + 11 significant bits < 24), so
  only the sum rounds; with float32 operands the product rounds once, as a
  multiplier without fused add would.
* :func:`exp`, :func:`expm1`, :func:`log`, :func:`power`, :func:`tanh`,
  :func:`sigmoid`, :func:`sin`, :func:`cos` evaluate in float64 (argument reduction + a polynomial, Horner's
  rule), accurate to a few float64 ulps, far below the float32 / BF16 result the
  callers round to.  A caller rounds the float64 result once to its type.
"""
from __future__ import annotations

import numpy as np

__all__ = ["matmul", "exp", "expm1", "log", "power", "tanh", "sigmoid", "sin", "cos"]

# Temporaries of matmul stay under this many elements (rows are processed in blocks).
_BLOCK_ELEMENTS = 1 << 22
# Below this many outputs per block, matmul uses accumulate (see there).
_INNER_MIN = 16


def matmul(a, b, *, acc=np.float32, init=None) -> np.ndarray:
    """``init + a @ b`` with each output's products added in increasing k, in ``acc``.

    ``a`` is ``[m, k]`` (or ``[k]``), ``b`` is ``[k, n]`` (or ``[k]``), as for ``@``;
    ``init`` (broadcast to the result) is the accumulator's starting value (a MAC
    array continuing a partial sum), else the sum starts at the first product.
    Returns an array of ``acc`` (a scalar array for vector @ vector).
    """
    acc = np.dtype(acc)
    a = np.asarray(a)
    b = np.asarray(b)
    vec_a, vec_b = a.ndim == 1, b.ndim == 1
    A = a.reshape(1, -1) if vec_a else a
    B = b.reshape(-1, 1) if vec_b else b
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not chain")
    m, k = A.shape
    n = B.shape[1]
    A = A.astype(acc, copy=False)
    B = B.astype(acc, copy=False)
    out = np.empty((m, n), acc)
    start = None if init is None else np.broadcast_to(np.asarray(init, acc).reshape(
        (1, 1) if np.ndim(init) == 0 else np.shape(init) if np.ndim(init) == 2 else (m, n)), (m, n))
    if k == 0:
        out[...] = 0 if start is None else start
    else:
        At = np.ascontiguousarray(A.T)                          # [k, m]: the reduction axis outermost
        rows = max(1, _BLOCK_ELEMENTS // max(1, k * n))
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            # the products, each rounded once, laid out [k, rows, n] (C order: k outermost)
            terms = np.multiply(At[:, r0:r1, None], B[:, None, :], order="C")
            if start is not None:                               # the accumulator's value enters first
                terms = np.concatenate([start[None, r0:r1, :], terms], axis=0)
            if (r1 - r0) * n < _INNER_MIN:
                # too few outputs: numpy would reduce along k as its inner loop (pairwise); accumulate is
                # the running sum by definition
                out[r0:r1] = np.add.accumulate(terms, axis=0)[-1]
            else:
                # a reduction over the outermost axis of a C-ordered array is ``out += terms[k]`` for
                # k = 0, 1, ...: sequential per element (tests/test_numerics.py checks it bit for bit)
                np.add.reduce(terms, axis=0, out=out[r0:r1])
    if vec_a and vec_b:
        return out.reshape(())
    if vec_a:
        return out.reshape(n)
    if vec_b:
        return out.reshape(m)
    return out


def _horner(r: np.ndarray, coeffs) -> np.ndarray:
    """``c0 + r (c1 + r (c2 + ...))`` for coefficients from the constant term up."""
    p = np.full_like(r, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = p * r + c
    return p


_INV_FACT = [1.0]
for _i in range(1, 30):
    _INV_FACT.append(_INV_FACT[-1] / _i)

# ln 2 split so that k * _LN2_HI is exact for |k| < 2**20 (Cody and Waite).
_LN2_HI = 6.93147180369123816490e-01   # 0x3FE62E42FEE00000
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_EXP_COEFFS = _INV_FACT[:15]           # exp(r), |r| <= ln2/2: r**15/15! < 4e-19


def exp(x) -> np.ndarray:
    """``e**x`` in float64 (module docstring): ``2**k * exp(r)``, ``x = k ln2 + r``."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        xc = np.clip(x, -1100.0, 1100.0)     # beyond: inf / 0 from ldexp; NaN stays NaN
        k = np.rint(xc * _INV_LN2)
        r = (xc - k * _LN2_HI) - k * _LN2_LO
        p = _horner(r, _EXP_COEFFS)
        y = np.ldexp(p, np.nan_to_num(k).astype(np.int64))
    return np.where(np.isnan(x), x, y)


def expm1(x) -> np.ndarray:
    """``e**x - 1`` in float64, accurate for small ``|x|`` too (Taylor below 1/2)."""
    x = np.asarray(x, np.float64)
    small = np.abs(x) < 0.5
    series = x * _horner(x, _INV_FACT[1:21])      # |x| < 1/2: x**20/20! < 1e-24
    return np.where(small, series, exp(x) - 1.0)


_SQRT_HALF = 0.70710678118654757   # sqrt(1/2), the lower end of the mantissa range below


def log(x) -> np.ndarray:
    """Natural log in float64: ``x = 2**k m`` with ``m`` in [sqrt(1/2), sqrt(2)), ``log m = 2 atanh s``,
    ``s = (m - 1) / (m + 1)`` (``|s| < 0.172``; the odd series to s**25 is exact to float64)."""
    x = np.asarray(x, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        m, k = np.frexp(x)                      # x = m 2**k, m in [1/2, 1)
        low = m < _SQRT_HALF
        m = np.where(low, m * 2.0, m)
        k = np.where(low, k - 1, k).astype(np.float64)
        s = (m - 1.0) / (m + 1.0)
        s2 = s * s
        series = 2.0 * s * _horner(s2, [1.0 / (2 * i + 1) for i in range(13)])
        y = (k * _LN2_HI + series) + k * _LN2_LO
    y = np.where(x == 0, -np.inf, y)
    y = np.where(x < 0, np.nan, y)
    return np.where(np.isposinf(x), np.inf, np.where(np.isnan(x), x, y))


def power(base, exponent) -> np.ndarray:
    """``base ** exponent`` for ``base > 0`` in float64, as ``exp(exponent log base)``."""
    return exp(np.asarray(exponent, np.float64) * log(base))


def tanh(x) -> np.ndarray:
    """``tanh x`` in float64: ``e / (e + 2)`` with ``e = expm1(2|x|)``, sign restored."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        e = expm1(2.0 * np.abs(np.clip(x, -40.0, 40.0)))      # tanh(40) is 1 in float64
        t = e / (e + 2.0)
    return np.where(np.isnan(x), x, np.copysign(t, x))


def sigmoid(x) -> np.ndarray:
    """``1 / (1 + e**-x)`` in float64."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + exp(-np.asarray(x, np.float64)))


# pi/2 split for the reduction x = k pi/2 + r (k * _PIO2_HI exact for |k| < 2**20).
_PIO2_HI = 1.57079632673412561417e+00     # 0x3FF921FB54400000
_PIO2_LO = 6.07710050650619224932e-11
_INV_PIO2 = 6.36619772367581382433e-01
_SIN_COEFFS = [(-1) ** i * _INV_FACT[2 * i + 1] for i in range(11)]   # odd series in r**2, |r| <= pi/4
_COS_COEFFS = [(-1) ** i * _INV_FACT[2 * i] for i in range(11)]


def _sincos(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(x, np.float64)
    if np.any(np.abs(x[np.isfinite(x)]) > 1e5):
        raise ValueError("numerics.sin/cos: |x| > 1e5 is outside the two-part reduction's exact range")
    with np.errstate(invalid="ignore"):
        k = np.rint(x * _INV_PIO2)
        r = (x - k * _PIO2_HI) - k * _PIO2_LO
        r2 = r * r
        s = r * _horner(r2, _SIN_COEFFS)
        c = _horner(r2, _COS_COEFFS)
    q = np.nan_to_num(k).astype(np.int64) & 3
    return s, c, q


def sin(x) -> np.ndarray:
    """``sin x`` in float64 for ``|x| <= 1e5`` (quadrant reduction, Taylor on ``|r| <= pi/4``)."""
    s, c, q = _sincos(x)
    y = np.select([q == 0, q == 1, q == 2], [s, c, -s], -c)
    return np.where(np.isfinite(np.asarray(x, np.float64)), y, np.nan)


def cos(x) -> np.ndarray:
    """``cos x`` in float64 for ``|x| <= 1e5``."""
    s, c, q = _sincos(x)
    y = np.select([q == 0, q == 1, q == 2], [c, -s, -c], s)
    return np.where(np.isfinite(np.asarray(x, np.float64)), y, np.nan)

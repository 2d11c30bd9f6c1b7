"""emulator.numerics: the order of its sums, bit for bit, and the accuracy of its functions."""
import numpy as np
import pytest

from emulator import numerics


def sequential(a, b, acc, init=None):
    """The spec of numerics.matmul, element by element in Python: init, then products in increasing k."""
    A = np.atleast_2d(np.asarray(a)).astype(acc)
    B = np.asarray(b).reshape(np.shape(b)[0], -1).astype(acc)
    m, k = A.shape
    n = B.shape[1]
    out = np.zeros((m, n), acc)
    for i in range(m):
        for j in range(n):
            terms = [A[i, kk] * B[kk, j] for kk in range(k)]
            s = acc(init[i, j]) if init is not None else terms.pop(0)
            for t in terms:
                s = acc(s + t)
            out[i, j] = s
    return out


SHAPES = [(1, 5, 1), (1, 300, 1), (2, 300, 1), (1, 300, 3), (3, 200, 5), (8, 64, 32), (17, 129, 2), (200, 60, 1),
          (1, 100, 40), (4, 4, 4)]


@pytest.mark.parametrize("acc", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_sums_each_output_in_increasing_k(shape, acc):
    m, k, n = shape
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    # magnitudes spread over six decades: any other order of the sum rounds differently
    a = (rng.standard_normal((m, k)) * 10.0 ** rng.integers(-3, 3, (m, k))).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    assert np.array_equal(numerics.matmul(a, b, acc=acc), sequential(a, b, acc))
    init = rng.standard_normal((m, n)).astype(acc)
    assert np.array_equal(numerics.matmul(a, b, acc=acc, init=init), sequential(a, b, acc, init))


def test_matmul_differs_from_a_pairwise_order():
    """The check above can fail: the same data summed pairwise (numpy's inner-axis sum) differs."""
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((1, 4096)) * 10.0 ** rng.integers(-3, 3, (1, 4096))).astype(np.float32)
    b = rng.standard_normal((4096, 1)).astype(np.float32)
    pairwise = (a[0] * b[:, 0]).sum(dtype=np.float32)
    assert numerics.matmul(a, b)[0, 0] != pairwise


def test_matmul_vector_shapes_and_blocks(monkeypatch):
    rng = np.random.default_rng(2)
    W = rng.integers(-8, 8, (50, 70)).astype(np.int8)
    x = rng.standard_normal(70).astype(np.float32)
    y = numerics.matmul(W, x, acc=np.float64)
    assert y.shape == (50,) and y.dtype == np.float64
    monkeypatch.setattr(numerics, "_BLOCK_ELEMENTS", 100)      # several row blocks give the same bits
    assert np.array_equal(numerics.matmul(W, x, acc=np.float64), y)
    assert numerics.matmul(x, x).shape == ()
    with pytest.raises(ValueError, match="do not chain"):
        numerics.matmul(W, W)


def test_functions_are_accurate_to_float64():
    x = np.linspace(-700, 700, 20001)
    assert np.max(np.abs(numerics.exp(x) / np.exp(x) - 1)) < 1e-15
    t = np.linspace(-20, 20, 20001)
    assert np.max(np.abs(numerics.tanh(t) - np.tanh(t))) < 1e-15
    s = np.concatenate([np.linspace(-1e-8, 1e-8, 101), np.linspace(-0.6, 0.6, 101)])
    assert np.max(np.abs(numerics.expm1(s) / np.where(s == 0, 1, np.expm1(s)) - np.where(s == 0, 0, 1))) < 1e-15
    r = np.linspace(-1e4, 1e4, 20001)
    assert np.max(np.abs(numerics.sin(r) - np.sin(r))) < 1e-11
    assert np.max(np.abs(numerics.cos(r) - np.cos(r))) < 1e-11
    g = np.geomspace(1e-300, 1e300, 20001)
    assert np.max(np.abs(numerics.log(g) - np.log(g)) / np.maximum(np.abs(np.log(g)), 1.0)) < 1e-15
    e = -np.arange(0, 256, 2) / 256
    assert np.max(np.abs(numerics.power(10000.0, e) / 10000.0 ** e - 1)) < 1e-14
    assert np.max(np.abs(numerics.sigmoid(t) - 1 / (1 + np.exp(-t)))) < 1e-15


def test_special_values():
    assert list(numerics.exp([np.inf, -np.inf, 1000.0, -1000.0])) == [np.inf, 0.0, np.inf, 0.0]
    assert np.isnan(numerics.exp([np.nan]))[0] and np.isnan(numerics.tanh([np.nan]))[0]
    assert list(numerics.tanh([np.inf, -np.inf, 0.0])) == [1.0, -1.0, 0.0]
    assert list(numerics.log([0.0, 1.0, np.inf])) == [-np.inf, 0.0, np.inf] and np.isnan(numerics.log([-1.0]))[0]
    with pytest.raises(ValueError, match="1e5"):
        numerics.sin([1e6])

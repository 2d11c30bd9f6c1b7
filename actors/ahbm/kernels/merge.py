"""Flash-attention building blocks in ``tl`` (seed §3, §4; reference/ahbm.md §3.3).

* :func:`init_running` - the running state ``m = -inf, l = 0, O = 0`` (fp32);
* :func:`fold_tile` - one online-softmax step over a score tile ``S`` and its ``V``;
* :func:`lse_merge` - the log-sum-exp merge of two partial states
  ``m = max(ma, mb); l = la e^(ma-m) + lb e^(mb-m); O = Oa e^(ma-m) + Ob e^(mb-m)``,
  = :func:`lse_scales` (everything on ``[M]``: needs only ``m`` and ``l``) then the
  ``[M, d]`` update, so a reduction can start a merge when a child's ``m, l`` arrived
  and wait for its ``O`` only for the last two ops (gqa_attention._reduce).
"""
from __future__ import annotations

__all__ = ["init_running", "fold_tile", "lse_merge", "lse_scales", "NEG_INF"]

NEG_INF = float("-inf")


def init_running(tl, M: int, d: int):
    return tl.full((M, 1), NEG_INF), tl.zeros((M, 1)), tl.zeros((M, d))


def fold_tile(tl, m, l, O, S, v, composite: bool = False):
    """Online softmax (FlashAttention-2 forward): fold scores ``S [M, T]`` and values ``v [T, d]``.

    ``composite=False``: ``v`` is in the TCM and ``P @ V`` is a blocking ``tl.dot`` (the
    baseline of seed §A); ``True``: ``P @ V`` is a non-blocking ``tl.composite`` on the PE
    scheduler (the seed's hybrid, §1), ``P`` read from the TCM, ``v`` an HBM ``tl.ref`` (or a
    TCM block), the result written to the TCM (§B.3).
    """
    m_new = tl.maximum(m, tl.max(S, axis=-1))
    P = tl.exp(S - m_new)
    corr = tl.exp(m - m_new)
    l = l * corr + tl.sum(P, axis=-1)
    Oj = tl.composite("gemm", a=P, b=v) if composite else tl.dot(P, v)
    O = O * corr + Oj
    return m_new, l, O


def lse_scales(tl, a, b):
    """The ``[M]`` half of a log-sum-exp merge of ``a = (ma, la)`` and ``b``: ``(m, sa, sb, l)``."""
    ma, la = a
    mb, lb = b
    m = tl.maximum(ma, mb)
    sa = tl.exp(ma - m)
    sb = tl.exp(mb - m)
    return m, sa, sb, la * sa + lb * sb


def lse_merge(tl, a, b):
    """Log-sum-exp merge of partial states ``a = (m, l, O)`` and ``b`` (seed §4)."""
    m, sa, sb, l = lse_scales(tl, a[:2], b[:2])
    return m, l, a[2] * sa + b[2] * sb

"""The kernels' fp32 arithmetic, exactly as the CPU emulation's default numerics do it, in NumPy.

The backward's precision model is bit-identical to the emulated kernels (docs/design.md
section 9.2), so its building blocks reproduce each instruction exactly, not to within an ulp:

* ``fma32(a, b, c)``: ``fmaf``, one rounding of the exact ``a * b + c`` to fp32. In float64
  ``a * b`` is exact but ``a * b + c`` may round, and a second rounding to fp32 can then land
  on the other side of a tie; the float64 sum's error (TwoSum) breaks such ties.
* ``mma(acc, A, B)``: ``mma.sync.m16n8k16`` chained over the contraction in steps of 16, as
  the emulation's twin computes each step: ``fp32(acc + a_0 b_0 + ... + a_15 b_15)`` with the
  sum taken in float64 in this order (16-bit products are exact in float64).

Values are float64 arrays holding fp32 (or bf16) values, as in ``precision.py``.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def fma32(a, b, c):
    """Correctly rounded fp32 fused multiply-add of fp32 values (float64 arrays in and out)."""
    a, b, c = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    with np.errstate(over="ignore", invalid="ignore"):
        p = a * b
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        r = s.astype(F32)
        r64 = r.astype(np.float64)
        toward = np.where(s > r64, np.inf, -np.inf).astype(F32)
        other = np.nextafter(r, toward)
        tie = (s != r64) & ((s - r64) == (other.astype(np.float64) - s))
        fix = tie & (err != 0) & ((err > 0) == (other > r))
        out = np.where(fix, other, r).astype(np.float64)
    return out


def mma(acc, A, B):
    """acc [..., M, N] (fp32 values, or None for zeros) plus A [..., M, Kc] @ B [..., Kc, N]
    (16-bit values), in mma steps of 16 along Kc, each rounded once to fp32."""
    Kc = A.shape[-1]
    assert Kc % 16 == 0 and B.shape[-2] == Kc
    shape = np.broadcast_shapes(A.shape[:-2], B.shape[:-2]) + (A.shape[-2], B.shape[-1])
    out = np.zeros(shape) if acc is None else np.broadcast_to(np.asarray(acc, np.float64), shape).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for k0 in range(0, Kc, 16):
            s = out
            for k in range(k0, k0 + 16):
                s = s + A[..., :, k, None] * B[..., None, k, :]
            out = s.astype(F32).astype(np.float64)
    return out


def neg_bf(x):
    """-x for bf16 values: a sign flip, exact (the kernels flip the operand's sign bits)."""
    return -np.asarray(x, dtype=np.float64)


def seq_sum(terms, axis, start=0.0):
    """fp32 running sum ``r32(...r32(start + t_0) + t_1 ...)`` along ``axis``."""
    terms = np.moveaxis(np.asarray(terms, dtype=np.float64), axis, 0)
    acc = np.broadcast_to(np.asarray(start, np.float64), terms.shape[1:]).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for t in terms:
            acc = (acc + t).astype(F32).astype(np.float64)
    return acc


def fma_chain(a, b, axis, start=0.0):
    """``fmaf`` running sum ``fma(a_n, b_n, ... fma(a_0, b_0, start))`` along ``axis``."""
    a = np.moveaxis(np.asarray(a, dtype=np.float64), axis, 0)
    b = np.moveaxis(np.asarray(b, dtype=np.float64), axis, 0)
    acc = np.broadcast_to(np.asarray(start, np.float64), np.broadcast_shapes(a.shape[1:], b.shape[1:])).copy()
    for x, y in zip(a, b):
        acc = fma32(x, y, acc)
    return acc


def xor_tree8(p):
    """The fp32 sum of a row's 8 threads' values p[0..7] by xor shuffles 4, 2, 1 (the kernels' row phases):
    ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))."""
    r = lambda x: np.asarray(x, np.float64).astype(F32).astype(np.float64)  # noqa: E731
    with np.errstate(over="ignore", invalid="ignore"):
        return r(r(r(p[0] + p[4]) + r(p[2] + p[6])) + r(r(p[1] + p[5]) + r(p[3] + p[7])))

"""What the backward recomputes with the forward's kernels, instruction for instruction.

``kda_prepare`` and ``kda_recurrence`` (with its per-chunk state store) are modelled here to
the bit, as the CPU emulation's default numerics run them: every ``fmaf`` and every
``mma.sync`` step rounded where the kernel rounds (``backward_arith``), every partial sum in
the kernel's order. The steps are those of ``precision.py`` ([1]-[15]); where
``precision.py`` rounds a whole matmul or sum once (an approximation within the forward's
parity tolerance), this module follows the kernel exactly:

- [1] l2norm: each row's sum of squares is 8 partial ``fmaf`` chains over K/8 adjacent
  channels (one per thread), combined by the xor-shuffle tree ``((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7))``;
- [6] L, Mf: mma steps of 16 channels (Mf: three passes, q_m k_i, q_m k_il, q_ml k_i); the pair
  form's ``fmaf`` chain over the channels;
- [8] the forward substitution's ``fmaf`` chain;
- [12]-[15] W, U and dS: mma steps (16 channels, 16 tokens); the state update one ``fmaf``.
"""
from __future__ import annotations

import numpy as np

from .backward_arith import fma32, mma, xor_tree8
from .dtypes import round_bf16, round_f32
from .precision import EPS_F32, chunk_decay, decayed_operands, ex2, pair_form_chunks

r32, bf = round_f32, round_bf16


def l2norm_exact(x):
    """[1] (x normalised, the rsqrt factor [..., 1]) of fp32 rows [..., K]."""
    K = x.shape[-1]
    seg = K // 8
    parts = []
    for j in range(8):
        acc = np.zeros(x.shape[:-1])
        for i in range(j * seg, (j + 1) * seg):
            acc = fma32(x[..., i], x[..., i], acc)
        parts.append(acc)
    ss = xor_tree8(parts)
    with np.errstate(divide="ignore"):
        r = r32(1.0 / np.sqrt(r32(ss + EPS_F32)))[..., None]
    return r32(x * r), r


def _pair(a, b, gc, mask):
    """[6] pair form: fmaf chain over channels of r32(a_i b_j) * ex2(r32(gc_i - gc_j)), masked."""
    K = a.shape[-1]
    acc = np.zeros(a.shape[:-2] + (a.shape[-2], b.shape[-2]))
    for c in range(K):
        w = ex2(r32(gc[..., :, None, c] - gc[..., None, :, c]))
        acc = fma32(r32(a[..., :, None, c] * b[..., None, :, c]), w, acc)
    return np.where(mask, acc, 0.0)


def solve_unit_lower_exact(Lb):
    """[8] X = (I + Lb)^-1, one column per thread, the fmaf chain in j order."""
    C = Lb.shape[-1]
    X = np.zeros(Lb.shape)
    for i in range(C):
        acc = np.broadcast_to(np.eye(C)[i], Lb.shape[:-1]).copy()
        for j in range(i):
            acc = fma32(-Lb[..., i, j, None], X[..., j, :], acc)
        X[..., i, :] = acc
    return X


def prepare_exact(qn, kn, g2, beta, scale):
    """[4]-[9] of kda_prepare on [..., 16, K] chunks (beta [..., 16]): the workspace operands
    (q_dec, k_dec, k_res, INV, Mqk as bf16 values, gexp fp32) and what the backward also needs
    (the factored form's q_m, k_m, k_i, gc and its reference gr, L before beta, Lb, the pair-form
    flag per chunk)."""
    C = g2.shape[-2]
    gc, gt, gr = chunk_decay(g2)
    op = decayed_operands(qn, kn, gc, gt, gr, scale)
    i = np.arange(C)
    strict, incl = i[:, None] > i[None, :], i[:, None] >= i[None, :]
    k_iT, k_ilT = np.swapaxes(op["k_i"], -1, -2), np.swapaxes(op["k_il"], -1, -2)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 only in chunks that take the pair form
        L = np.where(strict, mma(None, op["k_m"], k_iT), 0.0)
        Mf = np.where(incl, mma(mma(mma(None, op["q_m"], k_iT), op["q_m"], k_ilT), op["q_ml"], k_iT), 0.0)
    unsafe = pair_form_chunks(gc, gr)
    if np.any(unsafe):
        L[unsafe] = _pair(kn[unsafe], kn[unsafe], gc[unsafe], strict)
        Mf[unsafe] = _pair(r32(qn[unsafe] * scale), kn[unsafe], gc[unsafe], incl)
    Lb = np.where(strict, r32(L * beta[..., :, None]), 0.0)
    INV = bf(solve_unit_lower_exact(Lb))
    return dict(op, INV=INV, Mqk=bf(Mf), gexp=ex2(gt[..., 0, :]), gc=gc, gr=gr, L=L, Lb=Lb, unsafe=unsafe)


def chunk_states(H, ops, v, beta, state_precision):
    """kda_recurrence without its output, storing the state at each chunk's start ([10]-[15]).
    H [N, HV, K, V] as loaded ([10]); ops from prepare_exact on [N, HV, chunks, 16, .]; v
    [N, HV, chunks, 16, V]. Returns the states [N, HV, chunks, V, K] (the kernel's [V, K]
    orientation) as the kernel holds them: bf16 values, or fp32 with state_precision="fp32"."""
    T = lambda x: np.swapaxes(x, -1, -2)  # noqa: E731
    nchunks = v.shape[2]
    out = np.zeros(v.shape[:3] + (v.shape[-1], H.shape[-2]))
    for c in range(nchunks):
        out[:, :, c] = T(H)
        Ht = T(bf(H))  # [11] the state as the A operand, [V, K]
        kd, kr, inv = ops["k_dec"][:, :, c], ops["k_res"][:, :, c], ops["INV"][:, :, c]
        Wt = mma(None, Ht, T(kd))  # [12] W^T [V, 16], steps of 16 channels
        vsub = bf(r32(beta[:, :, c, None, :] * r32(T(v[:, :, c]) - Wt)))
        Ut = bf(mma(None, vsub, T(inv)))  # [13] U^T = vsub^T INV^T
        dSt = mma(None, Ut, kr)  # [15] dS^T [V, K] = U^T k_res
        H = fma32(H, ops["gexp"][:, :, c, :, None], T(dSt))
        if state_precision == "bf16":
            H = bf(H)
    return out

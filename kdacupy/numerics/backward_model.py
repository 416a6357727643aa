"""NumPy model of the backward kernels, bit for bit (docs/design.md section 9.2).

``kda_backward_model`` computes what ``kda_backward(backend="cuda")`` computes: each value is
rounded to the type the kernels hold it in, at the same point, every fp32 sum in the kernels'
order (``backward_arith``: exact ``fmaf``, mma steps of 16). On the CPU emulation's default
numerics the kernels give these results to the bit; on a GPU the approximate instructions and
the tensor cores' sums differ by ulps (docs/design.md section 2). Chunks of 16 tokens, bf16
operands for every matmul, fp32 accumulation. ``r32``/``bf``: round to fp32 / bf16; ``fma``:
one rounding; ``mma(A B)``: steps of 16 along the contraction, each rounded once; padded rows
of a ragged chunk are zeros.

recompute (the forward's kernels, ``backward_recompute``):
  R1. kda_prepare: the workspace operands q_dec, k_dec, k_res, INV, Mqk, gexp (precision.py [1]-[9]).
  R2. kda_recurrence without output, storing the state S_c entering each chunk, as held (bf16,
      or fp32 with state_precision="fp32"), [V, K] ([10]-[15]).
kda_bwd_chain (head-parallel, chunks in reverse; D = dS^T [V, K] in fp32 registers):
  C1. D = dfinal_state (fp32; zeros without one).
  C2. per chunk: Dop = bf(D), stored: dS_c, the gradient at the chunk's end.
  C3. dU^T = bf(r32(Hi + Lo)), Hi = mma(dO^T Mqk) then + mma(Dop k_res^T), Lo = mma(Dlo k_res^T)
      from zero, Dlo = bf(ftz(D - Dop)) D's low part, dO as bf16. Under a slow decay D
      gathers the whole sequence's gradient and dU^T is what cancels of it: Dop alone measured
      dA_log 1.3e-2 at x = -12 (T = 2048), with its low part 1.4e-3.
  C4. dY^T = mma(dU^T INV);  dX^T = r32(dY^T * beta).
  C5. acc = mma(dO^T q_dec) then + mma(-bf(dX^T) k_dec);  D = fma(D, gexp, acc).
  C6. dinitial_state = D in initial_state's dtype and layout (a zero-length sequence: dfinal_state).
kda_bwd_chunk (token-parallel; one CTA per chunk and query head, its value heads in order):
  P1. q, k: l2norm [1] (kept: qn, kn and the rsqrt factors); per value head the prepare
      steps [2]-[9] again (gc, gr, q_m, k_m, k_i, L before beta too), bit-identical to R1, but
      for Mqk, read from R1's workspace (its Mf takes the low parts of q_m and k_i as well).
  per V-block of VBLOCK value columns, in order:
  B1. W = mma(k_dec S_op^T), S_op = bf(S_c);  X = r32(v - W);  Y = bf(r32(beta * X)).
  B2. U = bf(mma(INV Y));  dU = bf(mma(Mqk^T dO) then + mma(k_res dS_c^T)).
  B3. dY = mma(INV^T dU);  dX = r32(beta * dY): dv.
  B4. chains continued across blocks: dLb~ = mma(bf(dY) U^T), dM = mma(dO U^T),
      dQd = mma(dO S_op), dKd = mma(-bf(dX) S_op), dKr = mma(U dS_c);
      dbeta_i = the fp32 sum (from 0, in order) over the 16-column groups of (c_0 + c_1) + (c_2 + c_3), c_t the
      fma chain of dY_iv X_iv over the group's columns 2t, 2t + 1, 2t + 8, 2t + 9, in order; dge_d = (c_0 + c_1) + (c_2 + c_3) in fp32,
      c_t the fma chain of dS_c S_c over the values v = 2t, 2t + 1, 2t + 8, 2t + 9 (mod 16), in order
      (S_c as held; an mma fragment's rows of lane t).
  after the blocks:
  B5. dLb = -dLb~ strictly below the diagonal, dM on and below it; dbeta_i continues its fma
      chain with dLb_ij L_ij (j < i); dL = r32(beta_i dLb); dbeta through the beta sigmoid:
      r32(dbeta r32(sig(b) sig(-b))) (x2 exact for allow_neg_eigval).
  B6. factored chunks (q_m, k_m, k_i: precision.py [5], measured from the reference gr), each
      carried to 16 bits by its low part x_l = bf(ftz(x_f - x)) of the fp32 product x_f it was
      rounded from (q_ml, k_il: precision.py's; k_ml alike, k_mf = r32(kn em)):
      dQm = mma(bf(dM) k_i) then + mma(bf(dM) k_il), dKm = mma(bf(dL) k_i) then + mma(bf(dL) k_il),
      dKi = mma(bf(dL)^T k_m), + mma(bf(dM)^T q_m), + mma(bf(dL)^T k_ml), + mma(bf(dM)^T q_ml).
      k_il in dQm, dKm: with q nearly parallel to k under the l2norm, dq is what its projection
      leaves of dqn, and k_i's rounding alone (2^-9 of dqn, in any direction) measured 0.63 of dq
      under a fast decay. q_ml, k_ml in dKi: B7's decay terms (below).
      Pair chunks (precision.py [6]'s test; E_xy = ex2(r32(gc_x - gc_y)) per channel, fma chains
      over the partner row in order):
      A_r = sum_{j<=r} r32(dM_rj kn_j) E_rj, B_r = sum_{j<r} r32(dL_rj kn_j) E_rj,
      Cm_r = sum_{i>=r} r32(dM_ir qs_i) E_ir, Cl_r = sum_{i>r} r32(dL_ir kn_i) E_ir, qs = r32(qn scale).
  B7. per element, e = ex2(gc), es = r32(e scale), er = ex2(r32(gc_last - gc)): the state's terms
      (through q_dec, k_dec, k_res), as soon as B4's chains end,
      tq_s = r32(dQd es), dk_s = r32(r32(dKd e) + r32(dKr er)), kt = r32(k_res dKr),
      g_s = r32(r32(q_dec dQd) + r32(k_dec dKd));
      then the in-chunk terms, scaled apart (factored chunks: em = ex2(r32(gc - gr)),
      ei = ex2(r32(gr - gc)); x16 = x + x_l, exact in fp32):
      tq_m = r32(dQm r32(em scale))                   [pair: r32(A scale)]
      dk_m = r32(r32(dKm em) + Mi), Mi = r32(dKi ei)  [pair: r32(B + Mi), Mi = r32(Cm + Cl)]
      g_m = r32(r32(q16 dQm) + r32(km16 dKm)), g2 = r32(ki16 dKi)
                                                      [pair: r32(r32(qs A) + r32(kn B)), r32(kn Mi)]
      dgam = r32(r32(g_s + g_m) - g2). dqn, dkn: fp32 sums over the group's value heads in order,
      each head's state part (tq_s, dk_s) then its in-chunk part (tq_m, dk_m).
      The decay's terms take each gradient times the very operand it came through, the same on
      both sides of an in-chunk pair's term (added at one row, taken from another), so that it
      cancels to fp32 precision (bf16-rounded factors on one side only would leave 2^-9 of it,
      measured 1e-2 of dg); and to 16 bits: near the gate's lower bound (e^-5 a token) the terms
      left after the pairs' cancellation are e^-5 of the ones that cancel, and bf16 q_m, k_m, k_i
      there measured dA_log 1.8e-2 (benchmarks/backward-accuracy.md).
  B8. per channel (natural-log units): dg_i = r32(suf_i + r32(pre_i + r32(gexp dge))), suf_i the
      fp32 sum of dgam_j over j >= i from the last row, pre_i of kt_j over j < i from the first.
      Gates (x = r32(g + dt_bias), a = ex2(r32(A_log log2e))): log: dg; softplus:
      -r32(r32(a s) dg) with s = 1 for x > 15 else rcp(r32(1 + ex2(r32(-x log2e)))), dA_log
      terms r32(dg r32(g2 ln2)); sigmoid: y = r32(a x), s as for y, dy = r32(r32(lb r32(s r32(1 - s))) dg),
      dx = r32(a dy), dA_log terms r32(dy y). Per chunk: ddt_bias partials (sum over rows in
      order), dA_log partials (rows in order per channel, then channels in order).
  B9. dq = r32(rq fma(-qn, dot, dqn)) (l2norm; else dqn), dot = ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7))
      in fp32, t_s the fma chain of qn dqn over the channels c with (c // E) % 8 = s in order (kda_bwd_chunk's 8
      threads a row, 16-byte pieces of E channels: E = 8 for 16-bit q, 4 for fp32); dk alike.
kda_bwd_reduce: dA_log, ddt_bias = fp32 sums of the per-chunk partials, chunks in order.

Head dims without variants of their own (K, V in [16, 256] outside {64, 128, 256}) run on the key
and value tiles (kdacupy/numerics/tiles.py): the model, as the kernels, runs over every array
padded with zeros to the tiles, a padded channel's gate 0 and its dA_log terms +0 (the kernels skip
it), and cuts the gradients back to the true sizes (docs/design.md section 2).
"""
from __future__ import annotations

import math

import numpy as np

from .backward_arith import fma32, fma_chain, mma, seq_sum, xor_tree8
from .backward_recompute import chunk_states, l2norm_exact, prepare_exact
from .dtypes import ftz_f32, round_bf16, round_f32, round_to
from .precision import CHUNK, LOG2E_F32, Chunks, beta_f32, ex2, gate_f32, scale_f32, sigmoid_f32
from .reference import state_from_kv, state_to_kv
from .tiles import exact_dims, pad_to, tile_of

r32, bf = round_f32, round_bf16
LN2_F32 = float(np.float32(math.log(2.0)))


def row_dot(x, y, E: int):
    """B9's dot product of each row (last axis): 8 fma chains, chain s over the channels c with (c // E) % 8 = s
    in order, summed by kda_bwd_chunk's xor shuffles (xor_tree8)."""
    K = x.shape[-1]
    t = [fma_chain(x[..., cs], y[..., cs], axis=-1) for cs in ([c for c in range(K) if c // E % 8 == s] for s in range(8))]
    return xor_tree8([np.broadcast_to(a, x.shape[:-1]) for a in t])


def dge_chains(n: int) -> list[list[int]]:
    """B4's dge: the value rows (of a block's first n) of each lane t's chain, in order: kda_bwd_chunk
    forms it from the mma fragments of S_c and dS_c, where lane t holds rows 2t, 2t + 1, 2t + 8, 2t + 9
    of each 16."""
    return [[v for v in range(n) if v % 16 in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9)] for t in range(4)]


def vblock(K: int) -> int:
    """Value columns kda_bwd_chunk handles at a time (its shared memory holds one block of S and dS)."""
    return 64 if K <= 128 else 16


def _T(x):
    return np.swapaxes(x, -1, -2)


def chain(ops, dO, dfinal, nchunks):
    """C1-C5: (dstates [N, HV, chunks, V, K] bf16 values, D at the start [N, HV, V, K])."""
    D = dfinal.copy()
    dstates = np.zeros(dO.shape[:3] + (dO.shape[-1], D.shape[-1]))
    for c in reversed(range(nchunks)):
        Dop = bf(D)
        dstates[:, :, c] = Dop
        dOt = _T(bf(dO[:, :, c]))  # [V, 16]
        kr = _T(ops["k_res"][:, :, c])
        dUt = bf(r32(mma(mma(None, dOt, ops["Mqk"][:, :, c]), Dop, kr) + mma(None, bf(ftz_f32(D - Dop)), kr)))
        dYt = mma(None, dUt, ops["INV"][:, :, c])
        dXt = r32(dYt * ops["beta"][:, :, c, None, :])
        acc = mma(mma(None, dOt, ops["q_dec"][:, :, c]), -bf(dXt), ops["k_dec"][:, :, c])
        D = fma32(D, ops["gexp"][:, :, c, None, :], acc)
    return dstates, D


def _pair_sums(dM, dL, qs, kn, gc):
    """B6's pair chunks: (A, B, Cm, Cl) per element [..., 16, K]."""
    C = gc.shape[-2]
    A, B, Cm, Cl = (np.zeros(kn.shape) for _ in range(4))
    rows = np.arange(C)
    for p in range(C):  # partner row, in order
        E_rp = ex2(r32(gc - gc[..., p:p + 1, :]))      # E_{r p}, r the element's row
        E_pr = ex2(r32(gc[..., p:p + 1, :] - gc))      # E_{p r}
        mA, mB = (p <= rows)[:, None], (p < rows)[:, None]
        mC, mD = (p >= rows)[:, None], (p > rows)[:, None]
        A = np.where(mA, fma32(r32(dM[..., :, p, None] * kn[..., p:p + 1, :]), E_rp, A), A)
        B = np.where(mB, fma32(r32(dL[..., :, p, None] * kn[..., p:p + 1, :]), E_rp, B), B)
        Cm = np.where(mC, fma32(r32(dM[..., p, :, None] * qs[..., p:p + 1, :]), E_pr, Cm), Cm)
        Cl = np.where(mD, fma32(r32(dL[..., p, :, None] * kn[..., p:p + 1, :]), E_pr, Cl), Cl)
    return A, B, Cm, Cl


def chunk_grads(ops, qn, kn, v, dO, beta, S, dS, scale, state_precision):
    """B1-B7 for every chunk at once ([N, HV, chunks, ...]). Returns per value head:
    tq, dkn (each [2, ...]: the state's part, the in-chunk part), dgam, kt, dge (with dbeta before
    the sigmoid, dv)."""
    K, V = kn.shape[-1], v.shape[-1]
    BV = vblock(K)
    S_op = bf(S)
    dLb = dM = dQd = dKd = dKr = None
    dbv = np.zeros(beta.shape)
    dge4 = np.zeros(S.shape[:-2] + (4, K))  # the chains c_t
    dv = np.zeros(v.shape)
    bcol = beta[..., :, None]
    dOb = bf(dO)
    for v0 in range(0, V, BV):
        sl = slice(v0, v0 + BV)
        Sb, Sv, dSb = S_op[..., sl, :], S[..., sl, :], dS[..., sl, :]
        W = mma(None, ops["k_dec"], _T(Sb))                                            # B1
        X = r32(v[..., sl] - W)
        Y = bf(r32(bcol * X))
        U = bf(mma(None, ops["INV"], Y))                                                # B2
        dU = bf(mma(mma(None, _T(ops["Mqk"]), dOb[..., sl]), ops["k_res"], _T(dSb)))
        dY = mma(None, _T(ops["INV"]), dU)                                              # B3
        dX = r32(bcol * dY)
        dv[..., sl] = dX
        dLb = mma(dLb, bf(dY), _T(U))                                                   # B4
        dM = mma(dM, dOb[..., sl], _T(U))
        dQd = mma(dQd, dOb[..., sl], Sb)
        dKd = mma(dKd, -bf(dX), Sb)
        dKr = mma(dKr, U, dSb)
        for g0 in range(0, X.shape[-1], 16):
            c = [fma_chain(dY[..., g0 + np.array(cols)], X[..., g0 + np.array(cols)], axis=-1) if cols else 0.0
                 for cols in dge_chains(min(16, X.shape[-1] - g0))]
            dbv = r32(dbv + r32(r32(c[0] + c[1]) + r32(c[2] + c[3])))
        for t, rows in enumerate(dge_chains(Sv.shape[-2])):
            dge4[..., t, :] = fma_chain(dSb[..., rows, :], Sv[..., rows, :], axis=-2, start=dge4[..., t, :])
    dge = r32(r32(dge4[..., 0, :] + dge4[..., 1, :]) + r32(dge4[..., 2, :] + dge4[..., 3, :]))
    C = CHUNK
    i = np.arange(C)
    strict, incl = i[:, None] > i[None, :], i[:, None] >= i[None, :]
    dLb = np.where(strict, -dLb, 0.0)                                                   # B5
    dM = np.where(incl, dM, 0.0)
    db = dbv
    for j in range(C):
        db = np.where(j < i, fma32(dLb[..., :, j], ops["L"][..., :, j], db), db)
    dL = r32(bcol * dLb)
    gc, gr = ops["gc"], ops["gr"]
    with np.errstate(invalid="ignore", over="ignore"):
        em, ei = ex2(r32(gc - gr)), ex2(r32(gr - gc))
        # the factored operands' low parts (precision.py [5]'s q_ml, k_il; k_m's alike): hi + lo, exact
        # in fp32, is each operand to 16 bits, and both sides of a pair's term take the same sums
        q_m, k_m, k_i = ops["q_m"], ops["k_m"], ops["k_i"]
        q_ml, k_il = ops["q_ml"], ops["k_il"]
        k_ml = bf(ftz_f32(r32(kn * em) - k_m))
        dQm = mma(mma(None, bf(dM), k_i), bf(dM), k_il)                                   # B6
        dKm = mma(mma(None, bf(dL), k_i), bf(dL), k_il)
        dKi = mma(mma(mma(mma(None, _T(bf(dL)), k_m), _T(bf(dM)), q_m), _T(bf(dL)), k_ml), _T(bf(dM)), q_ml)
        q2, km2, ki2 = q_m + q_ml, k_m + k_ml, k_i + k_il
        e = ex2(gc)
        es, er = r32(e * scale), ex2(r32(gc[..., -1:, :] - gc))
        # B7: the state's terms (at the chains' end), then the in-chunk terms
        tq_s = r32(dQd * es)
        dk_s = r32(r32(dKd * e) + r32(dKr * er))
        g_s = r32(r32(ops["q_dec"] * dQd) + r32(ops["k_dec"] * dKd))
        kt = r32(ops["k_res"] * dKr)
        tq_m = r32(dQm * r32(em * scale))
        Mi = r32(dKi * ei)
        dk_m = r32(r32(dKm * em) + Mi)
        g_m = r32(r32(q2 * dQm) + r32(km2 * dKm))
        g2 = r32(ki2 * dKi)
    if np.any(ops["unsafe"]):
        u = ops["unsafe"]
        qs = r32(qn[u] * scale)
        A, B, Cm, Cl = _pair_sums(dM[u], dL[u], qs, kn[u], gc[u])
        tq_m[u] = r32(A * scale)
        Mi_u = r32(Cm + Cl)
        dk_m[u] = r32(B + Mi_u)
        g_m[u] = r32(r32(qs * A) + r32(kn[u] * B))
        g2[u] = r32(kn[u] * Mi_u)
    dgam = r32(r32(g_s + g_m) - g2)
    # dqn, dkn take each value head's state part, then its in-chunk part (B7's sums over the group)
    tq, dkn_c = np.stack([tq_s, tq_m]), np.stack([dk_s, dk_m])
    return dict(tq=tq, dkn=dkn_c, dgam=dgam, kt=kt, dge=dge, dbeta=db, dv=dv)


def gate_grads(dgam, kt, dge, gexp, g, g2, gate, A_log, dt_bias, lower_bound):
    """B8 on [N, HV, chunks, 16, K]: (dg of the raw gate input, per-element dA_log terms or None)."""
    C = dgam.shape[-2]
    G = r32(gexp * dge)[..., None, :]
    suf = np.zeros(dgam.shape)
    acc = np.zeros(dgam.shape[:-2] + dgam.shape[-1:])
    for i in reversed(range(C)):
        acc = r32(acc + dgam[..., i, :])
        suf[..., i, :] = acc
    pre = np.zeros(dgam.shape)
    acc = np.zeros(acc.shape)
    for i in range(C):
        pre[..., i, :] = acc
        acc = r32(acc + kt[..., i, :])
    dgn = r32(suf + r32(pre + G))
    if gate == "log":
        return dgn, None
    HV, K = dgn.shape[1], dgn.shape[-1]
    shape = (1, HV, 1, 1, 1)
    a = np.ones(shape) if A_log is None else ex2(r32(np.asarray(A_log, np.float64) * LOG2E_F32)).reshape(shape)
    bias = 0.0 if dt_bias is None else np.asarray(dt_bias, np.float64).reshape(1, HV, 1, 1, K)
    x = r32(g + bias)
    if gate == "softplus":
        with np.errstate(over="ignore"):
            s = np.where(x > 15.0, 1.0, sigmoid_f32(x))
        dx = -r32(r32(a * s) * dgn)
        dA = r32(dgn * r32(g2 * LN2_F32))
    else:
        y = r32(a * x)
        ds = r32(sigmoid_f32(y) * sigmoid_f32(-y))  # s (1 - s), both factors accurate when saturated
        dy = r32(r32(float(np.float32(lower_bound)) * ds) * dgn)
        dx = r32(a * dy)
        dA = r32(dy * y)
    return dx, (None if A_log is None else dA)


def beta_grad(db, beta, beta_mode):
    """B5's last step: through the beta sigmoid (raw beta: unchanged)."""
    if beta_mode in ("none", "raw"):
        return db
    b = np.asarray(beta, np.float64)
    d = r32(db * r32(sigmoid_f32(b) * sigmoid_f32(-b)))
    return 2.0 * d if beta_mode == "sigmoid2" else d


def kda_backward_model(
    do, q, k, v, g, beta=None, *, dfinal_state=None, scale=None, initial_state=None, cu_seqlens=None,
    qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
    lower_bound=None, state_layout="kv", state_precision="bf16",
):
    """The backward kernels' result, in NumPy. Inputs in their storage dtypes; returns
    (dq, dk, dv, dg, dbeta, dinitial_state, dA_log, ddt_bias) in the arguments' dtypes."""
    K, V = q.shape[-1], v.shape[-1]
    if exact_dims(K, V):
        return _model(do, q, k, v, g, beta, dfinal_state=dfinal_state, scale=scale, initial_state=initial_state,
                      cu_seqlens=cu_seqlens, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
                      allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=A_log, dt_bias=dt_bias,
                      lower_bound=lower_bound, state_layout=state_layout, state_precision=state_precision)
    KT, VT = tile_of(K), tile_of(V)
    kax, vax = (-2, -1) if state_layout == "kv" else (-1, -2)  # the states' key and value axes
    state = lambda s: None if s is None else pad_to(pad_to(np.asarray(s), kax, KT), vax, VT)  # noqa: E731
    bias = None if dt_bias is None else pad_to(np.asarray(dt_bias).reshape(v.shape[2], K), -1, KT)
    if bias is not None and np.ndim(dt_bias) == 1:
        bias = bias.reshape(-1)
    out = _model(pad_to(np.asarray(do), -1, VT), pad_to(np.asarray(q), -1, KT), pad_to(np.asarray(k), -1, KT),
                 pad_to(np.asarray(v), -1, VT), pad_to(np.asarray(g), -1, KT), beta, dfinal_state=state(dfinal_state),
                 scale=scale_f32(scale, K), initial_state=state(initial_state), cu_seqlens=cu_seqlens,
                 qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval, gate=gate,
                 A_log=A_log, dt_bias=bias, lower_bound=lower_bound, state_layout=state_layout,
                 state_precision=state_precision, kdim=K)
    dq, dk, dv, dg, dbeta, dinit, dA_log, ddt = out
    cut = lambda x, axis, n: np.ascontiguousarray(np.take(x, np.arange(n), axis=axis))  # noqa: E731
    if dinit is not None:
        dinit = cut(cut(dinit, kax, K), vax, V)
    if ddt is not None:
        ddt = cut(ddt.reshape(v.shape[2], KT), -1, K).reshape(np.shape(dt_bias))
    return cut(dq, -1, K), cut(dk, -1, K), cut(dv, -1, V), cut(dg, -1, K), dbeta, dinit, dA_log, ddt


def _model(do, q, k, v, g, beta=None, *, dfinal_state, scale, initial_state, cu_seqlens, qk_l2norm, beta_sigmoid,
           allow_neg_eigval, gate, A_log, dt_bias, lower_bound, state_layout, state_precision, kdim=None):
    """kda_backward_model on arrays of the tile sizes; ``kdim``: the true key dim where the arrays are
    padded (its channels' gate 0, their dA_log terms +0)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    qn, kn = f64(q), f64(k)
    rq = rk = None
    if qk_l2norm:
        (qn, rq), (kn, rk) = l2norm_exact(qn), l2norm_exact(kn)
    beta_mode = "none" if beta is None else ("sigmoid2" if allow_neg_eigval else "sigmoid") if beta_sigmoid else "raw"
    g2 = gate_f32(f64(g), gate, A_log, dt_bias, lower_bound)
    if kdim is not None:
        g2[..., kdim:] = 0.0
    b = beta_f32(beta, (B, T, HV), beta_sigmoid, allow_neg_eigval)
    scale32 = scale_f32(scale, K)

    ch = Chunks.of(B, T, cu_seqlens)
    N, nchunks, lengths = ch.N, ch.nchunks, ch.lengths
    rep = lambda x: np.repeat(x, G, axis=2)  # noqa: E731
    qc, kc, vc, gcn, bc, doc, graw = (ch.split(x) for x in (rep(qn), rep(kn), f64(v), g2, b, f64(do), f64(g)))
    ops = prepare_exact(qc, kc, gcn, bc, scale32)                                     # R1, P1
    ops["beta"] = bc

    S0 = np.zeros((N, HV, K, V)) if initial_state is None else state_to_kv(initial_state, state_layout)
    H0 = bf(S0) if state_precision == "bf16" else r32(S0)
    S = chunk_states(H0, ops, vc, bc, state_precision)                               # R2
    dSL = np.zeros((N, HV, V, K)) if dfinal_state is None else _T(state_to_kv(dfinal_state, state_layout))
    dS, D0 = chain(ops, doc, dSL, nchunks)                                           # C1-C5
    out = chunk_grads(ops, qc, kc, vc, doc, bc, S, dS, scale32, state_precision)     # B1-B7

    live = (np.arange(nchunks * CHUNK)[None, :] < lengths[:, None]).reshape(N, 1, nchunks, CHUNK, 1)
    dx, dA = gate_grads(out["dgam"], out["kt"], out["dge"], ops["gexp"], graw, gcn, gate, A_log, dt_bias,
                        lower_bound)                                                 # B8
    dx = np.where(live, dx, 0.0)
    dA_log = ddt = None
    if dA is not None:
        if kdim is not None:
            dA[..., kdim:] = 0.0
        per_chunk = seq_sum(seq_sum(np.where(live, dA, 0.0), axis=-2), axis=-1)      # [N, HV, chunks]
        dA_log = seq_sum(np.moveaxis(per_chunk, 1, -1).reshape(N * nchunks, HV), axis=0).astype(np.float32)
    if dt_bias is not None:
        per_chunk = seq_sum(dx, axis=-2)                                              # [N, HV, chunks, K]
        ddt = seq_sum(np.moveaxis(per_chunk, 1, 2).reshape(N * nchunks, HV, K), axis=0)
        ddt = ddt.reshape(np.shape(dt_bias)).astype(np.float32)

    # B7's sums over the group, then B9
    grp = lambda x: np.stack([ch.join(x[0]), ch.join(x[1])], axis=-2).reshape(B, T, H, 2 * G, K)  # noqa: E731
    tq, dkc = grp(out["tq"]), grp(out["dkn"])  # per value head in order, its state part then its in-chunk part
    dqn, dkn = seq_sum(tq, axis=3), seq_sum(dkc, axis=3)
    if qk_l2norm:
        E = 16 // np.dtype(q.dtype).itemsize
        dq = r32(rq * fma32(-qn, row_dot(qn, dqn, E)[..., None], dqn))
        dk = r32(rk * fma32(-kn, row_dot(kn, dkn, E)[..., None], dkn))
    else:
        dq, dk = dqn, dkn

    dbeta = None if beta is None else _store(beta_grad(ch.join(out["dbeta"][..., None])[..., 0], beta, beta_mode),
                                             beta.dtype)
    dinit = None
    if initial_state is not None:
        D0 = np.where((lengths == 0)[:, None, None, None], dSL, D0)                  # C6
        dinit = state_from_kv(_T(D0), state_layout)
        dinit = _store(dinit, initial_state.dtype)
    return (_store(dq, q.dtype), _store(dk, k.dtype), _store(ch.join(out["dv"]), v.dtype), _store(ch.join(dx), g.dtype),
            dbeta, dinit, dA_log, ddt)


def _store(x, dtype):
    """fp32 values stored in ``dtype`` (round to nearest even), as the kernels' stores do."""
    dt = np.dtype(dtype)
    return round_to(x, dt).astype(dt)

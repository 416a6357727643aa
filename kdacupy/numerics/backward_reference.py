"""Float64 reference of the KDA backward: the gradients every backend is measured against.

The loss is ``sum(o * do) + sum(final_state * dfinal_state)`` (docs/design.md
section 9). Two forms of the core gradient, derived by hand (no autodiff):

* ``form="recurrent"``: the reverse-time sweep of the token-by-token definition.
  With ``Sp = diag(a_t) S_{t-1}`` (``a_t = exp(g_t)``), ``r_t = v_t - Sp^T k_t``,
  ``u_t = beta_t r_t``, ``S_t = Sp + k_t u_t^T``, ``o_t = scale S_t^T q_t`` and
  ``dS`` the gradient of the loss with respect to ``S_t``::

      dS   += scale q_t do_t^T;       dq_t = scale S_t do_t
      du    = dS^T k_t;               dk_t = dS u_t
      dbeta = r_t . du;               dr   = beta_t du;   dv_t = dr
      dk_t -= Sp dr;                  dSp  = dS - k_t dr^T
      dg_t  = rowsum(dSp * Sp);       dS   = diag(a_t) dSp      (the transposed transition)

  The states are recomputed segment by segment from checkpoints every
  ``checkpoint`` tokens, so memory stays at one segment's states.
* ``form="chunked"``: an independent derivation through the chunkwise WY form
  (``kdacupy.numerics.reference.chunked_form``), every product of two decays
  taken elementwise (``exp(gc_i - gc_j)``), so no decay overflows.

Both work on activated inputs (l2norm, gates and beta applied); the options'
own derivatives (l2norm, the beta sigmoid, the gate activations with A_log
and dt_bias, grouped value heads) are applied after, in ``kda_backward_reference``.
"""
from __future__ import annotations

import numpy as np

from .reference import (L2NORM_EPS, activate_beta, activate_gate, pack, sequence_bounds, sigmoid, state_from_kv,
                        state_to_kv, unpack)

# ---------------------------------------------------------------------------
# the core: gradients with respect to the activated q, k, v, g (natural log decay), beta, S0
# inputs padded [N, L, HV, ...] float64; states [N, HV, K, V]


def _step(S, q, k, v, g, beta, scale):
    """One token: (S_{t-1} decayed, r, u, S_t, o_t)."""
    Sp = np.exp(g)[..., None] * S
    r = v - np.einsum("nhk,nhkv->nhv", k, Sp)
    u = beta[..., None] * r
    St = Sp + k[..., None] * u[..., None, :]
    return Sp, r, u, St, scale * np.einsum("nhk,nhkv->nhv", q, St)


def recurrent_grad(q, k, v, g, beta, S0, do, dSL, scale, checkpoint=64):
    """Reverse-time sweep. Returns (dq, dk, dv, dg, dbeta, dS0) on the padded layout."""
    L = q.shape[1]
    C = max(1, int(checkpoint))
    starts, S = [], S0.copy()
    for t0 in range(0, L, C):
        starts.append(S)
        for t in range(t0, min(L, t0 + C)):
            S = _step(S, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale)[3]
    dq, dk, dg = np.zeros(q.shape), np.zeros(k.shape), np.zeros(g.shape)
    dv, dbeta = np.zeros(v.shape), np.zeros(beta.shape)
    dS = dSL.copy()
    for seg in reversed(range(len(starts))):
        t0 = seg * C
        prev = [starts[seg]]  # prev[i] = S_{t0 + i - 1}
        for t in range(t0, min(L, t0 + C) - 1):
            prev.append(_step(prev[-1], q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale)[3])
        for t in reversed(range(t0, min(L, t0 + C))):
            Sp, r, u, St, _ = _step(prev[t - t0], q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale)
            dS = dS + scale * q[:, t, :, :, None] * do[:, t, :, None, :]
            dq[:, t] = scale * np.einsum("nhkv,nhv->nhk", St, do[:, t])
            du = np.einsum("nhkv,nhk->nhv", dS, k[:, t])
            dk[:, t] = np.einsum("nhkv,nhv->nhk", dS, u)
            dbeta[:, t] = np.sum(r * du, axis=-1)
            dr = beta[:, t, :, None] * du
            dv[:, t] = dr
            dk[:, t] -= np.einsum("nhkv,nhv->nhk", Sp, dr)
            dSp = dS - k[:, t, :, :, None] * dr[:, :, None, :]
            dg[:, t] = np.sum(dSp * Sp, axis=-1)
            dS = np.exp(g[:, t])[..., None] * dSp
    return dq, dk, dv, dg, dbeta, dS


def _pairs(gc, mask):
    """exp(gc_i - gc_j) where ``mask`` [C, C] holds, else 0; [..., C, C, K]."""
    diff = gc[..., :, None, :] - gc[..., None, :, :]
    return np.exp(np.where(mask[..., None], diff, -np.inf))


def chunked_grad(q, k, v, g, beta, S0, do, dSL, scale, chunk_size=16):
    """The chunkwise derivation. Per chunk, with gc the in-chunk cumulative decay,
    E_ij = exp(gc_i - gc_j) elementwise per channel, A_ij = sum_d k_id k_jd E_ijd
    (i > j), M_ij = scale sum_d q_id k_jd E_ijd (i >= j), X = V - (K e^gc) S0,
    U = (I + diag(beta) A)^-1 diag(beta) X, O = scale (Q e^gc) S0 + M U and
    S_end = e^gc_last S0 + (K e^(gc_last - gc))^T U::

        dU = M^T dO + Kr dS_end;  dY = (I + diag(beta) A)^-T dU;  dX = beta dY = dV
        dbeta = rowsum(dY X) + rowsum(dLb A),  dLb = -(dY U^T) below the diagonal
        dA = beta dLb;  dM = dO U^T on and below it
        dS_start = scale (Q e^gc)^T dO + e^gc_last dS_end - (K e^gc)^T dX

    and the decays' gradient dg = reverse cumsum over the chunk of each factor's
    ``x * dx`` (signed by its exponent), plus the last row's terms on every row.
    Returns (dq, dk, dv, dg, dbeta, dS0) on the padded layout."""
    N, L, HV, K = k.shape
    C = int(chunk_size)
    Lp = -(-L // C) * C
    heads_first = lambda x: np.ascontiguousarray(  # noqa: E731
        np.moveaxis(np.pad(x, [(0, 0), (0, Lp - L)] + [(0, 0)] * (x.ndim - 2)), 1, 2))
    q, k, v, g, beta, do = (heads_first(x) for x in (q, k, v, g, beta, do))
    idx = np.arange(C)
    strict, incl = idx[:, None] > idx[None, :], idx[:, None] >= idx[None, :]
    T_ = lambda x: np.swapaxes(x, -1, -2)  # noqa: E731

    def chunk(c):
        sl = slice(c * C, (c + 1) * C)
        qc, kc, vc, bc, doc = q[:, :, sl], k[:, :, sl], v[:, :, sl], beta[:, :, sl], do[:, :, sl]
        gc = np.cumsum(g[:, :, sl], axis=2)
        E_A, E_M = _pairs(gc, strict), _pairs(gc, incl)
        A = np.einsum("...id,...jd,...ijd->...ij", kc, kc, E_A)
        M = scale * np.einsum("...id,...jd,...ijd->...ij", qc, kc, E_M)
        G, R = np.exp(gc), np.exp(gc[:, :, -1:] - gc)
        INV = np.linalg.inv(np.eye(C) + bc[..., None] * A)
        return qc, kc, vc, bc, doc, gc, E_A, E_M, A, M, G, R, INV

    starts, S = [], S0.copy()
    for c in range(Lp // C):
        starts.append(S)
        qc, kc, vc, bc, doc, gc, E_A, E_M, A, M, G, R, INV = chunk(c)
        U = INV @ (bc[..., None] * (vc - (kc * G) @ S))
        S = np.exp(gc[:, :, -1])[..., None] * S + T_(kc * R) @ U
    dq, dk, dg = np.zeros(q.shape), np.zeros(k.shape), np.zeros(g.shape)
    dv, dbeta = np.zeros(v.shape), np.zeros(beta.shape)
    dS = dSL.copy()
    for c in reversed(range(Lp // C)):
        sl = slice(c * C, (c + 1) * C)
        S0c = starts[c]
        qc, kc, vc, bc, doc, gc, E_A, E_M, A, M, G, R, INV = chunk(c)
        gexp = np.exp(gc[:, :, -1])
        X = vc - (kc * G) @ S0c
        U = INV @ (bc[..., None] * X)
        dU = T_(M) @ doc + (kc * R) @ dS
        dY = T_(INV) @ dU
        dX = bc[..., None] * dY
        dLb = np.where(strict, -(dY @ T_(U)), 0.0)
        dA = bc[..., None] * dLb
        dM = np.where(incl, doc @ T_(U), 0.0)
        dbeta[:, :, sl] = np.sum(dY * X, axis=-1) + np.sum(dLb * A, axis=-1)
        # the state terms: q e^gc, k e^gc, k e^(gc_last - gc) and e^gc_last
        dqd, dkd, dkr = doc @ T_(S0c), -(dX @ T_(S0c)), U @ T_(dS)
        dqc = scale * G * dqd
        dkc = G * dkd + R * dkr
        dgam = scale * qc * G * dqd + kc * G * dkd - kc * R * dkr
        dlast = np.sum(kc * R * dkr, axis=2) + gexp * np.sum(dS * S0c, axis=-1)
        # the in-chunk pairs: P_ijd = dX_ij x_id y_jd E_ijd adds to row i's decay and takes from row j's
        PA = dA[..., None] * kc[..., :, None, :] * kc[..., None, :, :] * E_A
        PM = scale * dM[..., None] * qc[..., :, None, :] * kc[..., None, :, :] * E_M
        dqc += scale * np.einsum("...ij,...jd,...ijd->...id", dM, kc, E_M)
        dkc += np.einsum("...ij,...jd,...ijd->...id", dA, kc, E_A) + np.einsum("...ij,...id,...ijd->...jd", dA, kc, E_A)
        dkc += scale * np.einsum("...ij,...id,...ijd->...jd", dM, qc, E_M)
        dgam += (PA + PM).sum(axis=-2) - (PA + PM).sum(axis=-3)
        dq[:, :, sl], dk[:, :, sl], dv[:, :, sl] = dqc, dkc, dX
        dg[:, :, sl] = np.cumsum(dgam[:, :, ::-1], axis=2)[:, :, ::-1] + dlast[:, :, None, :]
        dS = scale * T_(qc * G) @ doc + gexp[..., None] * dS - T_(kc * G) @ dX
    back = lambda x: np.moveaxis(x, 2, 1)[:, :L]  # noqa: E731
    return back(dq), back(dk), back(dv), back(dg), back(dbeta), dS


# ---------------------------------------------------------------------------
# the options' derivatives and the public entry


def l2norm_backward(x, dxn):
    """d/dx of x / sqrt(sum x^2 + eps) applied to dxn: r (dxn - xn (xn . dxn))."""
    r = 1.0 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)
    xn = x * r
    return r * (dxn - xn * np.sum(xn * dxn, axis=-1, keepdims=True))


def gate_backward(dgate, g, gate, A_log, dt_bias, lower_bound):
    """(dg, dA_log, ddt_bias) from the gradient of the natural log decay ``dgate``."""
    if gate == "log":
        return dgate, None, None
    g = np.asarray(g, dtype=np.float64)
    HV, K = g.shape[-2:]
    a = np.ones(HV) if A_log is None else np.exp(np.asarray(A_log, np.float64).reshape(HV))
    x = g if dt_bias is None else g + np.asarray(dt_bias, np.float64).reshape(HV, K)
    if gate == "softplus":  # -a softplus(x): d/dx = -a sigmoid(x), d/dA_log = the gate itself
        dx = -a[:, None] * sigmoid(x) * dgate
        dA = dgate * activate_gate(g, gate, A_log, dt_bias, lower_bound)
    else:  # lower_bound sigmoid(a x): d/dy = lb s (1 - s), y = a x
        s = sigmoid(a[:, None] * x)
        dy = float(lower_bound) * s * (1.0 - s) * dgate
        dx, dA = a[:, None] * dy, dy * a[:, None] * x
    dA_log = None if A_log is None else np.sum(dA, axis=(0, 1, 3))
    ddt = None if dt_bias is None else np.sum(dx, axis=(0, 1)).reshape(np.shape(dt_bias))
    return dx, dA_log, ddt


def beta_backward(dbeta, beta, beta_sigmoid, allow_neg_eigval):
    if beta is None:
        return None
    if not beta_sigmoid:
        return dbeta
    s = sigmoid(np.asarray(beta, dtype=np.float64))
    return dbeta * s * (1.0 - s) * (2.0 if allow_neg_eigval else 1.0)


def kda_backward_reference(
    do, q, k, v, g, beta=None, *, dfinal_state=None, scale=None, initial_state=None, cu_seqlens=None,
    qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
    lower_bound=None, state_layout="kv", form="recurrent", chunk_size=16,
):
    """Gradients of ``sum(o * do) + sum(final_state * dfinal_state)`` in float64, as a tuple
    (dq, dk, dv, dg, dbeta, dinitial_state, dA_log, ddt_bias); None for an argument not given."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    qf, kf = f64(q), f64(k)
    qn, kn = (qf, kf)
    if qk_l2norm:
        from .reference import l2normalize
        qn, kn = l2normalize(qf), l2normalize(kf)
    gf = activate_gate(g, gate, A_log, dt_bias, lower_bound)
    bf = activate_beta(beta, (B, T, HV), beta_sigmoid, allow_neg_eigval)
    scale = K ** -0.5 if scale is None else float(scale)

    bounds = sequence_bounds(B, T, cu_seqlens)
    N = len(bounds)
    Lmax = max([eos - bos for bos, eos in bounds] + [1])
    flat = lambda x: x.reshape((B * T,) + x.shape[2:])  # noqa: E731
    packed = [pack(flat(x), bounds, Lmax) for x in (np.repeat(qn, G, axis=2), np.repeat(kn, G, axis=2), f64(v), gf,
                                                    bf, f64(do))]
    S0 = np.zeros((N, HV, K, V)) if initial_state is None else state_to_kv(initial_state, state_layout)
    dSL = np.zeros((N, HV, K, V)) if dfinal_state is None else state_to_kv(dfinal_state, state_layout)
    if form == "recurrent":
        grads = recurrent_grad(*packed[:5], S0, packed[5], dSL, scale)
    elif form == "chunked":
        grads = chunked_grad(*packed[:5], S0, packed[5], dSL, scale, chunk_size)
    else:
        raise ValueError(f"form: expected 'recurrent' or 'chunked', got {form!r}")
    dqh, dkh, dv, dgate, dbeta = (unpack(x, bounds, B * T).reshape((B, T) + x.shape[2:]) for x in grads[:5])
    dS0 = grads[5]

    dqn = dqh.reshape(B, T, H, G, K).sum(axis=3)  # a query/key head feeds G value heads
    dkn = dkh.reshape(B, T, H, G, K).sum(axis=3)
    dq, dk = (l2norm_backward(qf, dqn), l2norm_backward(kf, dkn)) if qk_l2norm else (dqn, dkn)
    dg, dA_log, ddt_bias = gate_backward(dgate, g, gate, A_log, dt_bias, lower_bound)
    db = beta_backward(dbeta, beta, beta_sigmoid, allow_neg_eigval)
    dS0 = None if initial_state is None else state_from_kv(dS0, state_layout)
    return dq, dk, dv, dg, db, dS0, dA_log, ddt_bias

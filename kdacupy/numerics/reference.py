"""Float64 reference of KDA: the definition every backend is measured against.

Two forms of the same function (docs/design.md section 1):

* ``form="recurrent"``: the token-by-token definition, literally.
* ``form="chunked"``: the chunkwise WY form (chunk size a parameter), exact in
  exact arithmetic and fast enough for T = 8192 in NumPy.

Both take raw inputs (any float dtype), apply the options (l2norm, gate and beta
activation), work in float64 on all sequences and heads at once (sequences are
zero-padded to a common length: a zero token has k = v = q = 0 and g = 0, so it
leaves the state untouched), and return float64 arrays. Validation is the
caller's job (``kdacupy.api``); these functions assume well-formed input.
"""
from __future__ import annotations

import math

import numpy as np

LN2 = math.log(2.0)
L2NORM_EPS = 1e-6


# ---------------------------------------------------------------------------
# options, shared by both forms


def l2normalize(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


def softplus(x):
    return np.logaddexp(0.0, x)


def sigmoid(x):
    # both branches are finite for any x (no exp overflow)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def activate_gate(g, gate="log", A_log=None, dt_bias=None, lower_bound=None):
    """Natural-log decay per token and channel, float64, shape of ``g``."""
    g = np.asarray(g, dtype=np.float64)
    if gate == "log":
        return g
    HV, K = g.shape[-2:]
    a = np.ones(HV) if A_log is None else np.exp(np.asarray(A_log, np.float64).reshape(HV))
    x = g if dt_bias is None else g + np.asarray(dt_bias, np.float64).reshape(HV, K)
    if gate == "softplus":
        return -a[:, None] * softplus(x)
    if gate == "sigmoid":
        return float(lower_bound) * sigmoid(a[:, None] * x)
    raise ValueError(f"gate: unknown mode {gate!r}")


def activate_beta(beta, shape, beta_sigmoid=False, allow_neg_eigval=False):
    if beta is None:
        return np.ones(shape)
    b = np.asarray(beta, dtype=np.float64)
    if beta_sigmoid:
        b = sigmoid(b) * (2.0 if allow_neg_eigval else 1.0)
    return b


def activate_inputs(q, k, g, beta, HV, scale, qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, A_log, dt_bias,
                    lower_bound):
    """The options applied before the recurrence, in float64: q and k (l2-normalised
    when asked, repeated to the HV value heads), the log decay, beta, and the scale."""
    B, T, H, K = q.shape
    qf, kf = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    if qk_l2norm:
        qf, kf = l2normalize(qf), l2normalize(kf)
    qf, kf = np.repeat(qf, HV // H, axis=2), np.repeat(kf, HV // H, axis=2)
    gf = activate_gate(g, gate, A_log, dt_bias, lower_bound)
    bf = activate_beta(beta, (B, T, HV), beta_sigmoid, allow_neg_eigval)
    return qf, kf, gf, bf, K ** -0.5 if scale is None else float(scale)


def sequence_bounds(B, T, cu_seqlens=None):
    """[(bos, eos)] in flattened token index (b * T + t)."""
    if cu_seqlens is None:
        return [(b * T, (b + 1) * T) for b in range(B)]
    cu = [int(c) for c in np.asarray(cu_seqlens)]
    return list(zip(cu[:-1], cu[1:]))


def pack(x, bounds, length):
    """[B*T, ...] -> zero-padded [N, length, ...]."""
    out = np.zeros((len(bounds), length) + x.shape[1:], dtype=np.float64)
    for n, (bos, eos) in enumerate(bounds):
        out[n, : eos - bos] = x[bos:eos]
    return out


def unpack(x, bounds, total):
    out = np.zeros((total,) + x.shape[2:], dtype=np.float64)
    for n, (bos, eos) in enumerate(bounds):
        out[bos:eos] = x[n, : eos - bos]
    return out


def state_to_kv(state, layout):
    s = np.asarray(state, dtype=np.float64)
    return s if layout == "kv" else np.swapaxes(s, -1, -2)


def state_from_kv(state, layout):
    return state if layout == "kv" else np.swapaxes(state, -1, -2)


# ---------------------------------------------------------------------------
# the two forms on padded [N, L, HV, ...] float64 inputs; state [N, HV, K, V]


def recurrent_form(q, k, v, g, beta, S, scale):
    """Token-by-token definition: decay, delta-rule update, read-out."""
    S = S.copy()
    o = np.zeros(v.shape)
    for t in range(q.shape[1]):
        S *= np.exp(g[:, t])[..., None]
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - np.einsum("nhk,nhkv->nhv", kt, S))
        S += kt[..., None] * u[..., None, :]
        o[:, t] = scale * np.einsum("nhk,nhkv->nhv", q[:, t], S)
    return o, S


def _pair_products(a, b, gc, lower):
    """sum_d a_id b_jd exp(gc_id - gc_jd) for the (i, j) kept by ``lower``,
    elementwise (no overflow for any decay); shapes [..., C, K]."""
    diff = gc[..., :, None, :] - gc[..., None, :, :]
    diff = np.where(lower[..., None], diff, -np.inf)
    return np.einsum("...id,...jd,...ijd->...ij", a, b, np.exp(diff))


def chunked_form(q, k, v, g, beta, S, scale, chunk_size=64, on_chunk=None):
    """Chunkwise WY form. Per chunk, with gc the in-chunk cumulative decay:

        (I + A) U = diag(beta) (V - (K * e^gc) S),  A_ij = beta_i (k_i e^gc_i).(k_j e^-gc_j), i > j
        O = scale ((Q * e^gc) S + M U),             M_ij = (q_i e^gc_i).(k_j e^-gc_j), i >= j
        S <- e^gc_last * S + (K * e^(gc_last - gc))^T U

    The factored products are taken about the chunk's middle row so that the
    factors stay in range; chunks whose decay span would still overflow use the
    elementwise pair form. ``on_chunk(end, S)``, if given, sees the state after each chunk.
    """
    N, L, HV, K = k.shape
    C = int(chunk_size)
    Lp = -(-L // C) * C
    # [N, HV, Lp, D], contiguous: per-chunk slices are then cheap views
    heads_first = lambda x: np.ascontiguousarray(  # noqa: E731
        np.moveaxis(np.pad(x, [(0, 0), (0, Lp - L)] + [(0, 0)] * (x.ndim - 2)), 1, 2))
    q, k, v, g, beta = (heads_first(x) for x in (q, k, v, g, beta))
    S = S.copy()
    o = np.zeros(v.shape)
    idx = np.arange(C)
    strict = idx[:, None] > idx[None, :]
    incl = idx[:, None] >= idx[None, :]
    eye = np.eye(C)
    for c0 in range(0, Lp, C):
        sl = slice(c0, c0 + C)
        qc, kc, vc, bc = q[:, :, sl], k[:, :, sl], v[:, :, sl], beta[:, :, sl]
        gc = np.cumsum(g[:, :, sl], axis=2)
        rel = gc - gc[:, :, C // 2 : C // 2 + 1]
        with np.errstate(all="ignore"):
            er = np.exp(rel)
            kd, ki, qd = kc * er, kc / er, qc * er
            kiT = np.swapaxes(ki, -1, -2)
            A = np.where(strict, kd @ kiT, 0.0)
            M = np.where(incl, qd @ kiT, 0.0)
        bad = np.max(np.abs(rel), axis=(-1, -2)) > 600.0
        bad |= ~(np.isfinite(A).all(axis=(-1, -2)) & np.isfinite(M).all(axis=(-1, -2)))
        if np.any(bad):
            A[bad] = _pair_products(kc[bad], kc[bad], gc[bad], strict)
            M[bad] = _pair_products(qc[bad], kc[bad], gc[bad], incl)
        A *= bc[..., None]
        eg = np.exp(gc)
        U = np.linalg.solve(eye + A, bc[..., None] * (vc - (kc * eg) @ S))
        o[:, :, sl] = scale * ((qc * eg) @ S + M @ U)
        glast = gc[:, :, -1:]
        S = np.exp(glast[:, :, 0])[..., None] * S + np.swapaxes(kc * np.exp(glast - gc), -1, -2) @ U
        if on_chunk is not None:
            on_chunk(c0 + C, S)
    o = np.moveaxis(o, 2, 1)
    return o[:, :L], S


# ---------------------------------------------------------------------------
# public entry


def kda_reference(
    q, k, v, g, beta=None, *, scale=None, initial_state=None, output_final_state=False,
    cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False,
    gate="log", A_log=None, dt_bias=None, lower_bound=None, state_layout="kv",
    form="chunked", chunk_size=64, on_chunk=None,
):
    """KDA forward in float64. Returns ``(o, final_state)``: o ``[B, T, HV, V]``,
    final_state ``[N, HV, K, V]`` (``"vk"``: ``[N, HV, V, K]``) or None. ``on_chunk(end, S)``
    (chunked form) sees the state after each chunk, [N, HV, K, V], after each sequence's first
    ``end`` tokens."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    qf, kf, gf, bf, scale = activate_inputs(q, k, g, beta, HV, scale, qk_l2norm, beta_sigmoid, allow_neg_eigval,
                                            gate, A_log, dt_bias, lower_bound)

    bounds = sequence_bounds(B, T, cu_seqlens)
    N = len(bounds)
    L = max([eos - bos for bos, eos in bounds] + [1])
    flat = lambda x: x.reshape((B * T,) + x.shape[2:])  # noqa: E731
    args = [pack(flat(x), bounds, L) for x in (qf, kf, np.asarray(v, dtype=np.float64), gf, bf)]
    if initial_state is None:
        S0 = np.zeros((N, HV, K, V))
    else:
        S0 = state_to_kv(initial_state, state_layout)
    if form == "recurrent":
        o, S = recurrent_form(*args, S0, scale)
    elif form == "chunked":
        o, S = chunked_form(*args, S0, scale, chunk_size, on_chunk)
    else:
        raise ValueError(f"form: expected 'recurrent' or 'chunked', got {form!r}")
    o = unpack(o, bounds, B * T).reshape(B, T, HV, V)
    final = state_from_kv(S, state_layout) if output_final_state else None
    return o, final

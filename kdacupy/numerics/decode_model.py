"""NumPy model of the decode kernel's rounding (``kernels/kda_decode.cu``).

The decode works token by token in fp32 registers, the state loaded once from
the pool into fp32, kept in fp32 across the call's tokens and rounded to the
pool dtype only when stored. ``r32`` rounds to fp32, ``ex2`` is
``ex2.approx.ftz.f32`` computed exactly (kdacupy/numerics/precision.py). Rounding points,
in kernel order, per sequence, value head and token:

  1. inputs q, k, v, g, beta read as fp32 (exact from bf16 / fp16 / fp32);
  2. l2norm, gate (base 2) and beta exactly as the forward's prepare step
     (precision.py steps 1-3: ``l2norm_f32``, ``gate_f32``, ``beta_f32``);
  3. a  = ex2(g2)                      per-channel decay, fp32
     qs = r32(q * scale)               (scale rounded to fp32 once)
     kd = r32(k * a)                   the decayed key
  4. w  = r32(sum_k kd_k S_kv)          the kernel accumulates in fp32 (per-lane FMA chain,
                                        then a xor-shuffle tree); the model sums exactly and
                                        rounds once, so they differ by fp32 ulps (parity.EMULATE)
  5. u  = r32(beta * r32(v - w))
  6. S  = fp32(r32(k_k u_v) + S_kv a_k) one fp32 FMA per element, rounded once
  7. o  = out_dtype(r32(sum_k qs_k S_kv))   (summed as in 4)
  8. when token t's state is stored: pool[slot] = pool_dtype(S) (S stays fp32).
Padded sequences (negative start slot) give o = 0 and touch no slot.
"""
from __future__ import annotations

import numpy as np

from .decode_reference import decode_plan
from .dtypes import round_to
from .precision import beta_f32, ex2, gate_f32, l2norm_f32, r32, scale_f32
from .reference import state_from_kv, state_to_kv


def kda_decode_model(
    q, k, v, g, beta=None, *, state_pool, state_indices, num_accepted_tokens=None, scale=None,
    qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
    lower_bound=None, state_layout="vk",
):
    """The decode kernel's result, modelled in NumPy: updates ``state_pool`` in
    place and returns ``o`` in v's dtype."""
    N, T, H, K = q.shape
    HV = v.shape[2]
    G = HV // H
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    qn, kn = f64(q), f64(k)
    if qk_l2norm:
        qn, kn = l2norm_f32(qn), l2norm_f32(kn)
    qn, kn = np.repeat(qn, G, axis=2), np.repeat(kn, G, axis=2)
    a = ex2(gate_f32(f64(g), gate, A_log, dt_bias, lower_bound))
    b = beta_f32(beta, (N, T, HV), beta_sigmoid, allow_neg_eigval)
    scale32 = scale_f32(scale, K)
    qs, kd = r32(qn * scale32), r32(kn * a)
    vf = f64(v)
    start, write = decode_plan(state_indices, num_accepted_tokens, N, T, state_pool.shape[0])
    o = np.zeros(v.shape)
    for n in np.flatnonzero(start >= 0):
        S = r32(state_to_kv(state_pool[start[n]], state_layout))  # [HV, K, V]
        for t in range(T):
            w = r32(np.einsum("hk,hkv->hv", kd[n, t], S))
            u = r32(b[n, t][:, None] * r32(vf[n, t] - w))
            S = r32(r32(kn[n, t][:, :, None] * u[:, None, :]) + S * a[n, t][:, :, None])
            o[n, t] = r32(np.einsum("hk,hkv->hv", qs[n, t], S))
            if write[n, t] >= 0:
                state_pool[write[n, t]] = state_from_kv(S, state_layout).astype(np.float32).astype(state_pool.dtype)
    return round_to(o, v.dtype).astype(v.dtype)

"""NumPy model of the decode kernel's rounding (``kernels/kda_decode.cu``), to the bit.

The decode works token by token in fp32 registers, the state loaded once from
the pool into fp32, kept in fp32 across the call's tokens and rounded to the
pool dtype only when stored. ``r32`` rounds to fp32, ``ex2`` is
``ex2.approx.ftz.f32`` computed exactly (kdacupy/numerics/precision.py). A sum over the
K keys is the kernel's: each lane's fp32 FMA chain over its keys l, l + 32, ... then a xor
butterfly over the 32 lanes (``warp_dot``). Rounding points, in kernel order, per sequence,
value head and token:

  1. inputs q, k, v, g, beta read as fp32 (exact from bf16 / fp16 / fp32); token t > 0 of a
     tree starts from its parent's state: the previous token's as held, the start slot's
     (parent -1), or another draft's read back from ``step_states`` (rounded to its dtype);
  2. l2norm x * r32(rsqrt(r32(warp_dot(x, x) + 1e-6))), gate (base 2) and beta as the forward's
     prepare step (precision.py steps 2-3: ``gate_f32``, ``beta_f32``);
  3. a  = ex2(g2)                      per-channel decay, fp32
     qs = r32(q * scale)               (scale rounded to fp32 once)
     kd = r32(k * a)                   the decayed key
  4. w  = warp_dot(kd, S[:, v])
  5. u  = r32(beta * r32(v - w))
  6. S  = fma32(S_kv, a_k, r32(k_k u_v)) one fp32 FMA per element, rounded once
  7. o  = out_dtype(warp_dot(qs, S[:, v]))
  8. token t's state to its step row (``step_states[row, t]``, its dtype), then, where the
     pool is written (``update_pool``), to its slot: pool[slot] = pool_dtype(S) (S stays fp32).
Padded sequences (a start slot at or below ``null_slot``, default -1) give o = 0 and touch no slot and no step row.

Head dims (docs/design.md section 2): the kernel holds K rounded up to its key tile (a multiple
of 32), the channels past K read as zero; the model runs over the same padded keys (q, k, g,
dt_bias and the state padded with zeros), so every lane's chain and the butterfly take the
same values, zeros and their signs included, and the padded state stays zero. The scale's
default is the true K's. Value rows are independent of each other: they need no padding.
"""
from __future__ import annotations

import numpy as np

from .backward_arith import fma32
from .decode_reference import decode_plan, tree_plan
from .dtypes import round_to
from .precision import EPS_F32, beta_f32, ex2, gate_f32, r32, scale_f32
from .reference import state_from_kv, state_to_kv


def fma(a, b, c):
    """fma32 (correctly rounded fp32 a * b + c of fp32 values), fast: a * b is exact in float64,
    so rounding the float64 sum to fp32 is right unless that sum sits exactly on an fp32 midpoint
    (the low 29 of its 52 fraction bits 1 followed by zeros: a float64 rounding may have put it
    there) or below the fp32 normals (midpoints there have fewer bits); those take fma32."""
    a, b, c = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (a, b, c)))
    with np.errstate(over="ignore", invalid="ignore"):
        s = a * b + c
    r = s.astype(np.float32).astype(np.float64)
    slow = ((s.view(np.uint64) & 0x1FFFFFFF) == 0x10000000) | (np.abs(s) < 2.0 ** -125)
    if slow.any():
        r[slow] = fma32(a[slow], b[slow], c[slow])
    return r


def warp_dot(a, b):
    """sum_k a_k b_k over the last axis (K keys) as the decode kernel takes it, in fp32."""
    a, b = pad_keys(a), pad_keys(b)  # zero keys: exact zeros in each lane's chain
    a, b = np.broadcast_arrays(a, b)
    lanes = a.shape[:-1] + (a.shape[-1] // 32, 32)  # key 32 i + l: lane l's i-th
    a, b = a.reshape(lanes), b.reshape(lanes)
    x = r32(a[..., 0, :] * b[..., 0, :])  # fma(a, b, 0): the exact product rounded once
    for i in range(1, lanes[-2]):
        x = fma(a[..., i, :], b[..., i, :], x)
    lane = np.arange(32)
    for m in (16, 8, 4, 2, 1):
        x = r32(x + x[..., lane ^ m])
    return x[..., 0]


def key_tile(K: int) -> int:
    """The kernel's key tile for head dim K: K rounded up to a multiple of 32."""
    return -(-K // 32) * 32


def pad_keys(x, axis=-1):
    """x with ``axis`` (K keys) padded with zeros to the key tile."""
    x = np.asarray(x)
    K = x.shape[axis]
    if K % 32 == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, key_tile(K) - K)
    return np.pad(x, pad)


def l2norm_warp(x):
    """[2] x * r32(rsqrt(r32(sum x^2 + 1e-6))), the sum over the warp."""
    return r32(x * r32(1.0 / np.sqrt(r32(warp_dot(x, x) + EPS_F32)))[..., None])


def kda_decode_model(
    q, k, v, g, beta=None, *, state_pool, state_indices, num_accepted_tokens=None, scale=None,
    qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
    lower_bound=None, state_layout="vk", parent_indices=None, step_states=None, step_state_indices=None,
    update_pool=True, null_slot=-1,
):
    """The decode kernel's result, modelled in NumPy: updates ``state_pool`` (unless
    ``update_pool`` is False) and ``step_states`` in place and returns ``o`` in v's dtype."""
    N, T, H, K = q.shape
    HV = v.shape[2]
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    qn, kn = pad_keys(f64(q)), pad_keys(f64(k))  # the kernel's key tile, zeros past K
    if qk_l2norm:
        qn, kn = l2norm_warp(qn), l2norm_warp(kn)
    qn, kn = np.repeat(qn, HV // H, axis=2), np.repeat(kn, HV // H, axis=2)
    bias = None if dt_bias is None else pad_keys(f64(dt_bias).reshape(HV, K))
    a = ex2(gate_f32(pad_keys(f64(g)), gate, A_log, bias, lower_bound))
    b = beta_f32(beta, (N, T, HV), beta_sigmoid, allow_neg_eigval)
    qs, kd = r32(qn * scale_f32(scale, K)), r32(kn * a)  # [3]
    vf = f64(v)
    start, write = decode_plan(state_indices, num_accepted_tokens, N, T, state_pool.shape[0], update_pool,
                               null_slot)
    parent, rows = tree_plan(parent_indices, step_state_indices, step_states, N, T)
    o = np.zeros(v.shape)
    live = np.flatnonzero(start >= 0)  # the live sequences, all at once: [L, HV, K, V]
    kv = lambda x: pad_keys(f64(state_to_kv(x, state_layout)), axis=-2)  # noqa: E731
    true = lambda S: state_from_kv(S[..., :K, :], state_layout)  # noqa: E731  (the stored keys)
    S0 = kv(state_pool[start[live]])  # exact in fp32
    S = S0.copy()
    for t in range(T):
        for i, n in enumerate(live):                                                       # [1]
            if t and parent[n, t] != t - 1:
                S[i] = S0[i] if parent[n, t] < 0 else kv(step_states[rows[n], parent[n, t]])
        w = warp_dot(kd[live, t][:, :, None, :], np.swapaxes(S, -1, -2))                   # [4] [L, HV, V]
        u = r32(b[live, t][..., None] * r32(vf[live, t] - w))                               # [5]
        S = fma(S, a[live, t][..., None], r32(kn[live, t][..., None] * u[:, :, None, :]))  # [6]
        o[live, t] = warp_dot(qs[live, t][:, :, None, :], np.swapaxes(S, -1, -2))          # [7]
        for i, n in enumerate(live):                                                       # [8]
            if rows[n] >= 0:
                step_states[rows[n], t] = round_to(true(S[i]), step_states.dtype)
            if write[n, t] >= 0:
                state_pool[write[n, t]] = round_to(true(S[i]), state_pool.dtype)
    return round_to(o, v.dtype).astype(v.dtype)

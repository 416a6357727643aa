"""Float64 reference of ``kda_decode`` (docs/design.md section 7.1): the token-by-token
definition of docs/design.md section 1, starting from and writing to a state pool.

``decode_plan`` turns the index arguments into one start slot per sequence and
one write slot per (sequence, token); the reference, the precision model and the
tests all read the pool through it, so the index semantics live in one place.
"""
from __future__ import annotations

import numpy as np

from .reference import activate_inputs, state_from_kv, state_to_kv


def decode_plan(state_indices, num_accepted_tokens, N, T, P):
    """(start [N], write [N, T]) slots, -1 meaning none.

    ``[N]`` indices: sequence n starts from ``idx[n]`` and its state after the
    last token is written back there. ``[N, T]``: it starts from
    ``idx[n, a_n - 1]`` (``a_n = num_accepted_tokens[n]``, default 1) and the
    state after token t goes to ``idx[n, t]``. A negative start (or one >= P,
    which only unvalidated device indices can hold) pads the sequence: nothing
    is read or written for it. A negative ``idx[n, t]`` skips that write."""
    idx = np.asarray(state_indices).astype(np.int64)
    if idx.ndim == 1:
        start = idx.copy()
        write = np.full((N, T), -1, dtype=np.int64)
        if T:
            write[:, T - 1] = idx
    else:
        acc = np.ones(N, dtype=np.int64) if num_accepted_tokens is None else \
            np.clip(np.asarray(num_accepted_tokens).astype(np.int64), 1, T)
        start = idx[np.arange(N), acc - 1]
        write = idx.copy()
    start = np.where((start >= 0) & (start < P), start, -1)
    write = np.where((write >= 0) & (write < P) & (start[:, None] >= 0), write, -1)
    return start, write


def store_state(pool, slot, S_kv, layout):
    """Round a [HV, K, V] float64 state to the pool's dtype (through fp32) and store it."""
    pool[slot] = state_from_kv(S_kv, layout).astype(np.float32).astype(pool.dtype)


def kda_decode_reference(
    q, k, v, g, beta=None, *, state_pool, state_indices, num_accepted_tokens=None, scale=None,
    qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
    lower_bound=None, state_layout="vk",
):
    """Decode / verify step in float64; updates ``state_pool`` in place (in its
    dtype) and returns ``o`` [N, T, HV, V] as float64 (zeros for padded sequences)."""
    N, T, H, K = q.shape
    HV = v.shape[2]
    qf, kf, gf, bf, scale = activate_inputs(q, k, g, beta, HV, scale, qk_l2norm, beta_sigmoid, allow_neg_eigval,
                                            gate, A_log, dt_bias, lower_bound)
    vf = np.asarray(v, dtype=np.float64)
    start, write = decode_plan(state_indices, num_accepted_tokens, N, T, state_pool.shape[0])
    o = np.zeros(v.shape)
    for n in np.flatnonzero(start >= 0):
        S = state_to_kv(state_pool[start[n]], state_layout).copy()  # [HV, K, V]
        for t in range(T):
            S *= np.exp(gf[n, t])[:, :, None]
            u = bf[n, t][:, None] * (vf[n, t] - np.einsum("hk,hkv->hv", kf[n, t], S))
            S += kf[n, t][:, :, None] * u[:, None, :]
            o[n, t] = scale * np.einsum("hk,hkv->hv", qf[n, t], S)
            if write[n, t] >= 0:
                store_state(state_pool, write[n, t], S, state_layout)
    return o


def forward_through_pool(kda_forward, problem, a, **kwargs):
    """``kda_forward`` with a state pool on the NumPy backends ("reference",
    "model"): initial states gathered from the pool (zeros for negative slots),
    final states scattered back. (The kernels read and write the pool in place.)"""
    pool, idx = a["state_pool"], np.asarray(a["state_indices"]).astype(np.int64)
    live = idx >= 0
    init = np.zeros((len(idx),) + pool.shape[1:], dtype=pool.dtype)
    init[live] = pool[idx[live]]
    o, final = kda_forward(**kwargs, initial_state=init, output_final_state=True)
    pool[idx[live]] = final[live]
    return o, None

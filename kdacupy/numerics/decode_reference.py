"""Float64 reference of ``kda_decode`` (docs/design.md section 7.1): the token-by-token
definition of docs/design.md section 1, starting from and writing to a state pool.

``decode_plan`` turns the index arguments into one start slot per sequence and
one write slot per (sequence, token), ``tree_plan`` the tree-verify arguments into the
state each token starts from and each sequence's step row; the reference, the
precision model and the tests all read the pool through them, so the index semantics
live in one place.
"""
from __future__ import annotations

import numpy as np

from .reference import activate_inputs, state_from_kv, state_to_kv


def decode_plan(state_indices, num_accepted_tokens, N, T, P, update_pool=True, null_slot=-1):
    """(start [N], write [N, T]) slots, -1 meaning none (every write with ``update_pool`` False).

    ``[N]`` indices: sequence n starts from ``idx[n]`` and its state after the
    last token is written back there. ``[N, T]``: it starts from
    ``idx[n, a_n - 1]`` (``a_n = num_accepted_tokens[n]``, default 1) and the
    state after token t goes to ``idx[n, t]``. A start at or below ``null_slot``
    (default -1: a negative one; or one >= P, which only unvalidated device indices
    can hold) pads the sequence: nothing is read or written for it. An ``idx[n, t]``
    at or below ``null_slot`` skips that write."""
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
    start = np.where((start > null_slot) & (start < P), start, -1)
    write = np.where((write > null_slot) & (write < P) & (start[:, None] >= 0) & bool(update_pool), write, -1)
    return start, write


def tree_plan(parent_indices, step_state_indices, step_states, N, T):
    """(parent [N, T], rows [N]): the state token t starts from, and each sequence's row of
    ``step_states`` (-1: none; every row -1 without step_states).

    parent[n, t] is t - 1 (the previous token's state: a chain), -1 (the start slot's state,
    always for t = 0) or another earlier draft's. ``parent_indices[n, t]`` is followed for
    t >= 1 where sequence n has a step row (its parents' states live there); a value outside
    ``[-1, t)``, which only unchecked device indices can hold, reads as -1. Token 0's entry is
    not read (SGLang leaves 0 there)."""
    parent = np.tile(np.arange(T, dtype=np.int64) - 1, (N, 1))
    rows = np.full(N, -1, dtype=np.int64)
    if step_states is not None:
        R = step_states.shape[0]
        rows = np.arange(N, dtype=np.int64) if step_state_indices is None else \
            np.asarray(step_state_indices).astype(np.int64)
        rows = np.where((rows >= 0) & (rows < R), rows, -1)
    if parent_indices is not None:
        p = np.asarray(parent_indices).astype(np.int64)
        p = np.where((p >= 0) & (p < np.arange(T)), p, -1)
        parent = np.where(rows[:, None] >= 0, p, parent)
    return parent, rows


def step_problems(parents, rows, start, R, T, tree):
    """The first thing wrong with host tree-verify values, as (argument, expected, got), or None.
    ``parents`` [N, T] and ``rows`` [N] may be None (not given, or on the device: unchecked);
    ``start`` [N] (None: unknown) are the start slots. Parents of tokens t >= 1 lie in [-1, t);
    rows are < R, distinct among the live sequences (start >= 0), and, with a tree, given for
    every live sequence (a parent's state is read back from its step state)."""
    if parents is not None and parents.size and T > 1:
        p = parents[:, 1:]
        bad = (p < -1) | (p >= np.arange(1, T))
        if bad.any():
            n, j = np.argwhere(bad)[0]
            return ("parent_indices", "values in [-1, t) for token t >= 1 (-1: the start state; token 0's entry "
                    "is not read)", f"parent_indices[{n}, {j + 1}] = {int(p[n, j])}")
    if rows is None:
        return None
    if rows.size and rows.max() >= R:
        n = int(np.argmax(rows >= R))
        return ("step_state_indices", f"rows < R = {R} of step_states (negative: no step states)",
                f"step_state_indices[{n}] = {int(rows[n])}")
    if start is None:
        return None
    w = np.sort(rows[(start >= 0) & (rows >= 0)], kind="stable")
    dup = np.flatnonzero(w[1:] == w[:-1])
    if dup.size:
        return ("step_state_indices", "distinct rows for the sequences that write step states",
                f"row {int(w[dup[0]])} given more than once")
    missing = np.flatnonzero((start >= 0) & (rows < 0)) if tree else ()
    if len(missing):
        n = int(missing[0])
        return ("step_state_indices", "a row >= 0 for every live sequence with parent_indices (a parent's state "
                "is read back from its step state)", f"step_state_indices[{n}] = {int(rows[n])}")
    return None


def store_state(pool, slot, S_kv, layout):
    """Round a [HV, K, V] float64 state to the pool's dtype (through fp32) and store it."""
    pool[slot] = state_from_kv(S_kv, layout).astype(np.float32).astype(pool.dtype)


def kda_decode_reference(
    q, k, v, g, beta=None, *, state_pool, state_indices, num_accepted_tokens=None, scale=None,
    qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
    lower_bound=None, state_layout="vk", parent_indices=None, step_states=None, step_state_indices=None,
    update_pool=True, null_slot=-1,
):
    """Decode / verify step in float64; updates ``state_pool`` (unless ``update_pool`` is False)
    and ``step_states`` in place (in their dtypes) and returns ``o`` [N, T, HV, V] as float64
    (zeros for padded sequences). A tree keeps every token's state in float64: token t runs
    from its parent's exact state, so each root-to-leaf path is that path run alone."""
    N, T, H, K = q.shape
    HV = v.shape[2]
    qf, kf, gf, bf, scale = activate_inputs(q, k, g, beta, HV, scale, qk_l2norm, beta_sigmoid, allow_neg_eigval,
                                            gate, A_log, dt_bias, lower_bound)
    vf = np.asarray(v, dtype=np.float64)
    start, write = decode_plan(state_indices, num_accepted_tokens, N, T, state_pool.shape[0], update_pool,
                               null_slot)
    parent, rows = tree_plan(parent_indices, step_state_indices, step_states, N, T)
    o = np.zeros(v.shape)
    for n in np.flatnonzero(start >= 0):
        S0 = state_to_kv(state_pool[start[n]], state_layout).astype(np.float64)  # [HV, K, V]
        states = []
        for t in range(T):
            S = (S0 if parent[n, t] < 0 else states[parent[n, t]]).copy()
            S *= np.exp(gf[n, t])[:, :, None]
            u = bf[n, t][:, None] * (vf[n, t] - np.einsum("hk,hkv->hv", kf[n, t], S))
            S += kf[n, t][:, :, None] * u[:, None, :]
            o[n, t] = scale * np.einsum("hk,hkv->hv", qf[n, t], S)
            states.append(S)
            if rows[n] >= 0:
                step_states[rows[n], t] = state_from_kv(S, state_layout).astype(np.float32).astype(step_states.dtype)
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

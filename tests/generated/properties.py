"""The properties a generated case must have (tests/generated/cases.py makes the cases):
checked as differences between backends (the emulated kernels against the precision model, bit
for bit) and as properties of one backend (a padded row or a slot not named is untouched; a
sequence in a batch equals that sequence alone; a pooled prefill equals the plain forward from
the gathered states; each checkpoint equals the forward stopped there)."""
from __future__ import annotations

import numpy as np

import kdacupy

from .cases import arrays, pool_of


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def decode(case, backend):
    """(o, pool after, pool before, slots) of the case's decode step."""
    x, opts = arrays(case, case["N"], case["T"])
    pool = pool_of(case)
    before = pool.copy()
    idx = np.array(case["slots"], np.int32)
    o = kdacupy.kda_decode(**x, **opts, state_pool=pool, state_indices=idx, state_layout=case["layout"],
                           null_slot=case["null"], backend=backend)
    return o, pool, before, idx, x, opts


def check_decode(case, backend="model"):
    o, pool, before, idx, x, opts = decode(case, backend)
    pad = idx <= case["null"]
    assert not np.any(o[pad].astype(np.float64)), "a padded row's output is not zero"
    live = {int(s) for s in idx[~pad]}
    for s in range(case["P"]):
        if s not in live:
            assert same(pool[s], before[s]), f"slot {s} was not named (or was padding) and changed"
    for n in np.flatnonzero(~pad):  # each sequence alone, from the same pool
        alone = before.copy()
        o1 = kdacupy.kda_decode(**{k: v[n:n + 1] for k, v in x.items() if v is not None}, **opts, state_pool=alone,
                                state_indices=idx[n:n + 1], state_layout=case["layout"], null_slot=case["null"],
                                backend=backend)
        assert same(o1[0], o[n]), f"sequence {n}'s output differs from its run alone"
        assert same(alone[idx[n]], pool[idx[n]]), f"sequence {n}'s state differs from its run alone"


def check_decode_backends(case):
    """The emulated decode kernel equals the precision model bit for bit (output and pool)."""
    o_m, pool_m = decode(case, "model")[:2]
    o_e, pool_e = decode(case, "emulate")[:2]
    assert same(o_e, o_m), "emulated decode output differs from the model"
    assert same(pool_e, pool_m), "emulated decode pool differs from the model"


def check_prefill(case, backend="model"):
    """The pooled forward equals the plain forward from the gathered states (zeros for padding), its
    final states land in the named slots only; checkpoints (if any) equal the forward stopped there."""
    lens = case["lens"]
    T = sum(lens)
    x, opts = arrays(dict(case, dtype="bfloat16"), 1, T)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    pool = pool_of(case)
    before = pool.copy()
    idx = np.array(case["slots"], np.int32)
    pad = idx < 0
    layout = case["layout"]
    o, _ = kdacupy.kda_forward(**x, **opts, cu_seqlens=cu, state_pool=pool, state_indices=idx, state_layout=layout,
                               backend=backend)
    init = np.where(pad[:, None, None, None], 0, before[np.maximum(idx, 0)].astype(np.float32)).astype(pool.dtype)
    plain, fin = kdacupy.kda_forward(**x, **opts, cu_seqlens=cu, initial_state=init, output_final_state=True,
                                     state_layout=layout, state_dtype=pool.dtype, backend=backend)
    assert same(o, plain), "the pooled forward's output differs from the plain forward's"
    for n, s in enumerate(idx):
        if s >= 0:
            assert same(pool[s], fin[n]), f"slot {s} does not hold sequence {n}'s final state"
    for s in set(range(case["P"])) - {int(s) for s in idx[~pad]}:
        assert same(pool[s], before[s]), f"slot {s} was not named (or was padding) and changed"
    if case.get("every"):
        check_checkpoints(case, x, opts, cu, init, backend)


def check_checkpoints(case, x, opts, cu, init, backend):
    every, lens, layout = case["every"], case["lens"], case["layout"]
    J = max(1, max(lens) // every)
    HV, K, V = case["HV"], case["K"], case["V"]
    tail = (HV, V, K) if layout == "vk" else (HV, K, V)
    ck = np.full((len(lens), J) + tail, np.nan, np.float32)
    kdacupy.kda_forward(**x, **opts, cu_seqlens=cu, initial_state=init, state_layout=layout, checkpoint_every=every,
                        checkpoints=ck, backend=backend)
    for n, L in enumerate(lens):
        for j in range(1, J + 1):
            if j * every > L:
                assert np.isnan(ck[n, j - 1]).all(), f"sequence {n} has no boundary {j} but it was written"
                continue
            xs = {k: v[:, cu[n]:cu[n] + j * every] for k, v in x.items() if v is not None}
            _, f = kdacupy.kda_forward(**xs, **opts, initial_state=init[n:n + 1], output_final_state=True,
                                       state_layout=layout, state_dtype=np.float32, backend=backend)
            assert same(ck[n, j - 1], f[0]), f"checkpoint {j} of sequence {n} differs from the forward stopped there"


def check_tree(case, backend="model"):
    """fp32 step states: every root-to-leaf path of each sequence's tree, run alone as a chain from
    its start slot, is the tree's output and step states there, bit for bit; the pool is only read."""
    from ..decode_trees import path_by_path
    x, opts = arrays(case, case["N"], case["T"])
    pool = pool_of(case)
    before = pool.copy()
    idx = np.array(case["slots"], np.int32)
    parents = np.array(case["parents"], np.int64)
    HV, K, V = case["HV"], case["K"], case["V"]
    tail = (HV, V, K) if case["layout"] == "vk" else (HV, K, V)
    steps = np.zeros((case["N"], case["T"]) + tail, np.float32)
    o = kdacupy.kda_decode(**x, **opts, state_pool=pool, state_indices=idx, state_layout=case["layout"],
                           parent_indices=parents, step_states=steps, update_pool=False, backend=backend)
    assert same(pool, before), "update_pool=False wrote the pool"
    live = idx >= 0
    want_o, want_steps = path_by_path({k: v[live] for k, v in x.items() if v is not None},
                                      dict(opts, state_indices=idx[live], state_layout=case["layout"]), before,
                                      parents[live], np.float32, backend)
    assert same(o[live], want_o), "a tree's output differs from its paths run alone"
    assert same(steps[live], want_steps), "a tree's step states differ from its paths run alone"
    assert not np.any(o[~live].astype(np.float64)), "a padded sequence's output is not zero"


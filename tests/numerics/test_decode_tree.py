"""Tree speculative verify and step states in ``kda_decode`` on the NumPy backends (docs/design.md
section 7.1): each root-to-leaf path of a draft tree equals that path run alone (to the bit on
the reference and the model with fp32 step states), the model against the float64 reference,
SGLang's parent arrays, update_pool, and one test per validation error (nothing written)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.decode_reference import tree_plan
from kdacupy.numerics.dtypes import BF16

from ..decode_inputs import make_decode
from ..decode_trees import eagle_tree, leaf_paths, path_by_path, random_tree, sglang_parents
from ..inputs import rmse_ratio

F32 = np.float32


def tree_case(parents, N=2, H=1, HV=2, K=64, V=64, layout="vk", pool_dtype=F32, seed=0):
    T = parents.shape[1]
    x, opts, pool = make_decode(N=N, T=T, H=H, HV=HV, K=K, V=V, layout=layout, pool_dtype=pool_dtype, seed=seed)
    return x, opts, pool


def steps_like(pool, N, T, dtype=F32, rows=None):
    return np.full((rows or N, T) + pool.shape[1:], np.nan, dtype)


def test_eagle_tree_and_sglang_parents():
    par = eagle_tree(2, 4)
    assert len(par) == 31 and list(par[:7]) == [0, 0, 0, 1, 1, 2, 2]
    assert len(leaf_paths(par)) == 16 and all(len(p) == 5 for p in leaf_paths(par))
    # SGLang's comment tree: 0 -> {1, 2}, 1 -> {3}: retrieve_parent_token = [n/a, 0, 0, 1]
    assert list(sglang_parents([1, 3, -1, -1], [-1, 2, -1, -1])[1:]) == [0, 0, 1]


def test_tree_plan():
    par = np.array([[0, 0, 1, -1], [5, 0, 0, 2]])
    parent, rows = tree_plan(par, np.array([3, -1]), np.zeros((4, 4, 1, 1, 1)), 2, 4)
    assert rows.tolist() == [3, -1]
    assert parent.tolist() == [[-1, 0, 1, -1], [-1, 0, 1, 2]]  # no row: a chain; entry 0 never read
    parent, rows = tree_plan(None, None, None, 2, 3)
    assert rows.tolist() == [-1, -1] and parent.tolist() == [[-1, 0, 1]] * 2


@pytest.mark.parametrize("backend", ["reference", "model"])
@pytest.mark.parametrize("tree", ["eagle-topk2-depth4", "random"])
def test_every_path_is_that_path_run_alone(backend, tree):
    """fp32 step states: a parent's state is read back exactly, so the tree is bit for bit its
    paths run one by one (the reference keeps float64 states, the model fp32 registers)."""
    rng = np.random.default_rng(3)
    if tree == "random":
        parents = np.stack([random_tree(9, rng), random_tree(9, rng)])
    else:
        parents = np.stack([eagle_tree(2, 4)] * 2)
    x, opts, pool = tree_case(parents, layout="kv" if tree == "random" else "vk")
    N, T = parents.shape
    steps, p = steps_like(pool, N, T), pool.copy()
    o = kdacupy.kda_decode(**x, state_pool=p, **opts, parent_indices=parents, step_states=steps,
                           update_pool=False, backend=backend)
    np.testing.assert_array_equal(p, pool)
    want_o, want_steps = path_by_path(x, opts, pool, parents, F32, backend)
    np.testing.assert_array_equal(o.view(np.uint16), want_o.view(np.uint16))
    np.testing.assert_array_equal(steps, want_steps)
    # a tree is not a chain: some token's output differs from the chain verify of the same tokens
    chain = kdacupy.kda_decode(**x, state_pool=pool.copy(), **opts, backend=backend)
    assert not np.array_equal(o, chain)


@pytest.mark.parametrize("step_dtype", [F32, BF16])
def test_model_agrees_with_the_reference(step_dtype):
    """Within the decode's usual tolerances (test_decode.py): a bf16 output rounding (2^-8 RMS)
    and fp32 states to 1e-5; bf16 step states round each branch point's state once (2^-8)."""
    parents = np.stack([eagle_tree(2, 3), random_tree(15, np.random.default_rng(5))])
    x, opts, pool = tree_case(parents, HV=2)
    N, T = parents.shape
    out = {}
    for backend in ("reference", "model"):
        steps, p = steps_like(pool, N, T, step_dtype), pool.copy()
        o = kdacupy.kda_decode(**x, state_pool=p, **opts, parent_indices=parents, step_states=steps, backend=backend)
        out[backend] = o, steps, p
    (ro, rs, rp), (mo, ms, mp) = out["reference"], out["model"]
    assert rmse_ratio(mo, ro) < 2.0 ** -8
    tol = 2.0 ** -8 if step_dtype == BF16 else 1e-5
    assert rmse_ratio(ms, rs) < tol
    live = opts["state_indices"]
    assert rmse_ratio(mp[live], rp[live]) < tol


def test_sglang_parents_and_a_chain_agree_with_verify():
    """SGLang's arrays (the root's entry 0) run as given; parents t - 1 are the chain verify,
    bit for bit, with its step states the [N, T] verify's pool slots."""
    parents = np.stack([sglang_parents([1, 3, -1, -1], [-1, 2, -1, -1]), np.arange(4) - 1])
    assert parents[0, 0] == 0
    x, opts, pool = tree_case(parents, HV=1)
    steps = steps_like(pool, 2, 4)
    o = kdacupy.kda_decode(**x, state_pool=pool.copy(), **opts, parent_indices=parents, step_states=steps,
                           backend="model")
    want_o, want_steps = path_by_path(x, opts, pool, parents, F32, "model")
    np.testing.assert_array_equal(o, want_o)
    np.testing.assert_array_equal(steps, want_steps)
    slots = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    start = opts["state_indices"]
    big = np.concatenate([pool, pool[:5]])
    big[slots[:, 0]] = pool[start]
    ov = kdacupy.kda_decode(**x, state_pool=big, **dict(opts, state_indices=slots), backend="model")
    np.testing.assert_array_equal(ov[1], o[1])
    np.testing.assert_array_equal(big[slots[1]], steps[1])


@pytest.mark.parametrize("backend", ["reference", "model"])
def test_update_pool_and_step_rows(backend):
    """update_pool=True in a tree writes the last token's state to the start slot; step rows
    go where step_state_indices says (row 0 is never named: untouched), a padded sequence
    writes no row; update_pool=False with [N, T] indices leaves every slot as it was."""
    parents = np.array([[0, 0, 0], [0, -1, 1], [0, 0, 1]])
    x, opts, pool = tree_case(parents, N=3)
    idx = np.array([1, -1, 5], np.int32)
    steps = steps_like(pool, 3, 3, rows=4)
    p = pool.copy()
    o = kdacupy.kda_decode(**x, state_pool=p, **dict(opts, state_indices=idx), parent_indices=parents,
                           step_states=steps, step_state_indices=np.array([3, 2, 1], np.int64), backend=backend)
    assert np.isnan(steps[0]).all() and np.isnan(steps[2]).all()  # row 2: the padded sequence's
    assert not np.any(o[1].astype(np.float32))
    np.testing.assert_array_equal(p[1], steps[3, 2].astype(pool.dtype))
    np.testing.assert_array_equal(p[5], steps[1, 2].astype(pool.dtype))
    np.testing.assert_array_equal(p[[0, 2, 3, 4, 6]], pool[[0, 2, 3, 4, 6]])
    p = pool.copy()
    kdacupy.kda_decode(**x, state_pool=p, **dict(opts, state_indices=np.arange(9, dtype=np.int32).reshape(3, 3) - 2),
                       update_pool=False, backend=backend)
    np.testing.assert_array_equal(p, pool)


def bad(match, exc=ValueError, **change):
    """The call with ``change`` raises ``match`` and writes nothing (pool, out, step states)."""
    x, opts, pool = make_decode(N=3, T=3, H=1, P=8)
    args = dict(x, state_pool=pool, **opts, step_states=steps_like(pool, 3, 3),
                parent_indices=np.array([[0, 0, 1], [0, -1, 0], [0, 0, 0]], np.int32))
    args.update(change)
    before = {n: np.array(args[n], copy=True) for n in ("state_pool", "step_states") if isinstance(args[n], np.ndarray)}
    out = np.full(x["v"].shape, 7.0, dtype=x["v"].dtype)
    with pytest.raises(exc, match=match):
        kdacupy.kda_decode(**args, out=out)
    assert np.all(out.astype(np.float32) == 7.0)
    for n, b in before.items():
        np.testing.assert_array_equal(args[n], b)


def test_validation_errors():
    par = np.array([[0, 0, 1], [0, -1, 0], [0, 0, 0]], np.int32)
    bad(r"parent_indices: expected values in \[-1, t\) .* got parent_indices\[0, 2\] = 2",
        parent_indices=np.array([[0, 0, 2], [0, 0, 0], [0, 0, 0]], np.int32))
    bad(r"parent_indices\[1, 1\] = -2", parent_indices=np.array([[0, 0, 0], [0, -2, 0], [0, 0, 0]], np.int64))
    bad(r"parent_indices: expected shape", parent_indices=par[:, :2])
    bad("parent_indices: expected dtype int32 or int64", TypeError, parent_indices=par.astype(np.float32))
    bad("parent_indices: expected None without step_states", step_states=None)
    bad("step_state_indices: expected None without step_states", step_states=None, parent_indices=None,
        step_state_indices=np.arange(3))
    bad(r"parent_indices: expected \[N\] state_indices", state_indices=np.arange(9, dtype=np.int32).reshape(3, 3) - 1)
    pool = np.zeros((16, 1, 64, 64), F32)
    bad("step_states: expected shape", step_states=np.zeros((3, 2, 1, 64, 64), F32))
    bad("step_states: expected shape", step_states=np.zeros((3, 3, 1, 64, 32), F32))
    bad("step_states: expected at least N = 3 rows", step_states=np.zeros((2, 3, 1, 64, 64), F32))
    bad("step_states: expected dtype", TypeError, step_states=np.zeros((3, 3, 1, 64, 64), np.float16))
    bad("step_states: expected a C-contiguous", step_states=np.zeros((3, 3, 1, 64, 64), F32).swapaxes(3, 4))
    ro = np.zeros((3, 3, 1, 64, 64), F32)
    ro.flags.writeable = False
    bad("step_states: expected a writeable", step_states=ro)
    bad("step_states: expected memory separate from state_pool", state_pool=pool,
        step_states=pool[7:].reshape(3, 3, 1, 64, 64))
    bad(r"step_state_indices: expected rows < R = 4", step_states=np.zeros((4, 3, 1, 64, 64), F32),
        step_state_indices=np.array([0, 4, 1], np.int32))
    bad("step_state_indices: expected distinct rows", step_state_indices=np.array([0, 2, 0], np.int32))
    bad(r"step_state_indices: expected a row >= 0 for every live sequence with parent_indices",
        step_state_indices=np.array([0, -1, 1], np.int32))
    bad("update_pool: expected a bool", TypeError, update_pool=0)


def test_padded_sequences_need_no_step_row():
    """A padded sequence (negative start) may have no step row, or share one, under a tree."""
    x, opts, pool = make_decode(N=3, T=3, H=1, P=8)
    steps = steps_like(pool, 3, 3)
    kdacupy.kda_decode(**x, state_pool=pool.copy(), **dict(opts, state_indices=np.array([1, -1, 5], np.int32)),
                       parent_indices=np.zeros((3, 3), np.int32), step_states=steps,
                       step_state_indices=np.array([0, 0, 2], np.int32), backend="model")
    assert np.isfinite(steps[[0, 2]]).all() and np.isnan(steps[1]).all()

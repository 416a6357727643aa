"""kda_forward reading initial states from and writing final states to a state
pool (chunked prefill, docs/design.md section 7.1), and decode steps after it."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.parity import EMULATE, mismatch
from kdacupy.numerics.reference import kda_reference

from ..decode_inputs import gather_kv
from ..inputs import make_inputs, rmse_ratio

try:
    from kdacupy.emulate import find_compiler
    find_compiler()
    BACKENDS = ["reference", "model", "emulate"]
except Exception:  # noqa: BLE001
    BACKENDS = ["reference", "model"]


def prefill_case(layout="vk", pool_dtype=np.float32, P=6, seed=0):
    x, opts = make_inputs(cu_seqlens=[5, 0, 21, 17], H=1, HV=2, K=64, V=64, seed=seed)
    shape = (P, 2, 64, 64)
    pool = (0.5 * np.random.default_rng(seed + 7).standard_normal(shape)).astype(pool_dtype)
    return x, opts, pool, np.array([4, 1, -1, 0], np.int32)


def bf16(x):
    return np.asarray(x, np.float32).astype(BF16)


def close(x, ref):
    why = mismatch(x, ref, EMULATE)
    assert why is None, why


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout,pool_dtype", [("vk", np.float32), ("kv", BF16)])
def test_prefill_reads_and_writes_the_indexed_slots_only(backend, layout, pool_dtype):
    x, opts, pool, idx = prefill_case(layout, pool_dtype)
    p = pool.copy()
    o, s = kdacupy.kda_forward(**x, **opts, state_layout=layout, state_pool=p, state_indices=idx, backend=backend)
    assert s is None
    # the same call with gathered initial states (zeros for -1) and returned final states
    init = gather_kv(pool, idx, "kv")  # the slots as stored (no transpose)
    o2, s2 = kdacupy.kda_forward(**x, **opts, state_layout=layout, initial_state=np.ascontiguousarray(init.astype(pool_dtype)),
                                 output_final_state=True, backend=backend)
    if backend == "emulate":
        close(o, o2)
    else:
        np.testing.assert_array_equal(o, o2)
    for n, slot in enumerate(idx):
        if slot >= 0 and backend != "emulate":
            np.testing.assert_array_equal(p[slot], s2[n])
        elif slot >= 0:
            close(p[slot], s2[n])
    for slot in set(range(pool.shape[0])) - {4, 0}:  # 1: a zero-length sequence writes its state unchanged
        assert np.array_equal(p[slot].view(np.uint8), pool[slot].view(np.uint8)), slot


@pytest.mark.skipif("emulate" not in BACKENDS, reason="no host C++ compiler for the emulation")
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("layout,pool_dtype", [("vk", BF16), ("kv", np.float32)])
def test_emulated_prefill_into_the_pool_matches_the_model(precision, layout, pool_dtype):
    x, opts, pool, idx = prefill_case(layout, pool_dtype)
    pe, pm = pool.copy(), pool.copy()
    kw = dict(state_layout=layout, state_indices=idx, state_precision=precision)
    oe, _ = kdacupy.kda_forward(**x, **opts, state_pool=pe, **kw, backend="emulate")
    om, _ = kdacupy.kda_forward(**x, **opts, state_pool=pm, **kw, backend="model")
    close(oe, om)
    close(pe, pm)
    assert np.isfinite(oe.astype(np.float32)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_slot_starts_from_zeros_and_never_wraps(backend):
    x, opts, pool, _ = prefill_case()
    idx = np.array([-1, -1, -1, -1], np.int64)
    p = pool.copy()
    o, _ = kdacupy.kda_forward(**x, **opts, state_layout="vk", state_pool=p, state_indices=idx, backend=backend)
    o2, _ = kdacupy.kda_forward(**x, **opts, backend=backend)  # no initial state
    np.testing.assert_array_equal(o, o2)
    assert np.array_equal(p.view(np.uint8), pool.view(np.uint8))


@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_after_prefill_equals_one_forward_over_all_tokens(backend, layout):
    """Prefill T0 tokens into the pool, then decode 3 single tokens and one
    2-token verify step: the outputs are those of one kda_forward over the
    concatenated tokens from the same initial states (float64 reference)."""
    N, T0, steps = 2, 20, [1, 1, 1, 2]
    T = T0 + sum(steps)
    x, opts = make_inputs(B=N, T=T, H=1, HV=2, K=64, V=64, seed=3)
    kv = (0.5 * np.random.default_rng(5).standard_normal((5, 2, 64, 64))).astype(np.float32)  # [P, HV, K, V]
    idx = np.array([3, 1], np.int32)
    ref_o, _ = kda_reference(**x, **opts, initial_state=kv[idx].astype(np.float64))
    p = kv.copy() if layout == "kv" else np.ascontiguousarray(np.swapaxes(kv, -1, -2))
    pre = {n: a[:, :T0] for n, a in x.items()}
    outs = [kdacupy.kda_forward(**pre, **opts, state_layout=layout, state_pool=p, state_indices=idx,
                                backend=backend)[0]]
    t = T0
    for s in steps:  # the anchor bug of a [K, V] vs [V, K] mix-up in one path: prefill and decode share p
        step = {n: a[:, t:t + s] for n, a in x.items()}
        outs.append(kdacupy.kda_decode(**step, **opts, state_pool=p, state_indices=idx, state_layout=layout,
                                       backend=backend))
        t += s
    o = np.concatenate(outs, axis=1)
    # in units of the floor (the exact output rounded to bf16 once): the reference backend is
    # that rounding alone; the decode steps (fp32 state, one rounding of o) measure 1.14 floors
    # on the model and the emulated kernels, the prefill (the forward's bf16 operands and bf16
    # state) 2.07 floors; bounds about twice that. A [K, V] / [V, K] mix-up is O(1).
    for part, bound in ((slice(T0, None), 2.0), (slice(0, T0), 4.0)):
        err, floor = rmse_ratio(o[:, part], ref_o[:, part]), rmse_ratio(bf16(ref_o[:, part]), ref_o[:, part])
        assert err <= (1.0 + 1e-6 if backend == "reference" else bound) * floor, (part, err, floor)


def test_validation_of_the_pool_keywords():
    x, opts, pool, idx = prefill_case()
    kw = dict(state_layout="vk")
    before = pool.copy()
    for match, exc, extra in [
        ("state_pool: expected a state pool with state_indices", TypeError, dict(state_indices=idx)),
        ("state_indices: expected an int32/int64 array", TypeError, dict(state_pool=pool)),
        ("initial_state: expected None with state_pool", ValueError,
         dict(state_pool=pool, state_indices=idx, initial_state=pool[:4])),
        ("output_final_state: expected False with state_pool", ValueError,
         dict(state_pool=pool, state_indices=idx, output_final_state=True)),
        ("state_dtype: expected None with state_pool", ValueError,
         dict(state_pool=pool, state_indices=idx, state_dtype=np.float32)),
        ("state_indices: expected shape", ValueError, dict(state_pool=pool, state_indices=np.zeros((4, 1), np.int32))),
        ("state_indices: expected slots < P = 6", ValueError,
         dict(state_pool=pool, state_indices=np.array([0, 1, 2, 6], np.int32))),
        ("state_indices: expected distinct slots", ValueError,
         dict(state_pool=pool, state_indices=np.array([0, 1, 2, 0], np.int32))),
        ("state_pool: expected shape", ValueError, dict(state_pool=pool[:, :1], state_indices=idx)),
        ("sequence_parallel: expected None or 1 with state_pool", ValueError,
         dict(state_pool=pool, state_indices=idx, sequence_parallel=2)),
    ]:
        with pytest.raises(exc, match=match):
            kdacupy.kda_forward(**x, **opts, **kw, **extra)
    np.testing.assert_array_equal(pool, before)


@pytest.mark.skipif("emulate" not in BACKENDS, reason="no host C++ compiler for the emulation")
def test_one_token_tail_prefill_then_decode():
    """The anchor bug of a one-token tail sequence reading out of bounds: a
    1-token last sequence of a packed batch, exactly sized inputs, into the pool."""
    x, opts = make_inputs(cu_seqlens=[21, 1], H=1, K=64, V=64, seed=2)
    pool = (0.5 * np.random.default_rng(3).standard_normal((3, 1, 64, 64))).astype(BF16)
    idx = np.array([2, 0], np.int32)
    pe, pm = pool.copy(), pool.copy()
    oe, _ = kdacupy.kda_forward(**x, **opts, state_layout="vk", state_pool=pe, state_indices=idx, backend="emulate")
    om, _ = kdacupy.kda_forward(**x, **opts, state_layout="vk", state_pool=pm, state_indices=idx, backend="model")
    close(oe, om)
    close(pe, pm)
    np.testing.assert_array_equal(pe[1], pool[1])

"""kda_decode on NumPy: the reference against the recurrent definition, the model
against the reference, pool index semantics (padding, verify, rollback) and
one test per validation error (nothing written on failure)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.decode_model import kda_decode_model
from kdacupy.numerics.decode_reference import decode_plan, kda_decode_reference
from kdacupy.numerics.dtypes import BF16, F16
from kdacupy.numerics.reference import kda_reference
from kdacupy.seqpar import state_maps

from ..decode_inputs import gather_kv, make_decode
from ..inputs import make_inputs, rmse_ratio


def pool_opts(opts):
    return dict(opts)


@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("T", [1, 3])
def test_reference_is_the_recurrent_definition(layout, T):
    x, opts, pool = make_decode(N=3, T=T, H=1, HV=2, layout=layout, pool_dtype=np.float32)
    idx = opts["state_indices"]
    before = pool.copy()
    o = kda_decode_reference(**x, state_pool=pool, **pool_opts(opts))
    ro, rs = kda_reference(**x, initial_state=gather_kv(before, idx, layout), output_final_state=True,
                           form="recurrent", **{n: v for n, v in opts.items() if n not in ("state_layout", "state_indices")})
    np.testing.assert_allclose(o, ro, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gather_kv(pool, idx, layout), rs.astype(np.float32), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("pool_dtype", [np.float32, BF16])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("gate,beta", [("sigmoid", "logits"), ("softplus", "raw"), ("log", None)])
def test_model_agrees_with_the_reference(pool_dtype, layout, gate, beta):
    x, opts, pool = make_decode(N=4, T=4, H=1, HV=2, layout=layout, pool_dtype=pool_dtype, gate=gate, beta=beta)
    p_ref, p_mod = pool.copy(), pool.copy()
    ro = kda_decode_reference(**x, state_pool=p_ref, **pool_opts(opts))
    mo = kda_decode_model(**x, state_pool=p_mod, **pool_opts(opts))
    assert mo.dtype == x["v"].dtype
    # bf16 output: one rounding (2^-9 relative); the fp32 state adds ~1e-6
    assert rmse_ratio(mo, ro) < 2.0 ** -8
    tol = 2.0 ** -8 if pool_dtype == BF16 else 1e-5
    assert rmse_ratio(p_mod, p_ref) < tol
    np.testing.assert_array_equal(p_mod[::2], pool[::2])  # slots 0, 2, 4, ... are not indexed


@pytest.mark.parametrize("backend", ["reference", "model"])
def test_public_api_updates_the_pool_and_leaves_other_slots_bitwise(backend):
    x, opts, pool = make_decode(N=3, T=1, H=2, HV=4, pool_dtype=BF16)
    before = pool.copy()
    out = np.full(x["v"].shape, np.nan, dtype=x["v"].dtype)
    o = kdacupy.kda_decode(**x, state_pool=pool, **pool_opts(opts), out=out, backend=backend)
    assert o is out and np.isfinite(o.astype(np.float32)).all()
    touched = np.zeros(pool.shape[0], bool)
    touched[opts["state_indices"]] = True
    assert np.array_equal(pool[~touched].view(np.uint16), before[~touched].view(np.uint16))
    assert not np.array_equal(pool[touched].astype(np.float32), before[touched].astype(np.float32))


#: the slots each padding case writes, by hand: [N] indices 1, 3, 5 write their own slot; [N, T]
#: rows [0, 1], [2, 3], [4, 5] write both; a padded row ([-1, 6] in NT) writes none, not even slot 6
PADDED_WRITES = {
    ("N", 0): {3, 5}, ("N", 1): {1, 5}, ("N", 2): {1, 3},
    ("NT", 0): {2, 3, 4, 5}, ("NT", 1): {0, 1, 4, 5}, ("NT", 2): {0, 1, 2, 3},
}


@pytest.mark.parametrize("form", ["N", "NT"])
@pytest.mark.parametrize("pad_at", [0, 1, 2])
def test_padding_gives_zeros_and_touches_nothing(form, pad_at):
    N, T = 3, 2
    x, opts, pool = make_decode(N=N, T=T, H=1, P=8)
    if form == "N":
        idx = np.array([1, 3, 5], np.int64)
        idx[pad_at] = -1
    else:
        idx = np.array([[0, 1], [2, 3], [4, 5]], np.int32)
        idx[pad_at] = [-1, 6]  # a padded start: slot 6 must not be written either
    opts["state_indices"] = idx
    written = PADDED_WRITES[form, pad_at]
    for backend in ("reference", "model"):
        p = pool.copy()
        o = kdacupy.kda_decode(**x, state_pool=p, **pool_opts(opts), backend=backend)
        assert not np.any(o[pad_at].astype(np.float32))
        assert np.all(np.any(o.astype(np.float32) != 0, axis=(1, 2, 3))[np.arange(N) != pad_at])
        for s in range(pool.shape[0]):  # -1 never wraps to the last slot (7)
            assert np.array_equal(p[s], pool[s]) == (s not in written), (backend, s)


def test_negative_token_slot_only_skips_that_write():
    x, opts, pool = make_decode(N=2, T=3, H=1, P=8)
    idx = np.array([[0, -1, 2], [3, 4, -1]], np.int64)
    p = pool.copy()
    kdacupy.kda_decode(**x, state_pool=p, **dict(pool_opts(opts), state_indices=idx), backend="reference")
    for s in range(8):
        assert np.array_equal(p[s], pool[s]) == (s not in (0, 2, 3, 4)), s


@pytest.mark.parametrize("accepted", [1, 2, 3, 4])
def test_verify_writes_every_draft_state_and_rolls_back(accepted):
    """A verify step of T tokens writes one state per token (each equal to
    running the tokens one at a time); the next step starts from the state
    after ``accepted`` tokens. The model keeps fp32 across tokens, so with an
    fp32 pool both ways agree bitwise."""
    N, T = 2, 4
    x, opts, pool = make_decode(N=N, T=T, H=1, HV=2, P=2 * T + 2, pool_dtype=np.float32)
    opts = dict(opts, state_indices=np.arange(N * T, dtype=np.int32).reshape(N, T))
    idx = opts["state_indices"]
    p = pool.copy()
    o = kdacupy.kda_decode(**x, state_pool=p, **opts, backend="model")
    q = pool.copy()
    start = idx[:, 0].copy()
    for t in range(T):
        step = {n: a[:, t:t + 1] for n, a in x.items()}
        ot = kdacupy.kda_decode(**step, state_pool=q, **dict(opts, state_indices=start), backend="model")
        np.testing.assert_array_equal(ot[:, 0], o[:, t])
        np.testing.assert_array_equal(q[start], p[idx[:, t]])
    # the next verify step on the same slots, from the accepted draft's state
    nxt, _, _ = make_decode(N=N, T=T, H=1, HV=2, seed=9)
    acc = np.full(N, accepted, np.int64)
    a1, a2 = p.copy(), p.copy()
    o1 = kdacupy.kda_decode(**nxt, state_pool=a1, **opts, num_accepted_tokens=acc, backend="model")
    rows = idx[:, accepted - 1].copy()
    o2 = kdacupy.kda_decode(**nxt, state_pool=a2, **dict(opts, state_indices=rows), backend="model")
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(a1[idx[:, T - 1]], a2[rows])
    if accepted > 1:
        assert not np.array_equal(o1, kdacupy.kda_decode(**nxt, state_pool=p.copy(), **opts, backend="model"))


def test_decode_plan():
    start, write = decode_plan(np.array([[3, 4, 5], [-1, 6, 7]]), np.array([2, 3]), 2, 3, 8)
    assert start.tolist() == [4, 7]
    assert write.tolist() == [[3, 4, 5], [-1, 6, 7]]
    start, write = decode_plan(np.array([[3, 4, 5], [-1, 6, 7]]), None, 2, 3, 8)
    assert start.tolist() == [3, -1] and write.tolist() == [[3, 4, 5], [-1, -1, -1]]
    start, write = decode_plan(np.array([2, -1, 9]), None, 3, 2, 8)  # 9 >= P: padding (device values)
    assert start.tolist() == [2, -1, -1] and write.tolist() == [[-1, 2], [-1, -1], [-1, -1]]
    start, write = decode_plan(np.array([[3, 1, 5], [0, 6, 7]]), None, 2, 3, 8, null_slot=1)  # 0, 1: padding
    assert start.tolist() == [3, -1] and write.tolist() == [[3, -1, 5], [-1, -1, -1]]


# ---------------------------------------------------------------------------
# validation: every error names the argument; nothing is written


def bad(match, exc=ValueError, **change):
    x, opts, pool = make_decode(N=3, T=2, H=1, P=8)
    args = dict(x, state_pool=pool, **opts)
    args["state_indices"] = np.array([1, 3, 5], np.int32)
    args.update(change)
    pool_before = np.array(args["state_pool"], copy=True) if isinstance(args["state_pool"], np.ndarray) else None
    out = np.full(x["v"].shape, 7.0, dtype=x["v"].dtype)
    with pytest.raises(exc, match=match):
        kdacupy.kda_decode(**args, out=out)
    assert np.all(out.astype(np.float32) == 7.0)
    if pool_before is not None and pool_before.shape == args["state_pool"].shape:
        np.testing.assert_array_equal(args["state_pool"], pool_before)


def test_validation_errors():
    P, HV, K, V = 8, 1, 64, 64
    bad("state_pool: expected shape", state_pool=np.zeros((P, HV, K, V + 64), np.float32))
    bad(r"state_pool: expected shape .*\[P, HV, V, K\]", state_pool=np.zeros((P, HV, 64, 128), np.float32))
    bad(r"state_pool: expected shape .*\[P, HV, K, V\]", state_pool=np.zeros((P, HV, 64, 128), np.float32),
        state_layout="kv")
    bad("state_pool: expected dtype", TypeError, state_pool=np.zeros((P, HV, V, K), F16))
    bad("state_pool: expected a C-contiguous", state_pool=np.zeros((P, HV, K, V), np.float32).swapaxes(2, 3))
    ro = np.zeros((P, HV, V, K), np.float32)
    ro.flags.writeable = False
    bad("state_pool: expected a writeable", state_pool=ro)
    bad("state_pool: expected a NumPy or CuPy array", TypeError, state_pool=[[0.0]])
    bad("state_indices: expected dtype int32 or int64", TypeError, state_indices=np.array([1, 3, 5], np.float32))
    bad("state_indices: expected shape", state_indices=np.array([1, 3], np.int32))
    bad("state_indices: expected shape", state_indices=np.zeros((3, 3), np.int32))
    bad("state_indices: expected slots < P = 8", state_indices=np.array([1, 8, 5], np.int32))
    bad("state_indices: expected distinct slots", state_indices=np.array([1, 3, 1], np.int32))
    bad("state_indices: expected distinct slots", state_indices=np.array([[1, 2], [3, 4], [5, 2]], np.int32))
    bad("state_indices: expected distinct slots", state_indices=np.array([[1, 1], [3, 4], [5, 6]], np.int32))
    bad("state_indices: expected an int32/int64 array", TypeError, state_indices=None)
    bad("num_accepted_tokens: expected None unless state_indices is", num_accepted_tokens=np.array([1, 1, 1]))
    nt = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    bad(r"num_accepted_tokens: expected values in \[1, T = 2\]", state_indices=nt,
        num_accepted_tokens=np.array([1, 3, 1], np.int32))
    bad(r"num_accepted_tokens: expected values in \[1, T = 2\]", state_indices=nt,
        num_accepted_tokens=np.array([0, 1, 1], np.int32))
    bad("num_accepted_tokens: expected dtype", TypeError, state_indices=nt,
        num_accepted_tokens=np.array([1.0, 1, 1]))
    bad("num_accepted_tokens: expected shape", state_indices=nt, num_accepted_tokens=np.array([1, 1], np.int32))
    bad("state_layout", state_layout="xy")
    bad("g: expected shape", g=np.zeros((3, 2, 1, 32), BF16))


@pytest.mark.parametrize("backend", ["reference", "model", pytest.param("emulate", marks=pytest.mark.emulate)])
def test_padded_rows_may_repeat_slots(backend):
    """Slots named by a padded sequence are not written, so they may repeat live ones: slots 1
    and 2 hold sequence 0's states after its tokens 0 and 1 (as sequence 0 run alone writes
    them), the padded row's output is zero, every other slot is unchanged."""
    x, opts, pool = make_decode(N=2, T=2, H=1, P=8)
    idx = np.array([[1, 2], [-1, 2]], np.int32)
    p = pool.copy()
    o = kdacupy.kda_decode(**x, state_pool=p, **dict(pool_opts(opts), state_indices=idx), backend=backend)
    alone = pool.copy()
    o0 = kdacupy.kda_decode(**{n: a[:1] for n, a in x.items()}, state_pool=alone,
                            **dict(pool_opts(opts), state_indices=idx[:1]), backend=backend)
    np.testing.assert_array_equal(o[:1], o0)
    assert not np.any(o[1].astype(np.float32))
    np.testing.assert_array_equal(p[[1, 2]], alone[[1, 2]])
    assert not np.array_equal(p[1], pool[1]) and not np.array_equal(p[2], p[1])
    np.testing.assert_array_equal(p[[0, 3, 4, 5, 6, 7]], pool[[0, 3, 4, 5, 6, 7]])


@pytest.mark.parametrize("backend", ["reference", "model", pytest.param("emulate", marks=pytest.mark.emulate)])
def test_null_slot_pads_at_and_below_it(backend):
    """null_slot=2: a start slot at or below 2 pads its sequence and a per-token slot at or below
    it skips that store, exactly as -1 does by default (bit for bit, the call run twice: the
    second through the repeated-call path); such slots may repeat (vLLM's null block)."""
    x, opts, pool = make_decode(N=3, T=2, H=1, P=8)
    tables = [(np.array([[2, 5], [3, 0], [1, 2]], np.int64), np.array([[-1, 5], [3, -1], [-1, -1]], np.int64)),
              (np.array([0, 6, 2], np.int32), np.array([-1, 6, -1], np.int32))]
    for idx, as_negative in tables:
        want_p = pool.copy()
        want = kdacupy.kda_decode(**x, state_pool=want_p, **dict(opts, state_indices=as_negative), backend=backend)
        for _ in range(2):
            p = pool.copy()
            o = kdacupy.kda_decode(**x, state_pool=p, **dict(opts, state_indices=idx), null_slot=2, backend=backend)
            np.testing.assert_array_equal(o, want)
            np.testing.assert_array_equal(p, want_p)
        starts = as_negative if as_negative.ndim == 1 else as_negative[:, 0]
        padded = np.flatnonzero(starts < 0)
        assert padded.size and not np.any(o[padded].astype(np.float32))
        np.testing.assert_array_equal(p[:3], pool[:3])  # slots 0-2 are never read nor written


def test_null_slot_errors():
    bad("null_slot: expected an int", TypeError, null_slot=0.0)
    bad("null_slot: expected an int", TypeError, null_slot=True)
    bad("null_slot: expected an int >= -1", null_slot=-2)
    bad(r"state_indices: expected slots < P = 8 \(<= 0 for padding\)", state_indices=np.array([1, 8, 5], np.int32),
        null_slot=0)
    bad("state_indices: expected distinct slots", state_indices=np.array([1, 3, 1], np.int32), null_slot=0)
    bad(r"null_slot: expected an int below the pool's P = 8 slots", null_slot=8)  # every slot padding


@pytest.mark.parametrize("backend", ["reference", pytest.param("emulate", marks=pytest.mark.emulate)])
def test_cu_seqlens_of_equal_lengths_change_nothing(backend):
    """cu_seqlens [0, T, ..., N T] (an engine's packed offsets) give the call without them, bit for
    bit (on the emulation twice: the second through the repeated-call path)."""
    x, opts, pool = make_decode(N=3, T=2, H=1, P=8)
    want_p = pool.copy()
    want = kdacupy.kda_decode(**x, state_pool=want_p, **opts, backend=backend)
    for cu in (np.array([0, 2, 4, 6], np.int32), np.array([0, 2, 4, 6], np.int64)):
        for _ in range(2):
            p = pool.copy()
            o = kdacupy.kda_decode(**x, state_pool=p, **opts, cu_seqlens=cu, backend=backend)
            np.testing.assert_array_equal(o, want)
            np.testing.assert_array_equal(p, want_p)


def test_cu_seqlens_errors():
    bad(r"cu_seqlens: expected 2 tokens in every one of the N = 3 sequences .* got cu_seqlens\[1\] = 3",
        cu_seqlens=np.array([0, 3, 4, 6], np.int32))
    bad(r"cu_seqlens: expected 2 tokens .* got cu_seqlens\[3\] = 7", cu_seqlens=np.array([0, 2, 4, 7], np.int32))
    bad(r"cu_seqlens: expected shape \(4,\)", cu_seqlens=np.array([0, 2, 4], np.int32))
    bad("cu_seqlens: expected dtype int32 or int64", TypeError, cu_seqlens=np.array([0, 2, 4, 6], np.float32))


def test_out_and_inputs_may_not_overlap_the_pool():
    x, opts, pool = make_decode(N=2, T=2, H=1, P=8, pool_dtype=BF16)
    with pytest.raises(ValueError, match="out: expected memory separate from state_pool"):
        kdacupy.kda_decode(**x, state_pool=pool, **pool_opts(opts), out=pool[:2, :1].reshape(2, 2, 1, 64 * 32)[..., :64])
    before = pool.copy()
    v = pool[:2, 0, :2].reshape(2, 2, 1, 64)
    with pytest.raises(ValueError, match="v: expected memory separate from state_pool"):
        kdacupy.kda_decode(**dict(x, v=v), state_pool=pool, **pool_opts(opts))
    np.testing.assert_array_equal(pool, before)


@pytest.mark.parametrize("K,V", [(128, 128), (16, 16), (60, 100), (100, 60), (96, 96), (192, 192)])
def test_decode_accuracy_against_the_reference_over_many_steps(K, V):
    """64 single-token steps through the pool (model backend) against one float64
    forward: an fp32 pool reaches the bf16 output's rounding floor; a bf16 pool,
    rounded after every step, stays within a few times that; the same factors for every
    head size (the model's padded keys add nothing)."""
    N, T = 2, 64
    x, opts = make_inputs(B=N, T=T, H=2, HV=2, K=K, V=V, seed=1)
    s0 = 0.5 * np.random.default_rng(2).standard_normal((N, 2, K, V))
    ref_o, ref_s = kda_reference(**x, **opts, qk_l2norm=True, initial_state=s0, output_final_state=True)
    floor = rmse_ratio(ref_o.astype(np.float32).astype(BF16), ref_o)
    for pool_dtype, bound in ((np.float32, 1.02 * floor), (BF16, 3 * floor)):
        pool = np.ascontiguousarray(np.swapaxes(s0, -1, -2)).astype(pool_dtype)
        outs = [kdacupy.kda_decode(**{n: a[:, t:t + 1] for n, a in x.items()}, **opts, qk_l2norm=True,
                                   state_pool=pool, state_indices=np.arange(N, dtype=np.int32), backend="model")
                for t in range(T)]
        err = rmse_ratio(np.concatenate(outs, 1), ref_o)
        assert err < bound, (pool_dtype, err, floor)
        assert rmse_ratio(np.swapaxes(pool.astype(np.float64), -1, -2), ref_s) < (1e-6 if pool_dtype == np.float32
                                                                                   else 2.0 ** -7)


# ---------------------------------------------------------------------------
# head dims: the decode takes any K, V in [16, 256]; the chunked paths {64, 128, 256}


def test_decode_head_dims_and_the_other_paths_refusal():
    for K, V in ((60, 100), (16, 256), (256, 16)):
        x, opts, pool = make_decode(N=2, T=1, H=1, K=K, V=V)
        assert kdacupy.kda_decode(**x, state_pool=pool, **opts, backend="model").shape == (2, 1, 1, V)
    for K, V, match in ((8, 64, r"q: expected head dim K in \[16, 256\] \(kda_decode\), got K = 8"),
                        (64, 264, r"v: expected head dim V in \[16, 256\] \(kda_decode\), got V = 264"),
                        (288, 64, r"q: expected head dim K in \[16, 256\] \(kda_decode\), got K = 288")):
        x, opts, pool = make_decode(N=2, T=1, H=1, K=K, V=V)
        with pytest.raises(ValueError, match=match):
            kdacupy.kda_decode(**x, state_pool=pool, **opts, backend="model")
    for K, V in ((60, 64), (64, 60)):  # every other path takes them too (tests/emulate/*any_dims*)
        x, opts = make_inputs(B=1, T=8, H=1, K=K, V=V)
        for backend in ("reference", "model"):
            assert kdacupy.kda_forward(**x, **opts, backend=backend)[0].shape == x["v"].shape
            do = np.ones(x["v"].shape, x["v"].dtype)
            assert kdacupy.kda_backward(do, **x, **opts, backend=backend).dq.shape == x["q"].shape
            assert state_maps(**x, **opts, backend=backend)[0].shape == (1, 1, K, K)


def test_rows_of_other_head_dims_need_the_alignment_that_divides_them():
    """A 60-channel bf16 row is 120 bytes: contiguous arrays always pass; a strided view needs
    its pointer and outer strides on 8 bytes (gcd(16, 120)), which two elements' offset breaks."""
    x, opts, pool = make_decode(N=2, T=1, H=1, K=60, V=100)
    want = kdacupy.kda_decode(**x, state_pool=pool.copy(), **opts, backend="model")
    for shift, ok in ((4, True), (1, False)):  # elements of 2 bytes
        buf = np.zeros(x["q"].size + 16, BF16)[shift:shift + x["q"].size].reshape(x["q"].shape)
        buf[...] = x["q"]
        if ok:
            got = kdacupy.kda_decode(**dict(x, q=buf), state_pool=pool.copy(), **opts, backend="model")
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        else:
            with pytest.raises(ValueError, match="q: expected rows starting on 8-byte boundaries"):
                kdacupy.kda_decode(**dict(x, q=buf), state_pool=pool.copy(), **opts, backend="model")

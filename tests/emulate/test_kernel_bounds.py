"""The kernels' own bounds, fed what only device-resident indices can bring past the host
checks (slots >= P, accepted counts outside [1, T]): the launchers are called directly with
validated arguments whose index arrays are then swapped. Each pool is a view of a larger
buffer whose slot P is a sentinel, so a kernel that reads or writes one slot too far is seen
(in the output and in the sentinel) without the checks. And the bf16 and fp32 state modes
told apart bit for bit against the model (a kernel that skips the bf16 rounding of the state
is within 10% of the right answer, and only bitwise equality catches it)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.parity import EMULATE, mismatch
from kdacupy.numerics.precision import kda_model
from kdacupy.validation import validate
from kdacupy.validation.pool import validate_forward_pool

from ..cases import case_inputs
from ..decode_inputs import make_decode
from ..inputs import make_inputs

pytestmark = pytest.mark.emulate

SENTINEL = 1000.0


def pool_with_sentinel(P, rest, dtype=np.float32, seed=0):
    """(pool: a view of P slots, the buffer of P + 1 slots whose last slot is the sentinel)."""
    buf = (0.5 * np.random.default_rng(seed).standard_normal((P + 1,) + rest)).astype(dtype)
    buf[P] = SENTINEL
    return buf[:P], buf


def args(x, opts, **kw):
    o = dict(opts)
    o.update(kw)
    return dict(scale=None, initial_state=o.pop("initial_state", None), output_final_state=False,
                cu_seqlens=o.pop("cu_seqlens", None), qk_l2norm=o.pop("qk_l2norm", False),
                beta_sigmoid=o.pop("beta_sigmoid", False), allow_neg_eigval=o.pop("allow_neg_eigval", False),
                gate=o.pop("gate", "log"), A_log=o.pop("A_log", None), dt_bias=o.pop("dt_bias", None),
                lower_bound=o.pop("lower_bound", None), state_layout=o.pop("state_layout", "kv"), state_dtype=None,
                state_precision=o.pop("state_precision", "bf16"), out=None, backend="emulate")


@pytest.mark.parametrize("bad", ["P", "huge"])
def test_forward_pool_slot_at_or_past_P_is_padding(bad):
    """kda_recurrence.cu: ``slot >= pool_slots`` starts from zeros and stores nothing."""
    from kdacupy.ops.forward.kernels import forward
    x, opts = make_inputs(cu_seqlens=[9, 20], H=1, K=64, V=64)
    opts["qk_l2norm"] = True  # the variant of the parity cases (compiled once)
    P = 3
    pool, buf = pool_with_sentinel(P, (1, 64, 64))
    before = buf.copy()
    p, a = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], **args(x, opts))
    p, a = validate_forward_pool(p, a, pool, np.array([0, 1], np.int32), initial_state=None,
                                 output_final_state=False, state_dtype=None)
    slot = P if bad == "P" else 2**40
    o, _ = forward(p, dict(a, state_indices=np.array([slot, 1], np.int64)))
    np.testing.assert_array_equal(buf[[0, 2, P]], before[[0, 2, P]])  # slot 0 (not given), 2 and the sentinel
    assert not np.array_equal(buf[1], before[1])  # the live sequence wrote its slot
    # sequence 0 ran from zeros: the output of the same call without a pool
    o0, _ = kdacupy.kda_forward(**x, **opts, backend="emulate")
    np.testing.assert_array_equal(o[:, :9], o0[:, :9])


def decode_call(x, opts, pool, idx, acc):
    """The decode launcher (the fast path's DecodeCall) with ``idx`` / ``acc`` swapped in after a
    validation with in-range values; launched regardless of the host checks."""
    from kdacupy.ops.decode.fastpath import DecodeCall
    from kdacupy.validation.pool import validate_pool
    kw = {n: v for n, v in opts.items() if n not in ("state_indices", "num_accepted_tokens")}
    p, a = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], **args(x, kw, state_precision="fp32"))
    N, T = x["q"].shape[:2]
    good_idx = np.arange(N * T, dtype=idx.dtype).reshape(idx.shape) if idx.ndim == 2 else np.arange(N, dtype=idx.dtype)
    good_acc = None if acc is None else np.ones(N, acc.dtype)
    pool_info, _, _, _ = validate_pool(pool, good_idx, good_acc, p, a, T=T)
    arrays = (a["q"], a["k"], a["v"], a["g"], a["beta"], pool, idx, acc, None, a["A_log"], a["dt_bias"])
    call = DecodeCall(p, pool_info, arrays)
    return call.launch(arrays, [call._ptr(y) for y in arrays])


def test_decode_accepted_counts_outside_1_T_are_clamped():
    """kda_decode.cu clamps a = num_accepted_tokens[n] to [1, T]: T + 1 on row 0 would start
    from row 1's first slot, 0 or negative on row 1 from before its row."""
    N, T = 2, 3
    x, opts, _ = make_decode(N=N, T=T, H=1, K=64, V=64)
    pool, buf = pool_with_sentinel(N * T, (1, 64, 64))
    idx = np.arange(N * T, dtype=np.int32).reshape(N, T)
    got_pool = pool.copy()
    got = decode_call(x, opts, got_pool, idx, np.array([T + 1, -7], np.int32))
    want_pool = pool.copy()
    want = kdacupy.kda_decode(**x, **dict(opts, state_indices=idx, num_accepted_tokens=np.array([T, 1], np.int32)),
                              state_pool=want_pool, backend="emulate")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_pool, want_pool)


def test_decode_store_slots_at_or_past_P_are_skipped():
    """kda_decode.cu: a per-token store slot outside [0, P) stores nothing (the sentinel slot P
    stays); the start slot P pads the sequence."""
    N, T, P = 2, 2, 4
    x, opts, _ = make_decode(N=N, T=T, H=1, K=64, V=64)
    pool, buf = pool_with_sentinel(P, (1, 64, 64))
    before = buf.copy()
    idx = np.array([[0, P], [P, 2]], np.int64)  # row 0: stores token 0 only; row 1: padded (start P)
    o = decode_call(x, opts, pool, idx, None)
    np.testing.assert_array_equal(buf[[1, 2, 3, P]], before[[1, 2, 3, P]])
    assert not np.array_equal(buf[0], before[0])
    assert not np.any(o[1].astype(np.float32)) and np.any(o[0].astype(np.float32))


@pytest.mark.parametrize("name", ["softplus-raw-beta", "K256", "fixed-gva-sigmoid"])
def test_bf16_and_fp32_state_modes_match_the_model_bit_for_bit(name):
    """Each mode equals the model's same mode bitwise (final state everywhere, output where the
    case's summation order allows, else within the emulation's parity tolerance), and the model's
    two modes differ: so a kernel whose bf16 mode keeps the state in fp32 (or the reverse) fails
    here."""
    runs = {}
    for precision in ("bf16", "fp32"):
        x, opts = case_inputs(name, precision)
        o, s = kdacupy.kda_forward(**x, **opts, backend="emulate")
        om, sm = kda_model(**x, **opts)
        np.testing.assert_array_equal(s.view(np.uint8), sm.view(np.uint8))
        if name == "softplus-raw-beta":
            np.testing.assert_array_equal(o.view(np.uint8), om.view(np.uint8))
        else:  # the model rounds each matmul once, the mma each 16-step: here an output meets the difference
            assert mismatch(o, om, EMULATE) is None
        runs[precision] = sm
    assert not np.array_equal(runs["bf16"], runs["fp32"])

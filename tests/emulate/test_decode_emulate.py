"""The decode kernel, run on the CPU through the emulation, against the decode
precision model (tolerance ``kdacupy.parity.EMULATE``: only fp32 summation
order separates them), plus its index semantics on the real kernel. Each case and
tile builds its own variant, so the default run takes a sample of them (below);
the rest is a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.ops.decode.kernels import DecodeTiles, decode_candidates
from kdacupy.numerics.dtypes import BF16
from kdacupy.emulate import find_compiler
from kdacupy.numerics.parity import EMULATE, mismatch

from ..decode_cases import DECODE_CASES, DECODE_SAMPLE, decode_case, written_slots
from ..decode_checks import check_decode_step
from ..decode_inputs import make_decode
from ..sweeps import sample

try:
    find_compiler()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"no host C++ compiler for the emulation: {e}", allow_module_level=True)


def close(x, ref):
    why = mismatch(x, ref, EMULATE)
    assert why is None, why


def run_both(x, opts, pool, **kw):
    pe, pm = pool.copy(), pool.copy()
    oe = kdacupy.kda_decode(**x, state_pool=pe, **opts, backend="emulate", **kw)
    om = kdacupy.kda_decode(**x, state_pool=pm, **opts, backend="model", **kw)
    return oe, om, pe, pm


def untouched(after, before, written):
    """Slots outside ``written`` are bitwise unchanged."""
    keep = np.ones(before.shape[0], bool)
    keep[list(written)] = False
    return np.array_equal(after[keep].view(np.uint8), before[keep].view(np.uint8))


# the default run: DECODE_SAMPLE (tests/decode_cases.py); the other cases are a sweep
# (cover=False: the axis is the cases themselves)
@pytest.mark.parametrize("name", sample(list(DECODE_CASES), lambda n: n in DECODE_SAMPLE, cover=False))
def test_emulated_decode_matches_the_model(name):
    x, opts, pool = decode_case(name)
    pe = pool.copy()
    oe = kdacupy.kda_decode(**x, state_pool=pe, **opts, backend="emulate")
    check_decode_step(oe, pe, pool, x, opts, written_slots(name), [], EMULATE)


DECODE_TILES = [DecodeTiles(8, 1), DecodeTiles(16, 2), DecodeTiles(32, 8), DecodeTiles(64, 4)]


# the default run: the narrowest and the widest tile (cover=False: the axis is the tiles themselves)
@pytest.mark.parametrize("tiles", sample(DECODE_TILES, lambda t: t.BV in (8, 64), cover=False))
def test_every_tile_configuration_computes_the_same(tiles, monkeypatch):
    import kdacupy.ops.decode.fastpath as fp
    import kdacupy.ops.decode.kernels as dk
    assert tiles in decode_candidates(64, 64)
    monkeypatch.setattr(dk, "select_decode_tiles", lambda p, pool: tiles)
    dk.launch_plan.cache_clear()
    fp.clear()
    x, opts, pool = make_decode(N=2, T=2, H=1, HV=2, K=64, V=64, pool_dtype=BF16)
    oe, om, pe, pm = run_both(x, opts, pool)
    dk.launch_plan.cache_clear()
    fp.clear()
    close(oe, om)
    close(pe, pm)


@pytest.mark.parametrize("form", ["N", "NT"])
def test_padding_at_every_position_gives_zeros_and_touches_nothing(form):
    """The anchor bug: a -1 index that crashed the kernel or wrapped to the last slot."""
    N, T, P = 3, 2, 7
    x, opts, pool = make_decode(N=N, T=T, H=1, K=64, V=64, P=P)
    # by hand: [N] indices 0, 2, 4 write their own slot; [N, T] rows [0, 1], [2, 3], [4, 5] both;
    # the padded row writes none
    writes = {"N": [{2, 4}, {0, 4}, {0, 2}], "NT": [{2, 3, 4, 5}, {0, 1, 4, 5}, {0, 1, 2, 3}]}[form]
    for pad in range(N):
        if form == "N":
            idx = np.array([0, 2, 4], np.int32)
            idx[pad] = -1
        else:
            idx = np.array([[0, 1], [2, 3], [4, 5]], np.int64)
            idx[pad] = [-1, 6]  # not even slot 6 (the last) may be written
        out = np.full(x["v"].shape, np.nan, dtype=x["v"].dtype)  # poison: padded rows must be zeroed
        o = dict(opts, state_indices=idx)
        p = pool.copy()
        kdacupy.kda_decode(**x, state_pool=p, **o, backend="emulate", out=out)
        check_decode_step(out, p, pool, x, o, writes[pad], [pad], EMULATE)


def test_device_style_out_of_range_indices_are_padding():
    """Device indices are not validated by the host: the kernel treats a slot
    >= P like a negative one (launcher called directly, as the host checks
    would reject these). The CPU twin of test_gpu_decode.py's padding test."""
    from kdacupy.ops.decode.fastpath import DecodeCall
    from kdacupy.validation.pool import Pool
    from kdacupy.validation import validate
    x, opts, pool = make_decode(N=2, T=1, H=1, K=64, V=64, P=3)
    idx = np.array([99, 1], np.int32)
    kw = {n: v for n, v in opts.items() if n not in ("state_indices", "state_layout")}
    p, a = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=None, initial_state=None,
                    output_final_state=False, cu_seqlens=None, qk_l2norm=kw.pop("qk_l2norm"),
                    beta_sigmoid=kw.pop("beta_sigmoid"), allow_neg_eigval=False, **kw, state_layout="vk",
                    state_dtype=None, state_precision="fp32", out=None, backend="emulate")
    before = pool.copy()
    arrays = (a["q"], a["k"], a["v"], a["g"], a["beta"], pool, idx, None, None, a["A_log"], a["dt_bias"])
    call = DecodeCall(p, Pool(3, pool.dtype, "vk", False, False), arrays)
    assert call.checked(arrays) is None  # the host check refuses slot 99; the kernel is launched regardless
    o = call.launch(arrays, [call._ptr(x) for x in arrays])
    # by hand: slot 99 means padding (row 0 zero, nothing written), row 1 writes slot 1
    check_decode_step(o, pool, before, x, dict(opts, state_indices=np.array([-1, 1], np.int32)), {1}, [0], EMULATE)


@pytest.mark.parametrize("cu, traps", [([0, 2, 4], False), ([0, 3, 4], True), ([0, 2, 5], True)])
def test_device_style_cu_seqlens_are_checked_by_the_kernel(cu, traps):
    """Device cu_seqlens are not read by the host: each CTA checks its sequence's two offsets and
    traps where they are not n T and (n + 1) T (launcher called directly, as the host check would
    refuse the unequal ones); equal ones compute what the call without them computes."""
    from kdacupy.emulate.errors import EmulationError
    from kdacupy.ops.decode.fastpath import DecodeCall
    from kdacupy.validation import validate
    from kdacupy.validation.pool import Pool
    x, opts, pool = make_decode(N=2, T=2, H=1, K=64, V=64, P=5)
    kw = {n: v for n, v in opts.items() if n not in ("state_indices", "state_layout")}
    p, a = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=None, initial_state=None,
                    output_final_state=False, cu_seqlens=None, qk_l2norm=kw.pop("qk_l2norm"),
                    beta_sigmoid=kw.pop("beta_sigmoid"), allow_neg_eigval=False, **kw, state_layout="vk",
                    state_dtype=None, state_precision="fp32", out=None, backend="emulate")
    idx = np.asarray(opts["state_indices"])
    arrays = (a["q"], a["k"], a["v"], a["g"], a["beta"], pool.copy(), idx, None, None, a["A_log"], a["dt_bias"],
              None, None, None, np.array(cu, np.int64))
    call = DecodeCall(p, Pool(5, pool.dtype, "vk", False, False), arrays)
    assert (call.checked(arrays) is None) == traps  # the host check refuses the unequal ones
    if traps:
        with pytest.raises(EmulationError, match=r"__trap\(\) called"):
            call.launch(arrays, [call._ptr(x) for x in arrays])
        return
    o = call.launch(arrays, [call._ptr(x) for x in arrays])
    want_pool = pool.copy()
    want = kdacupy.kda_decode(**x, state_pool=want_pool, **opts, backend="emulate")
    np.testing.assert_array_equal(o, want)
    np.testing.assert_array_equal(arrays[5], want_pool)


def test_one_token_sequences_with_exact_sized_inputs():
    """The anchor bug of a one-token tail reading out of bounds: T = 1 inputs
    sliced from the end of larger buffers, so a read past the token would see
    NaN poison and spread it into o and the state."""
    x, opts, pool = make_decode(N=3, T=1, H=1, HV=2, K=64, V=64)
    big = {}
    for n, a in x.items():
        buf = np.full((a.shape[0], 2) + a.shape[2:], np.nan, dtype=a.dtype)
        buf[:, 0] = a[:, 0]  # token 1 of each row is poison: a strided [N, 1, ...] view over token 0
        big[n] = buf[:, :1]
    oe, om, pe, pm = run_both(big, opts, pool)
    close(oe, om)
    close(pe, pm)
    o2 = kdacupy.kda_decode(**x, state_pool=pool.copy(), **opts, backend="emulate")
    np.testing.assert_array_equal(oe, o2)


def test_layouts_agree_with_each_other():
    """The anchor bug of a [K, V] vs [V, K] mix-up in one path only: the same
    states stored in either layout give the same outputs and the same states."""
    x, opts, pool = make_decode(N=2, T=2, H=1, K=64, V=128, layout="vk")
    kv_pool = np.ascontiguousarray(pool.swapaxes(-1, -2))
    o_vk = kdacupy.kda_decode(**x, state_pool=pool, **opts, backend="emulate")
    o_kv = kdacupy.kda_decode(**x, state_pool=kv_pool, **dict(opts, state_layout="kv"), backend="emulate")
    np.testing.assert_array_equal(o_vk, o_kv)
    np.testing.assert_array_equal(pool, kv_pool.swapaxes(-1, -2))


def test_two_runs_are_bitwise_equal():
    x, opts, pool = decode_case("vk-bf16-pool-verify")
    a, b = pool.copy(), pool.copy()
    oa = kdacupy.kda_decode(**x, state_pool=a, **opts, backend="emulate")
    ob = kdacupy.kda_decode(**x, state_pool=b, **opts, backend="emulate")
    np.testing.assert_array_equal(oa, ob)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("accepted", [1, 2, 3])
def test_verify_with_every_num_accepted_tokens(accepted):
    """T = 3 draft window: the kernel starts from idx[n, a - 1] and stores every token's state."""
    x, opts, pool = decode_case("vk-bf16-pool-verify", accepted=[accepted, 4 - accepted])
    oe, om, pe, pm = run_both(x, opts, pool)
    close(oe, om)
    close(pe, pm)
    # the first sequence started from its accepted draft: its outputs differ from a start at draft 1
    if accepted > 1:
        o1 = kdacupy.kda_decode(**x, state_pool=pool.copy(), **dict(opts, num_accepted_tokens=None),
                                backend="emulate")
        assert not np.array_equal(o1[0], oe[0])

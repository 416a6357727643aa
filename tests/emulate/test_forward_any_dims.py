"""kda_forward at head dims without variants of their own (K, V in [16, 256] outside
{64, 128, 256}, K != V included) on the emulated kernels: the any-size variants run the tile above
each true size (kdacupy/ops/forward/limits.py, KDA_ANY_DIMS) with loads and stores masked at it.

Held three ways: bit for bit against the exact forward over zero-padded inputs (what the masks
promise: docs/design.md section 2), against the float64 reference with the bound of a tile-size
case of the same options, and, through the state pool and strided views, against the same kernels'
plain call (the masked state and row accesses write nothing outside the true extents). Each case
builds its own variants (1-2 s of the cold run), so the default run takes a sample of the cases (below);
the rest is a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.dtypes import BF16, F16, F32
from kdacupy.numerics.reference import kda_reference
from kdacupy.numerics.parity import EMULATE, mismatch
from kdacupy.seqpar import state_maps

from ..cases import MODEL_REF_ERROR, REF_BOUND_FACTOR
from ..inputs import make_inputs, rmse_ratio
from ..sweeps import sample
from .test_forward_bitwise import forward_exact

pytestmark = pytest.mark.emulate

#: name: (make_inputs' arguments, extra options, the tile-size case whose reference bound applies).
#: Odd sizes make rows that are not 16-byte multiples (17 bf16 channels: 34 bytes, rows on 2 bytes),
#: so the element-wise fills and stores run next to the cp.async ones.
ANY_CASES = {
    "K60-V100-gva-sigmoid": (dict(B=2, T=37, H=1, HV=2, K=60, V=100, state=np.float32), {}, "fixed-gva-sigmoid"),
    "K16-V16-varlen-ragged-zero-vk": (dict(cu_seqlens=[5, 0, 21, 16, 3], H=2, K=16, V=16, state=BF16,
                                           state_layout="vk"), {}, "varlen-ragged-zero-vk-bf16"),
    "K96-V192-fp16-softplus": (dict(T=33, H=1, K=96, V=192, dtype=F16, gate="softplus", beta="raw",
                                    state=np.float32), dict(state_dtype=np.float32), "softplus-raw-beta"),
    "K100-V60-fp32-log": (dict(T=20, H=2, HV=4, K=100, V=60, dtype=F32, gate="log", beta=None), {},
                          "log-gate-no-beta"),
    "K17-V33-odd-rows": (dict(T=24, H=1, K=17, V=33, state=BF16), dict(state_dtype=np.float32), "fixed-gva-sigmoid"),
    "K192-V96-pair-form": (dict(T=40, H=1, K=192, V=96, gate="log", g_scale=60.0, state=np.float32), {},
                           "pair-form-extreme-decay"),
    # V in (16, 32): one CTA of BV = 32 value rows, 12 of them masked (tuning.heuristic)
    "K24-V20-one-slice": (dict(T=21, H=1, K=24, V=20, state=np.float32), {}, "fixed-gva-sigmoid"),
}


def any_inputs(name, precision):
    size, extra, _ = ANY_CASES[name]
    x, opts = make_inputs(**size)
    opts.update(output_final_state=True, state_precision=precision, qk_l2norm=True, **extra)
    return x, opts


#: the default run: the GVA case (the K = 60, V = 100 builds the other tests here share) and rows off 16 bytes
#: at the bf16 state, varlen in the "vk" layout at the smallest tiles at the fp32 state; the rest is a sweep
ANY_SAMPLE = {("K60-V100-gva-sigmoid", "bf16"), ("K17-V33-odd-rows", "bf16"), ("K16-V16-varlen-ragged-zero-vk", "fp32")}


# (cover=False: not every case; each is its own dims and options)
@pytest.mark.parametrize("name, precision", sample([(n, p) for n in ANY_CASES for p in ("bf16", "fp32")],
                                                   lambda n, p: (n, p) in ANY_SAMPLE, cover=False))
def test_any_head_dims_are_the_padded_forward_bit_for_bit(name, precision):
    x, opts = any_inputs(name, precision)
    got = kdacupy.kda_forward(**x, **opts, backend="emulate")
    for a, b in zip(got, forward_exact(**x, **opts)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


# the default run: the sample's cases at the bf16 state, whose builds the test above makes
# (cover=False: not every case; each is its own dims and options)
@pytest.mark.parametrize("name", sample(list(ANY_CASES), lambda n: (n, "bf16") in ANY_SAMPLE, cover=False))
def test_any_head_dims_against_the_float64_reference(name):
    """Within the bound of the tile-size case with the same options: the true size costs no accuracy."""
    x, opts = any_inputs(name, "bf16")
    o, s = kdacupy.kda_forward(**x, **opts, backend="emulate")
    ro, rs = kda_reference(**x, **{n: v for n, v in opts.items() if n not in ("state_dtype", "state_precision")})
    bound_o, bound_s = (REF_BOUND_FACTOR * e for e in MODEL_REF_ERROR[ANY_CASES[name][2]])
    assert rmse_ratio(o, ro) <= bound_o and rmse_ratio(s, rs) <= bound_s, (rmse_ratio(o, ro), rmse_ratio(s, rs))


def test_strided_views_off_16_bytes_and_rows_of_the_tile():
    """q, k, g as views of wider rows (a 60-channel slice of 64: rows 128 bytes apart, the last
    piece cut short) and from 4 channels in (pointer on 8 bytes, every piece read element-wise);
    out a view with 16 channels of room: what the kernels read and write is the same."""
    x, opts = make_inputs(T=21, H=1, K=60, V=100, state=np.float32)
    opts.update(output_final_state=True)
    want = kdacupy.kda_forward(**x, **opts, backend="emulate")

    def wide(a, lead):  # a view of a's values inside rows of `lead` + K + pad channels
        full = np.zeros(a.shape[:-1] + (lead + a.shape[-1] + 4,), a.dtype)
        full[..., lead:lead + a.shape[-1]] = a
        return full[..., lead:lead + a.shape[-1]]
    for lead in (0, 4):
        views = dict(x, q=wide(x["q"], lead), k=wide(x["k"], lead), g=wide(x["g"], lead), v=wide(x["v"], lead))
        room = np.full(x["v"].shape[:-1] + (x["v"].shape[-1] + 16,), 7.0, x["v"].dtype)
        out = room[..., :x["v"].shape[-1]]
        got = kdacupy.kda_forward(**views, **opts, out=out, backend="emulate")
        np.testing.assert_array_equal(got[0].view(np.uint8), want[0].view(np.uint8))
        np.testing.assert_array_equal(got[1].view(np.uint8), want[1].view(np.uint8))
        assert np.all(room[..., x["v"].shape[-1]:] == 7.0)  # nothing written past V


@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_state_pool_at_any_head_dims(layout):
    """Each sequence reads its slot and writes its final state back, at the pool's true shape; the
    other slots, and every byte of them, are untouched; a negative index reads zeros, writes nothing."""
    K, V, HV = 60, 100, 2
    x, opts = make_inputs(cu_seqlens=[19, 7, 33], H=1, HV=HV, K=K, V=V)
    rng = np.random.default_rng(1)
    shape = (5, HV, V, K) if layout == "vk" else (5, HV, K, V)
    pool = rng.standard_normal(shape).astype(np.float32)
    idx = np.array([3, -1, 0], np.int32)
    before = pool.copy()
    o = kdacupy.kda_forward(**x, **opts, state_pool=pool, state_indices=idx, state_layout=layout, backend="emulate")[0]
    s0 = np.stack([before[i] if i >= 0 else np.zeros(shape[1:], np.float32) for i in idx])
    want_o, want_s = kdacupy.kda_forward(**x, **opts, initial_state=s0, output_final_state=True, state_layout=layout,
                                         backend="emulate")
    np.testing.assert_array_equal(o.view(np.uint8), want_o.view(np.uint8))
    np.testing.assert_array_equal(pool[[3, 0]], want_s[[0, 2]])
    np.testing.assert_array_equal(pool[[1, 2, 4]], before[[1, 2, 4]])


def test_refusals_name_the_argument():
    for K, V, match in ((8, 64, r"^q: expected head dim K in \[16, 256\] \(kda_forward\), got K = 8$"),
                        (64, 264, r"^v: expected head dim V in \[16, 256\] \(kda_forward\), got V = 264$")):
        x, opts = make_inputs(T=8, H=1, K=K, V=V)
        with pytest.raises(ValueError, match=match):
            kdacupy.kda_forward(**x, **opts, backend="emulate")
    x, opts = make_inputs(T=8, H=1, K=8, V=64)
    with pytest.raises(ValueError, match=r"^q: expected head dim K in \[16, 256\] \(sequence parallelism\)"):
        state_maps(**x, **opts, backend="model")


def test_the_split_at_any_head_dims_is_the_models_split():
    """Sequence parallelism on the any-size kernels: the maps (the M run's state is [K, K], so K = 60
    makes a 60 x 60 state on the 64 x 64 tiles), the scan and the segments' forward, against the
    model's split (parity.EMULATE), with a zero-length sequence passing its initial state through."""
    x, opts = make_inputs(cu_seqlens=[70, 0, 37, 5], H=1, HV=2, K=60, V=100, state=BF16, state_layout="vk")
    opts.update(output_final_state=True, state_dtype=np.float32)
    o, s = kdacupy.kda_forward(**x, **opts, backend="emulate", sequence_parallel=3)
    om, sm = kdacupy.kda_forward(**x, **opts, backend="model", sequence_parallel=3)
    assert not mismatch(o, om, EMULATE) and not mismatch(s, sm, EMULATE)
    np.testing.assert_array_equal(s[1], opts["initial_state"][1].astype(np.float32))
    M, B = state_maps(**x, **{n: v for n, v in opts.items() if n not in ("initial_state", "output_final_state",
                                                                             "state_dtype")}, backend="emulate")
    Mm, Bm = state_maps(**x, **{n: v for n, v in opts.items() if n not in ("initial_state", "output_final_state",
                                                                               "state_dtype")}, backend="model")
    assert M.shape == (4, 2, 60, 60) and B.shape == (4, 2, 100, 60)  # "vk": B^T
    assert not mismatch(M, Mm, EMULATE) and not mismatch(B, Bm, EMULATE)



def test_padded_channels_take_no_part_in_the_pair_form_test():
    """A padded channel's gate is 0, not the activation of a zero input: with a strong softplus gate
    (A_log = 5) and inputs far below its knee, every true channel decays little, while softplus(0)
    would decay a padded channel by 2^-148 a token, which would push each chunk into the pair form
    (kernels/prepare_steps.cuh, SAFE_EXPONENT) and change the bits of every output."""
    x, opts = make_inputs(T=32, H=1, K=60, V=64, gate="softplus", beta="raw", state=np.float32)
    x["g"] = np.full_like(x["g"], -20.0)
    opts.update(A_log=np.full_like(opts["A_log"], 5.0), dt_bias=np.zeros_like(opts["dt_bias"]),
                output_final_state=True, qk_l2norm=True)
    got = kdacupy.kda_forward(**x, **opts, backend="emulate")
    for a, b in zip(got, forward_exact(**x, **opts)):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_a_tuning_files_wgmma_tile_on_any_size_dims_runs_on_mma_sync(monkeypatch):
    """A wgmma tile from a tuning file reaches a K = 60, V = 100 problem through its bucket (the 64 / 128
    tiles'); the any-size variants are mma.sync's, so it runs there at its BV and stages: the same
    output, bit for bit, as the heuristic's tile."""
    from kdacupy.ops.forward import kernels
    from kdacupy.ops.forward.tuning import TileConfig
    x, opts = make_inputs(T=37, H=1, K=60, V=100, state=np.float32)
    want, want_s = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(128, 3, "wgmma"))
    got, got_s = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)) and np.array_equal(got_s, want_s)

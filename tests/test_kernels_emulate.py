"""The CUDA kernels, run on the CPU through the emulation, against the precision model.

Tolerance: the emulation computes every approximate instruction exactly and each
mma as an exact sum rounded once, so it follows the model's rounding points; what
is left is fp32 accumulation order (k-steps of the tensor-core chains, the
l2norm reduction tree, the pair form's FMA chain), which now and then moves a
value across a bf16 rounding boundary. One such flip is one bf16 unit in one
intermediate, so we allow an RMS difference of 2^-9 (a bf16 half-ulp, relative)
and a largest difference of 2^-6 of the output's range; an indexing or
layout bug shows up as O(1) differences, far outside both.
"""
import numpy as np
import pytest

import kdacupy
from kdacupy.dtypes import BF16, F16, F32
from kdacupy.emulate import find_compiler
from kdacupy.precision import kda_model
from kdacupy.tuning import TileConfig

from .inputs import make_inputs, rmse_ratio

try:
    find_compiler()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"no host C++ compiler for the emulation: {e}", allow_module_level=True)

TOL_RMS = 2.0 ** -9
TOL_MAX = 2.0 ** -6


def close(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(x).all()
    scale = np.max(np.abs(ref)) or 1.0
    assert np.max(np.abs(x - ref)) <= TOL_MAX * scale
    if np.any(ref):
        assert rmse_ratio(x, ref) <= TOL_RMS


def run_both(case, **kw):
    x, opts = make_inputs(**case)
    opts.update(kw)
    o, s = kdacupy.kda_forward(**x, **opts, backend="emulate")
    om, sm = kda_model(**x, **{n: v for n, v in opts.items() if n != "out"})
    return (o, s), (om, sm), (x, opts)


CASES = {
    # name: (input case, options)
    "fixed-gva-sigmoid": (dict(B=2, T=37, H=1, HV=2, K=64, V=64, state=np.float32), {}),
    "varlen-ragged-zero-vk-bf16": (dict(cu_seqlens=[5, 0, 21, 16, 3], H=2, K=64, V=64, state=BF16,
                                        state_layout="vk"), {}),
    "softplus-raw-beta": (dict(T=33, H=1, K=128, V=128, gate="softplus", beta="raw", state=np.float32), {}),
    "log-gate-no-beta": (dict(T=20, H=2, HV=4, K=64, V=128, gate="log", beta=None), {}),
    "fp16-inputs": (dict(T=29, H=1, K=128, V=64, dtype=F16), dict(state_dtype=np.float32)),
    "fp32-inputs": (dict(T=18, H=1, K=64, V=64, dtype=F32, state=np.float32), {}),
    "pair-form-extreme-decay": (dict(T=40, H=1, K=64, V=64, gate="log", g_scale=60.0, state=np.float32), {}),
    "K256": (dict(T=20, H=1, K=256, V=64, state=np.float32), {}),
    "V256": (dict(T=20, B=2, H=1, K=64, V=256, state=BF16), dict(state_dtype=np.float32)),
    "no-l2norm-neg-eigval": (dict(T=24, H=1, K=64, V=64), dict(qk_l2norm=False, allow_neg_eigval=True)),
    "g-and-beta-fp32": (dict(T=24, H=1, K=64, V=64), {}),
}


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(CASES))
def test_emulated_kernels_match_the_model(name, precision):
    case, extra = CASES[name]
    opts = dict(output_final_state=True, state_precision=precision, qk_l2norm=True)
    opts.update(extra)
    x, o_ = make_inputs(**case)
    if name == "g-and-beta-fp32":
        x["g"], x["beta"] = x["g"].astype(np.float32), x["beta"].astype(np.float32)
    o_.update(opts)
    o, s = kdacupy.kda_forward(**x, **o_, backend="emulate")
    om, sm = kda_model(**x, **o_)
    assert o.dtype == x["v"].dtype and o.shape == x["v"].shape
    assert s.dtype == sm.dtype and s.shape == sm.shape
    close(o, om)
    close(s, sm)


@pytest.mark.parametrize("tiles", [TileConfig(16, 2), TileConfig(32, 3), TileConfig(64, 2), TileConfig(128, 3)])
def test_every_tile_configuration_computes_the_same(tiles, monkeypatch):
    import kdacupy.kernels as kernels
    monkeypatch.setattr(kernels, "select_tiles", lambda p: tiles)
    x, opts = make_inputs(cu_seqlens=[19, 0, 33], H=1, HV=2, K=64, V=128, state=np.float32)
    o, s = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
    om, sm = kda_model(**x, **opts, output_final_state=True)
    close(o, om)
    close(s, sm)


def test_every_tail_length_and_zero_length_state_passthrough():
    lens = list(range(0, 18))  # every ragged tail 1..15, a full chunk, 17, and a zero-length first sequence
    x, opts = make_inputs(cu_seqlens=lens, H=1, K=64, V=64, state=np.float32)
    out = np.full(x["v"].shape, np.nan, dtype=BF16)  # poison: every element must be written
    o, s = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate", out=out)
    assert o is out
    om, sm = kda_model(**x, **opts, output_final_state=True)
    close(o, om)
    close(s, sm)
    np.testing.assert_array_equal(s[0], opts["initial_state"][0])  # unrounded: zero-length sequence


def test_strided_inputs_and_output():
    x, opts = make_inputs(B=2, T=21, H=2, K=64, V=64)
    qk = np.concatenate([x["q"], x["k"]], axis=-1)  # per-head interleaved projection, split by views
    q, k = qk[..., :64], qk[..., 64:]
    out = np.zeros((2, 21 * 2, 2, 64), dtype=BF16)[:, ::2]  # every other token row
    v = np.zeros((2, 21, 4, 64), dtype=BF16)[:, :, 1::2]  # every other head
    v[...] = x["v"]
    assert not (q.flags.c_contiguous or out.flags.c_contiguous or v.flags.c_contiguous)
    o, _ = kdacupy.kda_forward(**dict(x, q=q, k=k, v=v), **opts, backend="emulate", out=out)
    om, _ = kda_model(**x, **opts)
    assert o is out
    close(o, om)


def test_two_runs_are_bitwise_equal():
    x, opts = make_inputs(T=45, H=1, HV=2, K=64, V=64, state=np.float32)
    a = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
    b = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_empty_sequence_batch():
    x, opts = make_inputs(cu_seqlens=[0, 0], H=1, K=64, V=64, state=BF16)
    o, s = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate", state_dtype=np.float32)
    assert o.shape == (1, 0, 1, 64)
    np.testing.assert_array_equal(s, opts["initial_state"].astype(np.float32))


def test_emulation_accuracy_against_the_reference():
    from kdacupy.accuracy import OPTIONS, make_inputs as sweep_inputs
    from kdacupy.reference import kda_reference
    x = sweep_inputs(256, 2, 128, 128, "N(0,8)", "U(-8,8)", seed=3)
    ref_o, ref_s = kda_reference(**x, **{n: v for n, v in OPTIONS.items() if n != "state_dtype"})
    o, s = kdacupy.kda_forward(**x, **OPTIONS, backend="emulate")
    om, sm = kda_model(**x, **OPTIONS)
    assert rmse_ratio(o, ref_o) <= 1.05 * rmse_ratio(om, ref_o) + 1e-4
    assert rmse_ratio(s, ref_s) <= 1.05 * rmse_ratio(sm, ref_s) + 1e-4

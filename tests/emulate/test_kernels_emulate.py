"""The CUDA kernels, run on the CPU through the emulation, against the precision model.

Tolerance: ``kdacupy.numerics.parity.EMULATE`` (its docstring derives it): the emulation
computes approximate instructions exactly and each mma as an exact sum, so only
fp32 accumulation order separates it from the model.
"""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.parity import EMULATE, mismatch
from kdacupy.numerics.precision import kda_model
from kdacupy.ops.forward.tuning import TileConfig

from ..cases import CASES, FP32_SAMPLE, case_inputs, check_against_reference
from ..inputs import make_inputs, rmse_ratio
from ..sweeps import sample

pytestmark = pytest.mark.emulate  # skipped without a host C++ compiler (tests/conftest.py)

def close(x, ref):
    why = mismatch(x, ref, EMULATE)
    assert why is None, why


# every case at the bf16 state by default, the fp32 state on FP32_SAMPLE's; the rest is a sweep (tests/sweeps.py)
@pytest.mark.parametrize("name, precision", sample([(n, p) for p in ("bf16", "fp32") for n in CASES],
                                                   lambda n, p: p == "bf16" or n in FP32_SAMPLE))
def test_emulated_kernels_match_the_model(name, precision):
    x, opts = case_inputs(name, precision)
    o, s = kdacupy.kda_forward(**x, **opts, backend="emulate")
    om, sm = kda_model(**x, **opts)
    assert o.dtype == x["v"].dtype and o.shape == x["v"].shape
    assert s.dtype == sm.dtype and s.shape == sm.shape
    close(o, om)
    close(s, sm)
    check_against_reference(name, x, opts, o, s)  # the definition itself, not only the model


@pytest.mark.parametrize("tiles", [TileConfig(16, 2), TileConfig(32, 3), TileConfig(64, 2), TileConfig(128, 3)])
def test_every_tile_configuration_computes_the_same(tiles, monkeypatch):
    import kdacupy.ops.forward.kernels as kernels
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
    from kdacupy.cli.accuracy import OPTIONS, make_inputs as sweep_inputs
    from kdacupy.numerics.reference import kda_reference
    x = sweep_inputs(256, 2, 128, 128, "N(0,8)", "U(-8,8)", seed=3)
    ref_o, ref_s = kda_reference(**x, **{n: v for n, v in OPTIONS.items() if n != "state_dtype"})
    o, s = kdacupy.kda_forward(**x, **OPTIONS, backend="emulate")
    om, sm = kda_model(**x, **OPTIONS)
    assert rmse_ratio(o, ref_o) <= 1.05 * rmse_ratio(om, ref_o) + 1e-4
    assert rmse_ratio(s, ref_s) <= 1.05 * rmse_ratio(sm, ref_s) + 1e-4

"""The backward kernels on the CPU emulation: bit for bit the precision model (its docstring: the
kernels' arithmetic, fmaf and mma steps exactly), on every option, both state precisions, every
ragged tail, strided inputs; the launches' scratch is the one buffer, the gradients alone are
allocated. Few kernel variants, shared across the tests (each new one is a host compile)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.backward_model import kda_backward_model
from kdacupy.numerics.dtypes import BF16, F16, F32

from ..backward_cases import FD_CASES, problem

pytestmark = pytest.mark.emulate

#: name -> problem() options; the second is also the checked suite's (test_backward_checked.py)
CASES = {
    "gva-sigmoid-l2norm-neg-eigval": dict(FD_CASES["sigmoid-gva-l2norm-neg-eigval"], T=37),
    "varlen-gva-softplus-vk-f32-gate-and-beta": dict(FD_CASES["softplus-varlen-zero-vk"], lens=[5, 0, 21, 16, 3],
                                                     HV=2),
    "fp16-sigmoid-bias-only": dict(FD_CASES["sigmoid-bias-only-state-only"], T=19, dtype=F16),
    "fp32-softplus-bare": dict(FD_CASES["softplus-bare-sigmoid-beta"], T=18, dtype=F32),
    # batched, no beta, no l2norm, no initial state; chunk 1 decays 40x faster than chunks 0 and 2: one
    # chunk takes the pair form, the others the tensor cores
    "K128-V128-batched-mixed-chunks": dict(B=2, T=40, K=128, V=128, gate="log", beta=None, dfinal=True),
}
F32_PARTS = {"varlen-gva-softplus-vk-f32-gate-and-beta"}  # g and beta in fp32 with bf16 q, k, v


def inputs(name, state_dtype=np.float32):
    opts_in = dict(CASES[name])
    dtype = opts_in.pop("dtype", BF16)
    x, opts, do, ds = problem(**opts_in, dtype=dtype)
    if name in F32_PARTS:
        x["g"], x["beta"] = x["g"].astype(np.float32), x["beta"].astype(np.float32)
    if name == "K128-V128-batched-mixed-chunks":
        x["g"][:, 16:32] = (40 * x["g"][:, 16:32].astype(np.float32)).astype(x["g"].dtype)
    if "initial_state" in opts:
        opts["initial_state"] = opts["initial_state"].astype(state_dtype)
    return x, opts, do, None if ds is None else ds.astype(np.float32)


def assert_bitwise(got, want):
    assert type(got).__name__ == "KDAGradients"
    for field, a, b in zip(got._fields, got, want):
        if b is None:
            assert a is None, field
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, field
        np.testing.assert_array_equal(a, b, err_msg=field)


def run(name, precision="bf16", state_dtype=np.float32, **over):
    x, opts, do, ds = inputs(name, state_dtype)
    x.update(over)
    got = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, state_precision=precision, backend="emulate")
    want = kda_backward_model(do, **x, dfinal_state=ds, **opts, state_precision=precision)
    return got, want


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_kernels_are_the_model_bit_for_bit(name):
    assert_bitwise(*run(name))


def test_fp32_states_and_a_bf16_initial_state():
    got, want = run("gva-sigmoid-l2norm-neg-eigval", precision="fp32", state_dtype=BF16)
    assert got.dinitial_state.dtype == BF16
    assert_bitwise(got, want)


def test_every_ragged_tail_and_zero_length_sequences():
    x, opts, do, ds = problem(**{**FD_CASES["sigmoid-gva-l2norm-neg-eigval"], "lens": list(range(0, 18))},
                              dtype=BF16)
    opts["initial_state"] = opts["initial_state"].astype(np.float32)
    ds = ds.astype(np.float32)
    got = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="emulate")
    assert_bitwise(got, kda_backward_model(do, **x, dfinal_state=ds, **opts))
    np.testing.assert_array_equal(got.dinitial_state[0], ds[0])  # a zero-length sequence: passed through


def test_only_empty_sequences():
    x, opts, do, ds = problem(**{**FD_CASES["sigmoid-gva-l2norm-neg-eigval"], "lens": [0, 0]}, dtype=BF16)
    opts["initial_state"] = opts["initial_state"].astype(BF16)
    got = kdacupy.kda_backward(do, **x, dfinal_state=ds.astype(np.float32), **opts, backend="emulate")
    assert got.dq.shape == (1, 0, 1, 64) and got.dv.shape == (1, 0, 2, 64)
    np.testing.assert_array_equal(got.dinitial_state, ds.astype(np.float32).astype(BF16))
    np.testing.assert_array_equal(got.dA_log, np.zeros(2, np.float32))
    np.testing.assert_array_equal(got.ddt_bias, np.zeros((2, 64), np.float32))


def test_strided_inputs():
    x, opts, do, ds = inputs("gva-sigmoid-l2norm-neg-eigval")
    qk = np.concatenate([x["q"], x["k"]], axis=-1)  # a fused projection, split by views
    v = np.zeros(x["v"].shape[:2] + (4, 64), BF16)[:, :, ::2]  # every other head
    v[...] = x["v"]
    dov = np.zeros((1, 2 * do.shape[1]) + do.shape[2:], BF16)[:, ::2]  # every other token
    dov[...] = do
    strided = dict(x, q=qk[..., :64], k=qk[..., 64:], v=v)
    assert not (strided["q"].flags.c_contiguous or v.flags.c_contiguous or dov.flags.c_contiguous)
    got = kdacupy.kda_backward(dov, **strided, dfinal_state=ds, **opts, backend="emulate")
    assert_bitwise(got, kda_backward_model(do, **x, dfinal_state=ds, **opts))
    assert got.dq.flags.c_contiguous and got.dv.flags.c_contiguous

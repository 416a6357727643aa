"""kda_backward's face on NumPy arrays: the named tuple, dtypes and shapes, None for arguments not
given, and one test per validation error of its own arguments (do, dfinal_state)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.backward_reference import kda_backward_reference
from kdacupy.numerics.dtypes import BF16

from ..backward_cases import FD_CASES, problem


def bf16_problem(**kw):
    return problem(**{**FD_CASES["sigmoid-gva-l2norm-neg-eigval"], **kw, "dtype": BF16})


def test_the_gradients_come_back_named_in_their_arguments_dtypes():
    x, opts, do, ds = bf16_problem()
    x["g"] = x["g"].astype(np.float32)
    opts["initial_state"] = opts["initial_state"].astype(np.float32)
    grads = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts)
    assert isinstance(grads, kdacupy.KDAGradients)
    assert grads._fields == ("dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log", "ddt_bias")
    for field, arg in (("dq", x["q"]), ("dk", x["k"]), ("dv", x["v"]), ("dg", x["g"]), ("dbeta", x["beta"]),
                       ("dinitial_state", opts["initial_state"]), ("dA_log", opts["A_log"]),
                       ("ddt_bias", opts["dt_bias"])):
        got = getattr(grads, field)
        assert got.dtype == arg.dtype and got.shape == arg.shape, field
    ref = kda_backward_reference(do, **x, dfinal_state=ds, **opts)
    for got, r in zip(grads, ref):
        np.testing.assert_array_equal(got, r.astype(np.float32).astype(got.dtype))


def test_arguments_not_given_have_no_gradient():
    x, opts, do, ds = problem(**FD_CASES["log-batched-no-beta"])
    grads = kdacupy.kda_backward(do, **x, **opts)
    assert grads.dbeta is None and grads.dinitial_state is None and grads.dA_log is None and grads.ddt_bias is None
    assert grads.dq.shape == x["q"].shape and grads.dg.shape == x["g"].shape


def test_flat_dt_bias_gets_a_flat_gradient():
    x, opts, do, ds = problem(**FD_CASES["softplus-varlen-zero-vk"])
    assert opts["dt_bias"].ndim == 1
    assert kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts).ddt_bias.shape == opts["dt_bias"].shape


def test_without_a_loss_on_the_final_state_the_state_gradient_comes_from_o_alone():
    x, opts, do, ds = problem(T=5, state=True)
    g1 = kdacupy.kda_backward(do, **x, **opts)
    g0 = kdacupy.kda_backward(do, **x, dfinal_state=np.zeros_like(opts["initial_state"]), **opts)
    for a, b in zip(g1, g0):
        if a is not None:
            np.testing.assert_array_equal(a, b)
    zero = kdacupy.kda_backward(np.zeros_like(do), **x, **opts)
    assert all(not np.any(a) for a in zero if a is not None)


@pytest.mark.parametrize("bad, exc, words", [
    (dict(do=None), TypeError, "do: expected the gradient of o"),
    (dict(do="short"), ValueError, "do: expected shape (1, 4, 2, 64)"),
    (dict(do="float32"), TypeError, "do: expected dtype bfloat16"),
    (dict(dfinal_state="vk"), ValueError, "dfinal_state: expected shape (1, 2, 64, 64)"),
    (dict(dfinal_state="float16"), TypeError, "dfinal_state: expected dtype bfloat16 or float32"),
    (dict(dfinal_state="list"), TypeError, "dfinal_state: expected a NumPy or CuPy array"),
    (dict(lower_bound=-6.0), ValueError, "lower_bound: expected a number in [-5, 0]"),
    (dict(use_qk_l2norm_in_kernel=True), TypeError, "unexpected keyword argument 'use_qk_l2norm_in_kernel'"),
    (dict(do="strided"), ValueError, "do: expected a contiguous last dim"),
    (dict(dfinal_state="transposed"), ValueError, "dfinal_state: expected a C-contiguous array"),
    (dict(backend="fast"), ValueError, "backend: expected one of"),
])
def test_bad_arguments_are_named(bad, exc, words):
    x, opts, do, ds = bf16_problem()
    args = dict(do=do, **x, dfinal_state=ds, **opts)
    value = next(iter(bad.values()))
    name = next(iter(bad))
    if name == "do" and value == "short":
        value = do[:, :3]
    elif name == "do" and value == "float32":
        value = do.astype(np.float32)
    elif name == "do" and value == "strided":
        value = np.zeros(do.shape[:-1] + (2 * do.shape[-1],), do.dtype)[..., ::2]
    elif name == "dfinal_state":
        value = {"vk": np.swapaxes(ds, -1, -2)[:, :, :32], "float16": ds.astype(np.float16),
                 "list": ds.tolist(), "transposed": np.swapaxes(np.swapaxes(ds, -1, -2).copy(), -1, -2)}[value]
    args[name] = value
    with pytest.raises(exc) as e:
        kdacupy.kda_backward(**args)
    assert words in str(e.value), str(e.value)


def test_the_state_layout_decides_the_expected_shape():
    x, opts, do, ds = problem(**FD_CASES["softplus-varlen-zero-vk"])
    assert opts["state_layout"] == "vk"
    with pytest.raises(ValueError, match=r"dfinal_state: expected shape \(4, 1, 64, 64\) \(\[N, HV, V, K\]"):
        kdacupy.kda_backward(do, **x, dfinal_state=ds[:, :, :, :32], **opts)

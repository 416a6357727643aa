"""kda_forward on NumPy arrays: dispatch, out=, and one test per validation error."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.precision import kda_model
from kdacupy.numerics.reference import kda_reference

from ..inputs import make_inputs


def base(**kw):
    x, opts = make_inputs(T=20, H=2, HV=4, K=64, V=64, **kw)
    return x, opts


def test_reference_backend_returns_numpy_in_v_dtype():
    x, opts = base(state=np.float32)
    o, s = kdacupy.kda_forward(**x, **opts, output_final_state=True)
    ref_o, ref_s = kda_reference(**x, **opts, output_final_state=True)
    assert isinstance(o, np.ndarray) and o.dtype == BF16 and o.shape == x["v"].shape
    assert s.dtype == np.float32 and s.shape == (1, 4, 64, 64)
    np.testing.assert_array_equal(o, ref_o.astype(np.float32).astype(BF16))
    np.testing.assert_array_equal(s, ref_s.astype(np.float32))
    o2, s2 = kdacupy.kda_forward(**x, **opts)
    assert s2 is None


def test_model_backend_is_the_precision_model():
    x, opts = base(state=BF16, state_layout="vk")
    o, s = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="model", state_precision="fp32")
    o2, s2 = kda_model(**x, **opts, output_final_state=True, state_precision="fp32")
    np.testing.assert_array_equal(o.astype(np.float32), o2.astype(np.float32))
    assert s.dtype == BF16  # initial_state's dtype by default
    np.testing.assert_array_equal(s.astype(np.float32), s2.astype(np.float32))


def test_out_is_filled_and_returned():
    x, opts = base()
    out = np.full(x["v"].shape, np.nan, dtype=BF16)
    o, _ = kdacupy.kda_forward(**x, **opts, out=out)
    assert o is out
    ref, _ = kdacupy.kda_forward(**x, **opts)
    np.testing.assert_array_equal(out, ref)


def test_state_dtype_and_default_scale():
    x, opts = base()
    _, s = kdacupy.kda_forward(**x, **opts, output_final_state=True, state_dtype="bfloat16")
    assert s.dtype == BF16
    o1, _ = kdacupy.kda_forward(**x, **opts)
    o2, _ = kdacupy.kda_forward(**x, **opts, scale=64 ** -0.5)
    np.testing.assert_array_equal(o1, o2)


@pytest.mark.parametrize("backend", ["reference", pytest.param("emulate", marks=pytest.mark.emulate)])
def test_token_strided_inputs_are_used_as_they_are(backend):
    """On "emulate" the kernels get the views' token and head strides (on "reference" NumPy
    absorbs them): a fused projection split by views, and v every other head of a wider buffer,
    give the contiguous inputs' result bit for bit."""
    x, opts = base()
    qkv = np.concatenate([x["q"], x["k"]], axis=-1)  # a fused projection, split by views
    q, k = qkv[..., :64], qkv[..., 64:]
    v = np.zeros(x["v"].shape[:2] + (2 * x["v"].shape[2], 64), BF16)[:, :, 1::2]
    v[...] = x["v"]
    assert not (q.flags.c_contiguous or k.flags.c_contiguous or v.flags.c_contiguous)
    o1, _ = kdacupy.kda_forward(**dict(x, q=q, k=k, v=v), **opts, backend=backend)
    o2, _ = kdacupy.kda_forward(**x, **opts, backend=backend)
    np.testing.assert_array_equal(o1, o2)


def test_torch_style_dlpack_cpu_objects_are_accepted():
    x, opts = base(beta="raw", gate="log")
    x = {n: a.astype(np.float32) for n, a in x.items()}

    class Capsule:  # what a CPU torch tensor offers
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    o1, _ = kdacupy.kda_forward(**{n: Capsule(a) for n, a in x.items()}, **opts)
    o2, _ = kdacupy.kda_forward(**x, **opts)
    np.testing.assert_array_equal(o1, o2)


# ---------------------------------------------------------------------------
# validation: one case per check; each names the argument


def with_(x, opts, **changes):
    x, opts = dict(x), dict(opts)
    for n, val in changes.items():
        (x if n in x else opts)[n] = val
    return x, opts


def drop(d, *names):
    return {n: v for n, v in d.items() if n not in names}


BAD = {
    "q-not-array": (lambda x, o: with_(x, o, q=[[1.0]]), TypeError, "q: expected a NumPy or CuPy array"),
    "q-rank": (lambda x, o: with_(x, o, q=x["q"][0]), ValueError, "q: expected a 4-D array"),
    "k-shape": (lambda x, o: with_(x, o, k=x["k"][:, :-1]), ValueError, "k: expected shape"),
    "v-shape": (lambda x, o: with_(x, o, v=x["v"][:, :-1]), ValueError, "v: expected shape"),
    "hv-not-multiple": (lambda x, o: with_(x, o, v=x["v"][:, :, :3], g=x["g"][:, :, :3],
                                           beta=x["beta"][:, :, :3]), ValueError, "multiple of H"),
    "g-shape": (lambda x, o: with_(x, o, g=x["g"][:, :, :2]), ValueError, "g: expected shape"),
    "K-unsupported": (lambda x, o: with_(x, o, q=x["q"][..., :8], k=x["k"][..., :8], g=x["g"][..., :8],
                                         dt_bias=o["dt_bias"][:, :8]), ValueError,
                      r"q: expected head dim K in \[16, 256\] \(kda_forward\), got K = 8"),
    "V-unsupported": (lambda x, o: with_(x, o, v=x["v"][..., :8]), ValueError,
                      r"v: expected head dim V in \[16, 256\] \(kda_forward\), got V = 8"),
    "q-dtype": (lambda x, o: with_(x, o, q=x["q"].astype(np.float64), k=x["k"].astype(np.float64), backend="model"),
                TypeError, "q: expected dtype .* \\(float64 runs only on backend='reference'\\)"),
    "k-dtype": (lambda x, o: with_(x, o, k=x["k"].astype(np.float32)), TypeError, "k: expected dtype bfloat16"),
    "g-dtype": (lambda x, o: with_(x, o, g=x["g"].astype(np.float16)), TypeError,
                "g: expected dtype bfloat16 or float32"),
    "beta-shape": (lambda x, o: with_(x, o, beta=x["beta"][..., :1]), ValueError, "beta: expected shape"),
    "beta-dtype": (lambda x, o: with_(x, o, beta=x["beta"].astype(np.float16)), TypeError, "beta: expected dtype"),
    "beta-none-with-sigmoid": (lambda x, o: with_(x, o, beta=None), ValueError, "beta: expected beta logits"),
    "neg-eigval-without-sigmoid": (lambda x, o: with_(x, o, beta_sigmoid=False, allow_neg_eigval=True),
                                   ValueError, "allow_neg_eigval"),
    "bool-option": (lambda x, o: with_(x, o, qk_l2norm="yes"), TypeError, "qk_l2norm: expected a bool"),
    "gate-unknown": (lambda x, o: with_(x, o, gate="tanh"), ValueError, "gate: expected one of"),
    "log-gate-with-A_log": (lambda x, o: (x, dict(drop(o, "dt_bias", "lower_bound"), gate="log")), ValueError,
                            "A_log: expected None with gate='log'"),
    "A_log-shape": (lambda x, o: with_(x, o, A_log=o["A_log"][:2]), ValueError, "A_log: expected shape"),
    "A_log-dtype": (lambda x, o: with_(x, o, A_log=o["A_log"].astype(np.float64)), TypeError, "A_log: expected dtype"),
    "dt_bias-shape": (lambda x, o: with_(x, o, dt_bias=o["dt_bias"][:, :3]), ValueError, "dt_bias: expected shape"),
    "dt_bias-dtype": (lambda x, o: with_(x, o, dt_bias=o["dt_bias"].astype(np.float64)), TypeError,
                      "dt_bias: expected dtype"),
    "softplus-with-lower_bound": (lambda x, o: with_(x, o, gate="softplus"), ValueError,
                                  "lower_bound: expected None with gate='softplus'"),
    "sigmoid-without-lower_bound": (lambda x, o: with_(x, o, lower_bound=None), ValueError,
                                    "lower_bound: expected a number in \\[-5, 0\\] with gate='sigmoid'"),
    "lower_bound-range": (lambda x, o: with_(x, o, lower_bound=-6.0), ValueError, "lower_bound: expected a number"),
    "lower_bound-positive": (lambda x, o: with_(x, o, lower_bound=0.5), ValueError, "lower_bound: expected a number"),
    "scale-inf": (lambda x, o: with_(x, o, scale=float("inf")), ValueError, "scale: expected a finite"),
    "scale-over-fp32": (lambda x, o: with_(x, o, scale=1e39), ValueError, "scale: expected a real number finite in float32"),
    "cu-float": (lambda x, o: with_(x, o, cu_seqlens=np.array([0.0, 20.0])), TypeError, "cu_seqlens: expected dtype"),
    "cu-rank": (lambda x, o: with_(x, o, cu_seqlens=np.array([[0, 20]])), ValueError, "cu_seqlens: expected a 1-D"),
    "cu-with-B2": (lambda x, o: with_(x, o, **{n: np.concatenate([a, a]) for n, a in x.items()},
                                      cu_seqlens=np.array([0, 20])), ValueError, "B == 1 with cu_seqlens"),
    "cu-first": (lambda x, o: with_(x, o, cu_seqlens=np.array([1, 20])), ValueError, "cu_seqlens: expected first"),
    "cu-last": (lambda x, o: with_(x, o, cu_seqlens=np.array([0, 19])), ValueError, "cu_seqlens: expected last"),
    "cu-decreasing": (lambda x, o: with_(x, o, cu_seqlens=np.array([0, 12, 5, 20])), ValueError,
                      "cu_seqlens: expected non-decreasing"),
    "state_layout": (lambda x, o: with_(x, o, state_layout="kk"), ValueError, "state_layout: expected"),
    "state_precision": (lambda x, o: with_(x, o, state_precision="fp16"), ValueError, "state_precision: expected"),
    "initial_state-shape": (lambda x, o: with_(x, o, initial_state=np.zeros((2, 4, 64, 64), np.float32)), ValueError,
                            "initial_state: expected shape \\(1, 4, 64, 64\\)"),
    "initial_state-dtype": (lambda x, o: with_(x, o, initial_state=np.zeros((1, 4, 64, 64), np.float16)), TypeError,
                            "initial_state: expected dtype"),
    "state_dtype": (lambda x, o: with_(x, o, state_dtype=np.float16), TypeError, "state_dtype: expected"),
    "out-shape": (lambda x, o: with_(x, o, out=np.zeros((1, 20, 4, 32), BF16)), ValueError, "out: expected shape"),
    "out-dtype": (lambda x, o: with_(x, o, out=np.zeros(x["v"].shape, np.float32)), TypeError, "out: expected dtype"),
    "out-overlaps-v": (lambda x, o: with_(x, o, out=x["v"]), ValueError, "out: expected memory separate"),
    "backend-unknown": (lambda x, o: with_(x, o, backend="triton"), ValueError, "backend: expected one of"),
    "backend-cuda-on-numpy": (lambda x, o: with_(x, o, backend="cuda"), ValueError, "backend: expected CuPy"),
    "emulate-strided-last-dim": (lambda x, o: with_(x, o, backend="emulate",
                                                    q=np.swapaxes(np.swapaxes(x["q"], 2, 3).copy(), 2, 3)),
                                 ValueError, "q: expected a contiguous last dim"),
    "emulate-misaligned-rows": (lambda x, o: with_(x, o, backend="emulate",
                                                   v=np.zeros((1, 20, 4, 65), BF16)[..., 1:]), ValueError,
                                "v: expected rows starting on 16-byte boundaries"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_validation_error_names_the_argument(case):
    """Each error names its argument, and nothing is written: neither ``out`` (a sentinel of
    7s, or the case's own ``out``, filled with 7s too) nor any caller array."""
    x, opts = base(state=np.float32)
    change, exc, match = BAD[case]
    x, opts = change(x, opts)
    if "out" in opts:
        if opts["out"] is not x["v"]:  # the out-overlaps-v case: v itself is the out to watch
            opts["out"][...] = 7.0
    else:
        opts["out"] = np.full(x["v"].shape, 7.0, dtype=BF16)
    arrays = {n: a for n, a in {**x, **opts}.items() if isinstance(a, np.ndarray)}
    before = {n: a.copy() for n, a in arrays.items()}
    assert "out" in arrays
    with pytest.raises(exc, match=match):
        kdacupy.kda_forward(**x, **opts)
    bits = lambda a: np.ascontiguousarray(a).view(np.uint8)  # noqa: E731
    for n, a in arrays.items():  # nothing was written
        assert np.array_equal(bits(a), bits(before[n])), n


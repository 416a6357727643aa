"""The precision model of the backward kernels: its exact arithmetic, and its error against the
float64 reference gradient.

Bounds (RMSE ratio against the float64 reference, bf16 inputs and operands; u = 2^-9 as in
test_precision.py): one bf16 rounding costs at most 2^-8 relative and about 1.7e-3 RMS. A gradient passes through
more roundings in series than the output does: dq is (dO S^T + dM k_inv) times the decay, with
the bf16 state S (which carries the forward's state error, bounded at 12u in
test_precision.py), dM = dO U^T rounded to bf16 after U (itself after the bf16 Y and W), and
k_inv; dk adds the bf16 gradient state dS_c and the intra-chunk solve's transpose. About eight
roundings add in quadrature to ~4.8e-3; the gradient state is carried in fp32 (only its matmul
operand is bf16, re-rounded every chunk, so those roundings do not compound). We bound every
gradient at 10u = 1.95e-2, FLA's own test tolerance (about 2e-2): the worst measured values on
the FlashKDA sweep are 2-4x lower (benchmarks/backward-accuracy.md), so a lost FMA or a rounding
in the wrong place is caught. dA_log is one sum per head over all tokens and channels of
terms whose per-channel sums can cancel: with a uniform gate input it is the total of dg, and
(g, dt_bias) = (-4, -4) leaves it at 1/50 of the 2-norm of its per-channel sums. Each
channel's sum carries the gradient's relative error independently, so the head's relative
error is that error times kappa = ||per-channel sums|| / |total|: bounded at 10u max(1, kappa),
kappa from the reference (measured: 0.36 where kappa = 49, i.e. 7e-3 per channel).
"""
import ctypes

import numpy as np
import pytest

import kdacupy
from kdacupy.cli.accuracy import BIAS_REGIMES, G_REGIMES, OPTIONS, make_inputs as sweep_inputs
from kdacupy.cli.accuracy_backward import FIELDS, loss_inputs
from kdacupy.numerics.backward_arith import fma32, mma
from kdacupy.numerics.backward_model import kda_backward_model
from kdacupy.numerics.backward_reference import kda_backward_reference
from kdacupy.numerics.dtypes import BF16

from ..backward_cases import FD_CASES, problem
from ..inputs import rmse_ratio

U_BF16 = 2.0 ** -9  # the error unit u (test_precision.py)
BOUND = 10 * U_BF16


def _fmaf():
    try:
        libm = ctypes.CDLL("libm.so.6")
    except OSError:
        return None
    f = libm.fmaf
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float] * 3
    return f


def test_fma32_is_the_correctly_rounded_fmaf():
    fmaf = _fmaf()
    if fmaf is None:
        pytest.skip("no libm.so.6 to compare fmaf with")
    # a tie that a float64 a*b+c followed by a rounding to fp32 gets wrong: the exact value lies
    # 2^-70 below the midpoint of 1 + 2^-23 and 1 + 2^-22
    a, b, c = np.float32(1 + 2.0 ** -23), np.float32((1 - 2.0 ** -23) * 2.0 ** -24), np.float32(1 + 2.0 ** -23)
    assert float(np.float32(float(a) * float(b) + float(c))) == 1 + 2.0 ** -22
    assert fma32(a, b, c) == 1 + 2.0 ** -23 == fmaf(a, b, c)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 2000)) * 2.0 ** rng.integers(-30, 30, (3, 2000))).astype(np.float32)
    ours = fma32(*x)
    theirs = np.array([fmaf(*col) for col in x.T])
    np.testing.assert_array_equal(ours, theirs)


def test_mma_rounds_once_per_step_of_sixteen():
    # exact sum 1 + 3 * 2^-25 rounds up to 1 + 2^-23, but each step of 16 adds 3 * 2^-26 to 1,
    # which rounds back to 1: the chained result is 1, as the tensor cores' chain of mma.sync gives
    A = np.zeros((1, 32))
    A[0, 0], A[0, 5], A[0, 20] = 1.0, 3 * 2.0 ** -26, 3 * 2.0 ** -26
    B = np.ones((32, 1))
    assert mma(None, A, B)[0, 0] == 1.0
    assert mma(None, A[:, :16], B[:16])[0, 0] == 1.0
    assert mma(np.full((1, 1), 2.0 ** -24), A[:, :16], B[:16])[0, 0] == 1 + 2.0 ** -23
    assert float(np.float32((A @ B)[0, 0])) == 1 + 2.0 ** -23


def ratio(got, ref):
    """RMSE ratio; where the exact gradient is all zeros (e.g. dA_log with g + dt_bias = 0), the norm of ``got``."""
    ref = np.asarray(ref, np.float64)
    return rmse_ratio(got, ref) if np.any(ref) else float(np.linalg.norm(np.asarray(got, np.float64)))


def measured(backend_out, refs):
    return {f: (None if got is None else ratio(got, ref)) for f, got, ref in zip(FIELDS, backend_out, refs)}


def dA_condition(args, opts, ddx):
    """Per head: ||per-channel sums of the dA_log terms|| / |their total| (inf where it is 0), from the
    reference's gate gradient ``ddx`` (sigmoid gate: the terms are ddx * (g + dt_bias))."""
    x = np.asarray(args["g"], np.float64) + np.asarray(opts["dt_bias"], np.float64).reshape(ddx.shape[2:])
    per_channel = (ddx * x).sum(axis=(0, 1))  # [HV, K]
    total = np.abs(per_channel.sum(axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, np.linalg.norm(per_channel, axis=-1) / total, np.inf)


@pytest.mark.parametrize("g_regime,bias_regime", list(zip(G_REGIMES, BIAS_REGIMES)) + [("-4", "-4")])
def test_model_error_on_the_sweep(g_regime, bias_regime):
    args, opts = loss_inputs(sweep_inputs(256, 2, 64, 64, g_regime, bias_regime, seed=1), OPTIONS, seed=1)
    refs = kda_backward_reference(**args, **opts)
    got = kda_backward_model(**args, **opts)
    errs = measured(got, refs)
    for f, e in errs.items():
        assert e is not None and np.isfinite(e), f
        if f != "dA_log":
            assert e < BOUND, f"{f}: {e:.3g}"
    kappa = dA_condition(args, opts, refs[3])
    for h in range(2):  # dA_log, head by head, against its own condition (module docstring)
        if refs[6][h] == 0:
            assert got[6][h] == 0
            continue
        rel = abs(float(got[6][h]) - refs[6][h]) / abs(refs[6][h])
        assert rel < BOUND * max(1.0, kappa[h]), (h, rel, kappa[h])


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("case", list(FD_CASES))
def test_model_error_on_every_option(case, precision):
    x, opts, do, ds = problem(**{**FD_CASES[case], "T": 37}, dtype=BF16)
    if "initial_state" in opts:
        opts["initial_state"] = opts["initial_state"].astype(np.float32)
    ds = None if ds is None else ds.astype(np.float32)
    got = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="model", state_precision=precision)
    refs = kda_backward_reference(do, **x, dfinal_state=ds, **opts)
    for f, e in measured(got, refs).items():
        if e is not None:
            assert e < BOUND, f"{f}: {e:.3g}"
    for g, ref, arg in zip(got, refs, (x["q"], x["k"], x["v"], x["g"], x.get("beta"), opts.get("initial_state"),
                                        opts.get("A_log"), opts.get("dt_bias"))):
        assert (g is None) == (arg is None)
        if g is not None:
            assert g.dtype == arg.dtype and g.shape == arg.shape


def test_the_gradient_of_a_saturated_gate_keeps_its_relative_accuracy():
    """x = g + dt_bias = 16: the sigmoid's derivative is ~1e-7 of its value; s (1 - s) taken as
    sig(y) sig(-y) keeps it to fp32 precision (1 - s in fp32 would leave 2^-24 / 1e-7 of it)."""
    args, opts = loss_inputs(sweep_inputs(64, 1, 64, 64, "8", "+8", seed=2), OPTIONS, seed=2)
    refs = kda_backward_reference(**args, **opts)
    errs = measured(kda_backward_model(**args, **opts), refs)
    assert errs["dg"] < BOUND and errs["ddt_bias"] < BOUND


def test_model_backend_is_the_model():
    x, opts, do, ds = problem(**FD_CASES["softplus-varlen-zero-vk"], dtype=BF16)
    opts["initial_state"] = opts["initial_state"].astype(BF16)
    a = kdacupy.kda_backward(do, **x, dfinal_state=ds.astype(np.float32), **opts, backend="model")
    b = kda_backward_model(do, **x, dfinal_state=ds.astype(np.float32), **opts)
    for u, w in zip(a, b):
        np.testing.assert_array_equal(u, w)
    assert a.dinitial_state.dtype == BF16
    # a zero-length sequence hands dfinal_state through, rounded to the initial state's dtype
    np.testing.assert_array_equal(a.dinitial_state[1], ds[1].astype(np.float32).astype(BF16))

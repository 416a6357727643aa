"""The per-token options: beta's mode, the gate and its parameters, the scale."""
from __future__ import annotations

import numbers

import numpy as np

from ..numerics.dtypes import BF16, F16, F32, F64, dtype_name
from .arrays import check_dtype, check_shape, describe, fail

GATES = ("log", "softplus", "sigmoid")


def check_beta(arrays, shape, beta_sigmoid, allow_neg_eigval) -> str:
    """The beta mode the kernels specialise on: "none", "raw", "sigmoid" or "sigmoid2"."""
    b = arrays["beta"]
    if b is None:
        if beta_sigmoid:
            fail("beta", "beta logits with beta_sigmoid=True", "None")
        beta_mode = "none"
    else:
        check_shape("beta", b, shape, "([B, T, HV])")
        check_dtype("beta", b, tuple(dict.fromkeys((arrays["q"].dtype, F32))))
        beta_mode = ("sigmoid2" if allow_neg_eigval else "sigmoid") if beta_sigmoid else "raw"
    if allow_neg_eigval and not beta_sigmoid:
        fail("allow_neg_eigval", "beta_sigmoid=True (it doubles the sigmoid of the beta logits)",
             "beta_sigmoid=False")
    return beta_mode


def check_gate(gate, arrays, dt_bias, lower_bound, HV, K):
    """The gate and its parameters; returns lower_bound as a float (or None)."""
    if gate not in GATES:
        fail("gate", "one of " + ", ".join(map(repr, GATES)), repr(gate))
    A, dtb = arrays["A_log"], arrays["dt_bias"]
    if gate == "log":
        for n, x in (("A_log", A), ("dt_bias", dt_bias), ("lower_bound", lower_bound)):
            if x is not None:
                fail(n, "None with gate='log' (g is already the log decay)", describe(x))
    params = (BF16, F16, F32, F64) if arrays["q"].dtype == F64 else (BF16, F16, F32)
    if A is not None:
        if tuple(A.shape) not in ((HV,), (1, 1, HV, 1)):
            fail("A_log", f"shape ({HV},) or (1, 1, {HV}, 1) (a model's parameter shape)", tuple(A.shape))
        check_dtype("A_log", A, params)
    if dtb is not None:
        if tuple(dtb.shape) not in ((HV, K), (HV * K,)):
            fail("dt_bias", f"shape ({HV}, {K}) or ({HV * K},)", tuple(dtb.shape))
        check_dtype("dt_bias", dtb, params)
    if gate == "softplus" and lower_bound is not None:
        fail("lower_bound", "None with gate='softplus'", repr(lower_bound))
    if gate == "sigmoid":  # 0 included: no decay, as FlashKDA documents its range
        if lower_bound is None:
            fail("lower_bound", "a number in [-5, 0] with gate='sigmoid'", "None")
        if not isinstance(lower_bound, numbers.Real) or isinstance(lower_bound, bool) or not (
                -5.0 <= float(lower_bound) <= 0.0):
            fail("lower_bound", "a number in [-5, 0]", repr(lower_bound))
        lower_bound = float(lower_bound)
    return lower_bound


def gate_params_as_read(arrays, HV, capturing):
    """A_log as [HV] and bf16 / fp16 A_log and dt_bias in float32, the kernels' parameter
    types: one conversion on the arrays' own device (no host copy), after every check. While
    a CUDA graph is captured a conversion would be a per-call temporary the graph keeps, so
    such parameters are refused there (the torch face converts them with torch's allocator)."""
    for n in ("A_log", "dt_bias"):
        x = arrays[n]
        if x is None:
            continue
        if n == "A_log" and x.ndim != 1:
            x = x.reshape(HV)
        if x.dtype in (BF16, F16):
            if capturing():
                fail(n, "float32 while the current stream captures a CUDA graph (a conversion would be a "
                     "per-call temporary the graph keeps)", dtype_name(x.dtype))
            x = x.astype(F32)
        arrays[n] = x


def check_scale(scale, K) -> float:
    if scale is None:
        return K ** -0.5
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not np.isfinite(float(scale)):
        fail("scale", "a finite real number or None", repr(scale))
    if abs(float(scale)) > float(np.finfo(np.float32).max):  # the kernels take it as fp32: inf, then NaN outputs
        fail("scale", "a real number finite in float32 (the kernels' scale is fp32, at most 3.4028235e+38)",
             repr(scale))
    return float(scale)

"""Supported element types and the rounding functions the precision model uses.

Rounding helpers take and return float64 arrays holding exactly representable
values of the narrower type, so a chain of model steps reads like the kernel.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)  # the reference backend's own type

#: dtypes accepted for q, k, v, g, beta and out
INPUT_DTYPES = (BF16, F16, F32)
#: dtypes accepted for initial_state / final_state
STATE_DTYPES = (BF16, F32)

_NAMES = {BF16: "bfloat16", F16: "float16", F32: "float32", F64: "float64"}


def as_dtype(dt) -> np.dtype:
    """np.dtype of a dtype-like (numpy, ml_dtypes, CuPy, or a name)."""
    if isinstance(dt, str) and dt in ("bf16", "bfloat16"):
        return BF16
    return np.dtype(dt)


def row_alignment(x) -> int:
    """The alignment (bytes) the kernels need of array ``x``'s rows (its last dim): 16, or the widest
    power of two that divides a row's bytes where 16 does not (a 60-channel bf16 row is 120 bytes:
    8), so a contiguous array always meets it and a strided view needs its pointer and outer strides
    on that many bytes. Head dims in {64, 128, 256} give 16 in every dtype."""
    return math.gcd(16, x.shape[-1] * x.dtype.itemsize) if x.ndim and x.shape[-1] else 16


def dtype_name(dt) -> str:
    dt = np.dtype(dt)
    return _NAMES.get(dt, str(dt))


def round_f32(x):
    """Round float64 values to the nearest float32 (ties to even)."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def round_bf16(x):
    """Round float64 values to the nearest bfloat16 via float32 (as cvt.rn.bf16.f32
    does on a float32 register: callers round to float32 first where the kernel
    holds a float32)."""
    return np.asarray(x, dtype=np.float32).astype(BF16).astype(np.float64)


def round_f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


def round_to(x, dt):
    """Round float64 values to storage dtype ``dt`` (bf16, fp16 or fp32)."""
    dt = np.dtype(dt)
    if dt == BF16:
        return round_bf16(round_f32(x))
    if dt == F16:
        return round_f16(round_f32(x))
    if dt == F32:
        return round_f32(x)
    raise TypeError(f"no rounding to {dt}")


def ftz_f32(x):
    """Flush float32 magnitudes below the smallest normal (2^-126) to +0."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, 0.0, x)

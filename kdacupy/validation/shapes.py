"""The per-token arrays' ranks, shapes and dtypes."""
from __future__ import annotations

from dataclasses import dataclass

from ..numerics.dtypes import F32, F64, INPUT_DTYPES
from .arrays import check_dtype, check_shape, fail


@dataclass(frozen=True)
class Sizes:
    """Batch, tokens, query/key heads, value heads and the two head dims (the Problem's first fields)."""
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int


#: tokens of one call, B * T: the kernels take token counts and offsets as 32-bit ints
MAX_TOKENS = (1 << 31) - 1


def check_tokens(name, tokens, shape) -> None:
    """B * T within MAX_TOKENS, on every backend alike (the NumPy ones would take more)."""
    if tokens > MAX_TOKENS:
        fail(name, f"at most 2^31 - 1 tokens (B * T; the kernels take token counts as 32-bit ints)",
             f"B * T = {tokens} (shape {shape})")


def check_shapes(arrays) -> Sizes:
    q, k, v, g = (arrays[n] for n in "qkvg")
    for n in "qkvg":
        if arrays[n].ndim != 4:
            fail(n, "a 4-D array", f"{arrays[n].ndim}-D array of shape {tuple(arrays[n].shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    check_tokens("q", B * T, tuple(q.shape))
    if B < 1:
        fail("q", "batch size B >= 1", f"shape {tuple(q.shape)}")
    check_shape("k", k, q.shape, "(like q: [B, T, H, K])")
    if tuple(v.shape[:2]) != (B, T):
        fail("v", f"shape ({B}, {T}, HV, V) (B, T of q)", tuple(v.shape))
    if H < 1:
        fail("q", "at least one query/key head (H >= 1 in [B, T, H, K])", f"shape {tuple(q.shape)}")
    if HV % H:
        fail("v", f"a value-head count HV that is a multiple of H = {H}", f"HV = {HV}")
    check_shape("g", g, (B, T, HV, K), "([B, T, HV, K])")
    return Sizes(B, T, H, HV, K, V)


def check_input_dtypes(arrays, backend):
    q = arrays["q"]
    if backend == "reference":  # the float64 reference also takes float64
        check_dtype("q", q, INPUT_DTYPES + (F64,))
    else:
        check_dtype("q", q, INPUT_DTYPES, " (float64 runs only on backend='reference')" if q.dtype == F64 else "")
    for n in "kv":
        check_dtype(n, arrays[n], (q.dtype,))
    check_dtype("g", arrays["g"], tuple(dict.fromkeys((q.dtype, F32))))

"""``KDACUPY_EMULATE_NUMERICS``: which arithmetic the emulation's PTX twins do.

``exact`` (default): conversions round to nearest even, ``.approx`` instructions
are computed exactly and rounded once, each mma is an exact sum rounded once.
``hardware``: what the GPU documents or is measured to do: ``.approx`` results
perturbed deterministically within their PTX ISA error bounds, mma sums aligned
to the block's largest exponent and truncated (``mma_dot`` below is the same
model in NumPy), fp32 arithmetic flushing subnormals (CuPy's ``-ftz=true``).
The mode reaches the C++ build as ``-DKDA_EMU_NUMERICS=<code>``, so it is part of
the build cache key.
"""
from __future__ import annotations

import numpy as np

from .. import env
from .errors import EmulationEnvError

VARIABLE = "KDACUPY_EMULATE_NUMERICS"
MODES = {"exact": 0, "hardware": 1}
#: the tensor-core model's parameters (ptx_twins.h: KDA_EMU_MMA_BLOCK, KDA_EMU_MMA_GUARD)
MMA_BLOCK = 16
MMA_GUARD = 3
#: PTX ISA bounds of the .approx instructions the twins honour
ULP_BOUND = {"ex2": 2.0, "rcp": 1.0}  # ulps (ex2: of the correctly rounded result; rcp: of the exact)
REL_BOUND = {"lg2": 2.0 ** -22, "rsqrt": 2.0 ** -22.9, "tanh": 2.0 ** -11}  # lg2 in (0.5, 2): absolute


def mode() -> str:
    try:
        return env.get(VARIABLE)
    except env.EnvError as e:
        raise EmulationEnvError(str(e)) from None


def define(which: str | None = None) -> str:
    return f"-DKDA_EMU_NUMERICS={MODES[which or mode()]}"


def _trunc_f32(s: np.ndarray) -> np.ndarray:
    f = s.astype(np.float32)
    over = np.isfinite(f) & (np.abs(f.astype(np.float64)) > np.abs(s))
    f[over] = np.nextafter(f[over], np.float32(0))
    return f


def mma_dot(A, B, C, block: int = MMA_BLOCK, guard: int = MMA_GUARD, final: str = "rz",
            c_last: bool = False) -> np.ndarray:
    """D = A @ B + C (A [M, K], B [K, N] 16-bit floats, C fp32) as the hardware twin sums it:
    per block of ``block`` products, the running sum and the exact products are truncated to
    24 + ``guard`` bits below the largest exponent among them, added exactly, and the sum
    rounded to fp32 (``final``: "rz" truncates, "rn" rounds to nearest). ``guard=None``:
    no alignment (exact sum). ``c_last``: a variant for the GPU probe, the products summed
    alone and C added after in fp32 (round to nearest)."""
    P = A.astype(np.float64)[:, :, None] * B.astype(np.float64)[None, :, :]  # [M, K, N], exact
    acc = np.asarray(C, np.float32).copy()
    K = P.shape[1]
    for k0 in range(0, K, block):
        start = np.zeros_like(acc) if c_last and k0 == 0 else acc
        t = np.concatenate([start.astype(np.float64)[:, None, :], P[:, k0:k0 + block]], axis=1)
        if guard is not None:
            _, e = np.frexp(t)
            e = np.where(t == 0, -100000, e).max(axis=1, keepdims=True)
            q = np.ldexp(1.0, (e - 24 - guard).clip(-1000))
            t = np.trunc(t / q) * q
        s = t.sum(axis=1)  # exact: each term has at most 24 + guard bits at a shared scale
        acc = _trunc_f32(s) if final == "rz" else s.astype(np.float32)
    if c_last:
        acc = (acc.astype(np.float64) + np.asarray(C, np.float64)).astype(np.float32)
    return acc

"""Agreement of a backend with the precision model: the one definition the test
suites and the tuner use.

The kernels follow the model's rounding points, so a difference can only come
from (a) fp32 accumulation order (tensor-core k-steps, reductions) and (b) on a
GPU, the approximate SFU instructions (ex2 / rsqrt / rcp / lg2.approx, a few
fp32 ulps; the emulation computes them exactly). Both perturb fp32 values by
~1e-7 relative, which now and then moves one value across a bf16 rounding
boundary: one bf16 unit (2^-8 relative) in one intermediate, which the
recurrence then carries along. So parity allows an RMS difference of a bf16
half-unit (2^-9) and a largest difference of a few bf16 units of the output's
range; on the GPU twice that, for the SFU approximations. An indexing, layout
or synchronisation bug produces O(1) differences, far outside both.
"""
from __future__ import annotations

import numpy as np

EMULATE = dict(rms=2.0 ** -9, max=2.0 ** -6)
GPU = dict(rms=2.0 ** -8, max=2.0 ** -5)


def mismatch(x, ref, tol) -> str | None:
    """None when ``x`` agrees with the model's ``ref`` within ``tol``, else why not."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape:
        return f"shape {x.shape} != {ref.shape}"
    if not np.isfinite(x).all():
        return f"{int(np.size(x) - np.isfinite(x).sum())} non-finite values"
    if not ref.size:
        return None
    scale = float(np.max(np.abs(ref))) or 1.0
    worst = float(np.max(np.abs(x - ref)))
    if worst > tol["max"] * scale:
        return f"max |diff| {worst:.3g} > {tol['max']:.3g} x range {scale:.3g}"
    norm = float(np.linalg.norm(ref))
    if norm and np.linalg.norm(x - ref) / norm > tol["rms"]:
        return f"RMS ratio {np.linalg.norm(x - ref) / norm:.3g} > {tol['rms']:.3g}"
    return None

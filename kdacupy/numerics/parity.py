"""Agreement of a backend with the precision model: the one definition the test
suites and the tuner use.

The kernels follow the model's rounding points, so a difference can only come
from (a) fp32 accumulation order (tensor-core k-steps, reductions), (b) on a
GPU, the approximate SFU instructions (ex2 / rsqrt / rcp / lg2.approx, a few
fp32 ulps), the tensor cores' truncated sums and the flush of subnormals
(-ftz=true). All perturb fp32 values by ~1e-7 relative, which now and then
moves one value across a bf16 rounding boundary: one bf16 unit in one
intermediate, which the recurrence then carries along. An indexing, layout or
synchronisation bug produces O(1) differences, far outside both tolerances.

EMULATE (the emulation's default exact numerics): an RMS difference of a bf16
half-unit (2^-9) and a largest difference of a few bf16 units of the range.

GPU, sized with the emulation under KDACUPY_EMULATE_NUMERICS=hardware (every
.approx result perturbed within its PTX ISA bound, tensor-core sums truncated,
FTZ; benchmarks/size_parity.py, output in benchmarks/parity-sizing.txt):
- the GPU suite's option matrix (tests/cases.py, both state precisions, both
  sizes): worst max |diff| / range 2.5e-3, worst RMS ratio 3.3e-4;
- T = 8192 in 256-token segments started from the model's states
  (tests/longseq.py), every regime of the sweep: worst RMS ratio 1.38e-3 (the
  slowest decay, g = -8 / dt_bias = +4, state), worst max 8.3e-3 = about one
  bf16 unit of the largest state element over the range (2^-7); the full
  runs' RMSE against the reference within 0.2% of the model's.
GPU = twice the worst, rounded up to a power of two: rms 2^-8, max 2^-5.
Whole T = 8192 runs are never compared element-wise (there the differences
reach the model's own error): they are measured against the float64 reference.
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

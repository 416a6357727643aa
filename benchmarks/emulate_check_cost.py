"""Cost of the emulation's checks (KDACUPY_EMULATE_CHECK): one kda_forward on the CPU per
check mode, and a probe that does nothing but global and shared loads and stores (the checks'
worst case), best of a few runs after a warm-up (which builds the variants), on one OS thread.

    PYTHONPATH=. python benchmarks/emulate_check_cost.py [--T 256] [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kdacupy  # noqa: E402
from tests.inputs import make_inputs  # noqa: E402

MODES = ["", "memcheck", "racecheck", "aligncheck", "all"]
PROBE = r"""
extern "C" __global__ void stream(const float* x, float* y, int n, int reps) {
  float* s = reinterpret_cast<float*>(dynamic_smem());
  for (int r = 0; r < reps; r++) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[blockIdx.x * n + i] * 2.0f + r;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[blockIdx.x * n + i] = s[n - 1 - i];
    __syncthreads();
  }
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    os.environ["KDACUPY_EMULATE_THREADS"] = "1"
    x, opts = make_inputs(T=args.T, H=2, K=args.K, V=args.V, state=np.float32)
    from kdacupy.emulate import EmulatedModule
    from tests.emulate.test_emulate_runtime import kernel_source
    fn = EmulatedModule(kernel_source(PROBE), ["stream"]).get_function("stream")
    n = 4096
    xs, ys = np.arange(16 * n, dtype=np.float32), np.zeros(16 * n, np.float32)
    times, ref = {}, None
    for mode in MODES:
        os.environ["KDACUPY_EMULATE_CHECK"] = mode
        fn(16, 128, (xs, ys, np.int32(n), np.int32(1)), shared_mem=4 * n)
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn(16, 128, (xs, ys, np.int32(n), np.int32(20)), shared_mem=4 * n)
            best = min(best, time.perf_counter() - t0)
        times[mode] = best
        print(f"probe {mode or 'off':>10}: {best:7.3f} s  x{best / times['']:.2f}")
    times, ref = {}, None
    for mode in MODES:
        os.environ["KDACUPY_EMULATE_CHECK"] = mode
        out = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")  # builds
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
            best = min(best, time.perf_counter() - t0)
        times[mode] = best
        if ref is None:
            ref = out
        same = all(np.array_equal(a, b) for a, b in zip(out, ref))
        print(f"kda   {mode or 'off':>10}: {best:7.3f} s  x{best / times['']:.2f}  bit-identical: {same}")


if __name__ == "__main__":
    main()

"""Cost of the emulation's checks (KDACUPY_EMULATE_CHECK): one kda_forward on the CPU per
check mode, and a shared-memory-bound probe (DESIGN.md section 4's fiber workload: rounds of
shared stores and loads, 2 __syncthreads and a 5-step shuffle reduction), best of a few runs
after a warm-up (which builds the variants), on one OS thread.

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
    from tests.test_emulate_runtime import KERNELS, NAMES, kernel_source
    probe = EmulatedModule(kernel_source(KERNELS), NAMES)
    times, ref = {}, None
    for mode in MODES:
        os.environ["KDACUPY_EMULATE_CHECK"] = mode
        w = np.zeros((32, 128), np.float32)
        probe.get_function("workload")(32, 128, (w, np.int32(20)))
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            probe.get_function("workload")(32, 128, (w, np.int32(50)))
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

"""A few small forwards for compute-sanitizer (memcheck, racecheck, synccheck):
varlen with ragged and zero-length sequences, every kernel family the defaults
use (K = V = 64 and 128, bf16 and fp32 state, the pair form). CuPy's memory
pool is turned off first, so each array is its own allocation and an
out-of-bounds access is one the tool can see.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 benchmarks/sanitize_forward.py
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cupy as cp  # noqa: E402

import kdacupy  # noqa: E402
from kdacupy.dtypes import BF16  # noqa: E402
from tests.inputs import make_inputs  # noqa: E402

cp.cuda.set_allocator(None)  # plain cudaMalloc per array: the tool sees every array's bounds
cp.cuda.set_pinned_memory_allocator(None)

CASES = [
    dict(cu_seqlens=[5, 0, 21, 16, 3], H=2, K=64, V=64, state=BF16),
    dict(B=2, T=37, H=1, HV=2, K=128, V=128, state=np.float32),
    dict(T=40, H=1, K=64, V=64, gate="log", g_scale=60.0, state=np.float32),  # the pair form
]


def main():
    for i, case in enumerate(CASES):
        for precision in ("bf16", "fp32"):
            x, opts = make_inputs(**case)
            dev = {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in {**x, **opts}.items()}
            o, s = kdacupy.kda_forward(**dev, qk_l2norm=True, output_final_state=True, state_precision=precision)
            cp.cuda.Device().synchronize()
            o, s = cp.asnumpy(o).astype(np.float32), cp.asnumpy(s)
            assert np.isfinite(o).all() and np.isfinite(s).all(), (i, precision)
            print(f"case {i} state={precision}: ok", flush=True)


if __name__ == "__main__":
    main()

"""Small runs of every kernel family for compute-sanitizer (memcheck, racecheck,
synccheck): the forward (varlen with ragged and zero-length sequences, K = V = 64
and 128, bf16 and fp32 state, the pair form), the forward through a state pool,
decode and speculative verify on a pool (padding slots included), the split
forward (sequence parallelism: maps, scan kernel, segment forward) and
``kdacupy.seqpar.state_maps``. On the GPU CuPy's memory pool is turned off
first, so each array is its own allocation and an out-of-bounds access is one
the tool can see.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 benchmarks/sanitize.py
    python3 benchmarks/sanitize.py --backend model     # the same calls on the CPU (a rehearsal)

``--only forward decode`` runs a subset (families: forward, pool, decode, split, maps).
Exit status 0 when every run finished with finite results; an exception ends the
script with a traceback (status 1), the sanitizer's own findings with its
``--error-exitcode``.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kdacupy  # noqa: E402
from kdacupy import seqpar  # noqa: E402
from kdacupy.numerics.dtypes import BF16  # noqa: E402
from tests.decode_cases import decode_case  # noqa: E402
from tests.inputs import make_inputs  # noqa: E402

FORWARD = [
    dict(cu_seqlens=[5, 0, 21, 16, 3], H=2, K=64, V=64, state=BF16),
    dict(B=2, T=37, H=1, HV=2, K=128, V=128, state=np.float32),
    dict(T=40, H=1, K=64, V=64, gate="log", g_scale=60.0, state=np.float32),  # the pair form
]
DECODE = ["vk-fp32-pool-gva", "vk-bf16-pool-verify", "kv-bf16-pool", "softplus-raw-beta-128"]
FAMILIES = ("forward", "pool", "decode", "split", "maps")


class Runner:
    """Moves inputs to the device (``backend="cuda"``) or keeps them on the host."""

    def __init__(self, backend):
        self.backend = backend
        self.cp = None
        if backend == "cuda":
            import cupy

            cupy.cuda.set_allocator(None)  # plain cudaMalloc per array: the tool sees every array's bounds
            cupy.cuda.set_pinned_memory_allocator(None)
            self.cp = cupy

    def dev(self, d):
        if self.cp is None:
            return dict(d, backend=self.backend)
        return {n: (self.cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in d.items()}

    def host(self, x):
        if self.cp is not None:
            self.cp.cuda.Device().synchronize()
            x = self.cp.asnumpy(x)
        return np.asarray(x).astype(np.float32)

    def check(self, label, *arrays):
        for a in arrays:
            assert np.isfinite(self.host(a)).all(), f"{label}: non-finite result"
        print(f"{label}: ok", flush=True)


def forward(r):
    for i, case in enumerate(FORWARD):
        for precision in ("bf16", "fp32"):
            x, opts = make_inputs(**case)
            o, s = kdacupy.kda_forward(**r.dev({**x, **opts}), qk_l2norm=True, output_final_state=True,
                                       state_precision=precision)
            r.check(f"forward case {i} state={precision}", o, s)


def pool(r):
    x, opts = make_inputs(cu_seqlens=[40, 0, 17, 1], H=1, HV=2, K=128, V=128)
    p = (0.5 * np.random.default_rng(1).standard_normal((6, 2, 128, 128))).astype(BF16)
    d = r.dev({**x, **opts, "state_pool": p, "state_indices": np.array([4, 1, -1, 0], np.int32)})
    o, _ = kdacupy.kda_forward(**d, state_layout="vk")
    r.check("forward through a pool (a padding slot)", o, d["state_pool"])


def decode(r):
    for name in DECODE:
        x, opts, p = decode_case(name)
        if opts["state_indices"].ndim == 1:
            opts["state_indices"] = opts["state_indices"].copy()
            opts["state_indices"][0] = -1  # padding: neither read nor written
        d = r.dev({**x, **opts, "state_pool": p})
        o = kdacupy.kda_decode(**d)
        r.check(f"decode {name}", o, d["state_pool"])


def split(r):
    x, opts = make_inputs(cu_seqlens=[150, 0, 77, 300, 1], H=2, K=64, V=64, state=BF16)
    o, s = kdacupy.kda_forward(**r.dev({**x, **opts}), output_final_state=True, sequence_parallel=5)
    r.check("split forward (5 segments: maps, scan, segment forward)", o, s)


def maps(r):
    x, opts = make_inputs(cu_seqlens=[300, 0, 77], H=2, HV=4, K=128, V=128)
    opts.pop("initial_state", None)
    M, B = seqpar.state_maps(**r.dev({**x, **opts}))
    r.check("state_maps", M, B)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cuda", choices=("cuda", "model", "emulate", "reference"))
    ap.add_argument("--only", nargs="+", choices=FAMILIES, default=FAMILIES)
    args = ap.parse_args(argv)
    r = Runner(args.backend)
    for family in args.only:
        globals()[family](r)
    print(f"sanitize runs done ({', '.join(args.only)}; backend {args.backend})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

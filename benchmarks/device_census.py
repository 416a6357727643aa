"""How many kernel variants each step of benchmarks/device_check.sh compiles,
counted on the CPU: every step's calls (the GPU tests' inputs and options, the
sanitizer runs, the accuracy sweeps, the tuner's candidates, the benchmark
shapes) go through the emulation backend with a loader that records which
variant each launch asks for and launches nothing. Steps run in the script's
order and CuPy's kernel cache persists across processes, so a variant costs a
compile only in the first step that asks for it; the ``new`` column counts
those. With ``--time`` it also compiles one variant of each kernel through
NVRTC for sm_90 here and prints the seconds per variant (the box arithmetic of
device_check.sh's header uses these).

    PYTHONPATH=. python benchmarks/device_census.py [--time]

The GPU tests' own probe kernels (tests/gpu/test_gpu_ptx.py: one module) and
FLA's Triton kernels are not kdacupy variants and are not counted here.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kdacupy  # noqa: E402
from kdacupy import seqpar  # noqa: E402
from kdacupy.numerics.dtypes import BF16  # noqa: E402
from tests.cases import CASES, case_inputs  # noqa: E402
from tests.decode_cases import DECODE_CASES, decode_case  # noqa: E402
from tests.decode_inputs import make_decode  # noqa: E402
from tests.inputs import make_inputs  # noqa: E402

SEEN: list = []


class Recorder:
    """Stands in for the emulation's loader: records (kernel, config), launches nothing."""

    def get(self, kernel, config, name):
        SEEN.append((kernel, tuple(sorted(config.items()))))
        return name

    @staticmethod
    def launch(fn, grid, block, args, shared_mem):
        return None


def fwd(x, opts, **kw):
    kdacupy.kda_forward(**x, **opts, **{"backend": "emulate", **kw})


def gpu_suite():
    """tests/gpu/test_gpu_forward.py, test_gpu_decode.py, test_gpu_seqpar.py (their inputs and options)."""
    from kdacupy.cli.accuracy import OPTIONS, adversarial_inputs, make_inputs as sweep_inputs
    for name in CASES:
        longer = {"cu_seqlens": [150, 0, 77, 300, 1]} if "cu_seqlens" in CASES[name][0] else {"T": 300}
        for precision in ("bf16", "fp32"):
            for size in ({}, longer):
                fwd(*case_inputs(name, precision, **size))
        x, opts = case_inputs(name, "bf16", **longer)
        fwd(x, opts, sequence_parallel=1)
        fwd(x, opts, sequence_parallel=5)
    fwd(*make_inputs(cu_seqlens=list(range(18)) + [0], H=2, K=128, V=128, state=np.float32),
        output_final_state=True)
    fwd(*make_inputs(T=4096, H=8, K=128, V=128, state=BF16), output_final_state=True)
    x, _ = make_inputs(T=200, H=64, K=128, V=128)  # the 2^31-offset test's options, a short T
    fwd(x, dict(qk_l2norm=True, beta_sigmoid=True, gate="sigmoid", lower_bound=-5.0,
                cu_seqlens=np.array([0, 100, 200]), output_final_state=True))
    fwd(*make_inputs(cu_seqlens=[100, 0, 333], H=4, K=128, V=128, state=BF16), output_final_state=True)
    for kw in (dict(T=100, H=2, K=64, V=64), dict(T=1000, H=4, K=128, V=128), dict(T=200, H=2, K=128, V=128)):
        fwd(*make_inputs(**kw))
    for name in ("repeat-key g=0 T=8192", "repeat-key slow beta~2"):
        fwd(*adversarial_inputs(name, 8192, 4, 128, 128, seed=6))
    for name in DECODE_CASES:
        for size in ({}, dict(N=37)):
            if size and "indices" in DECODE_CASES[name]:
                size = dict(N=37, accepted=list(np.arange(37) % DECODE_CASES[name]["T"] + 1))
            x, opts, pool = decode_case(name, **size)
            kdacupy.kda_decode(**x, state_pool=pool, **opts, backend="emulate")
    for kw in (dict(N=4, T=1, H=2, HV=4, K=128, V=128, P=6, pool_dtype=BF16, indices=[-1, 5, 2, 0]),
               dict(N=8, T=1, H=2, HV=4, K=128, V=128, P=17, pool_dtype=np.float32)):
        x, opts, pool = make_decode(**kw)
        kdacupy.kda_decode(**x, state_pool=pool, **opts, backend="emulate")
    x, opts = make_inputs(cu_seqlens=[40, 0, 17, 1], H=1, HV=2, K=128, V=128)
    pool = np.zeros((6, 2, 128, 128), BF16)
    fwd(x, opts, state_layout="vk", state_pool=pool, state_indices=np.array([4, 1, -1, 0], np.int32))
    x, opts = make_inputs(cu_seqlens=[300, 0, 77], H=2, HV=4, K=128, V=128)
    seqpar.state_maps(**x, **opts, backend="emulate")
    x = sweep_inputs(8192, 4, 128, 128, "N(0,8)", "U(-8,8)", seed=1)
    for n in (1, 8, 32):
        fwd(x, OPTIONS, sequence_parallel=n)
    x, opts = make_inputs(T=20000, H=1, HV=1, K=128, V=128, state=BF16, state_layout="vk")
    fwd(x, opts, output_final_state=True, sequence_parallel=1)


def long_sweep():
    """tests/gpu/test_gpu_long.py: the sweep's options at T = 8192, fixed and varlen, and the
    256-token segments started from the model's (fp32) states."""
    from kdacupy.cli.accuracy import OPTIONS, make_inputs as sweep_inputs
    x = sweep_inputs(8192, 4, 128, 128, "-8", "+4", seed=5)
    fwd(x, OPTIONS)
    fwd(x, dict(OPTIONS, cu_seqlens=np.concatenate([[0], np.cumsum([1300, 547, 2048, 963, 271, 3063])])))
    seg = np.arange(0, 8193, 256)
    fwd(x, dict(OPTIONS, cu_seqlens=seg, initial_state=np.zeros((32, 4, 128, 128), np.float32)))


def sanitize():
    from benchmarks import sanitize as s
    r = s.Runner("emulate")
    r.check = lambda label, *arrays: None  # nothing was launched: the outputs are garbage
    for family in s.FAMILIES:
        getattr(s, family)(r)


def accuracy():
    from kdacupy.cli.accuracy import OPTIONS, make_inputs as sweep_inputs
    fwd(sweep_inputs(8192, 1, 128, 128, "-8", "+4", 0), OPTIONS, state_precision="fp32")


def adversarial():
    from kdacupy.cli.accuracy import ADVERSARIAL, adversarial_inputs
    for name in ADVERSARIAL:
        x, opts = adversarial_inputs(name, 256, 1, 128, 128)
        fwd(x, opts)


def tune_kimi():
    """python -m kdacupy.tune --shapes kimi: every bucket's prepare and candidates."""
    from kdacupy.cli.shapes import resolve_shapes, shape_problem
    from kdacupy.cli.tune import group_buckets
    from kdacupy.ops.forward.kernels import prepare_variant, recurrence_variant
    for b in group_buckets(resolve_shapes(["kimi"]), 132):
        p = shape_problem(b.shape)
        for v in [prepare_variant(p)] + [recurrence_variant(p, c) for c in b.candidates]:
            SEEN.append((v.kernel if hasattr(v, "kernel") else type(v).__name__, tuple(sorted(v.config().items()))))


def bench(names):
    from kdacupy.cli.shapes import make_inputs as shape_inputs, resolve_shapes
    for shape in resolve_shapes(names):
        small = shape.__class__(**{**shape.__dict__, "T": min(shape.T, 4096) if shape.lens is None else shape.T})
        x, opts = shape_inputs(small)
        fwd(x, opts)
        if names == ["fewhead"]:
            for n in (4, 16):
                fwd(x, opts, sequence_parallel=n)


def decode_bench():
    from kdacupy.cli.bench_decode import decode_shapes, make_case
    for s in decode_shapes():
        if s["N"] > 64:
            continue  # the variant does not depend on N (only the tiles do, through N x HV)
        a, o = make_case(s)
        kdacupy.kda_decode(**a, **o, backend="emulate")
    from kdacupy.ops.decode.kernels import DecodeVariant, decode_heuristic  # noqa: F401
    for s in decode_shapes():  # the tiles at N = 256, 512
        if s["N"] > 64:
            a, o = make_case(dict(s, N=64))
            kdacupy.kda_decode(**a, **o, backend="emulate")


STEPS = [
    ("GPU suite (forward, decode, seqpar)", gpu_suite),
    ("GPU long sweep", long_sweep),
    ("compute-sanitizer x3", sanitize),
    ("tuning (Kimi)", tune_kimi),
    ("benchmark (Kimi)", lambda: bench(["kimi"])),
    ("accuracy T=8192 fp32 state", accuracy),
    ("adversarial accuracy", adversarial),
    ("few-head serial vs split", lambda: bench(["fewhead"])),
    ("decode benchmark", decode_bench),
]

#: NVRTC seconds per variant for sm_90 on this machine's CPU (one core), by kernel (--time measures them)
PER_VARIANT_S = {"kda_prepare": 0.19, "kda_recurrence": 0.37, "kda_decode": 0.09, "kda_seqpar_scan": 0.10}


def census():
    from kdacupy.emulate.loader import EmulatedModule  # noqa: F401  (the emulation must import)
    from kdacupy.jit.loaders import EmulateLoader
    EmulateLoader.get = Recorder.get
    EmulateLoader.launch = staticmethod(Recorder.launch)
    from kdacupy.ops.decode import fastpath
    fastpath.clear()
    seen = set()
    rows = []
    for name, fn in STEPS:
        SEEN.clear()
        fn()
        step = set(SEEN)
        new = step - seen
        seen |= step
        by = Counter(k for k, _ in new)
        secs = sum(PER_VARIANT_S.get(k, 0.37) * n for k, n in by.items())
        rows.append((name, len(step), len(new), dict(by), secs))
    return rows


def time_variants():
    from kdacupy.cli.compile import select as pick
    from kdacupy.jit.nvrtc import compile_variant
    for kernel in ("prepare", "recurrence", "decode", "seqpar"):
        v = pick(kernel, ["K=128"])[0]
        compile_variant(v, "sm_90")  # warm NVRTC up
        t0 = time.perf_counter()
        for v in pick(kernel, ["K=128"])[:6]:
            compile_variant(v, "sm_90")
        print(f"{kernel}: {(time.perf_counter() - t0) / 6:.2f} s per variant (sm_90, one thread)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time", action="store_true", help="also time NVRTC per variant here")
    args = ap.parse_args(argv)
    print(f"{'step':38s} {'variants':>8} {'new':>5}  {'compile s (here)':>16}  new by kernel")
    for name, total, new, by, secs in census():
        print(f"{name:38s} {total:8d} {new:5d}  {secs:16.1f}  {by}")
    if args.time:
        time_variants()
    return 0


if __name__ == "__main__":
    sys.exit(main())

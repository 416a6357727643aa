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
FLA's Triton kernels are not kdacupy variants and are not counted there; ``--time-fla``
times the Triton compiles of FLA's first chunk_kda calls in the FLA steps (the pairs
benchmarks/fla_precompile.py compiles ahead), through Triton's own JIT specialisation.

    PYTHONPATH=. python benchmarks/device_census.py --time-fla
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


def gpu_backward():
    """tests/gpu/test_gpu_backward.py: the emulation suite's cases in both state precisions, the
    sweep problems (T = 1024, H = 4, three regimes; T = 2048, H = 8 for the repeatability test;
    T = 700, H = 2 varlen for the graph), the stream test's case."""
    from tests.emulate.test_backward_emulate import CASES as BWD_CASES, inputs as bwd_inputs
    from tests.gpu.test_gpu_backward import sweep_problem
    for name in BWD_CASES:
        x, opts, do, ds = bwd_inputs(name)
        for precision in ("bf16", "fp32"):
            kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, state_precision=precision, backend="emulate")
    for g_regime, bias_regime in (("N(0,8)", "U(-8,8)"), ("-8", "-8"), ("8", "+8")):
        args, opts = sweep_problem(g_regime=g_regime, bias_regime=bias_regime)
        kdacupy.kda_backward(**args, **opts, backend="emulate")
    args, opts = sweep_problem(T=2048, H=8)
    kdacupy.kda_backward(**args, **opts, backend="emulate")
    args, opts = sweep_problem(T=700, H=2)
    opts["cu_seqlens"] = np.array([0, 100, 100, 700])
    opts["initial_state"] = np.concatenate([opts["initial_state"]] * 3)
    opts["dfinal_state"] = np.concatenate([opts["dfinal_state"]] * 3)
    kdacupy.kda_backward(**args, **opts, backend="emulate")


def bench_backward(specs):
    """python -m kdacupy.bench --shapes backward SPECS: per shape the backward (whose forward
    stores each chunk's start state) and the forward, as kdacupy/cli/bench_backward.py calls them."""
    from kdacupy.cli.bench_backward import backward_shapes, loss_inputs
    for shape in backward_shapes(specs):
        arrays, fwd_opts, bwd_opts = loss_inputs(shape, np)
        ins = {n: a for n, a in arrays.items() if n != "do"}
        kdacupy.kda_forward(**ins, **fwd_opts, backend="emulate")
        kdacupy.kda_backward(**arrays, **bwd_opts, backend="emulate")


def gpu_frameworks():
    """tests/frameworks/test_gpu_frameworks.py: every kdacupy call its tests make, directly and
    through kdacupy.torch, kdacupy.compat.fla and kdacupy.jax, with the tests' shapes, dtypes and
    options (CPU tensors here; the adapters' backend=None is sent to the emulation). FLA's own
    Triton kernels and its naive reference are not kdacupy variants."""
    import torch

    import kdacupy.compat.fla as compat
    import kdacupy.torch as kt
    from kdacupy.validation import problem as vp
    real = vp.check_backend
    vp.check_backend = lambda backend, device: real("emulate" if backend is None else backend, device)
    try:
        def torch_inputs(B=1, T=300, H=2, HV=4, D=128):
            gen = torch.Generator().manual_seed(0)
            rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
            x = [rnd(B, T, H, D).bfloat16(), rnd(B, T, H, D).bfloat16(), rnd(B, T, HV, D).bfloat16(),
                 rnd(B, T, HV, D), rnd(B, T, HV)]
            return x, dict(gate="sigmoid", lower_bound=-5.0, A_log=rnd(HV) * 0.1, dt_bias=rnd(HV * D),
                           beta_sigmoid=True, qk_l2norm=True)
        x, opts = torch_inputs()
        kt.kda(*x, output_final_state=True, **opts)  # the stream test (and its kdacupy.kda_forward reference)
        x, opts = torch_inputs(T=200)
        kt.kda(*x, cu_seqlens=torch.tensor([0, 50, 50, 200], dtype=torch.int32), output_final_state=True, **opts)
        x, opts = torch_inputs(B=8, T=1)
        pool = torch.randn(16, 4, 128, 128)
        kt.kda_decode(*x, state_pool=pool, state_indices=torch.arange(8, dtype=torch.int32) * 2, **opts)
        x, opts = torch_inputs(T=100)
        leaves = [t.clone().requires_grad_() for t in x]
        o, s = kt.kda(*leaves, output_final_state=True, **opts)
        (o.float().square().mean() + s.mean()).backward()  # the autograd test: kda_backward
        N, H, D = 16, 16, 128
        pool = torch.randn(3 * N, H, D, D)
        idx = torch.randperm(3 * N)[:N].int()
        q, k, v = (torch.rand(1, N, H, D, dtype=torch.bfloat16) for _ in range(3))
        g = torch.nn.functional.logsigmoid(torch.randn(1, N, H, D))
        beta = torch.rand(1, N, H).sigmoid().bfloat16()
        compat.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool.clone(),
                                       cu_seqlens=torch.arange(N + 1, dtype=torch.int32), ssm_state_indices=idx,
                                       use_qk_l2norm_in_kernel=True)
        B, T = 2, 1024
        q, k, v = (torch.rand(B, T, H, D, dtype=torch.bfloat16) for _ in range(3))
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D))
        beta = torch.rand(B, T, H).sigmoid().bfloat16()
        compat.chunk_kda(q, k, v, g, beta, initial_state=pool[:B], output_final_state=True,
                         use_qk_l2norm_in_kernel=True)
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(s).astype(np.float32) for s in ((1, 300, 2, 128), (1, 300, 2, 128),
                                                                   (1, 300, 4, 128), (1, 300, 4, 128), (1, 300, 4))]
        xs[3] = -np.abs(xs[3])
        kdacupy.kda_forward(*xs, qk_l2norm=True, backend="emulate")  # the JAX test's reference and kdacupy.jax.kda
        kdacupy.kda_decode(*(a[:, :1] for a in xs), state_pool=np.zeros((2, 4, 128, 128), np.float32),
                           state_indices=np.array([1], np.int32), qk_l2norm=True, backend="emulate")
    finally:
        vp.check_backend = real


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


STEPS = [  # in device_check.sh's order (the steps that launch no kdacupy kernel left out)
    ("GPU suite (forward, decode, seqpar)", gpu_suite),
    ("GPU backward", gpu_backward),
    ("tuning (Kimi)", tune_kimi),
    ("benchmark (Kimi)", lambda: bench(["kimi"])),
    ("backward against FLA (kimi-T8192-H96)", lambda: bench_backward(["kimi-T8192-H96"])),
    ("compute-sanitizer x3", sanitize),
    ("GPU long sweep", long_sweep),
    ("decode benchmark", decode_bench),
    ("accuracy T=8192 fp32 state", accuracy),
    ("adversarial accuracy", adversarial),
    ("frameworks on the GPU", gpu_frameworks),
    ("few-head serial vs split", lambda: bench(["fewhead"])),
]

#: NVRTC seconds per variant for sm_90 on this machine's CPU (one core), by kernel (--time measures them)
PER_VARIANT_S = {"kda_prepare": 0.23, "kda_recurrence": 0.37, "kda_decode": 0.09, "kda_seqpar_scan": 0.38,
                 "kda_bwd_chain": 0.38, "kda_bwd_chunk": 0.72, "kda_bwd_reduce": 0.04}


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


#: (--kernel of python -m kdacupy.compile, --match texts) per timed kernel: K = V = 128 variants
TIMED = {"kda_prepare": ("prepare", ["K=128"]), "kda_recurrence": ("recurrence", ["K=128 V=128"]),
         "kda_decode": ("decode", ["K=128"]), "kda_seqpar_scan": ("seqpar", ["K=128"]),
         "kda_recurrence (store_states)": ("backward", ["K=128 V=128", "store_states"]),
         "kda_bwd_chain": ("backward", ["kda_bwd_chain K=128 V=128"]),
         "kda_bwd_chunk": ("backward", ["kda_bwd_chunk K=128"]), "kda_bwd_reduce": ("backward", ["kda_bwd_reduce"])}


def time_variants():
    from kdacupy.cli.compile import select as pick
    from kdacupy.jit.nvrtc import compile_variant
    for name, (kernel, match) in TIMED.items():
        found = pick(kernel, match)
        compile_variant(found[0], "sm_90")  # warm NVRTC up
        some = found[:: max(1, len(found) // 6)][:6]  # spread over the options
        t0 = time.perf_counter()
        for v in some:
            compile_variant(v, "sm_90")
        print(f"{name}: {(time.perf_counter() - t0) / len(some):.2f} s per variant (sm_90, one thread, "
              f"{len(some)} of {len(found)})")


def time_cpu_costs():
    """The new steps' CPU work here, one core: the backward tests' float64 references and model
    runs, and the imports the framework and FLA steps pay (each in a fresh interpreter)."""
    import subprocess
    from kdacupy.numerics.backward_model import kda_backward_model
    from kdacupy.numerics.backward_reference import kda_backward_reference
    from tests.emulate.test_backward_emulate import CASES as BWD_CASES, inputs as bwd_inputs
    from tests.gpu.test_gpu_backward import sweep_problem
    args, opts = sweep_problem()
    t0 = time.perf_counter()
    kda_backward_reference(**args, **opts)
    print(f"backward float64 reference, T = 1024, H = 4 (x3 in tests/gpu/test_gpu_backward.py): "
          f"{time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    for name in BWD_CASES:
        x, o, do, ds = bwd_inputs(name)
        for precision in ("bf16", "fp32"):
            kda_backward_model(do, **x, dfinal_state=ds, **o, state_precision=precision)
    print(f"backward model, the {2 * len(BWD_CASES)} parity runs: {time.perf_counter() - t0:.2f} s")
    for stmt in ("import kdacupy", "import torch", "import kdacupy.torch", "import torch, triton",
                 "import torch, fla.ops.kda", "import jax, jax.numpy; jax.devices()", "import kdacupy.jax"):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", stmt], capture_output=True, check=False)
        print(f"{stmt}: {time.perf_counter() - t0:.2f} s")


# ---------------------------------------------------------------------------
# FLA's first calls: Triton compiles every configuration its autotuner lists, one after another


def _cpu_seconds():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system  # ptxas runs as a child


#: Triton's autotuner times each configuration with triton.testing.do_bench (25 ms of warm-up and
#: 100 ms of repetitions by default, each after a 256 MB cache clear, after a first estimate),
#: plus loading the binary: about this much time per configuration
BENCH_S_PER_CONFIG = 0.2


def time_fla(sample=3):
    """The Triton compiles of FLA's first calls in each FLA step, timed here (one core, sm_90,
    through the JIT's own specialisation: benchmarks/fla_precompile.py's jit_source): per
    (launch, configuration) pair not already in Triton's cache (the steps run in order; the cache
    is on disk), ``sample`` pairs per kernel compiled and their mean times the count. FLA's
    autotuner then times every configuration of a key not tuned before (BENCH_S_PER_CONFIG)."""
    import tempfile
    import triton
    from triton.backends.compiler import GPUTarget

    from benchmarks import fla_precompile as fp
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kdacupy-census-triton-")
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    fp.hopper_choices()
    target = GPUTarget("cuda", 90, 32)
    compiled, grand = set(), 0.0
    steps = {"benchmark against FLA (forward: fixed, then varlen)": ("forward, fixed", "forward, varlen"),
             "backward against FLA (fixed; forward from the cache)": ("forward + backward, fixed",)}
    calls = dict(fp.cpu_calls())
    for step, names in steps.items():
        total = tuned = 0.0
        rows = {}
        for name in names:
            for item in fp.work_items(fp.record_launches(calls[name])):
                fn, src, options = fp.jit_source(item, target)  # the JIT's own source, specialisation, options
                config = item[1]
                key = (src.hash(), options.hash())
                if key in compiled:
                    continue
                compiled.add(key)
                n, secs, timed = rows.get(fn.__name__, (0, [], 0))
                if len(secs) < sample:
                    t0 = _cpu_seconds()
                    try:
                        triton.compile(src, target=target, options=options.__dict__)
                    except Exception as e:  # noqa: BLE001  (a configuration FLA's autotuner would drop)
                        print(f"  {fn.__name__} {config}: {type(e).__name__}", file=sys.stderr)
                    secs = secs + [_cpu_seconds() - t0]
                rows[fn.__name__] = (n + 1, secs, timed + (config is not None))
        for kernel, (n, secs, timed) in rows.items():
            total += sum(secs) / len(secs) * n
            tuned += timed * BENCH_S_PER_CONFIG
        grand += total
        print(f"{step}: {sum(r[0] for r in rows.values())} new compiles, {total:.0f} s here (one core) "
              f"+ ~{tuned:.0f} s of autotuning on the GPU")
        for kernel, (n, secs, _) in rows.items():
            print(f"    {kernel:48s} {n:3d} x {sum(secs) / len(secs):5.2f} s")
    print(f"all: {grand:.0f} s of compiles here, one after another; benchmarks/fla_precompile.py spreads them "
          f"over the GPU machine's cores before the FLA steps")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time", action="store_true",
                    help="also time NVRTC per variant, the backward tests' references and the imports here")
    ap.add_argument("--time-fla", action="store_true",
                    help="also time the Triton compiles of FLA's first chunk_kda calls here (needs torch, fla, triton)")
    args = ap.parse_args(argv)
    print(f"{'step':38s} {'variants':>8} {'new':>5}  {'compile s (here)':>16}  new by kernel")
    for name, total, new, by, secs in census():
        print(f"{name:38s} {total:8d} {new:5d}  {secs:16.1f}  {by}")
    if args.time:
        time_variants()
        time_cpu_costs()
    if args.time_fla:
        time_fla()
    return 0


if __name__ == "__main__":
    sys.exit(main())

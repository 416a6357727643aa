"""FLA's Triton kernels for the chunk_kda steps of benchmarks/device_check.sh (the forward and
the backward benchmarks against FLA), compiled before those steps run, in parallel processes.
On a fresh machine FLA's first ``chunk_kda`` call compiles every configuration its autotuner
lists, one after another, before it times them: measured on a CPU core
(``benchmarks/device_census.py --time-fla``), 188 configurations and ~70 s of compiles for the
forward benchmark's shapes, 109 and ~65 s more for the backward's, most of those steps' boxes.
(The decode step's fused_recurrent_kda_fwd is not autotuned: it compiles its few kernels itself.)

Each worker makes the benchmark steps' own FLA calls (kdacupy/cli/peers.py, bench_backward.py:
their inputs, options and shapes) with Triton's launches recorded instead of
made, then compiles its share of the (launch, configuration) pairs through Triton's own warm-up
path (``JITFunction.warmup``: a real launch's specialisation and cache key), which writes
Triton's on-disk cache. FLA's autotuner later finds every binary there and only times the
configurations. Nothing runs on the GPU here (no kernel is launched, nothing is timed), so FLA's
autotuning choices stay its own; if a binary were missed, FLA compiles it itself, as without
this step.

    python benchmarks/fla_precompile.py [--workers N]    (a GPU machine with torch and fla)
    python benchmarks/fla_precompile.py --dry-run        (any machine: the same work on CPU tensors,
                                                          each pair checked through Triton's binder)
"""
from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: what the FLA steps of device_check.sh run (tests/test_device_check.py holds them equal)
FORWARD_SHAPES = ["kimi96"]  # python -m kdacupy.bench --shapes kimi96
BACKWARD_SHAPES = ["kimi-T8192-H96"]  # python -m kdacupy.bench --shapes backward kimi-T8192-H96


def hopper_choices():
    """fla-core picks its configuration lists at import from the device (IS_NVIDIA_HOPPER,
    check_shared_mem); without a GPU, set them as an H200 reports them (before fla.ops loads)."""
    import fla.utils as fu
    fu.IS_NVIDIA_HOPPER = True
    fu.check_shared_mem = lambda arch="none", tensor_idx=0: True


def record_launches(work) -> list:
    """Every Triton launch ``work()`` makes, recorded and not made: (kind, launcher, args, kwargs),
    kind "autotune" (an Autotuner: each of its configurations compiles) or "jit"."""
    from triton.runtime import autotuner, jit as tjit
    calls = []
    saved = autotuner.Autotuner.run, tjit.JITFunction.run

    def autotuned(self, *args, **kwargs):
        calls.append(("autotune", self, args, {n: v for n, v in kwargs.items() if n != "warmup"}))

    def plain(self, *args, grid=None, warmup=False, **kwargs):
        calls.append(("jit", self, args, dict(kwargs, grid=grid)))

    autotuner.Autotuner.run, tjit.JITFunction.run = autotuned, plain
    try:
        work()
    finally:
        autotuner.Autotuner.run, tjit.JITFunction.run = saved
    return calls


def jit_of(launcher):
    """(the JITFunction under ``launcher``, the Heuristics between them)."""
    from triton.runtime import autotuner, jit as tjit
    chain = []
    while not isinstance(launcher, tjit.JITFunction):
        if isinstance(launcher, autotuner.Heuristics):
            chain.append(launcher)
        launcher = launcher.fn
    return launcher, chain


def configs_of(kind, launcher, args, kwargs) -> list:
    """The configurations FLA's autotuner compiles for this launch ([None]: a plain launch)."""
    if kind != "autotune":
        return [None]
    launcher.nargs = dict(zip(launcher.arg_names, args))
    try:
        return list(launcher.prune_configs({n: v for n, v in kwargs.items() if n != "grid"}))
    finally:
        launcher.nargs = None


def work_items(launches, seen=None) -> list:
    """(launch, configuration) pairs, one per distinct launch (same kernel, same argument kinds;
    ``seen``: the launches of earlier calls, shared)."""
    seen, items = set() if seen is None else seen, []
    for kind, launcher, args, kwargs in launches:
        kinds = tuple((n, str(getattr(v, "dtype", None if hasattr(v, "data_ptr") else v)))
                      for n, v in list(enumerate(args)) + sorted(kwargs.items()) if n != "grid")
        if (id(launcher), kinds) in seen:
            continue
        seen.add((id(launcher), kinds))
        items += [((kind, launcher, args, kwargs), c) for c in configs_of(kind, launcher, args, kwargs)]
    return items


def launch_kwargs(item) -> dict:
    """The keywords the JITFunction gets for one (launch, configuration), as the autotuner and the
    heuristics between them would pass them."""
    (kind, launcher, args, kwargs), config = item
    fn, heuristics = jit_of(launcher)
    kw = {n: v for n, v in kwargs.items() if n != "grid"}
    if config is not None:
        kw.update(config.all_kwargs())
    for h in heuristics:  # below the autotuner: Heuristics.run would add these
        named = {**dict(zip(fn.arg_names, args)), **kw}
        for name, heur in h.values.items():
            kw.setdefault(name, heur(named))
    return kw


def warm(item) -> None:
    """Compile one (launch, configuration) as its launch would, into Triton's caches (needs the
    GPU's driver: the target and the cache key are the device's)."""
    (kind, launcher, args, kwargs), config = item
    jit_of(launcher)[0].warmup(*args, grid=kwargs.get("grid") or (1,), **launch_kwargs(item))


def jit_source(item, target=None):
    """(JITFunction, ASTSource, options) of one (launch, configuration) as JITFunction.run builds
    them (its binder: specialisation, constants, alignment attributes), without a driver:
    ``target`` defaults to an H200's (sm_90). For the dry run's check and the census's timing."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    (kind, launcher, args, kwargs), config = item
    fn = jit_of(launcher)[0]
    kw = launch_kwargs(item)
    kw["debug"] = kw.get("debug", fn.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    backend = make_backend(target or GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, specialization, options)
    return fn, ASTSource(fn, signature, constexprs, attrs), options


# ---------------------------------------------------------------------------
# the benchmark steps' FLA calls


def free_memory():
    gc.collect()
    try:
        import cupy
        import torch
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001  (no GPU: nothing to free)
        pass


def gpu_calls(forward, backward):
    """(name, work) per shape: FLA's calls as the benchmark steps make them, on their inputs."""
    import torch

    from kdacupy.cli import peers
    from kdacupy.cli.bench import device_inputs
    from kdacupy.cli.bench_backward import FLABackward, backward_shapes, loss_inputs
    from kdacupy.cli.shapes import resolve_shapes
    fla = peers.FLA()

    def forward_call(shape):
        arrays, options = device_inputs(shape, 0)
        for state_dtype in (torch.bfloat16, torch.float32):  # as peers.run_fla tries them
            try:
                fla.call(fla.kwargs(arrays, options, state_dtype))
                return
            except Exception:  # noqa: BLE001
                if state_dtype == torch.float32:
                    raise

    def backward_call(shape):
        import cupy
        fb = FLABackward()
        fb.setup(*loss_inputs(shape, cupy))
        fb.step()

    out = [(f"forward {s.name}", lambda s=s: forward_call(s)) for s in resolve_shapes(forward)]
    out += [(f"forward + backward {s.name}", lambda s=s: backward_call(s)) for s in backward_shapes(backward)]
    return out


def cpu_calls(T=512, H=96):
    """FLA's chunk_kda with the benchmarks' options on CPU tensors (T does not specialise FLA's
    kernels): forward fixed, forward varlen, forward + backward fixed."""
    import torch
    from fla.ops.kda import chunk_kda

    from kdacupy.cli.peers import layout_keyword, signature_params

    def call(varlen, backward):
        D = 128
        mk = lambda *s, dt=torch.bfloat16: torch.randn(*s).to(dt).requires_grad_(backward)  # noqa: E731
        q, k, v, g, beta = mk(1, T, H, D), mk(1, T, H, D), mk(1, T, H, D), mk(1, T, H, D), mk(1, T, H)
        leaves = dict(initial_state=mk(2 if varlen else 1, H, D, D, dt=torch.float32),
                      A_log=mk(H, dt=torch.float32), dt_bias=mk(H * D, dt=torch.float32))
        kw = dict(scale=D ** -0.5, output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0, **leaves)
        layout = layout_keyword(signature_params(chunk_kda))
        if layout:
            kw[layout] = True
        if varlen:
            kw["cu_seqlens"] = torch.tensor([0, T // 3, T], dtype=torch.long)
        with torch.inference_mode(not backward):
            o, ht = chunk_kda(q, k, v, g, beta, **kw)[:2]
        if backward:
            torch.autograd.grad([o, ht], [q, k, v, g, beta, *leaves.values()],
                                [torch.randn_like(o), torch.randn_like(ht)], allow_unused=True)

    return [("forward, fixed", lambda: call(False, False)), ("forward, varlen", lambda: call(True, False)),
            ("forward + backward, fixed", lambda: call(False, True))]


def shadow(x):
    """What Triton's specialisation reads of a tensor (dtype, shape, the pointer's alignment), so
    the recorded launches keep no device memory; anything else as it is."""
    if not hasattr(x, "data_ptr") or not hasattr(x, "dtype"):
        return x
    from triton.runtime.jit import MockTensor

    class Shadow(MockTensor):
        def __init__(self, t):
            super().__init__(t.dtype, list(t.shape))
            self.misalignment = t.data_ptr() % 16

        def data_ptr(self):
            return self.misalignment

    return Shadow(x)


def all_items(calls, keep_real=False) -> list:
    """The work items of every call, each call's tensors freed once its launches are recorded
    (``keep_real``: pairs (item, the same with the real tensors), for the dry run's check)."""
    items, seen = [], set()
    for name, work in calls:
        for real in work_items(record_launches(work), seen):
            (kind, launcher, args, kwargs), config = real
            item = ((kind, launcher, tuple(map(shadow, args)), {n: shadow(v) for n, v in kwargs.items()}), config)
            items.append((item, real) if keep_real else item)
        real = None  # noqa: F841  (the last launch's tensors too)
        free_memory()
    return items


def kernel_name(item) -> str:
    return jit_of(item[0][1])[0].__name__


def check(pair) -> None:
    """The dry run's stand-in for ``warm``: the item goes through Triton's binder, and its shadowed
    arguments give the real tensors' cache key."""
    item, real = pair
    if jit_source(item)[1].hash() != jit_source(real)[1].hash():
        raise AssertionError("the shadowed arguments change the cache key")


# ---------------------------------------------------------------------------


def worker(index, count, args) -> int:
    """Compile (with --dry-run: check) every count-th work item from the index-th."""
    t0 = time.perf_counter()
    if args.dry_run:
        os.environ.setdefault("FLA_FLASH_KDA", "0")
        hopper_choices()
        pairs = all_items(cpu_calls(), keep_real=True)
        items, todo, action = [p[0] for p in pairs], pairs[index::count], check
    else:
        items = all_items(gpu_calls(args.forward, args.backward))
        todo, action = items[index::count], warm
    t1 = time.perf_counter()
    failed = 0
    for job in todo:
        try:
            action(job)
        except Exception as e:  # noqa: BLE001  (FLA's autotuner drops a configuration that fails to compile)
            failed += 1
            name = kernel_name(job[0] if args.dry_run else job)
            print(f"  worker {index}: {name}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    if index == 0:
        per = {}
        for item in items:
            per[kernel_name(item)] = per.get(kernel_name(item), 0) + 1
        print(f"{len(items)} (launch, configuration) pairs: " + ", ".join(f"{k} {n}" for k, n in per.items()))
    print(f"worker {index}: {len(todo)} {'checked' if args.dry_run else 'compiled'} ({failed} failed) in "
          f"{time.perf_counter() - t1:.1f} s after {t1 - t0:.1f} s of recording", flush=True)
    return 1 if failed and args.dry_run else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=min(8, max(1, (os.cpu_count() or 2) - 4)),
                    help="parallel processes (default: 8, or the cores less 4; each holds one call's tensors "
                         "while it records, a few GB)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: the benchmarks' chunk_kda calls on CPU tensors (FLA's choices as on an H200), "
                         "each (launch, configuration) through Triton's binder instead of compiled")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--forward", nargs="+", default=FORWARD_SHAPES)
    ap.add_argument("--backward", nargs="+", default=BACKWARD_SHAPES)
    args = ap.parse_args(argv)
    from kdacupy.cli.peers import fla_importable
    why = fla_importable()
    if why:
        print(f"FLA is not importable ({why}): nothing to compile")
        return 0
    if args.worker is not None:
        return worker(args.worker, args.workers, args)
    t0 = time.perf_counter()
    cmd = [sys.executable, os.path.abspath(__file__), "--workers", str(args.workers), "--forward", *args.forward,
           "--backward", *args.backward] + (["--dry-run"] if args.dry_run else [])
    procs = [subprocess.Popen(cmd + ["--worker", str(i)]) for i in range(args.workers)]
    rcs = [p.wait() for p in procs]
    print(f"{args.workers} workers ended with status {rcs} after {time.perf_counter() - t0:.1f} s"
          + ("" if args.dry_run else f"; Triton's cache: {os.environ.get('TRITON_CACHE_DIR', '~/.triton/cache')}"))
    return 0 if not any(rcs) else 1


if __name__ == "__main__":
    sys.exit(main())

"""FLA's Triton kernels for the FLA steps of benchmarks/device_check.sh, compiled before those
steps run, in parallel processes. On a fresh machine FLA's first ``chunk_kda`` call compiles
every configuration its autotuner lists, one after another, before it times them: measured on
a CPU (``benchmarks/device_census.py --time-fla``) that is ~80 s of compiles for the forward
benchmark's shapes and ~95 s more for the backward's, most of those steps' boxes.

Each worker makes the benchmark steps' own FLA calls (kdacupy/cli/peers.py, bench_backward.py,
bench_decode.py: their inputs, options and shapes) with Triton's launches recorded instead of
made, then compiles its share of the (launch, configuration) pairs through Triton's own warm-up
path (``JITFunction.warmup``: a real launch's specialisation and cache key), which writes
Triton's on-disk cache. FLA's autotuner later finds every binary there and only times the
configurations. Nothing runs on the GPU here (no kernel is launched, nothing is timed), so FLA's
autotuning choices stay its own; if a binary were missed, FLA compiles it itself, as without
this step.

    python benchmarks/fla_precompile.py [--workers N]    (a GPU machine with torch and fla)
    python benchmarks/fla_precompile.py --dry-run        (any machine: what would be compiled;
                                                          FLA's device-dependent choices as on an H200)
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
DECODE_N = [1, 64, 512]  # python -m kdacupy.bench --shapes decode --decode-n 1 64 512


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


def work_items(launches) -> list:
    """(launch, configuration) pairs, one per distinct launch (same kernel, same argument kinds)."""
    seen, items = set(), []
    for kind, launcher, args, kwargs in launches:
        kinds = tuple((n, str(getattr(v, "dtype", None if hasattr(v, "data_ptr") else v)))
                      for n, v in list(enumerate(args)) + sorted(kwargs.items()) if n != "grid")
        if (id(launcher), kinds) in seen:
            continue
        seen.add((id(launcher), kinds))
        items += [((kind, launcher, args, kwargs), c) for c in configs_of(kind, launcher, args, kwargs)]
    return items


def warm(item) -> None:
    """Compile one (launch, configuration) as its launch would, into Triton's caches."""
    (kind, launcher, args, kwargs), config = item
    fn, heuristics = jit_of(launcher)
    kw = {n: v for n, v in kwargs.items() if n != "grid"}
    if config is not None:
        kw.update(config.all_kwargs())
    for h in heuristics:  # below the autotuner: Heuristics.run would add these
        named = {**dict(zip(fn.arg_names, args)), **kw}
        for name, heur in h.values.items():
            kw.setdefault(name, heur(named))
    fn.warmup(*args, grid=kwargs.get("grid") or (1,), **kw)


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


def gpu_calls(forward, backward, decode_n):
    """(name, work) per shape: FLA's calls as the benchmark steps make them, on their inputs."""
    import torch

    from kdacupy.cli import peers
    from kdacupy.cli.bench import device_inputs
    from kdacupy.cli.bench_backward import FLABackward, backward_shapes, loss_inputs
    from kdacupy.cli.bench_decode import decode_shapes, detect_fla, fla_decode, make_case
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

    def decode_call(s):
        import cupy
        a, o = make_case(s, cupy)
        f = fla_decode(detect_fla(), s, a, o)
        if not callable(f):
            print(f"  FLA decode {s}: {f}", file=sys.stderr)

    out = [(f"forward {s.name}", lambda s=s: forward_call(s)) for s in resolve_shapes(forward)]
    out += [(f"forward + backward {s.name}", lambda s=s: backward_call(s)) for s in backward_shapes(backward)]
    out += [(f"decode {s}", lambda s=s: decode_call(s)) for s in decode_shapes() if s["N"] in decode_n]
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


def all_items(calls) -> list:
    launches = []
    for name, work in calls:
        launches += record_launches(work)
        free_memory()
    return work_items(launches)


def kernel_name(item) -> str:
    return jit_of(item[0][1])[0].__name__


# ---------------------------------------------------------------------------


def worker(index, count, args) -> int:
    t0 = time.perf_counter()
    items = all_items(gpu_calls(args.forward, args.backward, args.decode_n))
    mine = items[index::count]
    t1 = time.perf_counter()
    failed = 0
    for item in mine:
        try:
            warm(item)
        except Exception as e:  # noqa: BLE001  (FLA's autotuner drops such a configuration too)
            failed += 1
            print(f"  worker {index}: {kernel_name(item)} {item[1]}: {type(e).__name__}: {str(e)[:200]}",
                  file=sys.stderr)
    print(f"worker {index}: {len(mine)} of {len(items)} compiled ({failed} failed) in "
          f"{time.perf_counter() - t1:.1f} s after {t1 - t0:.1f} s of recording", flush=True)
    return 0


def dry_run() -> int:
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    hopper_choices()
    total = 0
    for name, work in cpu_calls():
        items = work_items(record_launches(work))
        per = {}
        for item in items:
            per[kernel_name(item)] = per.get(kernel_name(item), 0) + 1
        total += len(items)
        print(f"{name}: {len(items)} (launch, configuration) pairs: "
              + ", ".join(f"{k} {n}" for k, n in per.items()))
    print(f"{total} in all (some shared between the calls); nothing was compiled (--dry-run)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=min(10, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--dry-run", action="store_true", help="no GPU: list what would be compiled")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--forward", nargs="+", default=FORWARD_SHAPES)
    ap.add_argument("--backward", nargs="+", default=BACKWARD_SHAPES)
    ap.add_argument("--decode-n", nargs="+", type=int, default=DECODE_N)
    args = ap.parse_args(argv)
    from kdacupy.cli.peers import fla_importable
    why = fla_importable()
    if why:
        print(f"FLA is not importable ({why}): nothing to compile")
        return 0
    if args.dry_run:
        return dry_run()
    if args.worker is not None:
        return worker(args.worker, args.workers, args)
    t0 = time.perf_counter()
    cmd = [sys.executable, os.path.abspath(__file__), "--workers", str(args.workers), "--forward", *args.forward,
           "--backward", *args.backward, "--decode-n", *map(str, args.decode_n)]
    procs = [subprocess.Popen(cmd + ["--worker", str(i)]) for i in range(args.workers)]
    rcs = [p.wait() for p in procs]
    print(f"{args.workers} workers ended with {rcs} after {time.perf_counter() - t0:.1f} s "
          f"(Triton's cache: {os.environ.get('TRITON_CACHE_DIR', '~/.triton/cache')})")
    return 0 if not any(rcs) else 1


if __name__ == "__main__":
    sys.exit(main())

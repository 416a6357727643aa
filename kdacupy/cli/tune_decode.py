"""``python -m kdacupy.tune --decode``: every decode tile configuration on the
decode bench shapes, into ``<model>.decode.yaml`` (the lookup is
kdacupy/ops/decode/tuning.py)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from ..numerics.dtypes import BF16, dtype_name
from ..ops.decode.kernels import decode_candidates
from ..ops.decode.tuning import _device, bucket_key, bucket_of, clear_cache, file_name, user_dir


def tune(args) -> int:
    """Every decode tile configuration on the decode bench shapes, one bucket at a
    time: parity against the model on the bucket's first shape, then timing."""
    import time as _time

    import numpy as np
    import yaml

    from ..ops.decode import fastpath as decode_fastpath
    from ..decode import kda_decode
    from ..jit.nvrtc import compile_variant
    from ..numerics.parity import GPU, mismatch
    from ..ops.decode import kernels as decode_kernels
    from ..ops.decode.kernels import DecodeVariant, select_decode_tiles as default_select
    from . import timing
    from .bench_decode import decode_shapes, label, make_case

    shapes = decode_shapes()
    if args.dry_run:
        failed = 0
        seen = set()
        for s in shapes:
            for t in decode_candidates(128, 128):
                v = DecodeVariant(128, 128, BF16, BF16, BF16, "sigmoid", "sigmoid", True, s["pool"], "vk", t)
                if v in seen:
                    continue
                seen.add(v)
                res = compile_variant(v, args.arch)
                failed += not res.ok
                print(f"decode pool={dtype_name(s['pool'])} BV={t.BV} warps={t.warps}: "
                      f"{res.resources if res.ok else 'FAILED'}", flush=True)
        return 1 if failed else 0
    if not timing.gpu_available():
        print(timing.no_gpu_message("python -m kdacupy.tune --decode", " Use --dry-run to compile the candidates."),
              file=sys.stderr)
        return 2
    import cupy

    name, sm = _device()
    out_path = Path(args.output) if args.output else user_dir() / file_name(name)
    entries, done = [], set()
    t0 = _time.perf_counter()
    for s in shapes:
        shape = SimpleNamespace(K=128, V=128, T=s["T"], N=s["N"], HV=s["HV"])
        b = bucket_of(shape, s["pool"], sm)
        if bucket_key(b) in done:  # tuned on an earlier shape of the bucket
            continue
        done.add(bucket_key(b))
        a, o = make_case(s, cupy)
        small = dict(s, N=min(s["N"], 8))
        sa, so = make_case(small)
        pm = so["state_pool"].copy()
        ref = kda_decode(**sa, **dict(so, state_pool=pm), backend="model")
        times = {}
        for t in decode_candidates(128, 128):
            decode_kernels.select_decode_tiles = lambda p, pool, t=t: t  # noqa: E731
            decode_kernels.launch_plan.cache_clear()
            decode_fastpath.clear()
            try:
                da, do = {n: cupy.asarray(x) for n, x in sa.items()}, \
                    {n: (cupy.asarray(x) if isinstance(x, np.ndarray) else x) for n, x in so.items()}
                got = cupy.asnumpy(kda_decode(**da, **do))
                why = mismatch(got, ref, GPU) or mismatch(cupy.asnumpy(do["state_pool"]), pm, GPU)
                if why:
                    print(f"  {label(s)} BV={t.BV} warps={t.warps}: parity FAILED ({why})", flush=True)
                    continue
                out = cupy.empty(a["v"].shape, a["v"].dtype)
                med, _ = timing.time_calls([lambda: kda_decode(**a, **o, out=out)], args.warmup, args.iters)
                times[t] = med * 1e3
            except Exception as e:  # noqa: BLE001
                print(f"  {label(s)} BV={t.BV} warps={t.warps}: FAILED ({type(e).__name__}: {e})", flush=True)
        decode_kernels.select_decode_tiles = default_select
        decode_kernels.launch_plan.cache_clear()
        decode_fastpath.clear()
        if times:
            best = min(times, key=times.get)
            entries.append(dict(match=b, config=dict(BV=best.BV, warps=best.warps), time_us=round(times[best], 3)))
            print(f"  {label(s)}: BV={best.BV} warps={best.warps} {times[best]:.2f} us "
                  f"({len(times)} candidates)", flush=True)
            # after every bucket: a run stopped by a time limit keeps what it tuned
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(yaml.safe_dump(dict(schema=1, kind="decode", gpu=name, sm_count=sm,
                                                    buckets=entries), sort_keys=False))
    clear_cache()
    print(f"wrote {out_path} ({len(entries)} buckets in {_time.perf_counter() - t0:.0f} s)")
    return 0

"""Launch knobs of the decode kernel: the choice at run time and the tuner.

Knobs (``DecodeTiles``): BV value rows per CTA and warps per CTA. Where the
choice comes from, as for the forward's tiles (kdacupy/tuning.py):

1. ``$KDACUPY_TUNING_DIR/<model>.decode.yaml`` (else
   ``~/.cache/kdacupy/tuning/<model>.decode.yaml``), written by
   ``python -m kdacupy.tune --decode``;
2. the shipped ``tuning/<model>.decode.yaml``;
3. ``decode_heuristic`` ("heuristic (untuned)").

A bucket is K, V, the pool's dtype, the tokens per call (``T``: "1", "2-4",
">4") and the parallelism class of N * HV against the SM count. A file that
cannot be read or does not follow the schema below warns once and is ignored.

Schema::

    schema: 1
    kind: decode
    gpu: NVIDIA H200
    sm_count: 132
    buckets:
    - match: {K: 128, V: 128, pool: float32, tokens: '1', parallelism: '>=2'}
      config: {BV: 16, warps: 4}
      time_us: 12.5
"""
from __future__ import annotations

import sys
import warnings
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

from .kernels import DecodeTiles, decode_candidates, decode_heuristic
from ...numerics.dtypes import BF16, dtype_name
from ..forward.tuning import DEFAULT_SM_COUNT, HEURISTIC_SOURCE, model_name, parallelism_class, shipped_dir, user_dir

TOKENS = (("1", 1), ("2-4", 4), (">4", float("inf")))
MATCH_KEYS = ("K", "V", "pool", "tokens", "parallelism")


def tokens_class(T: int) -> str:
    return next(name for name, bound in TOKENS if T <= bound)


def bucket_of(p, pool_dtype, sm_count: int) -> dict:
    return dict(K=int(p.K), V=int(p.V), pool=dtype_name(pool_dtype), tokens=tokens_class(p.T),
                parallelism=parallelism_class(p.N * p.HV, sm_count))


def bucket_key(b: dict) -> tuple:
    return tuple(b[k] for k in MATCH_KEYS)


def file_name(device_name: str) -> str:
    return f"{model_name(device_name)}.decode.yaml"


def parse(data, path) -> dict:
    """{bucket key: DecodeTiles} of a decode tuning file; ValueError when it does not follow the schema."""
    if not isinstance(data, dict) or data.get("schema") != 1 or data.get("kind") != "decode":
        raise ValueError("not a schema 1 decode tuning file")
    out = {}
    for i, e in enumerate(data.get("buckets") or []):
        m, c = e.get("match"), e.get("config")
        if not isinstance(m, dict) or set(m) != set(MATCH_KEYS) or not isinstance(c, dict) or set(c) != {"BV", "warps"}:
            raise ValueError(f"buckets[{i}]: expected match {MATCH_KEYS} and config BV, warps")
        t = DecodeTiles(int(c["BV"]), int(c["warps"]))
        if not t.valid_for(int(m["K"]), int(m["V"])) or t not in decode_candidates(int(m["K"]), int(m["V"])):
            raise ValueError(f"buckets[{i}]: config {c} is not a decode tile configuration for K, V")
        out[bucket_key(m)] = t
    return out


@lru_cache(maxsize=None)
def load(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        return {}
    try:
        import yaml
        return parse(yaml.safe_load(p.read_text()), path)
    except Exception as e:  # noqa: BLE001  (a broken file is ignored, with one warning)
        warnings.warn(f"kdacupy: ignoring decode tuning file {path}: {e}", stacklevel=3)
        return {}


@lru_cache(maxsize=None)
def _device():
    import cupy
    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return name, dev.attributes["MultiProcessorCount"]


def describe(p, pool_dtype) -> tuple[DecodeTiles, str]:
    """(tiles, where they came from) for a validated problem."""
    if not p.device:
        return decode_heuristic(p.K, p.V, p.N * p.HV, DEFAULT_SM_COUNT), HEURISTIC_SOURCE
    name, sm = _device()
    key = bucket_key(bucket_of(p, pool_dtype, sm))
    for d in (user_dir(), shipped_dir()):
        path = str(d / file_name(name))
        t = load(path).get(key)
        if t is not None:
            return t, path
    return decode_heuristic(p.K, p.V, p.N * p.HV, sm), HEURISTIC_SOURCE


def select(p, pool_dtype) -> DecodeTiles:
    return describe(p, pool_dtype)[0]


def clear_cache():
    load.cache_clear()


# ---------------------------------------------------------------------------
# the tuner: python -m kdacupy.tune --decode


def tune(args) -> int:
    """Every decode tile configuration on the decode bench shapes, one bucket at a
    time: parity against the model on the bucket's first shape, then timing."""
    import time as _time

    import numpy as np
    import yaml

    from ... import decode_fastpath
    from ...cli import timing
    from . import kernels as decode_kernels
    from ...cli.bench_decode import decode_shapes, label, make_case
    from ...cli.compile import compile_variant
    from ...decode import kda_decode
    from .kernels import DecodeVariant, select_decode_tiles as default_select
    from ...numerics.parity import GPU, mismatch

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

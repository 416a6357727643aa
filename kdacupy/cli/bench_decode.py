"""``python -m kdacupy.bench --shapes decode``: the decode kernel on a state pool.

Shapes: N in {1, 8, 64, 256, 512} sequences, HV = H in {16, 32}, K = V = 128,
T = 1 (decode, ``state_indices`` [N]) and T = 4 (verify, [N, T] indices with
``num_accepted_tokens``), fp32 and bf16 pools in the "vk" layout; bf16 q/k/v/g,
beta logits, the sigmoid gate with A_log and dt_bias, qk_l2norm (Kimi Linear's
options). Slots are a random permutation of a pool of N * T + 1 slots.

Per shape: median and min time (CUDA events, one per call), the bytes a step
must move (state read once and written once per stored token, inputs read, o
written) as GB/s and as a fraction of the measured device copy bandwidth, the
host time of one call (wall clock around the Python call, launch included),
and FLA's ``fused_recurrent_kda`` on the same inputs when torch and fla are
importable (best effort: FLA's keyword set varies between versions; a failure
is recorded, not fatal).

Always, also without a GPU: the host overhead of ``kda_decode`` with a null
launcher on the CPU (validation, cache lookup, argument packing; NumPy arrays,
the emulation backend's path with its launch replaced by nothing).
"""
from __future__ import annotations

import datetime
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..numerics.dtypes import BF16, F32, dtype_name

NS = (1, 8, 64, 256, 512)
HVS = (16, 32)
TS = (1, 4)
POOLS = (F32, BF16)
K = V = 128


def decode_shapes():
    return [dict(N=n, HV=hv, T=t, pool=pool) for pool in POOLS for t in TS for hv in HVS for n in NS]


def label(s) -> str:
    return f"N={s['N']} HV={s['HV']} T={s['T']} pool={dtype_name(s['pool'])}"


def make_case(s, xp=np, seed=0):
    """(arrays, options) for kda_decode; ``xp`` NumPy or CuPy."""
    rng = np.random.default_rng(seed)
    N, HV, T = s["N"], s["HV"], s["T"]
    # drawn where they are used (up to 8 M elements per array): xp's generator, fp32, then bf16
    draw = (lambda shape: rng.standard_normal(shape, dtype=np.float32)) if xp is np else \
        (lambda shape: xp.random.standard_normal(shape, dtype=np.float32))
    unit = lambda x: x / xp.sqrt((x * x).sum(axis=-1, keepdims=True))  # noqa: E731
    a = dict(q=unit(draw((N, T, HV, K))), k=unit(draw((N, T, HV, K))), v=draw((N, T, HV, V)),
             g=draw((N, T, HV, K)), beta=draw((N, T, HV)))
    a = {n: to_bf16(x, xp) for n, x in a.items()}
    P = N * T + 1
    slots = rng.permutation(P)[: N * T].astype(np.int32)
    idx = slots if T == 1 else slots.reshape(N, T)
    opts = dict(gate="sigmoid", lower_bound=-5.0, A_log=xp.asarray(rng.uniform(0, 1, HV).astype(np.float32)),
                dt_bias=xp.asarray(rng.standard_normal((HV, K)).astype(np.float32)), qk_l2norm=True,
                beta_sigmoid=True, state_layout="vk", state_indices=xp.asarray(idx), state_pool=pool_of(s, P, xp))
    if T > 1:
        opts["num_accepted_tokens"] = xp.asarray(rng.integers(1, T + 1, N).astype(np.int32))
    return a, opts


def pool_of(s, P, xp):
    """A random pool on the GPU (up to 4 GiB at N = 512, T = 4: drawn there, not on the host);
    on the host random when small (parity checks), else zeros (host-overhead runs never read it)."""
    if xp is np:
        shape = (P, s["HV"], V, K)
        if np.prod(shape) > 2e7:
            return np.zeros(shape, dtype=s["pool"])
        return (0.1 * np.random.default_rng(P).standard_normal(shape, dtype=np.float32)).astype(s["pool"])
    x = 0.1 * xp.random.standard_normal((P, s["HV"], V, K), dtype=np.float32)
    return x if s["pool"] == F32 else to_bf16(x, xp)


def to_bf16(x, xp):
    try:
        return x.astype(BF16)
    except Exception:  # noqa: BLE001  (a CuPy without bf16 casts: truncate the fp32 bits)
        return (x.view(xp.uint32) >> 16).astype(xp.uint16).view(BF16)


def step_bytes(s) -> dict:
    """Compulsory bytes of one step: state read once, written once per stored token."""
    N, HV, T = s["N"], s["HV"], s["T"]
    state = N * HV * K * V * np.dtype(s["pool"]).itemsize
    inputs = N * T * HV * (2 * K + V + K + 1) * 2 + N * T * 4 + HV * (K + 1) * 4
    out = N * T * HV * V * 2
    return dict(state_read=state, state_written=state * T, inputs=inputs, output=out,
                total=state * (1 + T) + inputs + out)


# ---------------------------------------------------------------------------
# host overhead, with a null launcher


class _NullLoader:
    def get(self, kernel, config, name):
        return name

    @staticmethod
    def launch(fn, grid, block, args, shared_mem):
        return None


@contextmanager
def null_launcher():
    """kda_decode's emulation path with nothing compiled and nothing launched."""
    from ..ops.decode import fastpath as decode_fastpath
    from ..ops.decode import kernels as decode_kernels

    saved = decode_fastpath.loader, decode_kernels.loader
    decode_fastpath.loader = decode_kernels.loader = lambda kind: _NullLoader()
    decode_kernels.launch_plan.cache_clear()
    decode_fastpath.clear()
    try:
        yield
    finally:
        decode_fastpath.loader, decode_kernels.loader = saved
        decode_kernels.launch_plan.cache_clear()
        decode_fastpath.clear()


def host_overhead(calls: int = 2000, repeats: int = 5) -> list[dict]:
    """Microseconds per kda_decode call (min over repeats of the mean of ``calls``)
    with a null launcher: decode (N = 64, T = 1) and verify (N = 64, T = 4) on an
    fp32 pool, with ``out`` given and not."""
    from ..decode import kda_decode

    rows = []
    with null_launcher():
        for T in (1, 4):
            s = dict(N=64, HV=32, T=T, pool=F32)
            a, o = make_case(s)
            out = np.empty(a["v"].shape, a["v"].dtype)
            for given in (True, False):
                kw = dict(out=out) if given else {}
                kda_decode(**a, **o, **kw, backend="emulate")
                best = float("inf")
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        kda_decode(**a, **o, **kw, backend="emulate")
                    best = min(best, (time.perf_counter() - t0) / calls)
                arrays = [x for x in (*a.values(), o["state_pool"], o["state_indices"], o.get("num_accepted_tokens"),
                                      out if given else None, o["A_log"], o["dt_bias"]) if x is not None]
                ptr_best = float("inf")
                for _ in range(repeats):  # the share of NumPy's x.ctypes.data (CuPy's x.data.ptr is far cheaper)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        [x.ctypes.data for x in arrays]
                    ptr_best = min(ptr_best, (time.perf_counter() - t0) / calls)
                rows.append(dict(N=64, HV=32, T=T, out_given=given, us_per_call=best * 1e6,
                                 numpy_pointer_us=ptr_best * 1e6))
    return rows


def forward_validation_us(calls: int = 500, repeats: int = 5) -> float:
    """For scale: kda_forward's validation alone on a small NumPy problem, same machine, same moment."""
    from ..validation import validate

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 64, 32, 128)).astype(BF16)
    v = rng.standard_normal((1, 64, 32, 128)).astype(BF16)
    kw = dict(scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, qk_l2norm=True,
              beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None, lower_bound=None,
              state_layout="vk", state_dtype=None, state_precision="bf16", out=None, backend="emulate")
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            validate(q, q, v, v, None, **kw)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


# ---------------------------------------------------------------------------
# GPU timing


def fla_decode(s, a, o):
    """A closure running FLA's fused_recurrent_kda on the same inputs and pool
    copy, or an error string. Sequences are packed (B = 1, cu_seqlens), the pool
    is FLA's initial_state updated in place through ssm_state_indices."""
    try:
        import inspect
        import os

        os.environ.setdefault("FLA_FLASH_KDA", "0")
        import torch
        from fla.ops.kda import fused_recurrent_kda

        from .peers import to_torch

        params = set(inspect.signature(fused_recurrent_kda).parameters)
        if "ssm_state_indices" not in params:
            return "this fla has no ssm_state_indices keyword"
        N, T, HV = s["N"], s["T"], s["HV"]
        flat = lambda x: to_torch(x).reshape((1, N * T) + tuple(x.shape[2:]))  # noqa: E731
        pool = to_torch(o["state_pool"]).clone()
        kw = dict(q=flat(a["q"]), k=flat(a["k"]), v=flat(a["v"]), g=flat(a["g"]), beta=flat(a["beta"]),
                  initial_state=pool, inplace_final_state=True,
                  cu_seqlens=torch.arange(0, N * T + 1, T, device=pool.device, dtype=torch.long),
                  ssm_state_indices=to_torch(o["state_indices"]).to(torch.long),
                  use_qk_l2norm_in_kernel=True, A_log=to_torch(o["A_log"]),
                  dt_bias=to_torch(o["dt_bias"]).reshape(-1), lower_bound=o["lower_bound"])
        if "num_accepted_tokens" in o:
            kw["num_accepted_tokens"] = to_torch(o["num_accepted_tokens"]).to(torch.long)
        for name in ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel"):
            if name in params:
                kw[name] = True
        if "state_v_first" in params:
            kw["state_v_first"] = True
        kw = {n: x for n, x in kw.items() if n in params or n in ("q", "k", "v", "g", "beta")}

        def call():
            with torch.inference_mode():
                return fused_recurrent_kda(**kw)
        call()
        call.keywords = sorted(kw)  # what this fla accepted (gate options missing: its math differs)
        return call
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:300]


def bench_gpu(shapes, warmup, iters, fla_on=True, on_row=None) -> tuple[dict, list]:
    import cupy

    from . import timing
    from ..decode import kda_decode

    info = timing.device_info()
    copy_gbps = timing.copy_bandwidth()
    rows = []
    for s in shapes:
        a, o = make_case(s, cupy)
        out = cupy.empty(a["v"].shape, a["v"].dtype)
        call = lambda: kda_decode(**a, **o, out=out)  # noqa: E731
        call()
        cupy.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            call()
        host_us = (time.perf_counter() - t0) / 200 * 1e6
        cupy.cuda.get_current_stream().synchronize()
        med, mn = timing.time_calls([call], warmup, iters)
        b = step_bytes(s)
        gbps = b["total"] / (med * 1e-3) / 1e9
        row = dict(shape={**s, "pool": dtype_name(s["pool"])}, median_us=med * 1e3, min_us=mn * 1e3, bytes=b,
                   achieved_gbps=gbps, fraction_of_copy_bw=gbps / copy_gbps, host_us_per_call=host_us, fla=None)
        if fla_on:
            f = fla_decode(s, a, o)
            if callable(f):
                fm, fmin = timing.time_calls([f], warmup, iters, "torch")
                row["fla"] = dict(median_us=fm * 1e3, min_us=fmin * 1e3, ratio_fla_over_kdacupy=fm / med,
                                  keywords=f.keywords)
            else:
                row["fla"] = dict(error=f)
        rows.append(row)
        if on_row is not None:
            on_row(dict(device=info, copy_bandwidth_gbps=copy_gbps), rows)
        print(f"  {label(s):34s} {med * 1e3:8.2f} us  {gbps:7.0f} GB/s  {gbps / copy_gbps:5.2f} of copy  "
              f"host {host_us:6.1f} us" + (f"  FLA {row['fla'].get('median_us', float('nan')):8.2f} us"
                                           if row["fla"] else ""), flush=True)
    return dict(device=info, copy_bandwidth_gbps=copy_gbps), rows


def run(args) -> int:
    """Entry from ``python -m kdacupy.bench`` when ``--shapes decode`` is given."""
    from . import timing

    now = datetime.datetime.now(datetime.timezone.utc)
    calls = max(50, 20 * args.iters)  # --iters 100 (the default): 2000 calls per host measurement
    host = host_overhead(calls)
    fwd = forward_validation_us(calls // 4)
    print("host overhead of kda_decode (null launcher, NumPy arrays, this CPU):")
    for r in host:
        print(f"  N={r['N']} HV={r['HV']} T={r['T']} out {'given' if r['out_given'] else 'allocated'}: "
              f"{r['us_per_call']:.1f} us per call, of which {r['numpy_pointer_us']:.1f} us NumPy's pointer lookups")
    print(f"  for scale, kda_forward's validation alone: {fwd:.1f} us per call")
    doc = dict(kind="kdacupy.bench.decode", date=now.isoformat(timespec="seconds"), commit=timing.git_commit(),
               host_overhead=host, forward_validation_us=fwd)
    path = Path(args.json) if args.json else Path(f"benchmarks/decode_{now.strftime('%Y%m%d-%H%M%S')}.json")

    def write(head=None, rows=None):  # after every shape: a run stopped by a time limit keeps what it measured
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(doc, **(head or {}), **({"shapes": rows} if rows is not None else {})),
                                   indent=1, default=str))

    if not timing.gpu_available():
        print(timing.no_gpu_message("python -m kdacupy.bench --shapes decode", " (host overhead measured above)"),
              file=sys.stderr)
        if args.json:
            write()
            print(f"wrote {path}")
        return 2
    write()
    bench_gpu(decode_shapes(), args.warmup, args.iters, not args.no_fla, on_row=write)
    print(f"wrote {path}")
    return 0

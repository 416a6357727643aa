"""``python -m kdacupy.bench --shapes decode``: the decode kernel on a state pool.

Shapes: N in {1, 8, 64, 256, 512} sequences, HV = H in {16, 32}, K = V = 128,
T = 1 (decode, ``state_indices`` [N]) and T = 4 (verify, [N, T] indices with
``num_accepted_tokens``), fp32 and bf16 pools in the "vk" layout; bf16 q/k/v/g,
beta logits, the sigmoid gate with A_log and dt_bias, qk_l2norm (Kimi Linear's
options). Slots are a random permutation of a pool of N * T + 1 slots.

Per shape, three times per step: the device time (GRAPH_STEPS steps captured
in one CUDA graph and replayed between CUDA events: the kernel with no host in
the way), the stream time (GRAPH_STEPS eager calls between one event pair: what
an engine calling from Python gets; one event pair per call would time the host
path at small shapes) and the host time (wall clock per call, launch included);
the host's overhead is stream - device where the host is the bottleneck. Then
the bytes a step must move (state read once and written once per stored token,
inputs read, o written) as GB/s of the device time and as a fraction of the
measured device copy bandwidth. FLA, when torch and fla are importable and the
installed FLA offers a pool decode (``detect_fla``: ``fused_recurrent_kda_fwd``
with ``ssm_state_indices`` / ``num_accepted_tokens`` / ``inplace_final_state``,
``state_v_first`` or ``transpose_state_layout``), on the same inputs and a copy
of the pool, timed the same three ways; the call timed is printed first and kept
in the JSON, and one call of each from the same pool is compared first (RMS
ratio of output and written slots). ``--decode-n`` keeps some N only.

Always, also without a GPU (and so in ``--dry-run``): the host time per call of
``kda_decode``'s CUDA path, repeated calls with the same arrays, on device-array
stand-ins (kdacupy/cli/cuda_standins.py: CuPy arrays over host memory, a null
kernel in the RawKernel's place: the code that runs on a GPU, less the driver's
launch), and of each compat decode entry point (kdacupy.torch.kda_decode,
kdacupy.compat.fla, and kdacupy.compat.vllm / sglang where present) on CPU tensors
standing for CUDA tensors; medians of many calls. Also the emulation backend's
path with a null launcher (NumPy arrays: its per-array pointer wrappers for
memcheck are not the CUDA path's cost).
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


def per_call_us(fn, calls: int, batch: int = 50) -> dict:
    """``fn()``'s wall time per call in microseconds: the median and the min over batches of
    ``batch`` calls (a batch's mean; the median is robust to a busy machine's preemptions), and
    the median of the thread's CPU time per call (what other processes' turns do not add to)."""
    fn()
    means, cpu = [], []
    for _ in range(max(1, calls // batch)):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(batch):
            fn()
        means.append((time.perf_counter() - t0) / batch * 1e6)
        cpu.append((time.thread_time() - c0) / batch * 1e6)
    return dict(median_us=float(np.median(means)), min_us=min(means), cpu_median_us=float(np.median(cpu)),
                calls=len(means) * batch)


def cuda_host_overhead(calls: int = 20000, gpu: str = "NVIDIA H200", sm_count: int = 132) -> list[dict]:
    """Microseconds per repeated kda_decode call on the CUDA path (kdacupy/cli/cuda_standins.py:
    CuPy arrays over host memory, a null kernel in the RawKernel's place), the same arrays every
    call: decode (N = 64, T = 1) and verify (N = 64, T = 4) on an fp32 pool, ``out`` given and not;
    each row says which kernel the calls launched, and how often."""
    from ..decode import kda_decode
    from .cuda_standins import as_standins, device_array, standin_device

    rows = []
    with standin_device(gpu, sm_count) as kernels_made:
        for T in (1, 4):
            s = dict(N=64, HV=32, T=T, pool=F32)
            a, o = make_case(s)
            a, o = as_standins(a), as_standins(o)
            out = device_array(a["v"].shape, a["v"].dtype)
            for given in (True, False):
                kw = dict(a, **o, **(dict(out=out) if given else {}))
                t = per_call_us(lambda: kda_decode(**kw), calls)
                fns = [fn for fn in kernels_made.values() if fn.launches]
                rows.append(dict(N=64, HV=32, T=T, out_given=given, **t, kernel=fns[-1].config,
                                 launches=sum(fn.launches for fn in fns)))
                for fn in fns:
                    fn.launches = 0
    return rows


def _torch_case(N=64, HV=32, T=1):
    """make_case's decode inputs as CPU tensors (zero-copy) for the compat entry points."""
    import torch

    def tensor(x):  # zero-copy; bf16 through its bits (NumPy's DLPack has no bf16)
        if not isinstance(x, np.ndarray):
            return x
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) if x.dtype == BF16 else torch.from_numpy(x)

    a, o = make_case(dict(N=N, HV=HV, T=T, pool=F32))
    return {n: tensor(x) for n, x in a.items()}, {n: tensor(x) for n, x in o.items()}


def compat_calls(N=64, HV=32) -> dict:
    """Each compat decode entry point as its engine calls it for one token per sequence (N
    sequences, HV = H heads, K = V = 128, fp32 pool [P, HV, V, K], Kimi's options): name ->
    a call, or an error string where the module is missing or its case cannot be built."""
    import importlib

    import torch

    a, o = _torch_case(N, HV)
    q, k, v, g, beta = a["q"], a["k"], a["v"], a["g"], a["beta"]
    pool, idx, A_log, dt_bias = o["state_pool"], o["state_indices"], o["A_log"], o["dt_bias"]
    pq, pk, pv, pg, pb = (x.reshape((1, N) + tuple(x.shape[2:])) for x in (q, k, v, g, beta))  # [1, N*T, ...]
    cu = torch.arange(N + 1, dtype=torch.int32)
    # (module, function, args, keywords): the engines' own tensors made here, once, not in the timed calls
    cases = {
        "kdacupy.torch.kda_decode": ("kdacupy.torch", "kda_decode", (q, k, v, g, beta), dict(
            state_pool=pool, state_indices=idx, qk_l2norm=True, beta_sigmoid=True, gate="sigmoid", A_log=A_log,
            dt_bias=dt_bias, lower_bound=-5.0)),
        # FLA's serving entry (fla-core 0.6.0), as vLLM's older layers call it
        "kdacupy.compat.fla.fused_recurrent_kda_fwd": ("kdacupy.compat.fla", "fused_recurrent_kda_fwd", (
            q, k, v, g, beta), dict(A_log=A_log, dt_bias=dt_bias.reshape(-1), initial_state=pool,
                                   inplace_final_state=True, state_v_first=True, ssm_state_indices=idx,
                                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                   use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)),
        # vLLM's KDA layer: decode on packed tokens, the gate already applied (fused_kda_gate)
        "kdacupy.compat.vllm.fused_recurrent_kda": ("kdacupy.compat.vllm", "fused_recurrent_kda", (
            pq, pk, pv, pg, pb), dict(initial_state=pool, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                      ssm_state_indices=idx)),
        # SGLang's KDA backend: the raw gate flat [1, N, HV * K], beta logits, A_log [1, 1, HV, 1]
        "kdacupy.compat.sglang.fused_sigmoid_gating_delta_rule_update": (
            "kdacupy.compat.sglang", "fused_sigmoid_gating_delta_rule_update", (
                A_log.reshape(1, 1, HV, 1), pg.reshape(1, N, -1), dt_bias.reshape(-1), 1.0, 20.0, pq, pk, pv, pb,
                pool, idx), dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu, is_kda=True, lower_bound=-5.0)),
    }
    calls = {}
    for name, (module, fn, args, kw) in cases.items():
        try:
            f = getattr(importlib.import_module(module), fn)
            calls[name] = lambda f=f, args=args, kw=kw: f(*args, **kw)
        except Exception as e:  # noqa: BLE001  (a module not there yet, or one without this function)
            calls[name] = f"{type(e).__name__}: {e}"[:200]
    return calls


def compat_host_overhead(calls: int = 20000, gpu: str = "NVIDIA H200", sm_count: int = 132) -> list[dict]:
    """Microseconds per call of kdacupy.torch.kda_decode and each compat decode entry point on
    the CUDA path without a GPU: CPU tensors stand for CUDA tensors (cuda_standins.standin_torch_cuda)
    under the same stand-ins as cuda_host_overhead, in ``torch.inference_mode`` as engines run;
    a row whose call did not launch the null kernel once per call says so (``launches``)."""
    import torch

    from .cuda_standins import standin_device, standin_torch_cuda

    rows = []
    with standin_device(gpu, sm_count) as kernels_made, standin_torch_cuda(), torch.inference_mode():
        for name, call in compat_calls().items():
            if isinstance(call, str):
                rows.append(dict(entry=name, error=call))
                continue
            try:
                t = per_call_us(call, calls)
            except Exception as e:  # noqa: BLE001  (record it: the other rows still stand)
                rows.append(dict(entry=name, error=f"{type(e).__name__}: {e}"[:200]))
                continue
            launched = sum(fn.launches for fn in kernels_made.values())
            for fn in kernels_made.values():
                fn.launches = 0
            rows.append(dict(entry=name, **t, launches=launched))
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


#: what the decode comparison needs from FLA's pool entry point, and what it uses when there
FLA_POOL = ("initial_state", "inplace_final_state", "ssm_state_indices")
FLA_OPTIONS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "lower_bound",
               "A_log", "dt_bias")


def detect_fla() -> dict:
    """What the installed FLA offers for decode on a state pool, without a GPU.

    The pool arguments (``ssm_state_indices``, ``num_accepted_tokens``,
    ``inplace_final_state``) are taken by ``fla.ops.kda.fused_recurrent.
    fused_recurrent_kda_fwd`` only (fla-core 0.6.0's public ``fused_recurrent_kda``
    drops them); the [V, K] state layout keyword is ``state_v_first``, in older
    releases ``transpose_state_layout``, and without either FLA gets the pool in
    its [K, V] layout. Returns ``call`` (the dotted name), ``params``, ``layout_keyword``,
    ``verify`` (num_accepted_tokens taken), ``missing_options`` (Kimi options it
    lacks: its math would differ, so it is not timed) and ``error`` (why FLA
    cannot be timed; None when it can)."""
    from .peers import fla_importable, layout_keyword, signature_params

    info = dict(call=None, params=[], layout_keyword=None, verify=False, missing_options=[], error=None,
                version=None)
    why = fla_importable()
    if why:
        return dict(info, error=why)
    try:
        import importlib
        import os

        os.environ.setdefault("FLA_FLASH_KDA", "0")  # FLA's own Triton kernels, not a FlashKDA backend
        import fla

        info["version"] = getattr(fla, "__version__", "unknown")
        mod = importlib.import_module("fla.ops.kda.fused_recurrent")
    except Exception as e:  # noqa: BLE001
        return dict(info, error=f"import fla.ops.kda.fused_recurrent failed: {type(e).__name__}: {e}"[:300])
    fn = getattr(mod, "fused_recurrent_kda_fwd", None)
    if fn is None:
        return dict(info, error="fla.ops.kda.fused_recurrent has no fused_recurrent_kda_fwd")
    params = signature_params(fn)
    info.update(call="fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd", params=sorted(params),
                layout_keyword=layout_keyword(params), verify="num_accepted_tokens" in params,
                missing_options=[n for n in FLA_OPTIONS if n not in params], function=fn)
    missing = [n for n in FLA_POOL if n not in params]
    if missing:
        info["error"] = f"fused_recurrent_kda_fwd takes no {', '.join(missing)} (no state pool)"
    elif info["missing_options"]:
        info["error"] = f"fused_recurrent_kda_fwd takes no {', '.join(info['missing_options'])} (other math)"
    return info


def fla_decode(fla: dict, s, a, o):
    """A closure running FLA's pool decode on the same inputs and a copy of the
    pool (``call.pool``: FLA's copy, in its layout), or an error string. The
    inputs go as ``[N, T, ...]`` (one sequence per row, no cu_seqlens), the
    pool as ``initial_state`` updated in place through ``ssm_state_indices``
    (``[N]``, or ``[N, T]`` with ``num_accepted_tokens``: one slot per token,
    the same contract as kda_decode's); ``out`` given when FLA takes it."""
    if fla.get("error"):
        return fla["error"]
    if s["T"] > 1 and not fla["verify"]:
        return "this fla's fused_recurrent_kda_fwd takes no num_accepted_tokens (no speculative verify)"
    try:
        import torch

        from .peers import to_torch

        fn = fla["function"]
        kw = fla_kwargs(fla, a, o, to_torch, lambda x: x.clone(memory_format=torch.contiguous_format),
                        torch.empty_like)
        pool = kw["initial_state"]

        def call():
            with torch.inference_mode():
                return fn(**kw)

        call()
        torch.cuda.synchronize()
        call.pool, call.out = pool, kw.get("out")
        call.keywords = sorted(kw)
        return call
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:300]


def fla_kwargs(fla: dict, a, o, convert, copy, empty_like) -> dict:
    """The keywords of FLA's pool decode for kdacupy's inputs ``a`` and options
    ``o``: ``convert`` makes FLA's tensors (zero-copy), ``copy`` a contiguous copy
    (FLA's own pool, transposed to [K, V] when FLA has no layout keyword), ``empty_like`` its
    output buffer when it takes ``out``. Only keywords the signature names."""
    params = set(fla["params"])
    pool = copy(convert(o["state_pool"]))  # [P, HV, V, K]
    if fla["layout_keyword"] is None:
        pool = copy(pool.swapaxes(-1, -2))
    kw = dict(q=convert(a["q"]), k=convert(a["k"]), v=convert(a["v"]), g=convert(a["g"]), beta=convert(a["beta"]),
              A_log=convert(o["A_log"]), dt_bias=convert(o["dt_bias"]).reshape(-1), initial_state=pool,
              inplace_final_state=True, ssm_state_indices=convert(o["state_indices"]),
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              lower_bound=o["lower_bound"])
    if "num_accepted_tokens" in o:
        kw["num_accepted_tokens"] = convert(o["num_accepted_tokens"])
    if fla["layout_keyword"] is not None:
        kw[fla["layout_keyword"]] = True
    if "out" in params:
        kw["out"] = empty_like(kw["v"])
    return kw


def fla_label(fla: dict) -> str:
    """Which call is timed, in words (printed before the table, kept in the JSON)."""
    if fla.get("error"):
        return f"FLA not timed: {fla['error']}"
    layout = f"{fla['layout_keyword']}=True" if fla["layout_keyword"] else "its [K, V] pool layout (no layout keyword)"
    return (f"FLA {fla['version']}: {fla['call']}(ssm_state_indices=, inplace_final_state=True, "
            f"{'num_accepted_tokens= (verify), ' if fla['verify'] else ''}{layout}, use_gate_in_kernel=True, "
            "use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True, lower_bound=-5)")


def _from_torch(t):
    """A torch CUDA tensor as a CuPy array, zero-copy (bf16 through its bits)."""
    import cupy
    import torch

    if t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.view(torch.int16)).view(BF16)
    return cupy.from_dlpack(t)


def agreement(o, ours_pool, ours_out, f) -> dict:
    """RMS ratio of FLA's written pool slots and output against kdacupy's, each
    run once from the same pool (``ours_pool`` / ``f.pool`` after one call): a
    wrongly wired call shows as O(1) here, both kernels' rounding as ~1e-3."""
    import cupy

    from .bench_seqpar import rms_ratio

    written = cupy.asarray(o["state_indices"]).reshape(-1)
    ours, theirs = ours_pool[written], _from_torch(f.pool)[written]
    if theirs.shape != ours.shape:  # FLA's [K, V] layout
        theirs = theirs.swapaxes(-1, -2)
    res = dict(rms_ratio_state=rms_ratio(theirs.astype(cupy.float32), ours.astype(cupy.float32)))
    if f.out is not None:
        res["rms_ratio_o"] = rms_ratio(_from_torch(f.out).astype(cupy.float32), ours_out.astype(cupy.float32))
    return res


#: graph-captured steps per event pair, and pairs per measurement
GRAPH_STEPS, REPEATS = 20, 5


def measure(call, clock, warmup, repeats=REPEATS, steps=GRAPH_STEPS) -> dict:
    """Per step: device time (a captured graph of ``steps`` calls, replayed),
    stream time (``steps`` eager calls per event pair: what an engine calling
    from Python gets) and host time (wall clock per call); the host's share is
    stream - device when the host is the bottleneck."""
    from . import timing

    for _ in range(warmup):
        call()
    host = timing.host_us_per_call(call)
    stream, stream_min = timing.time_steps(call, steps, repeats, clock)
    try:
        dev, dev_min = timing.time_graph(call, steps, repeats, clock)
        graph_error = None
    except Exception as e:  # noqa: BLE001  (record it: the eager numbers still stand)
        dev = dev_min = None
        graph_error = f"{type(e).__name__}: {e}"[:300]
    out = dict(device_us=None if dev is None else dev * 1e3, device_min_us=None if dev_min is None else dev_min * 1e3,
               stream_us=stream * 1e3, stream_min_us=stream_min * 1e3, host_us_per_call=host)
    if graph_error:
        out["graph_error"] = graph_error
    if dev is not None:
        out["host_overhead_us"] = max(0.0, stream - dev) * 1e3
        out["host_bound"] = host > dev * 1e3
    return out


def bench_gpu(shapes, warmup, iters, fla_on=True, on_row=None) -> tuple[dict, list]:
    """Every shape: kdacupy's device, stream and host time per step (``measure``;
    ``iters`` calls per measurement), and FLA's on the same inputs when it offers
    a pool decode (``detect_fla``), after one call of each checks they agree."""
    import math

    import cupy

    from . import timing
    from ..decode import kda_decode

    info = timing.device_info()
    copy_gbps = timing.copy_bandwidth()
    repeats = max(3, math.ceil(iters / GRAPH_STEPS))
    fla = detect_fla() if fla_on else dict(error="disabled (--no-fla)")
    head = dict(device=info, copy_bandwidth_gbps=copy_gbps, fla_call=fla_label(fla),
                fla={n: v for n, v in fla.items() if n != "function"},
                method=f"device: {GRAPH_STEPS} steps captured in one CUDA graph, replayed {repeats} times between "
                       f"event pairs; stream: {GRAPH_STEPS} eager calls per event pair; host: wall clock per call")
    print(head["fla_call"], flush=True)
    print(f"  {'shape':34s} {'device us':>9} {'GB/s':>6} {'%copy':>5} {'stream us':>9} {'host us':>8}"
          f"  {'FLA dev us':>10} {'FLA str us':>10} {'FLA/kda':>7} {'rms o':>8}", flush=True)
    rows = []
    for s in shapes:
        a, o = make_case(s, cupy)
        out = cupy.empty(a["v"].shape, a["v"].dtype)
        f = fla_decode(fla, s, a, o) if fla_on else None  # before ours: FLA's pool copy is the start state
        call = lambda: kda_decode(**a, **o, out=out)  # noqa: E731
        call()
        cupy.cuda.get_current_stream().synchronize()
        row = dict(shape={**s, "pool": dtype_name(s["pool"])}, bytes=step_bytes(s), fla=None)
        if callable(f):
            try:
                row["agreement"] = agreement(o, o["state_pool"], out, f)
            except Exception as e:  # noqa: BLE001
                row["agreement"] = dict(error=f"{type(e).__name__}: {e}"[:300])
        row["kdacupy"] = measure(call, "cupy", warmup, repeats)
        k = row["kdacupy"]
        t = k["device_us"] or k["stream_us"]
        row["achieved_gbps"] = row["bytes"]["total"] / (t * 1e-6) / 1e9
        row["fraction_of_copy_bw"] = row["achieved_gbps"] / copy_gbps
        if callable(f):
            try:
                fm = row["fla"] = measure(f, "torch", warmup, repeats)
                both = fm["device_us"] is not None and k["device_us"] is not None  # like for like
                fm["ratio_fla_over_kdacupy"] = fm["device_us"] / k["device_us"] if both else \
                    fm["stream_us"] / k["stream_us"]
                fm["ratio_of"] = "device" if both else "stream"
            except Exception as e:  # noqa: BLE001
                row["fla"] = dict(error=f"{type(e).__name__}: {e}"[:300])
        elif f is not None:
            row["fla"] = dict(error=f)
        rows.append(row)
        if on_row is not None:
            on_row(head, rows)
        fr = row["fla"] or {}
        cell = lambda x, w, p: f"{x:{w}.{p}f}" if isinstance(x, (int, float)) else f"{'-':>{w}}"  # noqa: E731
        print(f"  {label(s):34s} {cell(k['device_us'], 9, 2)} {row['achieved_gbps']:6.0f} "
              f"{100 * row['fraction_of_copy_bw']:5.1f} {k['stream_us']:9.2f} {k['host_us_per_call']:8.1f}  "
              f"{cell(fr.get('device_us'), 10, 2)} {cell(fr.get('stream_us'), 10, 2)} "
              f"{cell(fr.get('ratio_fla_over_kdacupy'), 7, 2)} "
              f"{cell((row.get('agreement') or {}).get('rms_ratio_o'), 8, 5)}", flush=True)
        del a, o, out, f
        timing.free_memory()
    return head, rows


def cuda_path_host_time(calls: int, gpu: str, sm_count: int) -> tuple[list, list]:
    """The CUDA path's host time per call (cuda_host_overhead, compat_host_overhead), printed."""
    print(f"host time per call of kda_decode's CUDA path (kdacupy/cli/cuda_standins.py: CuPy arrays over host "
          f"memory, a null kernel for the RawKernel; {gpu} tiles; the same arrays every call; median of "
          f"{calls} calls):")
    cuda = cuda_host_overhead(calls, gpu, sm_count)
    for r in cuda:
        print(f"  N={r['N']} HV={r['HV']} T={r['T']} out {'given' if r['out_given'] else 'allocated'}: "
              f"{r['median_us']:.1f} us (min {r['min_us']:.1f}, CPU {r['cpu_median_us']:.1f}), "
              f"{r['launches']} launches")
    print(f"host time per call of the compat decode entry points (CPU tensors standing for CUDA tensors, the same "
          f"stand-ins, torch.inference_mode; N=64 HV=32 T=1; median of {max(50, calls // 5)} calls):")
    try:
        compat = compat_host_overhead(max(50, calls // 5), gpu, sm_count)  # each costs more: fewer calls
    except ImportError as e:  # no torch: kdacupy.torch and the compat faces need it
        compat = [dict(entry="kdacupy.torch", error=f"{type(e).__name__}: {e}"[:200])]
    for r in compat:
        if "error" in r:
            print(f"  {r['entry']}: not measured: {r['error']}")
        else:
            print(f"  {r['entry']}: {r['median_us']:.1f} us (min {r['min_us']:.1f}, CPU {r['cpu_median_us']:.1f}), "
                  f"{r['launches']} launches")
    return cuda, compat


def run(args) -> int:
    """Entry from ``python -m kdacupy.bench`` when ``--shapes decode`` is given."""
    from . import timing

    now = datetime.datetime.now(datetime.timezone.utc)
    calls = max(50, 20 * args.iters)  # --iters 100 (the default): 2000 calls per host measurement
    host = host_overhead(calls)
    fwd = forward_validation_us(calls // 4)
    print("host overhead of kda_decode on the emulation's path (null launcher, NumPy arrays, this CPU):")
    for r in host:
        print(f"  N={r['N']} HV={r['HV']} T={r['T']} out {'given' if r['out_given'] else 'allocated'}: "
              f"{r['us_per_call']:.1f} us per call, of which {r['numpy_pointer_us']:.1f} us NumPy's pointer lookups")
    print(f"  for scale, kda_forward's validation alone: {fwd:.1f} us per call")
    cuda, compat = cuda_path_host_time(10 * calls, getattr(args, "gpu", "NVIDIA H200"),
                                       getattr(args, "sm_count", 132))
    doc = dict(kind="kdacupy.bench.decode", date=now.isoformat(timespec="seconds"), commit=timing.git_commit(),
               host_overhead=host, forward_validation_us=fwd, cuda_host_overhead=cuda, compat_host_overhead=compat)
    path = Path(args.json) if args.json else Path(f"benchmarks/decode_{now.strftime('%Y%m%d-%H%M%S')}.json")

    def write(head=None, rows=None):  # after every shape: a run stopped by a time limit keeps what it measured
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(doc, **(head or {}), **({"shapes": rows} if rows is not None else {})),
                                   indent=1, default=str))

    if getattr(args, "dry_run", False):
        fla = detect_fla() if not args.no_fla else dict(error="disabled (--no-fla)")
        print(fla_label(fla))
        shapes = [s for s in decode_shapes() if not args.decode_n or s["N"] in args.decode_n]
        for s in shapes:
            print(f"  {label(s):34s} {step_bytes(s)['total'] / 1e6:9.2f} MB per step")
        print(f"{len(shapes)} shapes; nothing was run on a GPU (dry run)")
        if args.json:  # the host times measured above
            write()
            print(f"wrote {path}")
        return 0
    if not timing.gpu_available():
        print(timing.no_gpu_message("python -m kdacupy.bench --shapes decode", " (host overhead measured above)"),
              file=sys.stderr)
        if args.json:
            write()
            print(f"wrote {path}")
        return 2
    write()
    shapes = [s for s in decode_shapes() if not getattr(args, "decode_n", None) or s["N"] in args.decode_n]
    bench_gpu(shapes, args.warmup, args.iters, not args.no_fla, on_row=write)
    print(f"wrote {path}")
    return 0

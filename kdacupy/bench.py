"""``python -m kdacupy.bench``: kdacupy against FLA's ``chunk_kda`` on the same
inputs, timed with CUDA events (DESIGN 6). Needs a GPU.

Shapes (K = V = 128, bf16, one value head per query head):
  kimi     T = 8192 with H = 96 and 64, each as one fixed-length sequence
           (B = 1), varlen [1300, 547, 2048, 963, 271, 3063] and varlen 8 x 1024
  fewhead  H = 12 with T = 8192, 32768, 65536; H = 16 with T = 16384 (B = 1)
  all      both; explicit specs like ``T=8192,H=96`` or ``varlen=1300:547,H=64``
           work too (see ``python -m kdacupy.tune --help``).
Options, as in Kimi Linear / FlashKDA's tests: gate="sigmoid" with
lower_bound=-5, A_log [H] ~ U(0,1), dt_bias [H, K] ~ N(0,1) (fp32),
qk_l2norm=True, beta logits (beta_sigmoid=True), random l2-normalised q/k,
a random bf16 initial state and a bf16 final state in the "vk" layout.

Per shape: kdacupy's median and min time over ``--iters`` calls after
``--warmup`` (one CUDA event pair per call; two input sets alternate when the
inputs are small enough to stay in L2), the tile configuration and where it
came from (tuning file or heuristic), the compulsory HBM traffic (every input
read once, every output written once, states included) and the achieved GB/s,
also as a fraction of the device-to-device copy bandwidth measured once at the
start (bytes read + written). With torch and fla importable: FLA's time on the
same arrays (zero-copy through DLPack, FLA_FLASH_KDA=0 so FLA's own Triton path
runs, under torch.inference_mode), the ratio FLA / kdacupy, and before any
timing the RMS ratio ||o - o_fla|| / ||o_fla|| of outputs and final states.
FLA asserts fp32 initial states, so it gets fp32 copies of the same states
(recorded in the JSON). The geometric mean of FLA / kdacupy over the Kimi
shapes closes the table. JSON goes to ``benchmarks/<model>_<date>.json`` unless
``--json`` says otherwise.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import inspect
import json
import math
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .dtypes import BF16, F16, F32, dtype_name

LOWER_BOUND = -5.0
NO_GPU = ("{prog}: no CUDA GPU is available (CuPy found none); timing needs a GPU.{hint}")

# ---------------------------------------------------------------------------
# shapes

DTYPES = {"bf16": BF16, "bfloat16": BF16, "fp16": F16, "float16": F16, "fp32": F32, "float32": F32}


@dataclass(frozen=True)
class Shape:
    name: str
    T: int
    H: int
    HV: int | None = None
    K: int = 128
    V: int = 128
    B: int = 1
    lens: tuple | None = None  # varlen sequence lengths (B == 1, T == sum)
    dtype: str = "bf16"
    state_precision: str = "bf16"

    @property
    def hv(self) -> int:
        return self.HV or self.H

    @property
    def N(self) -> int:
        return len(self.lens) if self.lens is not None else self.B

    @property
    def np_dtype(self):
        return DTYPES[self.dtype]

    def to_dict(self) -> dict:
        return dict(name=self.name, B=self.B, T=self.T, H=self.H, HV=self.hv, K=self.K, V=self.V,
                    N=self.N, lens=None if self.lens is None else list(self.lens),
                    dtype=dtype_name(self.np_dtype), state_precision=self.state_precision)


KIMI_VARLEN = (1300, 547, 2048, 963, 271, 3063)


def kimi_shapes():
    out = []
    for H in (96, 64):
        out += [Shape(f"kimi-T8192-H{H}", 8192, H),
                Shape(f"kimi-varlen6-H{H}", 8192, H, lens=KIMI_VARLEN),
                Shape(f"kimi-varlen8x1024-H{H}", 8192, H, lens=(1024,) * 8)]
    return out


def fewhead_shapes():
    return [Shape("fewhead-T8192-H12", 8192, 12), Shape("fewhead-T32768-H12", 32768, 12),
            Shape("fewhead-T65536-H12", 65536, 12), Shape("fewhead-T16384-H16", 16384, 16)]


SHAPE_SETS = {"kimi": kimi_shapes, "fewhead": fewhead_shapes, "all": lambda: kimi_shapes() + fewhead_shapes()}
SPEC_KEYS = ("B", "T", "H", "HV", "K", "V", "varlen", "dtype", "state")


def parse_shape(spec: str) -> Shape:
    """``T=8192,H=96,K=128,V=128`` or ``varlen=1300:547:2048,H=64`` (also
    ``varlen=1024x8``); keys B, T, H, HV, K, V, varlen, dtype (bf16/fp16/fp32),
    state (state precision bf16/fp32). Defaults: B=1, HV=H, K=V=128, bf16."""
    kv = {}
    for part in spec.split(","):
        if "=" not in part:
            raise ValueError(f"shape {spec!r}: expected KEY=VALUE items separated by ',', got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in SPEC_KEYS:
            raise ValueError(f"shape {spec!r}: unknown key {key!r} (keys: {', '.join(SPEC_KEYS)})")
        if key in kv:
            raise ValueError(f"shape {spec!r}: {key} given twice")
        kv[key] = value
    try:
        ints = {k: int(kv[k]) for k in ("B", "T", "H", "HV", "K", "V") if k in kv}
        lens = None
        if "varlen" in kv:
            m = re.fullmatch(r"(\d+)x(\d+)", kv["varlen"])
            lens = (int(m.group(1)),) * int(m.group(2)) if m else tuple(int(x) for x in kv["varlen"].split(":"))
    except ValueError:
        raise ValueError(f"shape {spec!r}: sizes must be integers") from None
    if "H" not in ints:
        raise ValueError(f"shape {spec!r}: H is required")
    if lens is not None:
        if not lens or min(lens) < 0:
            raise ValueError(f"shape {spec!r}: varlen needs lengths >= 0")
        if ints.get("B", 1) != 1:
            raise ValueError(f"shape {spec!r}: varlen needs B=1")
        if "T" in ints and ints["T"] != sum(lens):
            raise ValueError(f"shape {spec!r}: T={ints['T']} but the varlen lengths sum to {sum(lens)}")
        ints["T"] = sum(lens)
    if "T" not in ints:
        raise ValueError(f"shape {spec!r}: T (or varlen) is required")
    for k in ("K", "V"):
        if ints.get(k, 128) not in (64, 128, 256):
            raise ValueError(f"shape {spec!r}: {k} must be 64, 128 or 256")
    if min(ints.values()) < 0 or ints["H"] < 1 or ints.get("B", 1) < 1:
        raise ValueError(f"shape {spec!r}: sizes must be positive")
    if ints.get("HV", ints["H"]) % ints["H"]:
        raise ValueError(f"shape {spec!r}: HV must be a multiple of H")
    dt = kv.get("dtype", "bf16")
    if dt not in DTYPES:
        raise ValueError(f"shape {spec!r}: dtype must be bf16, fp16 or fp32")
    st = kv.get("state", "bf16")
    if st not in ("bf16", "fp32"):
        raise ValueError(f"shape {spec!r}: state must be bf16 or fp32")
    return Shape(spec, ints["T"], ints["H"], ints.get("HV"), ints.get("K", 128), ints.get("V", 128),
                 ints.get("B", 1), lens, "bf16" if DTYPES[dt] == BF16 else "fp16" if DTYPES[dt] == F16 else "fp32",
                 st)


def resolve_shapes(items) -> list[Shape]:
    """Named sets and explicit specs, in order, without duplicates."""
    out = []
    for item in items:
        for s in (SHAPE_SETS[item]() if item in SHAPE_SETS else [parse_shape(item)]):
            if s not in out:
                out.append(s)
    return out


def shape_arg(text):
    """argparse type: a comma-free set name or a spec; errors become usage errors."""
    if text in SHAPE_SETS:
        return text
    try:
        parse_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


# ---------------------------------------------------------------------------
# inputs and traffic


def _cast(x, dt):
    try:
        return x.astype(dt)
    except Exception:  # noqa: BLE001  (a CuPy without this cast: through the host)
        import cupy

        return cupy.asarray(cupy.asnumpy(x).astype(dt))


def make_inputs(shape: Shape, xp=np, seed=0):
    """Random inputs for ``kda_forward(**arrays, **options)`` (and ``kda_model``):
    FlashKDA-style, nothing zero. ``xp``: numpy, or cupy (generated on the device)."""
    B, T, H, HV, K, V, N = shape.B, shape.T, shape.H, shape.hv, shape.K, shape.V, shape.N
    if xp is np:
        rng = np.random.default_rng(seed)
        normal = lambda s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
        uniform = lambda s: rng.random(s, dtype=np.float32)  # noqa: E731
    else:
        rs = xp.random.RandomState(seed)
        normal = lambda s: rs.standard_normal(s, dtype=np.float32)  # noqa: E731
        uniform = lambda s: rs.random_sample(s, dtype=np.float32)  # noqa: E731
    dt = shape.np_dtype

    def unit(x):
        return x / xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True))

    arrays = dict(q=_cast(unit(normal((B, T, H, K))), dt), k=_cast(unit(normal((B, T, H, K))), dt),
                  v=_cast(normal((B, T, HV, V)), dt), g=_cast(normal((B, T, HV, K)), dt),
                  beta=_cast(normal((B, T, HV)), dt))
    options = dict(qk_l2norm=True, beta_sigmoid=True, gate="sigmoid", lower_bound=LOWER_BOUND,
                   A_log=uniform((HV,)), dt_bias=normal((HV, K)),
                   initial_state=_cast(0.5 * normal((N, HV, V, K)), BF16), state_layout="vk",
                   output_final_state=True, state_dtype=BF16, state_precision=shape.state_precision)
    if shape.lens is not None:
        options["cu_seqlens"] = xp.asarray(np.concatenate([[0], np.cumsum(shape.lens)]).astype(np.int64))
    return arrays, options


def validated(arrays, options, backend):
    """``kdacupy.validation.validate`` with kda_forward's defaults filled in."""
    from .api import kda_forward
    from .validation import validate

    defaults = {n: p.default for n, p in inspect.signature(kda_forward).parameters.items()}
    names = [n for n, p in inspect.signature(validate).parameters.items() if p.kind == p.KEYWORD_ONLY]
    kw = {n: options.get(n, defaults.get(n)) for n in names}
    kw["backend"] = backend
    return validate(arrays["q"], arrays["k"], arrays["v"], arrays["g"], arrays.get("beta"), **kw)


def shape_problem(shape: Shape):
    """The Problem of a shape without allocating it (zero-stride NumPy views,
    validated as for the "model" backend); ``device`` is True, as on the GPU."""
    import dataclasses

    def fake(shp, dt):
        return np.broadcast_to(np.ones((), dtype=dt), shp)

    B, T, H, HV, K, V, N = shape.B, shape.T, shape.H, shape.hv, shape.K, shape.V, shape.N
    dt = shape.np_dtype
    arrays = dict(q=fake((B, T, H, K), dt), k=fake((B, T, H, K), dt), v=fake((B, T, HV, V), dt),
                  g=fake((B, T, HV, K), dt), beta=fake((B, T, HV), dt))
    options = dict(qk_l2norm=True, beta_sigmoid=True, gate="sigmoid", lower_bound=LOWER_BOUND,
                   A_log=fake((HV,), F32), dt_bias=fake((HV, K), F32), initial_state=fake((N, HV, V, K), BF16),
                   state_layout="vk", output_final_state=True, state_dtype=BF16,
                   state_precision=shape.state_precision)
    if shape.lens is not None:
        options["cu_seqlens"] = np.concatenate([[0], np.cumsum(shape.lens)]).astype(np.int64)
    p, _ = validated(arrays, options, "model")
    return dataclasses.replace(p, device=True, backend="cuda")


def compulsory_bytes(shape: Shape) -> dict:
    """HBM traffic no implementation can avoid: each input read once, each
    output written once (bf16 initial state in, bf16 final state out)."""
    B, T, H, HV, K, V, N = shape.B, shape.T, shape.H, shape.hv, shape.K, shape.V, shape.N
    e = np.dtype(shape.np_dtype).itemsize
    state = N * HV * K * V * 2
    reads = dict(q=B * T * H * K * e, k=B * T * H * K * e, v=B * T * HV * V * e, g=B * T * HV * K * e,
                 beta=B * T * HV * e, A_log=HV * 4, dt_bias=HV * K * 4,
                 cu_seqlens=(N + 1) * 8 if shape.lens is not None else 0, initial_state=state)
    writes = dict(o=B * T * HV * V * e, final_state=state)
    return dict(read=sum(reads.values()), written=sum(writes.values()),
                total=sum(reads.values()) + sum(writes.values()), parts={**reads, **writes})


# ---------------------------------------------------------------------------
# GPU helpers


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


def no_gpu_message(prog: str, hint: str = "") -> str:
    return NO_GPU.format(prog=prog, hint=hint)


def device_info() -> dict:
    import cupy

    from . import __version__
    from .tuning import device_facts, model_name

    dev, name, sm = device_facts()
    props = cupy.cuda.runtime.getDeviceProperties(dev)
    rt = cupy.cuda.runtime.runtimeGetVersion()
    return dict(name=name, model=model_name(name), sm_count=sm, device_id=dev,
                compute_capability=f"{props['major']}.{props['minor']}", l2_bytes=int(props.get("l2CacheSize", 0)),
                memory_bytes=int(props.get("totalGlobalMem", 0)), cupy=cupy.__version__, cuda_runtime=rt,
                cuda_driver=cupy.cuda.runtime.driverGetVersion(), kdacupy=__version__,
                python=platform.python_version())


def time_calls(calls, warmup: int, iters: int, clock: str = "cupy") -> tuple[float, float]:
    """(median, min) milliseconds of one call, one CUDA event pair per call on
    the current stream (CuPy's, or torch's with ``clock="torch"``); ``calls``
    alternate (input sets that rotate)."""
    n = len(calls)
    for i in range(warmup):
        calls[i % n]()
    if clock == "torch":
        import torch

        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        stream = torch.cuda.current_stream()
    else:
        import cupy

        ev = cupy.cuda.Event
        stream = cupy.cuda.get_current_stream()
    starts, ends = [ev() for _ in range(iters)], [ev() for _ in range(iters)]
    for i in range(iters):
        starts[i].record(stream)
        calls[i % n]()
        ends[i].record(stream)
    ends[-1].synchronize()
    if clock == "torch":
        ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        import cupy

        ms = [cupy.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends)]
    return float(np.median(ms)), float(np.min(ms))


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), median."""
    import cupy

    a = cupy.empty(nbytes, dtype=np.uint8)
    a.fill(1)
    b = cupy.empty_like(a)
    med, _ = time_calls([lambda src=a, dst=b: dst.data.copy_from_device_async(src.data, nbytes)], 3, iters)
    del a, b
    cupy.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / (med * 1e-3) / 1e9


def finite(x) -> bool:
    """No NaN/Inf in a bf16/fp16/fp32 CuPy array (through its bits: no float cast needed)."""
    import cupy

    if x.dtype.itemsize == 2:
        bits = x.view(cupy.uint16)
        mask = 0x7F80 if x.dtype == BF16 else 0x7C00
        return not bool(((bits & mask) == mask).any())
    return bool(cupy.isfinite(x).all())


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return os.environ.get("KDACUPY_COMMIT") or None


def git_dirty() -> bool | None:
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                             capture_output=True, text=True, timeout=10)
        return bool(out.stdout.strip()) if out.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def free_memory():
    try:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except Exception:  # noqa: BLE001
        pass
    if "torch" in sys.modules:
        try:
            sys.modules["torch"].cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------
# FLA


def fla_importable() -> str | None:
    """None when torch and fla can be imported, else why not."""
    for mod in ("torch", "fla"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    return None


def to_torch(x):
    """A CuPy array as a torch tensor, zero-copy through DLPack (bf16 through
    its bits, so it does not depend on DLPack's bfloat16 support)."""
    import torch

    if x.dtype == BF16:
        import cupy

        return torch.from_dlpack(x.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


def signature_params(fn) -> set:
    try:
        return set(inspect.signature(fn).parameters)  # follows functools.wraps (FLA's decorators)
    except (TypeError, ValueError):
        return set()


def layout_keyword(params) -> str | None:
    """chunk_kda's keyword for the [V, K] state layout: ``state_v_first``, else
    the older ``transpose_state_layout``, else None (FLA's [K, V] default). Only
    a named parameter counts: chunk_kda takes **kwargs, where an unknown keyword
    would vanish silently."""
    return next((k for k in ("state_v_first", "transpose_state_layout") if k in params), None)


class FLA:
    """FLA's ``chunk_kda`` on kdacupy's inputs.

    The call follows fla/ops/kda/chunk.py in fla-org/flash-linear-attention
    (``chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
    use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, safe_gate, lower_bound, ..., state_v_first, cu_seqlens,
    cu_seqlens_cpu, ..., **kwargs)`` with ``A_log`` and ``dt_bias`` ([HV * K])
    read from kwargs; it asserts ``initial_state.dtype == torch.float32``;
    ``transpose_state_layout`` is the older, now deprecated, name of
    ``state_v_first``). Which of the two layout keywords exists is read from
    the installed signature; with neither, FLA gets the state in its default
    [K, V] layout. ``FLA_FLASH_KDA=0`` is set before fla is imported, so the
    dispatcher (fla/ops/backends/__init__.py) skips the FlashKDA backend
    (fla/ops/kda/backends/flashkda.py) and FLA's own Triton kernels run.
    """

    def __init__(self):
        os.environ["FLA_FLASH_KDA"] = "0"
        import fla
        import torch
        from fla.ops.kda import chunk_kda

        self.torch, self.fn = torch, chunk_kda
        self.version = getattr(fla, "__version__", "unknown")
        self.params = signature_params(chunk_kda)
        self.layout_kw = layout_keyword(self.params)

    def kwargs(self, arrays, options, state_dtype):
        torch = self.torch
        h0 = to_torch(options["initial_state"])  # [N, HV, V, K] bf16
        if self.layout_kw is None:
            h0 = h0.transpose(-1, -2)  # FLA's default [N, HV, K, V]
        kw = dict(q=to_torch(arrays["q"]), k=to_torch(arrays["k"]), v=to_torch(arrays["v"]),
                  g=to_torch(arrays["g"]), beta=to_torch(arrays["beta"]), scale=arrays["q"].shape[-1] ** -0.5,
                  initial_state=h0.to(state_dtype).contiguous(), output_final_state=True,
                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  safe_gate=True, lower_bound=options["lower_bound"], A_log=to_torch(options["A_log"]),
                  dt_bias=to_torch(options["dt_bias"]).reshape(-1))
        if self.layout_kw is not None:
            kw[self.layout_kw] = True
        cu = options.get("cu_seqlens")
        if cu is not None:
            kw["cu_seqlens"] = to_torch(cu).to(torch.long)
            if "cu_seqlens_cpu" in self.params:  # spares FLA a device-to-host copy per call
                import cupy

                kw["cu_seqlens_cpu"] = torch.from_numpy(cupy.asnumpy(cu).astype(np.int64))
        return kw

    def call(self, kw):
        with self.torch.inference_mode():
            return self.fn(**kw)

    def backend(self, kw) -> str:
        """Which backend FLA's dispatcher picks for this call (best effort)."""
        try:
            from fla.ops.backends import BackendRegistry

            BackendRegistry.ensure_initialized("kda")
            reg = BackendRegistry._registries.get("kda")
            with self.torch.inference_mode():
                for be in (reg._backends.values() if reg is not None else ()):
                    if be.can_use() and be.verify("chunk_kda", **kw)[0] and hasattr(be, "chunk_kda"):
                        return be.backend_type
            return "triton (chunk_kda default)"
        except Exception as e:  # noqa: BLE001
            return f"unknown ({type(e).__name__})"

    def final_state_vk(self, s):
        """FLA's final state as [N, HV, V, K]."""
        return s if self.layout_kw is not None else s.transpose(-1, -2)


def rms_ratio_torch(x, ref) -> float:
    x, ref = x.float(), ref.float()
    return float((x - ref).norm() / ref.norm())


def run_fla(fla: FLA, sets, o, s, warmup, iters) -> dict:
    """FLA on the same input sets: agreement with kdacupy's (o, s), then timing."""
    res = dict(version=fla.version, layout_keyword=fla.layout_kw, inference_mode=True)
    kw = None
    for state_dtype in (fla.torch.bfloat16, fla.torch.float32):
        kw = fla.kwargs(*sets[0], state_dtype)
        try:
            fo, fs = fla.call(kw)[:2]
            res["state_dtype"] = str(state_dtype).replace("torch.", "")
            break
        except Exception as e:  # noqa: BLE001
            if state_dtype == fla.torch.float32:
                raise
            res["bf16_state_rejected"] = f"{type(e).__name__}: {e}"[:300]
    res["backend"] = fla.backend(kw)
    res["rms_ratio_o"] = rms_ratio_torch(to_torch(o), fo)
    res["rms_ratio_state"] = rms_ratio_torch(to_torch(s), fla.final_state_vk(fs))
    kws = [kw] + [fla.kwargs(a, opt, kw["initial_state"].dtype) for a, opt in sets[1:]]
    res["median_ms"], res["min_ms"] = time_calls([lambda k=k: fla.call(k) for k in kws], warmup, iters, "torch")
    return res


# ---------------------------------------------------------------------------
# one shape


def kdacupy_calls(sets):
    """Closures running ``kda_forward`` on each input set."""
    from .api import kda_forward

    return [lambda a=a, o=o: kda_forward(**a, **o, backend="cuda") for a, o in sets]


def make_row(shape: Shape, k_times, tiles, source, fla_res, copy_gbps, ok_finite=True, rotated=False) -> dict:
    traffic = compulsory_bytes(shape)
    med, mn = k_times
    gbps = traffic["total"] / (med * 1e-3) / 1e9
    kda = dict(median_ms=med, min_ms=mn, tiles=dict(BV=tiles.BV, stages=tiles.stages), tiles_source=source,
               finite=ok_finite)
    row = dict(shape=shape.to_dict(), kdacupy=kda,
               bytes=traffic, achieved_gbps=gbps, fraction_of_copy_bw=gbps / copy_gbps if copy_gbps else None,
               rotated_inputs=rotated, fla=fla_res, ratio_fla_over_kdacupy=None)
    if fla_res and fla_res.get("median_ms"):
        row["ratio_fla_over_kdacupy"] = fla_res["median_ms"] / med
    return row


def device_inputs(shape: Shape, seed: int):
    import cupy

    return make_inputs(shape, cupy, seed)


def selection(arrays, options):
    """(TileConfig, source) kda_forward will use for these inputs."""
    from .tuning import describe_selection

    return describe_selection(validated(arrays, options, "cuda")[0])


def bench_shape(shape: Shape, args, fla, copy_gbps, l2_bytes) -> dict:
    rotated = compulsory_bytes(shape)["total"] < 3 * l2_bytes
    sets = [device_inputs(shape, seed) for seed in ((0, 1) if rotated else (0,))]
    tiles, source = selection(*sets[0])
    calls = kdacupy_calls(sets)
    o, s = calls[0]()  # compiles the variants
    ok = finite(o) and finite(s)
    fla_res = None
    if fla is not None:
        try:
            fla_res = run_fla(fla, sets, o, s, args.warmup, args.iters)
        except Exception as e:  # noqa: BLE001  (record and go on)
            fla_res = dict(error=f"{type(e).__name__}: {e}"[:2000])
    del o, s
    k_times = time_calls(calls, args.warmup, args.iters)
    row = make_row(shape, k_times, tiles, source, fla_res, copy_gbps, ok, rotated)
    del sets, calls
    free_memory()
    return row


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summarize(rows) -> dict:
    kimi = [r["ratio_fla_over_kdacupy"] for r in rows if r["shape"]["name"].startswith("kimi-")]
    return dict(geomean_fla_over_kdacupy_kimi=geomean(kimi),
                kimi_shapes_with_fla=sum(1 for x in kimi if x))


def format_table(rows, summary) -> str:
    head = (f"{'shape':<24} {'kdacupy ms':>10} {'min':>7} {'tiles':>10} {'src':>5} {'GB/s':>7} {'%copy':>6} "
            f"{'FLA ms':>8} {'FLA/kda':>7} {'rms o':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['shape']['name']:<24} ERROR: {r['error'][:200]}")
            continue
        k, f = r["kdacupy"], r["fla"] or {}
        src = "heur" if k["tiles_source"].startswith("heuristic") else "file"
        frac = f"{100 * r['fraction_of_copy_bw']:5.1f}%" if r["fraction_of_copy_bw"] else "    -"
        fms = f"{f['median_ms']:8.3f}" if f.get("median_ms") else ("   error" if f.get("error") else "       -")
        ratio = f"{r['ratio_fla_over_kdacupy']:7.2f}" if r["ratio_fla_over_kdacupy"] else "      -"
        rms = f"{f['rms_ratio_o']:8.1e}" if f.get("rms_ratio_o") is not None else "       -"
        tiles = f"{k['tiles']['BV']}/{k['tiles']['stages']}"
        lines.append(f"{r['shape']['name']:<24} {k['median_ms']:10.3f} {k['min_ms']:7.3f} {tiles:>10} {src:>5} "
                     f"{r['achieved_gbps']:7.0f} {frac:>6} {fms} {ratio} {rms}")
    gm = summary["geomean_fla_over_kdacupy_kimi"]
    lines.append(f"geometric mean FLA / kdacupy over the Kimi shapes: {gm:.2f}" if gm else
                 "geometric mean FLA / kdacupy over the Kimi shapes: - (FLA did not run)")
    return "\n".join(lines)


def default_json_path(model: str, now: datetime.datetime) -> Path:
    return Path("benchmarks") / f"{model}_{now.strftime('%Y-%m-%dT%H%M%S')}.json"


def write_json(path, doc):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kdacupy.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", type=shape_arg, default=["all"], metavar="SET|SPEC",
                    help="kimi, fewhead, all (default) or explicit shape specs")
    ap.add_argument("--json", metavar="PATH", help="where to write the results "
                    "(default benchmarks/<model>_<date>.json)")
    ap.add_argument("--iters", type=int, default=100, help="timed calls per measurement (default 100)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls first (default 10)")
    ap.add_argument("--no-fla", action="store_true", help="do not run FLA's chunk_kda")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")
    if not gpu_available():
        print(no_gpu_message(ap.prog), file=sys.stderr)
        return 2
    shapes = resolve_shapes(args.shapes)
    now = datetime.datetime.now(datetime.timezone.utc)
    info = device_info()
    copy_gbps = copy_bandwidth()
    print(f"kdacupy bench on {info['name']} ({info['sm_count']} SMs), CuPy {info['cupy']}, "
          f"CUDA runtime {info['cuda_runtime']}; copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    fla, fla_status = None, "disabled (--no-fla)"
    if not args.no_fla:
        fla_status = fla_importable()
        if fla_status is None:
            try:
                fla = FLA()
                fla_status = f"fla {fla.version}, layout keyword {fla.layout_kw}"
            except Exception as e:  # noqa: BLE001
                fla_status = f"import failed: {type(e).__name__}: {e}"
    print(f"FLA: {fla_status}", flush=True)
    path = Path(args.json) if args.json else default_json_path(info["model"], now)
    head = dict(kind="kdacupy.bench", date=now.isoformat(timespec="seconds"), commit=git_commit(),
                dirty=git_dirty(), device=info, copy_bandwidth_gbps=copy_gbps, iters=args.iters,
                warmup=args.warmup, fla_status=fla_status, env={"FLA_FLASH_KDA": os.environ.get("FLA_FLASH_KDA")},
                options=dict(gate="sigmoid", lower_bound=LOWER_BOUND, qk_l2norm=True, beta_sigmoid=True,
                             state_layout="vk", initial_state="bfloat16", state_dtype="bfloat16"))
    rows = []
    for shape in shapes:
        print(f"  {shape.name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(bench_shape(shape, args, fla, copy_gbps, info["l2_bytes"]))
        except Exception as e:  # noqa: BLE001  (record it, keep the other shapes' results)
            rows.append(dict(shape=shape.to_dict(), error=f"{type(e).__name__}: {e}"[:2000], kdacupy=None,
                             fla=None, ratio_fla_over_kdacupy=None))
            free_memory()
        # after every shape: a run stopped by a time limit still leaves what it measured
        write_json(path, dict(head, complete=len(rows) == len(shapes), shapes=rows, **summarize(rows)))
    summary = summarize(rows)
    print(format_table(rows, summary))
    print(f"wrote {path}")
    bad = [r["shape"]["name"] for r in rows if r.get("error") or not r["kdacupy"]["finite"]]
    if bad:
        print(f"kdacupy failed or gave non-finite output for {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark and tuning shapes: the named sets (kimi, fewhead), shape specs
(``T=8192,H=96``), FlashKDA-style random inputs for a shape, its Problem and its
compulsory HBM traffic. NumPy only; CuPy is imported when inputs are made on
the device."""
from __future__ import annotations

import argparse
import inspect
import re
from dataclasses import dataclass

import numpy as np

from ..numerics.dtypes import BF16, F16, F32, dtype_name
from ..validation.head_dims import HEAD_DIMS, describe

LOWER_BOUND = -5.0
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


FEWHEAD_VARLEN2 = (20011, 12757)
FEWHEAD_VARLEN4 = (30011, 17003, 9525, 8997)


def fewhead_shapes():
    """Few heads, long sequences: where the chunk chain bounds the serial run
    (sequence parallelism, docs/design.md section 7.2); first the serving shape, Kimi-K3's 96 heads
    at tensor parallelism 8 over 8K tokens."""
    out = [Shape("fewhead-T8192-H12", 8192, 12)]
    for H in (12, 16):
        out += [Shape(f"fewhead-T{T}-H{H}", T, H) for T in (16384, 32768, 65536, 131072)]
        out += [Shape(f"fewhead-varlen2-H{H}", sum(FEWHEAD_VARLEN2), H, lens=FEWHEAD_VARLEN2),
                Shape(f"fewhead-varlen4-H{H}", sum(FEWHEAD_VARLEN4), H, lens=FEWHEAD_VARLEN4)]
    return out


SHAPE_SETS = {"kimi": kimi_shapes, "kimi96": lambda: [s for s in kimi_shapes() if s.H == 96],
              "fewhead": fewhead_shapes, "all": lambda: kimi_shapes() + fewhead_shapes()}
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
    for k in ("K", "V"):  # the forward's head dims (kdacupy/validation/head_dims.py)
        if ints.get(k, 128) not in HEAD_DIMS["forward"]:
            raise ValueError(f"shape {spec!r}: {k} must be in {describe('forward')}")
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


def named_shape(text) -> Shape | None:
    """One shape of the named sets by its name (``kimi-T8192-H96``), or None."""
    return next((s for s in SHAPE_SETS["all"]() if s.name == text), None)


def resolve_shapes(items) -> list[Shape]:
    """Named sets, shapes by name and explicit specs, in order, without duplicates."""
    out = []
    for item in items:
        one = named_shape(item) if item not in SHAPE_SETS else None
        for s in (SHAPE_SETS[item]() if item in SHAPE_SETS else [one] if one else [parse_shape(item)]):
            if s not in out:
                out.append(s)
    return out


def shape_arg(text):
    """argparse type: a set name, a shape's name or a spec; errors become usage errors."""
    if text in SHAPE_SETS or named_shape(text):
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
        cu = np.concatenate([[0], np.cumsum(shape.lens)]).astype(np.int64)
        if xp is np:  # on a 64-byte boundary, as a device allocation is: its sectors then do not depend on
            # where NumPy's allocator put it (the profiler counts the sectors every head reads once)
            cu = _aligned_copy(cu, 64)
        options["cu_seqlens"] = xp.asarray(cu)
    return arrays, options


def _aligned_copy(x: np.ndarray, align: int) -> np.ndarray:
    """A C-contiguous copy of ``x`` whose data starts on an ``align``-byte boundary."""
    buf = np.empty(x.nbytes + align, np.uint8)
    start = -buf.ctypes.data % align
    out = buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def validated(arrays, options, backend):
    """``kdacupy.validation.validate`` with kda_forward's defaults filled in."""
    from ..api import kda_forward
    from ..validation import validate

    defaults = {n: p.default for n, p in inspect.signature(kda_forward).parameters.items()}
    names = [n for n, p in inspect.signature(validate).parameters.items() if p.kind == p.KEYWORD_ONLY]
    # validate's keywords that kda_forward has (its path keyword keeps validate's own default)
    kw = {n: options.get(n, defaults[n]) for n in names if n in options or n in defaults}
    kw["backend"] = backend
    if kw.get("state_layout") is None:  # kda_forward's None: "kv" without a pool
        kw["state_layout"] = "kv"
    return validate(arrays["q"], arrays["k"], arrays["v"], arrays["g"], arrays.get("beta"), **kw)


def shape_problem(shape: Shape):
    """The Problem of a shape without allocating its per-token arrays (views of one row,
    validated as for the "model" backend); ``device`` is True, as on the GPU."""
    import dataclasses

    def fake(shp, dt):
        # one row, repeated: the last dim contiguous as the kernels' layout checks want, nothing large allocated
        row = np.ones(shp[-1], dtype=dt)
        return np.lib.stride_tricks.as_strided(row, shp, (0,) * (len(shp) - 1) + (row.itemsize,), writeable=False)

    B, T, H, HV, K, V, N = shape.B, shape.T, shape.H, shape.hv, shape.K, shape.V, shape.N
    dt = shape.np_dtype
    arrays = dict(q=fake((B, T, H, K), dt), k=fake((B, T, H, K), dt), v=fake((B, T, HV, V), dt),
                  g=fake((B, T, HV, K), dt), beta=fake((B, T, HV), dt))
    options = dict(qk_l2norm=True, beta_sigmoid=True, gate="sigmoid", lower_bound=LOWER_BOUND,
                   A_log=np.ones(HV, F32), dt_bias=np.ones((HV, K), F32), initial_state=np.ones((N, HV, V, K), BF16),
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


def compulsory_train_bytes(shape: Shape) -> dict:
    """A training step's (the forward, then its backward): the two passes' compulsory traffic."""
    f, b = compulsory_bytes(shape), compulsory_backward_bytes(shape)
    return dict(read=f["read"] + b["read"], written=f["written"] + b["written"], total=f["total"] + b["total"])


def compulsory_backward_bytes(shape: Shape) -> dict:
    """The backward's traffic no implementation can avoid: the forward's inputs, do and
    dfinal_state read once, each gradient written once (bf16 states; dA_log, ddt_bias fp32)."""
    fwd = compulsory_bytes(shape)["parts"]
    reads = {n: v for n, v in fwd.items() if n not in ("o", "final_state")}
    reads.update(do=fwd["o"], dfinal_state=fwd["final_state"])
    writes = dict(dq=fwd["q"], dk=fwd["k"], dv=fwd["v"], dg=fwd["g"], dbeta=fwd["beta"],
                  dinitial_state=fwd["initial_state"], dA_log=fwd["A_log"], ddt_bias=fwd["dt_bias"])
    return dict(read=sum(reads.values()), written=sum(writes.values()),
                total=sum(reads.values()) + sum(writes.values()), parts={**reads, **writes})

"""Argument checking for ``kda_forward``: every check of docs/design.md
section 1, before any work starts, so a failing call writes nothing. One helper
per concern (arrays, shapes, dtypes, beta, gate, seqlens, state, out, kernel
layouts); the kernels' own limits (head dims) come from the kernel family's
``supports`` (kdacupy/ops/forward/limits.py).

Errors name the argument, what was expected and what was received. Values of
device arrays are never read (that would synchronise the host): device
``cu_seqlens`` get their dtype and shape checked here and are clamped in the
kernels, so bad values cannot touch memory outside the arrays.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import numpy as np

from .numerics.dtypes import F32, F64, INPUT_DTYPES, STATE_DTYPES, as_dtype, dtype_name
from .ops.forward.limits import supports

GATES = ("log", "softplus", "sigmoid")
BACKENDS = (None, "cuda", "reference", "model", "emulate")
LAYOUTS = ("kv", "vk")
STATE_PRECISIONS = ("bf16", "fp32")


def _cupy():
    try:
        import cupy
    except Exception:  # noqa: BLE001  (no CuPy, or CuPy without CUDA libraries)
        return None
    return cupy


def capturing(cp) -> bool:
    """Whether the current stream is capturing a CUDA graph. Asking the legacy stream while
    another stream captures raises: a host copy there would break that capture too."""
    try:
        return bool(cp.cuda.get_current_stream().is_capturing())
    except Exception:  # noqa: BLE001
        return True


def fail(name, expected, got, exc=ValueError):
    raise exc(f"{name}: expected {expected}, got {got}")


def _desc(x):
    return f"{type(x).__module__}.{type(x).__name__}"


def as_array(name, x):
    """A NumPy or CuPy array for ``x``; CUDA objects (torch, JAX) through
    ``__cuda_array_interface__`` / ``__dlpack__``, zero-copy.

    Streams: ``cupy.from_dlpack`` passes CuPy's current stream to the
    producer's ``__dlpack__(stream=...)`` (the DLPack protocol), so the
    producer's pending writes are ordered before our kernels. The producer's
    allocator does not learn that CuPy's stream reads the memory: the caller
    keeps the inputs alive until the forward has run on that stream (or runs
    both on one stream, e.g. ``cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)``)."""
    cp = _cupy()
    if isinstance(x, np.ndarray) or (cp is not None and isinstance(x, cp.ndarray)):
        return x
    # DLPack first: torch's __cuda_array_interface__ raises for bfloat16, DLPack carries it
    if hasattr(x, "__dlpack_device__"):
        dev_type = int(x.__dlpack_device__()[0])
        if dev_type == 1:  # kDLCPU
            return np.from_dlpack(x)
        if dev_type in (2, 3, 13) and cp is not None:  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
            return cp.from_dlpack(x)
    elif cp is not None and hasattr(type(x), "__cuda_array_interface__"):
        return cp.asarray(x)
    fail(name, "a NumPy or CuPy array (or a CUDA array through DLPack / __cuda_array_interface__)", _desc(x),
         TypeError)


def is_device(x) -> bool:
    return not isinstance(x, np.ndarray)


@dataclass(frozen=True)
class Problem:
    """The validated call: sizes, dtypes and options the backends specialise on."""
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int
    dtype: np.dtype  # q, k, v (and out)
    g_dtype: np.dtype
    beta_dtype: Optional[np.dtype]
    gate: str
    beta_mode: str  # "none", "raw", "sigmoid", "sigmoid2"
    qk_l2norm: bool
    scale: float
    lower_bound: Optional[float]
    state_layout: str
    state_in_dtype: Optional[np.dtype]
    state_out_dtype: Optional[np.dtype]
    state_precision: str
    varlen: bool
    device: bool  # CuPy arrays (else NumPy)
    backend: str


def _check_bool(name, x):
    if not isinstance(x, (bool, np.bool_)):
        fail(name, "a bool", repr(x), TypeError)
    return bool(x)


def _check_dtype(name, x, allowed, hint=""):
    if x.dtype not in allowed:
        fail(name, "dtype " + " or ".join(dtype_name(d) for d in allowed) + hint, dtype_name(x.dtype), TypeError)


def _check_shape(name, x, shape, what):
    if tuple(x.shape) != tuple(shape):
        fail(name, f"shape {tuple(shape)} {what}", tuple(x.shape))


def check_kernel_layout(name, x, align=16):
    """The kernels read the last dim as contiguous rows (16-byte vectors where
    ``align`` is 16); batch, token and head strides are free but keep that alignment."""
    item = x.dtype.itemsize
    st = x.strides
    if x.size and x.shape[-1] > 1 and st[-1] != item:
        fail(name, f"a contiguous last dim (stride {item} bytes)", f"strides {st}; make it contiguous first")
    ptr = x.data.ptr if is_device(x) else x.ctypes.data
    if x.size and (ptr % align or any(s % align for s, n in zip(st[:-1], x.shape) if n > 1)):
        fail(name, f"rows starting on {align}-byte boundaries", f"data address {ptr:#x} and strides {st}")


#: keywords of FLA's chunk_kda and of FlashKDA, and what kdacupy calls them (README "Keyword mapping")
FOREIGN_KEYWORDS = {
    "use_qk_l2norm_in_kernel": "qk_l2norm=True",
    "use_beta_sigmoid_in_kernel": "beta_sigmoid=True",
    "use_gate_in_kernel": "gate='softplus' (or gate='sigmoid' with lower_bound=; False: gate='log')",
    "safe_gate": "gate='sigmoid' with lower_bound=",
    "transpose_state_layout": "state_layout='vk'",
    "final_state": "output_final_state=True (the state is returned)",
    "head_first": "[B, T, H, K] arrays (kdacupy takes no head-first layout)",
}


def check_keywords(unknown: dict):
    """TypeError for keywords kda_forward does not take, with kdacupy's name for FLA's and FlashKDA's."""
    name = next(iter(unknown))
    hint = FOREIGN_KEYWORDS.get(name)
    where = "see the README's keyword mapping table"
    if hint:
        raise TypeError(f"kda_forward() got an unexpected keyword argument {name!r}: kdacupy spells it {hint}; "
                        f"{where}")
    raise TypeError(f"kda_forward() got an unexpected keyword argument {name!r}; {where}")


def validate(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens, qk_l2norm,
             beta_sigmoid, allow_neg_eigval, gate, A_log, dt_bias, lower_bound, state_layout,
             state_dtype, state_precision, out, backend) -> tuple[Problem, dict[str, Any]]:
    """Check every argument; return the Problem and the arrays to use."""
    if backend not in BACKENDS:
        fail("backend", "one of " + ", ".join(map(repr, BACKENDS)), repr(backend))
    arrays = _arrays(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias,
                     out=out)
    device = _check_devices(arrays)
    backend = _check_backend(backend, device)
    sizes = _check_shapes(arrays)
    reason = supports(sizes)  # the kernels' limits, before anything that depends on the sizes
    if reason:
        raise ValueError(reason)
    B, T, H, HV, K, V = sizes
    _check_input_dtypes(arrays, backend)
    flags = {n: _check_bool(n, x) for n, x in (("beta_sigmoid", beta_sigmoid), ("allow_neg_eigval", allow_neg_eigval),
                                               ("qk_l2norm", qk_l2norm), ("output_final_state", output_final_state))}
    beta_mode = _check_beta(arrays, (B, T, HV), flags["beta_sigmoid"], flags["allow_neg_eigval"])
    lower_bound = _check_gate(gate, arrays, dt_bias, lower_bound, HV, K)
    scale = _check_scale(scale, K)
    cu, N = _check_seqlens(cu_seqlens, B, T, device)
    s0, state_out = _check_state(arrays, state_layout, state_precision, state_dtype, (N, HV, K, V),
                                 flags["output_final_state"])
    _check_out(arrays, device)
    if backend in ("cuda", "emulate"):
        _check_kernel_layouts(arrays)

    problem = Problem(
        B=B, T=T, H=H, HV=HV, K=K, V=V, N=N, dtype=arrays["q"].dtype, g_dtype=arrays["g"].dtype,
        beta_dtype=None if arrays["beta"] is None else arrays["beta"].dtype, gate=gate, beta_mode=beta_mode,
        qk_l2norm=flags["qk_l2norm"], scale=scale, lower_bound=lower_bound, state_layout=state_layout,
        state_in_dtype=None if s0 is None else s0.dtype, state_out_dtype=state_out,
        state_precision=state_precision, varlen=cu is not None, device=device, backend=backend)
    arrays["cu_seqlens"] = cu
    return problem, arrays


def _arrays(**given) -> dict:
    return {n: None if x is None and n not in ("q", "k", "v", "g") else as_array(n, x) for n, x in given.items()}


def _check_devices(arrays) -> bool:
    """One kind of array (NumPy or CuPy), on one device; True for CuPy."""
    device = is_device(arrays["q"])
    for n, x in arrays.items():
        if x is not None and is_device(x) != device:
            fail(n, f"a {'CuPy (device)' if device else 'NumPy (host)'} array like q",
                 f"a {'CuPy (device)' if is_device(x) else 'NumPy (host)'} array")
    if device:
        current = _cupy().cuda.Device().id
        for n, x in arrays.items():
            if x is not None and x.device.id != current:
                fail(n, f"an array on the current CUDA device {current}", f"device {x.device.id}")
    return device


def _check_backend(backend, device) -> str:
    if backend is None:
        backend = "cuda" if device else "reference"
    if backend == "cuda" and not device:
        fail("backend", "CuPy arrays (or CUDA arrays through DLPack) for backend='cuda'", "NumPy arrays")
    if backend != "cuda" and device:
        fail("backend", f"NumPy arrays for backend={backend!r}", "CuPy arrays")
    return backend


class Sizes(NamedTuple):
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int


def _check_shapes(arrays) -> Sizes:
    q, k, v, g = (arrays[n] for n in "qkvg")
    for n in "qkvg":
        if arrays[n].ndim != 4:
            fail(n, "a 4-D array", f"{arrays[n].ndim}-D array of shape {tuple(arrays[n].shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if B < 1:
        fail("q", "batch size B >= 1", f"shape {tuple(q.shape)}")
    _check_shape("k", k, q.shape, "(like q: [B, T, H, K])")
    if tuple(v.shape[:2]) != (B, T):
        fail("v", f"shape ({B}, {T}, HV, V) (B, T of q)", tuple(v.shape))
    if H < 1 or HV % H:
        fail("v", f"a value-head count HV that is a multiple of H = {H}", f"HV = {HV}")
    _check_shape("g", g, (B, T, HV, K), "([B, T, HV, K])")
    return Sizes(B, T, H, HV, K, V)


def _check_input_dtypes(arrays, backend):
    q = arrays["q"]
    if backend == "reference":  # the float64 reference also takes float64
        _check_dtype("q", q, INPUT_DTYPES + (F64,))
    else:
        _check_dtype("q", q, INPUT_DTYPES, " (float64 runs only on backend='reference')" if q.dtype == F64 else "")
    for n in "kv":
        _check_dtype(n, arrays[n], (q.dtype,))
    _check_dtype("g", arrays["g"], tuple(dict.fromkeys((q.dtype, F32))))


def _check_beta(arrays, shape, beta_sigmoid, allow_neg_eigval) -> str:
    """The beta mode the kernels specialise on: "none", "raw", "sigmoid" or "sigmoid2"."""
    b = arrays["beta"]
    if b is None:
        if beta_sigmoid:
            fail("beta", "beta logits with beta_sigmoid=True", "None")
        beta_mode = "none"
    else:
        _check_shape("beta", b, shape, "([B, T, HV])")
        _check_dtype("beta", b, tuple(dict.fromkeys((arrays["q"].dtype, F32))))
        beta_mode = ("sigmoid2" if allow_neg_eigval else "sigmoid") if beta_sigmoid else "raw"
    if allow_neg_eigval and not beta_sigmoid:
        fail("allow_neg_eigval", "beta_sigmoid=True (it doubles the sigmoid of the beta logits)",
             "beta_sigmoid=False")
    return beta_mode


def _check_gate(gate, arrays, dt_bias, lower_bound, HV, K):
    """The gate and its parameters; returns lower_bound as a float (or None)."""
    if gate not in GATES:
        fail("gate", "one of " + ", ".join(map(repr, GATES)), repr(gate))
    A, dtb = arrays["A_log"], arrays["dt_bias"]
    if gate == "log":
        for n, x in (("A_log", A), ("dt_bias", dt_bias), ("lower_bound", lower_bound)):
            if x is not None:
                fail(n, "None with gate='log' (g is already the log decay)", _value(x))
    params = (F32, F64) if arrays["q"].dtype == F64 else (F32,)
    if A is not None:
        _check_shape("A_log", A, (HV,), "([HV])")
        _check_dtype("A_log", A, params)
    if dtb is not None:
        if tuple(dtb.shape) not in ((HV, K), (HV * K,)):
            fail("dt_bias", f"shape ({HV}, {K}) or ({HV * K},)", tuple(dtb.shape))
        _check_dtype("dt_bias", dtb, params)
    if gate == "softplus" and lower_bound is not None:
        fail("lower_bound", "None with gate='softplus'", repr(lower_bound))
    if gate == "sigmoid":
        if lower_bound is None:
            fail("lower_bound", "a number in [-5, 0) with gate='sigmoid'", "None")
        if not isinstance(lower_bound, numbers.Real) or isinstance(lower_bound, bool) or not (
                -5.0 <= float(lower_bound) < 0.0):
            fail("lower_bound", "a number in [-5, 0)", repr(lower_bound))
        lower_bound = float(lower_bound)
    return lower_bound


def _value(x) -> str:
    """An argument as an error message shows it: arrays by kind, shape and dtype, scalars by value."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{_desc(x)} of shape {tuple(x.shape)} and dtype {dtype_name(x.dtype)}"
    return repr(x)


def _check_scale(scale, K) -> float:
    if scale is None:
        return K ** -0.5
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not np.isfinite(float(scale)):
        fail("scale", "a finite real number or None", repr(scale))
    return float(scale)


def _check_seqlens(cu, B, T, device):
    """(cu_seqlens as an array or None, number of sequences N); host values fully checked."""
    if cu is None:
        return None, B
    if isinstance(cu, (list, tuple)):
        cu = np.asarray(cu)
        if cu.dtype.kind not in "iu":
            fail("cu_seqlens", "integers", f"values of dtype {cu.dtype}", TypeError)
        cu = cu.astype(np.int64)
    cu = as_array("cu_seqlens", cu)
    if cu.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        fail("cu_seqlens", "dtype int32 or int64", dtype_name(cu.dtype), TypeError)
    if cu.ndim != 1 or cu.shape[0] < 2:
        fail("cu_seqlens", "a 1-D array [N + 1] with N >= 1", f"shape {tuple(cu.shape)}")
    if B != 1:
        fail("q", "B == 1 with cu_seqlens (sequences packed in one row)", f"B = {B}")
    if is_device(cu) and not device:
        fail("cu_seqlens", "a NumPy array like q", "a CuPy (device) array")
    if not is_device(cu):
        _check_host_seqlens(cu, T)
        if device:
            if capturing(_cupy()):
                fail("cu_seqlens", "a device (CuPy) array while the current stream is capturing a CUDA "
                     "graph (a graph cannot hold a copy from host memory)", "a host (NumPy) array or list")
            cu = _cupy().asarray(cu)  # host -> device: no device-to-host sync
    return cu, cu.shape[0] - 1


def _check_host_seqlens(cu, T):
    if cu[0] != 0:
        fail("cu_seqlens", "first value 0", int(cu[0]))
    if cu[-1] != T:
        fail("cu_seqlens", f"last value T = {T}", int(cu[-1]))
    if np.any(np.diff(cu) < 0):
        i = int(np.argmax(np.diff(cu) < 0))
        fail("cu_seqlens", "non-decreasing values", f"cu_seqlens[{i}] = {int(cu[i])} > "
             f"cu_seqlens[{i + 1}] = {int(cu[i + 1])}")


def _check_state(arrays, state_layout, state_precision, state_dtype, dims, output_final_state):
    """(initial state array or None, final state dtype or None)."""
    if state_layout not in LAYOUTS:
        fail("state_layout", "'kv' or 'vk'", repr(state_layout))
    if state_precision not in STATE_PRECISIONS:
        fail("state_precision", "'bf16' or 'fp32'", repr(state_precision))
    N, HV, K, V = dims
    s0 = arrays["initial_state"]
    state_shape = (N, HV, K, V) if state_layout == "kv" else (N, HV, V, K)
    allowed = STATE_DTYPES + ((F64,) if arrays["q"].dtype == F64 else ())  # float64 calls (the reference)
    if s0 is not None:
        _check_shape("initial_state", s0, state_shape, f"([N, HV, {'K, V' if state_layout == 'kv' else 'V, K'}] "
                     f"for state_layout={state_layout!r})")
        _check_dtype("initial_state", s0, allowed)
    if state_dtype is not None:
        try:
            sd = as_dtype(state_dtype)
        except TypeError:
            sd = None
        if sd not in allowed:
            fail("state_dtype", ", ".join(map(dtype_name, allowed)) + " or None", repr(state_dtype), TypeError)
        state_dtype = sd
    if not output_final_state:
        return s0, None
    default = F64 if arrays["q"].dtype == F64 else F32
    return s0, state_dtype or (s0.dtype if s0 is not None else default)


def _check_out(arrays, device):
    o, v = arrays["out"], arrays["v"]
    if o is None:
        return
    _check_shape("out", o, v.shape, "(the shape of v)")
    _check_dtype("out", o, (v.dtype,))
    if not device and not o.flags.writeable:
        fail("out", "a writeable array", "a read-only array")
    shares = (_cupy().may_share_memory if device else np.may_share_memory)
    for n in ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"):
        x = arrays[n]
        if x is not None and shares(o, x):
            fail("out", "memory separate from the inputs", f"an array overlapping {n}")


def _check_kernel_layouts(arrays):
    """What the kernels read: row layouts and contiguity. (A strided device
    cu_seqlens is copied into the persistent workspace by the launcher,
    ops/forward/kernels.py, never into a per-call temporary a captured graph
    would keep.)"""
    for n in ("q", "k", "v", "g", "beta", "out"):
        if arrays[n] is not None:
            check_kernel_layout(n, arrays[n], 16 if n != "beta" else arrays[n].dtype.itemsize)
    for n in ("initial_state", "A_log", "dt_bias"):
        x = arrays[n]
        if x is not None and not x.flags.c_contiguous:
            fail(n, "a C-contiguous array", f"strides {x.strides}")

"""The vocabulary every check uses: the error, array conversion (NumPy, CuPy,
DLPack, ``__cuda_array_interface__``), and the simple per-array checks (bool,
dtype, shape)."""
from __future__ import annotations

import numpy as np

from ..numerics.dtypes import dtype_name


def cupy_module():
    """CuPy, or None where it is not importable (no CuPy, or CuPy without CUDA libraries)."""
    try:
        import cupy
    except Exception:  # noqa: BLE001
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


def describe_type(x):
    return f"{type(x).__module__}.{type(x).__name__}"


def describe(x) -> str:
    """An argument as an error message shows it: arrays by kind, shape and dtype, scalars by value."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{describe_type(x)} of shape {tuple(x.shape)} and dtype {dtype_name(x.dtype)}"
    return repr(x)


def as_array(name, x):
    """A NumPy or CuPy array for ``x``; CUDA objects (torch, JAX) through
    ``__cuda_array_interface__`` / ``__dlpack__``, zero-copy.

    Streams: ``cupy.from_dlpack`` passes CuPy's current stream to the
    producer's ``__dlpack__(stream=...)`` (the DLPack protocol), so the
    producer's pending writes are ordered before our kernels. The producer's
    allocator does not learn that CuPy's stream reads the memory: the caller
    keeps the inputs alive until the forward has run on that stream (or runs
    both on one stream, e.g. ``cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)``)."""
    cp = cupy_module()
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
    fail(name, "a NumPy or CuPy array (or a CUDA array through DLPack / __cuda_array_interface__)",
         describe_type(x), TypeError)


def is_device(x) -> bool:
    return not isinstance(x, np.ndarray)


def check_bool(name, x):
    if not isinstance(x, (bool, np.bool_)):
        fail(name, "a bool", repr(x), TypeError)
    return bool(x)


def check_dtype(name, x, allowed, hint=""):
    if x.dtype not in allowed:
        fail(name, "dtype " + " or ".join(dtype_name(d) for d in allowed) + hint, dtype_name(x.dtype), TypeError)


def check_shape(name, x, shape, what):
    if tuple(x.shape) != tuple(shape):
        fail(name, f"shape {tuple(shape)} {what}", tuple(x.shape))

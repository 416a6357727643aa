"""Where the arrays live and how the kernels may read them: one kind of array
on one device, the backend that fits, ``out`` apart from the inputs, and the
row layouts the kernels need."""
from __future__ import annotations

import numpy as np

from ..numerics.dtypes import row_alignment
from .arrays import check_dtype, check_shape, cupy_module, fail, is_device


def check_devices(arrays) -> bool:
    """One kind of array (NumPy or CuPy), on one device; True for CuPy."""
    device = is_device(arrays["q"])
    for n, x in arrays.items():
        if x is not None:
            check_kind(n, x, device)
    if device:
        for n, x in arrays.items():
            if x is not None:
                check_place(n, x, device)
    return device


def check_kind(name, x, device):
    """``x`` is the kind of array q is (CuPy for ``device``, else NumPy)."""
    if is_device(x) != device:
        fail(name, f"a {'CuPy (device)' if device else 'NumPy (host)'} array like q",
             f"a {'CuPy (device)' if is_device(x) else 'NumPy (host)'} array")


def check_place(name, x, device):
    """``x`` is q's kind of array and, a CuPy one, on the current CUDA device."""
    check_kind(name, x, device)
    if device:
        current = cupy_module().cuda.Device().id
        if x.device.id != current:
            fail(name, f"an array on the current CUDA device {current}", f"device {x.device.id}")


def check_backend(backend, device) -> str:
    if backend is None:
        backend = "cuda" if device else "reference"
    if backend == "cuda" and not device:
        fail("backend", "CuPy arrays (or CUDA arrays through DLPack) for backend='cuda'", "NumPy arrays")
    if backend != "cuda" and device:
        fail("backend", f"NumPy arrays for backend={backend!r}", "CuPy arrays")
    return backend


def check_out(arrays, device):
    o, v = arrays["out"], arrays["v"]
    if o is None:
        return

    check_shape("out", o, v.shape, "(the shape of v)")
    check_dtype("out", o, (v.dtype,))
    if not device and not o.flags.writeable:
        fail("out", "a writeable array", "a read-only array")
    shares = (cupy_module().may_share_memory if device else np.may_share_memory)
    for n in ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"):
        x = arrays[n]
        if x is not None and shares(o, x):
            fail("out", "memory separate from the inputs", f"an array overlapping {n}")


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


def check_kernel_layouts(arrays):
    """What the kernels read: row layouts and contiguity. (A strided device
    cu_seqlens is copied into the persistent workspace by the launcher,
    ops/forward/kernels.py, never into a per-call temporary a captured graph
    would keep.)"""
    for n in ("q", "k", "v", "g", "beta", "out"):
        if arrays[n] is not None:
            check_kernel_layout(n, arrays[n], row_alignment(arrays[n]) if n != "beta" else arrays[n].dtype.itemsize)
    for n in ("initial_state", "A_log", "dt_bias"):
        x = arrays[n]
        if x is not None and not x.flags.c_contiguous:
            fail(n, "a C-contiguous array", f"strides {x.strides}")

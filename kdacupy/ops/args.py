"""Kernel arguments that every family's launchers pack the same way: data pointers, strides,
cu_seqlens, the forward's state pool and the gate's lower bound.

A pointer is a CuPy array's device address, or, for the CPU emulation, a
``kdacupy.emulate.pointer`` that carries the NumPy array's extent (memcheck); 0 for none.
"""
from __future__ import annotations

import numpy as np

LOG2E = 1.0 / np.log(2.0)


def ptr(x):
    if x is None:
        return np.uint64(0)
    if isinstance(x, np.ndarray):  # the emulation: the array's extent goes along (memcheck)
        from ..emulate import pointer
        return pointer(x)
    return np.uint64(x.data.ptr)


def strides(x):
    """Batch, token and head strides in elements (the last dim is contiguous)."""
    if x is None:
        return [np.int64(0)] * 3
    return [np.int64(s // x.dtype.itemsize) for s in x.strides[:3]]


def cu_args(cu):
    return [ptr(cu), np.int32(0 if cu is None else int(cu.dtype == np.int64))]


def pool_args(a):
    """State pool of kda_forward (docs/design.md section 7.1): slot indices, their width, the pool's size."""
    idx = a.get("state_indices")
    if idx is None:
        return [np.uint64(0), np.int32(0), np.int64(0)]
    return [ptr(idx), np.int32(idx.dtype == np.int64), np.int64(a["state_pool"].shape[0])]


def lower_bound_log2(p) -> np.float32:
    """The gate's lower bound in log2 units, as the kernels take it (0 for none)."""
    return np.float32(p.lower_bound * LOG2E) if p.lower_bound is not None else np.float32(0)

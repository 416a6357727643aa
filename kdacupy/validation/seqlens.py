"""``cu_seqlens``: host values fully checked; device values never read (the
kernels clamp them, so bad values cannot touch memory outside the arrays)."""
from __future__ import annotations

import numpy as np

from ..numerics.dtypes import dtype_name
from .arrays import as_array, capturing, cupy_module, fail, is_device


def check_seqlens(cu, B, T, device):
    """(cu_seqlens as an array or None, number of sequences N)."""
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
        check_host_seqlens(cu, T)
        if device:
            if capturing(cupy_module()):
                fail("cu_seqlens", "a device (CuPy) array while the current stream is capturing a CUDA "
                     "graph (a graph cannot hold a copy from host memory)", "a host (NumPy) array or list")
            cu = cupy_module().asarray(cu)  # host -> device: no device-to-host sync
    return cu, cu.shape[0] - 1


def check_host_seqlens(cu, T):
    if cu[0] != 0:
        fail("cu_seqlens", "first value 0", int(cu[0]))
    if cu[-1] != T:
        fail("cu_seqlens", f"last value T = {T}", int(cu[-1]))
    if np.any(np.diff(cu) < 0):
        i = int(np.argmax(np.diff(cu) < 0))
        fail("cu_seqlens", "non-decreasing values", f"cu_seqlens[{i}] = {int(cu[i])} > "
             f"cu_seqlens[{i + 1}] = {int(cu[i + 1])}")

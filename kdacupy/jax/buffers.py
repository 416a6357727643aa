"""XLA's buffers as the arrays kdacupy takes, inside a ``jax.experimental.buffer_callback``.

The callback receives XLA's own device buffers (no host round trip) and, on a GPU,
XLA's stream (``ExecutionContext.stream``). On the CPU a buffer is a NumPy array
(``np.asarray``, zero-copy); on a GPU it becomes a CuPy array over the same device
memory (from its ``__cuda_array_interface__`` pointer, or DLPack), and CuPy's current
stream is made XLA's stream (``cupy.cuda.ExternalStream``), so kdacupy's kernels run
in XLA's stream order with no host synchronisation. Output buffers are written in
place; inputs are never written.
"""
from __future__ import annotations

import contextlib

import numpy as np


def xla_stream(ctx):
    """XLA's CUDA stream for this call, or None on the CPU (where there is no GPU context)."""
    try:
        return int(ctx.stream)
    except Exception:  # noqa: BLE001  (jaxlib raises UNIMPLEMENTED without a GPU context)
        return None


def _pointer(buf):
    try:
        return int(buf.__cuda_array_interface__["data"][0])
    except Exception:  # noqa: BLE001  (a dtype the interface cannot spell: DLPack below)
        return None


def _device_of(buffers):
    import cupy
    for b in buffers:
        ptr = _pointer(b)
        if ptr:
            return int(cupy.cuda.runtime.pointerGetAttributes(ptr).device)
    return cupy.cuda.runtime.getDevice()


def _device_view(buf, device):
    import cupy
    ptr = _pointer(buf)
    if ptr is None:
        return cupy.from_dlpack(buf)
    shape, dtype = tuple(buf.shape), np.dtype(buf.dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    memory = cupy.cuda.UnownedMemory(ptr, nbytes, buf, device)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))  # XLA's default layout: row-major


@contextlib.contextmanager
def arrays_of(ctx, buffers):
    """Yields a function from buffer to array (NumPy on the CPU, CuPy on a GPU); on a GPU the
    block runs with CuPy's current device and stream set to the buffers' device and XLA's stream."""
    stream = xla_stream(ctx)
    if stream is None:
        yield np.asarray
        return
    import cupy
    device = _device_of(buffers)
    with cupy.cuda.Device(device), cupy.cuda.ExternalStream(stream, device):
        yield lambda b: _device_view(b, device)

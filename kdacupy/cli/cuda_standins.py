"""The CUDA path's host cost without a GPU: device-array stand-ins and a null launcher.

A stand-in is a real ``cupy.ndarray`` (so ``kda_decode`` takes its CUDA path
and reads it as it reads any CuPy array: dtype, shape, strides, ``data.ptr``,
``data.device_id``) over ``cupy.cuda.UnownedMemory`` on device 0 whose address
is host memory that nothing dereferences. ``standin_device()`` stands in for
what only a driver answers, and for the kernel launch:

- ``cupy.cuda.runtime.getDevice``, ``cupy.cuda.Device()``: device 0;
- ``cupy.cuda.get_current_stream``: a stream that is not capturing;
- the device's name and SM count (the decode tuning lookup);
- CuPy's allocator: host memory (``out`` allocated by the launcher);
- the CUDA loader's ``get``: a ``NullKernel`` per variant, nothing compiled;
  ``CudaLoader.launch`` is the real one and calls it as it calls a
  ``cupy.RawKernel``: the null kernel keeps the grid, block and arguments.

So the timed code is what ``kda_decode`` runs on CuPy arrays, less the driver's
launch (CuPy's argument packing and ``cuLaunchKernel``).
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import numpy as np

#: the stand-in stream's handle (any non-zero value: a non-default stream)
STREAM_PTR = 0x5EED0


class NullKernel:
    """A compiled kernel's place: ``fn(grid, block, args, shared_mem=)`` keeps the launch."""

    max_dynamic_shared_size_bytes = 0

    def __init__(self, kernel: str, config: dict, name: str):
        self.kernel, self.config, self.name = kernel, dict(config), name
        self.launches = 0
        self.last = None

    def __call__(self, grid, block, args, shared_mem=0):
        self.launches += 1
        self.last = (grid, block, args, shared_mem)


class StandinStream:
    """What the path asks of CuPy's current stream."""

    ptr = STREAM_PTR
    device_id = 0

    @staticmethod
    def is_capturing() -> bool:
        return False


class HostArena:
    """CuPy's allocator on host memory: blocks handed out round the arena, 256-byte aligned
    as CuPy's pool aligns them; nothing is freed or read."""

    def __init__(self, nbytes: int = 1 << 26):
        self.buf = np.zeros(nbytes + 256, np.uint8)
        self.base = -self.buf.ctypes.data % 256 + self.buf.ctypes.data
        self.nbytes, self.at = nbytes, 0

    def __call__(self, size: int):
        import cupy

        size = max(256, -(-size // 256) * 256)
        if size > self.nbytes:
            raise MemoryError(f"stand-in allocation of {size} bytes exceeds the arena ({self.nbytes})")
        if self.at + size > self.nbytes:
            self.at = 0
        ptr, self.at = self.base + self.at, self.at + size
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, size, self.buf, 0), 0)


def device_view(host: np.ndarray):
    """A stand-in over ``host``'s own memory (same address, shape, strides, dtype)."""
    import cupy

    if any(s < 0 for s in host.strides):
        raise ValueError("device_view: negative strides are not supported")
    span = sum((n - 1) * s for n, s in zip(host.shape, host.strides)) + host.itemsize if host.size else 1
    mem = cupy.cuda.UnownedMemory(host.ctypes.data, span, host, 0)
    return cupy.ndarray(host.shape, host.dtype, memptr=cupy.cuda.MemoryPointer(mem, 0), strides=host.strides)


def device_array(shape, dtype, fill=0):
    """A C-contiguous stand-in of its own (host memory, 256-byte aligned, filled with ``fill``)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    buf = np.zeros(n + 256, np.uint8)
    off = -buf.ctypes.data % 256
    host = buf[off:off + n].view(dtype).reshape(shape)
    host[...] = fill
    return device_view(host)


def as_standins(arrays: dict) -> dict:
    """Every NumPy array of ``arrays`` as a stand-in over the same memory; the rest as given."""
    return {n: device_view(x) if isinstance(x, np.ndarray) else x for n, x in arrays.items()}


@contextmanager
def standin_device(name: str = "NVIDIA H200", sm_count: int = 132):
    """CuPy and kdacupy's CUDA loader on stand-ins (module docstring) while the block runs; the
    decode caches that hold compiled functions are cleared on entry and exit."""
    import cupy
    import cupy.cuda

    from ..jit.loaders import loader
    from ..ops.decode import fastpath, kernels, tuning

    real_device = cupy.cuda.Device
    cuda = loader("cuda")
    kernels_made: dict = {}

    def null_get(kernel, config, fn_name):
        key = (kernel, tuple(sorted(config.items())), cupy.cuda.Device().id)
        fn = kernels_made.get(key)
        if fn is None:
            fn = kernels_made[key] = NullKernel(kernel, config, fn_name)
        return fn

    def clear():
        kernels.launch_plan.cache_clear()
        fastpath.clear()

    def patch(obj, attr, value):
        had = attr in vars(obj)
        old = vars(obj).get(attr)
        setattr(obj, attr, value)
        stack.callback(lambda: setattr(obj, attr, old) if had else delattr(obj, attr))

    with ExitStack() as stack:
        stack.callback(clear)
        old_alloc = cupy.cuda.get_allocator()
        stack.callback(cupy.cuda.set_allocator, old_alloc)
        patch(cupy.cuda.runtime, "getDevice", lambda: 0)
        patch(cupy.cuda, "Device", lambda device=None: real_device(0 if device is None else device))
        patch(cupy.cuda, "get_current_stream", lambda device=None: StandinStream())
        patch(tuning, "_device", lambda: (name, sm_count))
        patch(cuda, "get", null_get)
        cupy.cuda.set_allocator(HostArena())
        clear()
        yield kernels_made


class StandinStreamContext(StandinStream):
    """CuPy's stream object for the stand-in stream, as a context (entering a real one asks the driver)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@contextmanager
def standin_torch_cuda():
    """CPU tensors standing for CUDA tensors on device 0 (inside ``standin_device()``): what only
    a CUDA build of torch answers is answered (``Tensor.get_device``: 0, torch's current raw
    stream: ``STREAM_PTR``, CuPy's object for that stream: a context that needs no driver);
    kdacupy.torch's eager path (kdacupy/torch/eager.py) then views their memory as it views a
    CUDA tensor's. Allocations (``torch.empty``) stay on torch's CPU allocator."""
    import importlib

    import torch

    eager = importlib.import_module("kdacupy.torch.eager")  # at run time: the CLI layer does not build on the face
    with ExitStack() as stack:
        stack.callback(eager.clear)
        had = "get_device" in vars(torch.Tensor)
        old = vars(torch.Tensor).get("get_device")
        torch.Tensor.get_device = lambda self: 0
        stack.callback(lambda: setattr(torch.Tensor, "get_device", old) if had else delattr(torch.Tensor, "get_device"))
        had_raw = hasattr(torch._C, "_cuda_getCurrentRawStream")
        old_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        torch._C._cuda_getCurrentRawStream = lambda dev: STREAM_PTR
        stack.callback(lambda: setattr(torch._C, "_cuda_getCurrentRawStream", old_raw) if had_raw
                       else delattr(torch._C, "_cuda_getCurrentRawStream"))
        eager.clear()
        eager._streams[0, STREAM_PTR] = StandinStreamContext()
        yield

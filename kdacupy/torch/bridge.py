"""Torch tensors to the arrays kdacupy takes and back, without copies, on torch's stream.

CPU tensors become NumPy arrays (``np.from_dlpack``; bfloat16, which NumPy's
DLPack does not know, through an int16 view re-read as ``ml_dtypes.bfloat16``);
CUDA tensors become CuPy arrays (``cupy.from_dlpack``). Both share the tensor's
memory. Results come back the same way (``torch.from_numpy`` /
``torch.from_dlpack``), so nothing is copied in either direction.

Streams: ``on_torch_stream`` makes CuPy's current stream torch's current stream
(``cupy.cuda.ExternalStream`` of ``torch.cuda.current_stream().cuda_stream``),
so every DLPack exchange inside it names the stream the consumer already runs
on (no event, no wait) and kdacupy's kernels run in torch's stream order, as a
torch kernel would: no host synchronisation, and capturable in
``torch.cuda.graph`` like the core (docs/design.md section 5).
"""
from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import torch

BF16 = np.dtype(ml_dtypes.bfloat16)

_TO_NUMPY = {torch.float64: np.dtype(np.float64), torch.float32: np.dtype(np.float32),
             torch.float16: np.dtype(np.float16), torch.bfloat16: BF16,
             torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64)}


def numpy_dtype(dtype):
    """NumPy dtype of a torch dtype (None stays None)."""
    if dtype is None:
        return None
    if dtype not in _TO_NUMPY:
        raise TypeError(f"state_dtype: expected torch.float32, torch.bfloat16 (or torch.float64 on the "
                        f"reference backend) or None, got {dtype}")
    return _TO_NUMPY[dtype]


def to_array(t):
    """The NumPy (CPU) or CuPy (CUDA) array that views tensor ``t``; None stays None."""
    if t is None:
        return None
    t = t.detach()
    if t.device.type == "cpu":
        if t.dtype == torch.bfloat16:
            return np.from_dlpack(t.view(torch.int16)).view(BF16)
        return np.from_dlpack(t)
    if t.device.type == "cuda":
        import cupy
        return cupy.from_dlpack(t)
    raise TypeError(f"kdacupy.torch runs on CPU and CUDA tensors, got a tensor on {t.device}")


def to_tensor(a):
    """The torch tensor that views array ``a`` (NumPy or CuPy); None stays None."""
    if a is None:
        return None
    if isinstance(a, np.ndarray):
        if not a.flags.writeable:  # torch tensors are always writeable: give it memory of its own
            a = a.copy()
        if a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)
    return torch.from_dlpack(a)


def on_torch_stream(device):
    """Context in which CuPy runs on torch's current stream of ``device`` (a no-op for CPU)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    import cupy
    index = device.index if device.index is not None else torch.cuda.current_device()
    ptr = torch.cuda.current_stream(index).cuda_stream
    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(index))
    # torch's default stream is the legacy NULL stream: CuPy's own object for it
    stack.enter_context(cupy.cuda.Stream.null if ptr == 0 else cupy.cuda.ExternalStream(ptr, index))
    return stack


def empty_like_rows(x, shape=None, dtype=None):
    """A new C-contiguous tensor on ``x``'s device, from torch's allocator (stream-ordered,
    graph-pool aware), for results that kdacupy writes through ``out=``."""
    return torch.empty(tuple(x.shape) if shape is None else shape, dtype=dtype or x.dtype, device=x.device)

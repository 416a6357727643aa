"""The eager host path of ``kdacupy.torch.kda_decode`` on CUDA tensors.

An engine that does not capture CUDA graphs pays this path every token, and the
custom op (``torch.ops.kdacupy.decode``, kdacupy/torch/ops.py) alone costs more
host time in eager mode than a decode step's kernel. Where running the op's body
directly is the same thing, this runs it directly: CUDA tensors of type
``torch.Tensor`` exactly, not compiling or tracing, no torch dispatch or function
mode active, and no autograd to record. Everything else goes through the op.

The op's body (bridge.py) makes CuPy arrays of the tensors through DLPack and
CuPy's stream object for torch's current stream, every call. Here both are kept:

- a CuPy view per (data pointer, shape, strides, dtype, device) of a tensor,
  made once (``cupy.ndarray`` over ``UnownedMemory`` at that address: DLPack's
  zero-copy view, with no reference to the tensor, so the cache keeps no memory
  alive; a view is only used while a tensor with exactly that memory is passed);
- CuPy's stream per (device, torch's current stream handle): the DLPack
  exchange of the op's body names the stream its consumer runs on, so it adds
  no synchronisation, and there is none to skip.

``kdacupy.kda_decode`` then checks the arrays (its own cached fast path), and the
pool's version counter is bumped as the op's declared mutation does.
"""
from __future__ import annotations

import torch

import kdacupy

from .bridge import _TO_NUMPY

MAX_VIEWS = 4096
_views: dict = {}
_streams: dict = {}
_CUPY: list = []  # cupy once imported, or None where it is not importable


def clear():
    _views.clear()
    _streams.clear()


def _cupy():
    if not _CUPY:
        try:
            import cupy
        except Exception:  # noqa: BLE001  (no CuPy, or CuPy without CUDA libraries)
            cupy = None
        _CUPY.append(cupy)
    return _CUPY[0]


def _no_mode() -> bool:
    """Not compiling or tracing, and no torch function or dispatch mode on (fake, proxy and
    functional tensors' modes too: each puts the Python dispatch key in the thread's included
    set). Where a torch lacks these flags, never eager."""
    try:
        return not (torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
                    or torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.Python))
    except AttributeError:
        return False


def _view(key):
    """A CuPy array over the memory a tensor's (pointer, shape, strides, dtype, device) name."""
    cupy = _cupy()
    ptr, shape, strides, dtype, dev = key
    np_dtype = _TO_NUMPY.get(dtype)
    if cupy is None or np_dtype is None:
        return None
    item = np_dtype.itemsize
    span = (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * item if all(shape) else 0
    mem = cupy.cuda.UnownedMemory(ptr, span, None, dev)
    return cupy.ndarray(tuple(shape), np_dtype, memptr=cupy.cuda.MemoryPointer(mem, 0),
                        strides=tuple(s * item for s in strides))


def current_stream(dev: int):
    """CuPy's object for torch's current stream on device ``dev`` (torch's raw handle: what
    ``torch.cuda.current_stream(dev).cuda_stream`` is, without making a Stream object)."""
    try:
        ptr = torch._C._cuda_getCurrentRawStream(dev)
    except AttributeError:
        ptr = torch.cuda.current_stream(dev).cuda_stream
    stream = _streams.get((dev, ptr))
    if stream is None:
        cupy = _cupy()
        stream = _streams[dev, ptr] = cupy.cuda.Stream.null if ptr == 0 else cupy.cuda.ExternalStream(ptr, dev)
    return stream


def _key(t):
    """What a view of ``t`` stands for: its memory, layout and type (only ``torch.Tensor``
    itself is ever viewed: subclasses such as fake or functional tensors never match)."""
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t)


def _views_of(tensors, dev):
    """The views of ``tensors`` (None stays None), made where missing; None where a tensor
    cannot be viewed here (not a plain CUDA tensor on ``dev``, a dtype CuPy is not given)."""
    views = []
    for t in tensors:
        if t is None:
            views.append(None)
            continue
        key = _key(t)
        a = _views.get(key)
        if a is None:
            if key[5] is not torch.Tensor or key[4] != dev or (a := _view(key[:5])) is None:
                return None
            if len(_views) >= MAX_VIEWS:
                _views.clear()
            _views[key] = a
        views.append(a)
    return views


def decode(q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens, A_log, dt_bias, out, scale, qk_l2norm,
           beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, backend) -> bool:
    """The decode op's body, run directly (True), or False where only the op is the same thing
    (the caller then calls the op). Arguments as ``ops.decode``'s."""
    tensors = (q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens, A_log, dt_bias, out)
    dev = q.get_device()
    if dev < 0 or not _no_mode() or (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in tensors)):
        return False
    try:  # the views made before: one lookup per tensor (_key, inline)
        views = [None if t is None else _views[t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t)]
                 for t in tensors]
    except KeyError:
        views = _views_of(tensors, dev)
        if views is None:
            return False
    runtime = _cupy().cuda.runtime
    stream = current_stream(dev)
    prev = runtime.getDevice()  # torch's current device, as a rule: nothing to switch
    if prev != dev:
        runtime.setDevice(dev)
    try:
        with stream:
            kdacupy.kda_decode(
                *views[:5], state_pool=views[5], state_indices=views[6], num_accepted_tokens=views[7],
                scale=scale, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval,
                gate=gate, A_log=views[8], dt_bias=views[9], lower_bound=lower_bound, state_layout=state_layout,
                out=views[10], backend=backend)
    finally:
        if prev != dev:
            runtime.setDevice(prev)
    torch.autograd.graph.increment_version(state_pool)
    return True

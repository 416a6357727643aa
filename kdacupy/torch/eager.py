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
from .tensors import CONVERTED_PARAM_DTYPES

MAX_VIEWS = 4096
MAX_PARAMS = 256
_views: dict = {}
_streams: dict = {}
_params: dict = {}  # float32 copies of bf16 / fp16 gate parameters (float_param)
_CUPY: list = []  # cupy once imported, or None where it is not importable
#: other caches of views (kdacupy.compat's decode calls), cleared with these
clear_hooks: list = []


def clear():
    _views.clear()
    _streams.clear()
    _params.clear()
    for hook in clear_hooks:
        hook()


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
           beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, backend, null_slot,
           cu_seqlens=None) -> bool:
    """The decode op's body, run directly (True), or False where only the op is the same thing
    (the caller then calls the op). Arguments as ``ops.decode``'s."""
    tensors = (q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens, A_log, dt_bias, out, cu_seqlens)
    dev = q.get_device()
    if dev < 0 or not eager_ok(tensors):
        return False
    try:  # the views made before: one lookup per tensor (_key, inline)
        views = [None if t is None else _views[t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t)]
                 for t in tensors]
    except KeyError:
        views = _views_of(tensors, dev)
        if views is None:
            return False
    launch(dev, current_stream(dev), views, state_pool, dict(
        scale=scale, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval, gate=gate,
        lower_bound=lower_bound, state_layout=state_layout, backend=backend, null_slot=null_slot))
    return True


def eager_ok(tensors) -> bool:
    """Where the op's body may run directly (the device checked by the caller): no mode on, and no
    autograd to record."""
    return _no_mode() and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


def launch(dev, stream, views, state_pool, options):
    """``kdacupy.kda_decode`` on the views (q, k, v, g, beta, state_pool, state_indices,
    num_accepted_tokens, A_log, dt_bias, out, cu_seqlens) on ``stream`` and device ``dev``; the
    pool tensor's version bumped as the op's declared mutation does."""
    runtime = _cupy().cuda.runtime
    prev = runtime.getDevice()  # torch's current device, as a rule: nothing to switch
    if prev != dev:
        runtime.setDevice(dev)
    try:
        with stream:
            kdacupy.kda_decode(*views[:5], state_pool=views[5], state_indices=views[6], num_accepted_tokens=views[7],
                               A_log=views[8], dt_bias=views[9], out=views[10], cu_seqlens=views[11], **options)
    finally:
        if prev != dev:
            runtime.setDevice(prev)
    torch.autograd.graph.increment_version(state_pool)


def bind(dev, views, options):
    """The core call ``launch`` just made on ``views`` (its order) and ``options``, bound to the
    views' pointers (``fastpath.DecodeCall.bind``: only out's then varies), or None where kdacupy
    cached no such call. Keyed as kdacupy.kda_decode keys it, on device ``dev``."""
    arrays = (*views[:8], views[10], views[8], views[9], None, None, None, views[11])  # fastpath.NAMES order
    runtime = _cupy().cuda.runtime
    prev = runtime.getDevice()
    if prev != dev:
        runtime.setDevice(dev)
    try:
        call = kdacupy.prepared_decode(arrays, options)
    finally:
        if prev != dev:
            runtime.setDevice(prev)
    return None if call is None else call.bind([0 if x is None else x.data.ptr for x in arrays])


def launch_bound(dev, stream, bound, out_ptr, state_pool) -> bool:
    """``launch`` of a bound call (``bind``) with out at ``out_ptr``; False, launching nothing,
    where out fails a per-call check (the caller then takes kdacupy.kda_decode, which raises)."""
    runtime = _cupy().cuda.runtime
    prev = runtime.getDevice()
    if prev != dev:
        runtime.setDevice(dev)
    try:
        with stream:
            if not bound.launch(out_ptr):
                return False
    finally:
        if prev != dev:
            runtime.setDevice(prev)
    torch.autograd.graph.increment_version(state_pool)
    return True


def float_param(x):
    """(copy, storage): a bf16 / fp16 gate parameter (A_log [HV], dt_bias) as a float32 C-contiguous
    copy, made once per (pointer, shape, strides, dtype, device, type, version) of ``x``: an in-place
    change bumps the version and makes a new copy. ``storage``, x's, is held with the copy, so its
    memory is not freed and reused by another tensor under the same key. None where a change could
    not be noticed (an inference tensor has no version counter) or where the conversion belongs to
    autograd or to a CUDA graph being captured: the caller then converts as before."""
    if x.is_inference():  # no version counter
        return None
    key = (x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device(), type(x), x._version)
    if (torch.is_grad_enabled() and x.requires_grad) or _capturing(key[4]):
        return None  # a capture replays the conversion, so it sees later changes: it must record it
    hit = _params.get(key)
    if hit is not None:
        return hit
    if len(_params) >= MAX_PARAMS:
        _params.clear()
    hit = _params[key] = (x.detach().float().contiguous(), x.untyped_storage())
    return hit


def _capturing(dev: int) -> bool:
    return dev >= 0 and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def gate_params(A_log, dt_bias, convert):
    """A_log and dt_bias as ``convert`` (kdacupy/torch/api.py's ``_gate_params``) makes them, the
    float32 copies of bf16 / fp16 ones taken from ``float_param`` where it has them (one conversion
    per parameter version instead of one per call; it also keeps their address, so kdacupy's own
    fast path sees the same call)."""
    if A_log is not None and A_log.dim() == 4 and A_log.shape[:2] == (1, 1) and A_log.shape[3] == 1:
        A_log = A_log.reshape(-1)
    out = []
    for x in (A_log, dt_bias):
        if x is not None and x.dtype in CONVERTED_PARAM_DTYPES:
            hit = float_param(x)
            if hit is not None:
                x = hit[0]
        out.append(x)
    return convert(*out)

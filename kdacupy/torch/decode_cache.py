"""A repeated decode step (``kdacupy.torch.kda_decode`` and the engines' step, kdacupy/compat/pool.py's
``step``, with its length check): the CuPy views
of the core call kept per call signature, so a step reads each tensor's metadata once and calls
``kdacupy.kda_decode`` (docs/design.md section 10.1: kdacupy/torch/eager.py's path, without the
reshapes, the option checks and the gate conversions of ``kdacupy.torch.kda_decode``).

The key holds what makes the kept views the call's own: every tensor's data pointer, shape,
strides, dtype, device and type, the version of a gate parameter that is converted (bf16 / fp16:
its float32 copy is kept with the entry, with the parameter's storage, so the memory under the key
is not reused), the sequence split (N, T) and the options with their types. A call that misses
runs ``kdacupy.torch.kda_decode``'s full path as before (every check and error there) and then stores its
views; one that cannot be kept (a reshape that copies, rows whose last dim is strided, a
parameter without a version counter) is never stored. kdacupy.kda_decode's own per-call checks
(alignment, overlap, the pool) run on every call. The pool's version is bumped as before.
"""
from __future__ import annotations

import operator

import torch

from . import eager
from .tensors import check_equal_lengths

MAX_ENTRIES = 256
MAX_OUT_VIEWS = 64
MAX_CHECKED = 256
_entries: dict = {}
_checked: dict = {}  # cu_seqlens already found equal-length: key -> its storage
_expected: dict = {}  # (n, T, dtype, device) -> [0, T, 2T, ...] on that device
_padded: dict = {}  # (slots' key, stream) -> the buffer padded_slots writes
_PARAMS = ("A_log", "dt_bias")
_getters: dict = {}  # option names -> their values' getter (_option_values)


def clear():
    _entries.clear()
    _checked.clear()
    _expected.clear()
    _padded.clear()


eager.clear_hooks.append(clear)


def _meta(t):
    return None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t))


def _param_meta(t):
    """A gate parameter's key: its metadata and, where it is converted, its version."""
    if t is None:
        return None
    if t.dtype in (torch.bfloat16, torch.float16):
        version = -1 if t.is_inference() else t._version  # an inference tensor has none: its copy is not kept
        return t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t), version
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t)


class _Entry:
    __slots__ = ("dev", "views", "keep", "out_shape", "out_views", "copies", "options", "bound")

    def __init__(self, dev, views, keep, out_shape, options):
        self.dev, self.views, self.keep, self.out_shape, self.options = dev, views, keep, out_shape, options
        self.out_views: dict = {}
        self.copies = bool(keep)
        self.bound = None  # the core call bound to the views' pointers (eager.bind), after the first hit

    def out_view(self, o):
        """The view of a fresh C-contiguous o (v's shape) as [N, T, HV, V]: only its address varies."""
        ptr = o.data_ptr()
        view = self.out_views.get(ptr)
        if view is None:
            if len(self.out_views) >= MAX_OUT_VIEWS:
                self.out_views.clear()
            o4 = o.view(self.out_shape)
            view = self.out_views[ptr] = eager._view((ptr, o4.shape, o4.stride(), o4.dtype, self.dev))
        return view


def repeated(q, k, v, g, beta, pool, idx, num_accepted_tokens, opts):
    """``cached`` for ``kdacupy.torch.kda_decode``'s own call ([N, T, ...] inputs)."""
    try:
        N, T = q.shape[0], q.shape[1]
    except (AttributeError, IndexError):  # the full path says what is wrong with q
        return None, None
    return cached(q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts)


def cached(q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts):
    """(o, None) from the kept views where this call signature was stored (o in v's shape), else
    (None, the key to ``remember`` it by after the full path ran, or None where it cannot be kept)."""
    if torch.compiler.is_compiling():  # traced: the op's path, which torch.compile sees as one call
        return None, None
    params = (opts.get("A_log"), opts.get("dt_bias"))
    tensors = (q, k, v, g, beta, pool, idx, num_accepted_tokens)
    try:
        names = tuple(opts)
        values = _option_values(names)(opts)
        # every tensor's metadata inline (_meta's, one pass: a step's whole budget is microseconds)
        key = (N, T, names, values, tuple(map(type, values)),
               tuple([None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t))
                      for t in tensors]), tuple(map(_param_meta, params)))
        entry = _entries.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option: the full path says what
        return None, None
    if entry is None:
        return None, key
    if eager.eager_ok(tensors + tuple(params)):  # as the full path's eager.decode decides
        stream = eager.current_stream(entry.dev)
        if not (entry.copies and stream.is_capturing()):  # a capture records the conversion (full path)
            o = torch.empty_like(v, memory_format=torch.contiguous_format)  # v's shape (cheaper than empty)
            bound = entry.bound
            if bound:
                if eager.launch_bound(entry.dev, stream, bound, o.data_ptr(), pool):
                    return o, None
                bound = entry.bound = None  # out refused, or kdacupy's cache cleared (retuned): bound again below
            views = entry.views + [entry.out_view(o)]
            eager.launch(entry.dev, stream, views, pool, entry.options)  # checks o, as every first hit
            if bound is None:  # the same launch from raw pointers from now on (kdacupy.prepared_decode)
                entry.bound = eager.bind(entry.dev, views, entry.options) or False  # False: none to bind
            return o, None
    return None, None


def _option_values(names):
    """opts -> the values of the options but the gate parameters (which are keyed by _param_meta),
    in ``names``' order: one getter per caller's set of option names."""
    get = _getters.get(names)
    if get is None:
        kept = [n for n in names if n not in _PARAMS]
        get = _getters[names] = (lambda opts, kept=tuple(kept): tuple(opts[n] for n in kept)) if len(kept) < 2 \
            else operator.itemgetter(*kept)
    return get


def remember(key, q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts):
    """Keep the views of the call the full path just made under ``key`` (from ``cached``), where
    every one is a view of the tensors under the key (or a kept float32 copy of a parameter)."""
    if key is not None:
        _store(key, (q, k, v, g, beta, pool, idx, num_accepted_tokens), [opts.get(n) for n in _PARAMS], N, T, opts,
               v)


def _options(opts):
    """The options as the torch face passes them on (its numbers as floats)."""
    out = {n: (float(x) if n in ("scale", "lower_bound") and x is not None else x)
           for n, x in opts.items() if n not in _PARAMS}
    out.setdefault("backend", None)
    return out


def _store(key, tensors, params, N, T, opts, v):
    dev = tensors[0].get_device()
    if dev < 0 or not eager.eager_ok(tuple(tensors) + tuple(params)):
        return
    rows = []
    for x in tensors[:5]:
        if x is None:
            rows.append(None)
            continue
        try:
            r = x.view((N, T) + tuple(x.shape[2:]))  # a view, or nothing kept (the full path copies)
        except RuntimeError:
            return
        if r.dim() and r.stride(-1) != 1 and r.shape[-1] > 1:
            return  # the torch face copies such rows
        rows.append(r)
    keep, gate = [], []
    A_log, dt_bias = params
    if A_log is not None and A_log.dim() == 4 and A_log.shape[:2] == (1, 1) and A_log.shape[3] == 1:
        A_log = A_log.view(-1)
    for x in (A_log, dt_bias):
        if x is not None and x.dtype in (torch.bfloat16, torch.float16):
            hit = eager.float_param(x)
            if hit is None:
                return
            keep.append(hit)
            x = hit[0]
        if x is not None and not x.is_contiguous():
            return  # the torch face copies it every call
        gate.append(x)
    views = eager._views_of(rows + list(tensors[5:]) + gate, dev)
    if views is None:
        return
    if len(_entries) >= MAX_ENTRIES:
        _entries.clear()
    _entries[key] = _Entry(dev, views, keep, (N, T) + tuple(v.shape[2:]), _options(opts))


def check_lengths(cu_seqlens, T):
    """check_equal_lengths, in fewer torch calls: once per (pointer, shape, strides, dtype, device,
    type, version) of cu_seqlens and T where it has a version counter; else every call (an inference
    tensor has none, so a change in place could not be noticed), host ones read on the host, device
    ones against a kept [0, T, 2T, ...] (three launches, not four; none kept while capturing)."""
    if not cu_seqlens.is_inference():
        key = (cu_seqlens.data_ptr(), cu_seqlens.shape, cu_seqlens.stride(), cu_seqlens.dtype,
               cu_seqlens.device, type(cu_seqlens), cu_seqlens._version, T)
        if key not in _checked:
            check_equal_lengths(cu_seqlens, T)
            if len(_checked) >= MAX_CHECKED:
                _checked.clear()
            _checked[key] = cu_seqlens.untyped_storage()  # held: its memory is not reused under this key
        return
    dev = cu_seqlens.device
    n = cu_seqlens.shape[0]
    if dev.type == "cpu":
        if cu_seqlens.dim() != 1 or cu_seqlens.tolist() != list(range(0, n * T, T)):
            check_equal_lengths(cu_seqlens, T)  # raises, with its message
        return
    if torch.cuda.is_current_stream_capturing():
        check_equal_lengths(cu_seqlens, T)
        return
    key = (n, T, cu_seqlens.dtype, dev)
    expected = _expected.get(key)
    if expected is None:
        with torch.inference_mode(False):
            expected = torch.arange(n, device=dev, dtype=cu_seqlens.dtype) * T
        if len(_expected) >= MAX_CHECKED:
            _expected.clear()
        _expected[key] = expected
    torch._assert_async((cu_seqlens == expected).all(), f"cu_seqlens: expected {T} tokens in every sequence")


def padded_slots(idx, null_block):
    """idx with the slots at or below ``null_block`` as -1 (kdacupy's padding), recomputed every call
    (the engine rewrites its slots on the device) into one buffer per (slots' pointer, shape, strides,
    dtype, device, torch's current stream): the step's views then have one address, so its cached
    call is found. On the CPU and while capturing a CUDA graph, a new tensor each call."""
    dev = idx.get_device()
    if dev < 0 or eager._capturing(dev):  # no buffer kept from inside a capture (it belongs to its pool)
        return idx.masked_fill(idx <= null_block, -1)
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    key = (idx.data_ptr(), idx.shape, idx.stride(), idx.dtype, dev, type(idx),
           None if raw_stream is None else raw_stream(dev))
    buf = _padded.get(key)
    if buf is None:
        if len(_padded) >= MAX_CHECKED:
            _padded.clear()
        buf = _padded[key] = (torch.empty_like(idx, memory_format=torch.contiguous_format),
                              torch.empty_like(idx, dtype=torch.bool, memory_format=torch.contiguous_format),
                              idx.new_full((), -1))
    slots, live, pad = buf
    return torch.where(torch.gt(idx, null_block, out=live), idx, pad, out=slots)

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
from .tensors import CONVERTED_PARAM_DTYPES, check_equal_lengths

MAX_ENTRIES = 256
MAX_OUT_VIEWS = 64
MAX_CHECKED = 256
_entries: dict = {}
_fronts: dict = {}  # an engine call's key (front_key) -> (the key of its step's entry, T)
_checked: dict = {}  # cu_seqlens already found equal-length: key -> its storage
_PARAMS = ("A_log", "dt_bias")
_getters: dict = {}  # option names -> their values' getter (_option_values)


def clear():
    _entries.clear()
    _fronts.clear()
    _checked.clear()


eager.clear_hooks.append(clear)


def _meta(t):
    return None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t))


def _param_meta(t):
    """A gate parameter's key: its metadata and, where it is converted, its version."""
    if t is None:
        return None
    if t.dtype in CONVERTED_PARAM_DTYPES:
        version = -1 if t.is_inference() else t._version  # an inference tensor has none: its copy is not kept
        return t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t), version
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t)


class _Entry:
    __slots__ = ("dev", "views", "cu", "keep", "out_shape", "out_views", "copies", "options", "bound")

    def __init__(self, dev, views, cu, keep, out_shape, options):
        self.dev, self.views, self.keep, self.out_shape, self.options = dev, views, keep, out_shape, options
        self.cu = cu  # the view of cu_seqlens (checked in the kernel), or None
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


def repeated(q, k, v, g, beta, pool, idx, num_accepted_tokens, opts, cu_seqlens=None):
    """``cached`` for ``kdacupy.torch.kda_decode``'s own call ([N, T, ...] inputs)."""
    try:
        N, T = q.shape[0], q.shape[1]
    except (AttributeError, IndexError):  # the full path says what is wrong with q
        return None, None
    return cached(q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts, cu_seqlens)


def cached(q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts, cu_seqlens=None):
    """(o, key) from the kept views where this call signature was stored (o in v's shape), else
    (None, the key to ``remember`` it by after the full path ran, or None where it cannot be kept)."""
    if torch.compiler.is_compiling():  # traced: the op's path, which torch.compile sees as one call
        return None, None
    params = (opts.get("A_log"), opts.get("dt_bias"))
    tensors = (q, k, v, g, beta, pool, idx, num_accepted_tokens, cu_seqlens)
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
    return _hit(entry, tensors + params, v, pool), key


def _hit(entry, tensors, v, pool):
    """o from a stored entry's launch (v's shape), or None where this call must take the full path:
    a mode on or autograd to record, a capture that would record a conversion, out refused."""
    if eager.eager_ok(tensors):  # as the full path's eager.decode decides
        stream = eager.current_stream(entry.dev)
        if not (entry.copies and stream.is_capturing()):  # a capture records the conversion (full path)
            o = torch.empty_like(v, memory_format=torch.contiguous_format)  # v's shape (cheaper than empty)
            bound = entry.bound
            if bound:
                if eager.launch_bound(entry.dev, stream, bound, o.data_ptr(), pool):
                    return o
                bound = entry.bound = None  # out refused, or kdacupy's cache cleared (retuned): bound again below
            views = entry.views + [entry.out_view(o), entry.cu]
            eager.launch(entry.dev, stream, views, pool, entry.options)  # checks o, as every first hit
            if bound is None:  # the same launch from raw pointers from now on (kdacupy.prepared_decode)
                entry.bound = eager.bind(entry.dev, views, entry.options) or False  # False: none to bind
            return o
    return None


def front_key(name, tensors, params, scalars):
    """The key of an engine's call as the engine makes it, before its arguments are mapped to the
    step's (``front``): the entry point's name, every tensor's metadata (``_meta``'s), the gate
    parameters' (``_param_meta``: versions where converted) and the other arguments with their
    types; None where one is not a tensor (the call then maps its arguments; an unhashable
    argument is found by ``front``'s lookup, the only hash of the key on a hit)."""
    try:
        return (name, scalars, tuple(map(type, scalars)),
                tuple([None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device(), type(t))
                       for t in tensors]), tuple(map(_param_meta, params)))
    except (AttributeError, TypeError):
        return None


def front(fkey, tensors, v, pool, cu_seqlens):
    """o (v's shape) where an engine's call under ``fkey`` (``front_key``) was mapped before to a
    stored step (``alias``): the step's launch, without mapping the arguments again. What the key
    cannot settle is redone: the equal-length check of ``cu_seqlens`` (its values), and every
    check of the step's own hit. None: map the arguments (the call's full path)."""
    if fkey is None or torch.compiler.is_compiling():
        return None
    try:
        hit = _fronts.get(fkey)
    except TypeError:  # an unhashable argument: never stored (alias), the call maps its arguments
        return None
    if hit is None:
        return None
    entry = _entries.get(hit[0])
    if entry is None:  # the step's entry is gone (the cache was cleared or filled up)
        return None
    if cu_seqlens is not None and cu_seqlens.get_device() < 0:  # device ones: the kernel checks them
        check_lengths(cu_seqlens, hit[1])
    return _hit(entry, tensors, v, pool)


def alias(fkey, key, T, raw, mapped):
    """Let ``front`` find the step stored under ``key`` from the engine's call under ``fkey``, where
    the mapping is a function of what ``fkey`` holds: every mapped tensor (the step's q, k, v, g,
    beta, pool, slots) is a view of one of the engine's tensors ``raw`` (the same data pointer; a
    tensor the mapping computed, from values, has its own) and the step's entry is stored."""
    if fkey is None or key is None or key not in _entries:
        return
    ptrs = {t.data_ptr() for t in raw if t is not None}
    if all(t is None or t.data_ptr() in ptrs for t in mapped):
        if len(_fronts) >= MAX_ENTRIES:
            _fronts.clear()
        try:
            _fronts[fkey] = (key, T)
        except TypeError:  # an unhashable argument (front finds nothing under such a key)
            pass


def _option_values(names):
    """opts -> the values of the options but the gate parameters (which are keyed by _param_meta),
    in ``names``' order: one getter per caller's set of option names."""
    get = _getters.get(names)
    if get is None:
        kept = [n for n in names if n not in _PARAMS]
        get = _getters[names] = (lambda opts, kept=tuple(kept): tuple(opts[n] for n in kept)) if len(kept) < 2 \
            else operator.itemgetter(*kept)
    return get


def remember(key, q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts, cu_seqlens=None):
    """Keep the views of the call the full path just made under ``key`` (from ``cached``), where
    every one is a view of the tensors under the key (or a kept float32 copy of a parameter)."""
    if key is not None:
        _store(key, (q, k, v, g, beta, pool, idx, num_accepted_tokens), [opts.get(n) for n in _PARAMS], N, T, opts,
               v, cu_seqlens)


def _options(opts):
    """The options as the torch face passes them on (its numbers as floats)."""
    out = {n: (float(x) if n in ("scale", "lower_bound") and x is not None else x)
           for n, x in opts.items() if n not in _PARAMS}
    out.setdefault("backend", None)
    return out


def _store(key, tensors, params, N, T, opts, v, cu_seqlens=None):
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
        if x is not None and x.dtype in CONVERTED_PARAM_DTYPES:
            hit = eager.float_param(x)
            if hit is None:
                return
            keep.append(hit)
            x = hit[0]
        if x is not None and not x.is_contiguous():
            return  # the torch face copies it every call
        gate.append(x)
    views = eager._views_of(rows + list(tensors[5:]) + gate + [cu_seqlens], dev)
    if views is None:
        return
    if len(_entries) >= MAX_ENTRIES:
        _entries.clear()
    _entries[key] = _Entry(dev, views[:10], views[10], keep, (N, T) + tuple(v.shape[2:]), _options(opts))


def check_lengths(cu_seqlens, T):
    """check_equal_lengths of host ``cu_seqlens`` (device ones go to the decode kernel, which checks
    them), in fewer torch calls: once per (pointer, shape, strides, dtype, device, type, version) and
    T where it has a version counter; else every call, read on the host (an inference tensor has
    none, so a change in place could not be noticed)."""
    if not cu_seqlens.is_inference():
        key = (cu_seqlens.data_ptr(), cu_seqlens.shape, cu_seqlens.stride(), cu_seqlens.dtype,
               cu_seqlens.device, type(cu_seqlens), cu_seqlens._version, T)
        if key not in _checked:
            check_equal_lengths(cu_seqlens, T)
            if len(_checked) >= MAX_CHECKED:
                _checked.clear()
            _checked[key] = cu_seqlens.untyped_storage()  # held: its memory is not reused under this key
        return
    n = cu_seqlens.shape[0]
    if cu_seqlens.dim() != 1 or cu_seqlens.tolist() != list(range(0, n * T, T)):
        check_equal_lengths(cu_seqlens, T)  # raises, with its message

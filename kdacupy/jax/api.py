"""``kdacupy.jax.kda`` (``jax.custom_vjp``) and ``kdacupy.jax.kda_decode``.

Each is one ``jax.experimental.buffer_callback`` per direction: XLA hands the
callback its buffers (device buffers and XLA's stream on a GPU, so no host round
trip; host buffers on the CPU), the callback runs ``kdacupy.kda_forward`` /
``kdacupy.kda_backward`` / ``kdacupy.kda_decode`` on them and writes the results
into XLA's output buffers. So the calls work under ``jax.jit``, ``jax.grad`` (the
backward is ``kdacupy.kda_backward``: only the inputs are saved) and ``jax.vmap``
(kdacupy/jax/batching.py). Arguments are checked by kdacupy when the callback runs;
its ValueError / TypeError text reaches the caller inside JAX's runtime error.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import jax
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

import kdacupy

from . import batching, manual
from .buffers import arrays_of

#: the differentiable inputs, then cu_seqlens, in the order of the custom_vjp's arguments
_INPUTS = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias", "cu_seqlens")
#: what may fold into the batch dim under vmap (per-sequence arrays)
_PER_SEQUENCE = ("q", "k", "v", "g", "beta", "initial_state", "do", "dfinal_state")


class Options(NamedTuple):
    """The static options of one call (hashable: they specialise the traced function)."""
    scale: Optional[float]
    output_final_state: bool
    qk_l2norm: bool
    beta_sigmoid: bool
    allow_neg_eigval: bool
    gate: str
    lower_bound: Optional[float]
    state_layout: str
    state_dtype: Optional[str]
    state_precision: str
    sequence_parallel: Optional[int]
    backend: Optional[str]
    ranks: tuple  # each input's rank as given (None when absent): vmap adds leading dims to these
    save_for_backward: bool = False  # under jax.grad: the forward keeps its workspace and chunk states

    def forward_kwargs(self):
        return dict(scale=self.scale, qk_l2norm=self.qk_l2norm, beta_sigmoid=self.beta_sigmoid,
                    allow_neg_eigval=self.allow_neg_eigval, gate=self.gate, lower_bound=self.lower_bound,
                    state_layout=self.state_layout, state_precision=self.state_precision, backend=self.backend)


def _struct(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))


def _final_state_struct(opts, q, v, initial_state, cu_seqlens):
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    if opts.state_dtype is not None:
        dtype = _named_dtype(opts.state_dtype)
    elif initial_state is not None:
        dtype = initial_state.dtype
    else:
        dtype = np.float64 if np.dtype(q.dtype) == np.float64 else np.float32
    return _struct((N, HV, K, V) if opts.state_layout == "kv" else (N, HV, V, K), dtype)


def _named_dtype(name):
    import ml_dtypes
    return ml_dtypes.bfloat16 if name in ("bfloat16", "bf16") else np.dtype(name)


def _callback(body, opts, names, out_names, out_ranks):
    """A buffer_callback body: buffers -> arrays, then ``body`` over the vmap's leading dims."""
    base = {n: r for n, r in zip(_INPUTS + ("do", "dfinal_state", "kept"), opts.ranks + (4, 4, 1)) if r is not None}

    def callback(ctx, outs, *bufs):
        with arrays_of(ctx, tuple(bufs) + tuple(outs)) as array:
            inputs = dict.fromkeys(_INPUTS)
            inputs.update(zip(names, map(array, bufs)))
            outputs = dict(zip(out_names, map(array, outs)))
            # the kept buffer is one call's: a folded call's would not be the per-index slices the backward reads
            fold = (inputs["cu_seqlens"] is None and not ("A_log" in out_names or "dt_bias" in out_names)
                    and "kept" not in out_names + names)
            batching.run(functools.partial(body, opts), inputs, base, outputs, dict(zip(out_names, out_ranks)),
                         _PER_SEQUENCE, fold=fold)
    return callback


def _forward_body(opts, a, out):
    keep = {} if "kept" not in out else dict(save_for_backward=out["kept"] if out["kept"].size else True)
    res = kdacupy.kda_forward(
        a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=a["initial_state"], A_log=a["A_log"],
        dt_bias=a["dt_bias"], cu_seqlens=a["cu_seqlens"], output_final_state=opts.output_final_state,
        state_dtype=None if opts.state_dtype is None else _named_dtype(opts.state_dtype),
        sequence_parallel=None if keep else opts.sequence_parallel, out=out["o"], **opts.forward_kwargs(), **keep)
    if "final_state" in out:
        out["final_state"][...] = res[1]


def _backward_body(opts, a, out):
    kw = opts.forward_kwargs()
    del kw["backend"]
    kept = a.get("kept")  # the forward's, handed back by this very call's residuals: its own by construction
    grads = kdacupy.kda_backward(
        a["do"], a["q"], a["k"], a["v"], a["g"], a["beta"], dfinal_state=a.get("dfinal_state"),
        initial_state=a["initial_state"], cu_seqlens=a["cu_seqlens"], A_log=a["A_log"], dt_bias=a["dt_bias"],
        backend=opts.backend, saved=kdacupy.KDASaved(kept, None) if kept is not None and kept.size else None, **kw)
    for name, grad in zip(_INPUTS[:8], tuple(grads)):
        if name in out:
            if grad is None:
                out[name][...] = 0
            else:
                out[name][...] = grad.reshape(out[name].shape)


def _kept_struct(opts, q, v, cu_seqlens):
    """The kept buffer of one call (its vmap's leading dims are added by JAX): saved_nbytes on the kernels'
    backends, nothing on the NumPy ones (which keep nothing)."""
    kernels = opts.backend in ("cuda", "emulate") or (opts.backend is None and jax.default_backend() == "gpu")
    n = kdacupy.saved_nbytes(q.shape[-4:], v.shape[-4:], None if cu_seqlens is None else cu_seqlens.shape[-1] - 1,
                             opts.state_precision) if kernels else 0
    return _struct((n,), np.uint8)


def _forward(opts, args, keep=False):
    """(o, final_state) and, with ``keep``, the kept buffer (one call per vmap index: never folded, so that
    the backward's per-index slices are each call's own)."""
    q, _, v = args[:3]
    names = tuple(n for n, x in zip(_INPUTS, args) if x is not None)
    present = [x for x in args if x is not None]
    outs, out_names, out_ranks = [_struct(v.shape, v.dtype)], ["o"], [4]
    if opts.output_final_state:
        outs.append(_final_state_struct(opts, q, v, args[5], args[8]))
        out_names.append("final_state")
        out_ranks.append(4)
    if keep:
        outs.append(_kept_struct(opts, q, v, args[8]))
        out_names.append("kept")
        out_ranks.append(1)
    call = buffer_callback(_callback(_forward_body, opts, names, tuple(out_names), tuple(out_ranks)), tuple(outs),
                           vmap_method="expand_dims")
    axes = manual.varying(*present)  # inside shard_map: the results vary as the inputs do
    results = [manual.to_varying(r, axes) for r in call(*present)]
    primal = results[0], (results[1] if opts.output_final_state else None)
    return (primal, results[-1]) if keep else primal


def _backward(opts, do, dfinal_state, args, kept=None):
    extra = (("do", do),) + ((("dfinal_state", dfinal_state),) if opts.output_final_state else ()) + (
        (("kept", kept),) if kept is not None else ())
    names = tuple(n for n, x in zip(_INPUTS, args) if x is not None) + tuple(n for n, _ in extra)
    present = [x for x in args if x is not None] + [x for _, x in extra]
    wrt = [(n, x) for n, x in zip(_INPUTS[:8], args) if x is not None]
    call = buffer_callback(
        _callback(_backward_body, opts, names, tuple(n for n, _ in wrt), tuple(x.ndim for _, x in wrt)),
        tuple(_struct(x.shape, x.dtype) for _, x in wrt), vmap_method="expand_dims")
    axes = manual.varying(*present)  # each gradient typed as its argument, summed over the shards sharing it
    grads = {n: manual.like(manual.to_varying(d, axes), x, axes) for (n, x), d in zip(wrt, call(*present))}
    return tuple(grads.get(n) for n in _INPUTS[:8])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _kda(opts, q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens):
    return _forward(opts, (q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens))


def _kda_fwd(opts, *args):
    if opts.save_for_backward:
        primal, kept = _forward(opts, args, keep=True)
        return primal, (args, kept)
    return _forward(opts, args), (args, None)


def _kda_bwd(opts, residuals, cotangents):
    args, kept = residuals
    do, dfinal_state = cotangents
    return _backward(opts, do, dfinal_state, args, kept) + (None,)


_kda.defvjp(_kda_fwd, _kda_bwd)


def _flag(name, x):
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {x!r}")
    return bool(x)


def _real(name, x):
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) or not math.isfinite(x):
        raise TypeError(f"{name}: expected a finite real number or None, got {x!r}")
    return float(x)


def _rank(name, x, ranks):
    if x is not None and getattr(x, "ndim", None) not in ranks:
        raise ValueError(f"{name}: expected a {' or '.join(map(str, ranks))}-D array, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")


def _gate_params(A_log, dt_bias):
    """A_log in a model's parameter shape [1, 1, HV, 1] as [HV] and bf16 / fp16 parameters as float32,
    by JAX ops (on the device, differentiable: the gradients come back in the parameters' shape and
    dtype); kdacupy checks what is left when the callback runs."""
    if A_log is not None and A_log.ndim == 4:
        A_log = jax.numpy.reshape(A_log, (-1,))
    return tuple(x.astype(np.float32) if x is not None and str(x.dtype) in ("bfloat16", "float16") else x
                 for x in (A_log, dt_bias))


def kda(q, k, v, g, beta=None, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
        lower_bound=None, state_layout="kv", state_dtype=None, state_precision="bf16", sequence_parallel=None,
        backend=None, save_for_backward=False):
    """Kimi Delta Attention forward on JAX arrays: ``(o, final_state)``, as ``kdacupy.kda_forward``.

    Differentiable (``jax.custom_vjp``; the backward is ``kdacupy.kda_backward``) with respect
    to q, k, v, g, beta, initial_state, A_log and dt_bias; works under ``jax.jit``,
    ``jax.grad`` and ``jax.vmap``. On a GPU it runs kdacupy's CUDA kernels on XLA's device
    buffers and stream; on the CPU the NumPy backends (``backend=None``: the float64
    reference, rounded to the inputs' dtype). ``state_dtype``: a dtype or its name, or None.
    ``save_for_backward=True``: under ``jax.grad`` the forward keeps its workspace and chunk states
    as a residual (an XLA buffer of ``kdacupy.saved_nbytes`` bytes) and the backward reads them instead
    of recomputing: the same gradients, more memory (docs/design.md section 9.5; serial forward).
    """
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("initial_state", initial_state)):
        _rank(name, x, (4,))
    _rank("beta", beta, (3,))
    _rank("A_log", A_log, (1, 4))
    _rank("dt_bias", dt_bias, (1, 2))
    A_log, dt_bias = _gate_params(A_log, dt_bias)
    _rank("cu_seqlens", cu_seqlens, (1,))
    if state_dtype is not None:
        state_dtype = "bfloat16" if str(state_dtype) in ("bf16", "bfloat16") else np.dtype(state_dtype).name
    if sequence_parallel is not None and (isinstance(sequence_parallel, bool) or not isinstance(sequence_parallel,
                                                                                                 int)):
        raise TypeError(f"sequence_parallel: expected None or an int, got {sequence_parallel!r}")
    args = (q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens)
    opts = Options(scale=_real("scale", scale), output_final_state=_flag("output_final_state", output_final_state),
                   qk_l2norm=_flag("qk_l2norm", qk_l2norm), beta_sigmoid=_flag("beta_sigmoid", beta_sigmoid),
                   allow_neg_eigval=_flag("allow_neg_eigval", allow_neg_eigval), gate=gate,
                   lower_bound=_real("lower_bound", lower_bound), state_layout=state_layout, state_dtype=state_dtype,
                   state_precision=state_precision, sequence_parallel=sequence_parallel, backend=backend,
                   ranks=tuple(None if x is None else x.ndim for x in args),
                   save_for_backward=_flag("save_for_backward", save_for_backward))
    if opts.save_for_backward and sequence_parallel not in (None, 1):
        raise ValueError(f"sequence_parallel: expected None or 1 with save_for_backward=True (the kept chunk "
                         f"states come from the serial recurrence), got {sequence_parallel}")
    return _kda(opts, *args)


def kda_decode(q, k, v, g, beta=None, *, state_pool, state_indices, num_accepted_tokens=None, scale=None,
               qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
               lower_bound=None, state_layout="vk", backend=None):
    """One decode or speculative-verify step on a state pool, as ``kdacupy.kda_decode``, the
    functional way: returns ``(o, new_state_pool)``. The new pool aliases the old one's
    buffer, so under ``jax.jit(..., donate_argnums=...)`` of the pool XLA updates it in place
    (without donation XLA copies the pool first). No autograd."""
    names = ("q", "k", "v", "g", "beta", "state_pool", "state_indices", "num_accepted_tokens", "A_log", "dt_bias")
    given = [(n, x) for n, x in zip(names, (q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens,
                                            A_log, dt_bias)) if x is not None]
    for name, x in given[:4]:
        _rank(name, x, (4,))
    _rank("state_pool", state_pool, (4,))
    opts = dict(scale=_real("scale", scale), qk_l2norm=_flag("qk_l2norm", qk_l2norm),
                beta_sigmoid=_flag("beta_sigmoid", beta_sigmoid),
                allow_neg_eigval=_flag("allow_neg_eigval", allow_neg_eigval), gate=gate,
                lower_bound=_real("lower_bound", lower_bound), state_layout=state_layout, backend=backend)
    pool_at = [n for n, _ in given].index("state_pool")

    def callback(ctx, outs, *bufs):
        with arrays_of(ctx, tuple(bufs) + tuple(outs)) as array:
            a = dict(zip((n for n, _ in given), map(array, bufs)))
            o, pool = array(outs[0]), array(outs[1])  # pool: the output buffer, holding the input's contents
            kdacupy.kda_decode(a["q"], a["k"], a["v"], a["g"], a.get("beta"), state_pool=pool,
                               state_indices=a["state_indices"], num_accepted_tokens=a.get("num_accepted_tokens"),
                               A_log=a.get("A_log"), dt_bias=a.get("dt_bias"), out=o, **opts)

    call = buffer_callback(callback, (_struct(v.shape, v.dtype), _struct(state_pool.shape, state_pool.dtype)),
                           input_output_aliases={pool_at: 1}, vmap_method="sequential")
    o, pool = call(*(x for _, x in given))
    return o, pool

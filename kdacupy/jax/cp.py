"""``kdacupy.jax.kda_cp``: context parallelism inside ``jax.shard_map`` (docs/design.md
sections 7.3 and 10.3).

Each device of the mesh axis ``axis_name`` holds a contiguous slice of the tokens (the
shard of the token dimension, in axis order). The forward is two buffer callbacks around
``jax.lax.all_gather``: the first computes the device's carried maps (kdacupy.distributed's
``Shard.forward_rows``), XLA gathers them over the axis, the second scans them into the
start states and runs the local forward; the final states' shares are summed by ``psum``.
The backward (``custom_vjp``) is the same with ``backward_rows`` (maps and adjoints) and
``backward``; the shared arguments' gradients (initial_state, A_log, dt_bias) are the
devices' shares summed by ``psum``.

A callback never raises before a collective (a device that stops there leaves the others in
XLA's rendezvous until its 40 s timeout aborts the process): each step's failure travels as
a status row gathered with its data, the next callback raises on every device with the same
message naming the failed device (its index on the axis) and step, and a last side-effect
callback checks the local step's statuses after the last collective (passing the output
through: its result is what the caller gets).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from kdacupy.distributed import steps

from . import manual
from .api import _flag, _gate_params, _named_dtype, _rank, _real
from .buffers import arrays_of

FN = "kdacupy.jax.kda_cp"
_ARGS = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias", "cu_seqlens")


class CPOptions(NamedTuple):
    """The static options of one call (hashable)."""
    axis_name: Any
    ranks: int
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
    backend: Optional[str]

    def call(self, a, backward):
        """LocalCall's keywords for the arrays ``a`` of one callback."""
        options = dict(scale=self.scale, qk_l2norm=self.qk_l2norm, beta_sigmoid=self.beta_sigmoid,
                       allow_neg_eigval=self.allow_neg_eigval, gate=self.gate, lower_bound=self.lower_bound,
                       state_precision=self.state_precision, backend=self.backend)
        options.update({n: a[n] for n in ("A_log", "dt_bias") if a.get(n) is not None})
        kw = dict(cu_seqlens=a.get("cu_seqlens"), initial_state=a.get("initial_state"),
                  state_layout=self.state_layout, options=options)
        if not backward:
            kw.update(output_final_state=self.output_final_state,
                      state_dtype=None if self.state_dtype is None else _named_dtype(self.state_dtype))
        return kw


def _struct(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))


def _status_struct():
    return _struct((steps.STATUS_BYTES,), np.uint8)


def _callback(body, names):
    """A buffer callback over named inputs; ``body(a, outs)`` gets arrays (NumPy, or CuPy on a GPU)."""
    def callback(ctx, outs, *bufs):
        with arrays_of(ctx, tuple(bufs) + tuple(outs)) as array:
            body(dict(zip(names, map(array, bufs))), [array(o) for o in outs])
    return callback


def _shard(opts, a, backward=False, **extra):
    rank = int(a["rank"].item())
    return steps.shard_of(FN, rank, [a["q"].shape[1]] * opts.ranks, a["q"], a["k"], a["v"], a["g"], a.get("beta"),
                          **opts.call(a, backward), **extra)


def _check(what, rows):
    steps.check(FN, what, rows)


def _run(names, outs, body, *inputs, axes):
    results = buffer_callback(_callback(body, names), tuple(outs))(*inputs)
    return [manual.to_varying(r, axes) for r in results]


def _checked(what, statuses, x, axes):
    """``x`` once every device's local step is known to have gone well (after the last
    collective): its buffer passes through a callback (aliased, not copied) that raises on
    every device if any failed. (A side-effect callback would leave its error in JAX's
    runtime token, raised again at every later barrier.)"""
    call = buffer_callback(_callback(lambda a, outs: _check(what, a["statuses"]), ("statuses", "x")),
                           (_struct(x.shape, x.dtype),), input_output_aliases={1: 0})
    return manual.to_varying(call(statuses, x)[0], axes)


def _sizes(args):
    q, v, cu = args[0], args[2], args[8]
    B, _, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu is None else cu.shape[0] - 1
    xdtype = steps.exchange_dtype(q)
    return B, HV, K, V, N, xdtype


def _forward(opts, args):
    names = tuple(n for n, x in zip(_ARGS, args) if x is not None) + ("rank",)
    rank = jax.lax.axis_index(opts.axis_name)
    present = [x for x in args if x is not None] + [rank]
    axes = manual.varying(*present) | {opts.axis_name}
    B, HV, K, V, N, xdtype = _sizes(args)
    gather = functools.partial(jax.lax.all_gather, axis_name=opts.axis_name)

    def maps(a, outs):
        shard, status = steps.capture(lambda: _shard(opts, a), validating=True)
        rows = None
        if shard is not None and shard.carries:
            rows, status = steps.capture(shard.forward_rows)
        outs[0][...] = 0 if rows is None else rows
        outs[1][...] = status

    rows, st = _run(names, (_struct(steps.rows_shape(B, HV, K, V, args[8] is not None, False), xdtype),
                            _status_struct()), maps, *present, axes=axes)
    rows, st = gather(rows), gather(st)

    def forward(a, outs):
        _check("computing its state maps", a["statuses"])

        def step():
            o, share = _shard(opts, a, out=outs[0]).forward(a["rows"])
            if o is not outs[0]:
                outs[0][...] = o
            if share is not None:
                outs[1][...] = share
        outs[-1][...] = steps.capture(step)[1]

    v = args[2]
    outs = [_struct(v.shape, v.dtype)] + ([_struct((N, HV, K, V), xdtype)] if opts.output_final_state else [])
    res = _run(names + ("rows", "statuses"), outs + [_status_struct()], forward, *present, rows, st, axes=axes)
    final = None
    if opts.output_final_state:
        final = jax.lax.psum(res[1], opts.axis_name)  # one share per sequence is not zero: exact
        final = (final if opts.state_layout == "kv" else jnp.swapaxes(final, -1, -2)).astype(
            _final_dtype(opts, args, xdtype))
    return _checked("running its local forward", gather(res[-1]), res[0], axes), final


def _final_dtype(opts, args, xdtype):
    if opts.state_dtype is not None:
        return _named_dtype(opts.state_dtype)
    return args[5].dtype if args[5] is not None else xdtype


def _backward(opts, args, do, dfinal):
    names = tuple(n for n, x in zip(_ARGS, args) if x is not None)
    extra = ("do",) + (("dfinal_state",) if dfinal is not None else ()) + ("rank",)
    rank = jax.lax.axis_index(opts.axis_name)
    present = [x for x in args if x is not None] + [do] + ([dfinal] if dfinal is not None else []) + [rank]
    axes = manual.varying(*present) | {opts.axis_name}
    B, HV, K, V, N, xdtype = _sizes(args)
    gather = functools.partial(jax.lax.all_gather, axis_name=opts.axis_name)

    def local(a):
        shard = _shard(opts, a, backward=True, do=a["do"], dfinal_state=a.get("dfinal_state"))
        return shard, (None if shard.c.ds is None else shard.c.kv(shard.c.ds))

    def maps(a, outs):
        got, status = steps.capture(lambda: local(a), validating=True)
        rows = None
        if got is not None and got[0].carries:
            rows, status = steps.capture(lambda: got[0].backward_rows(got[1]))
        outs[0][...] = 0 if rows is None else rows
        outs[1][...] = status

    rows, st = _run(names + extra, (_struct(steps.rows_shape(B, HV, K, V, args[8] is not None, True), xdtype),
                                    _status_struct()), maps, *present, axes=axes)
    rows, st = gather(rows), gather(st)
    wrt = [(n, x) for n, x in zip(_ARGS[:8], args) if x is not None]
    shapes = {"initial_state": (N, HV, K, V)}

    def backward(a, outs):
        _check("computing its state maps and adjoints", a["statuses"])

        def step():
            shard, dfinal_x = local(a)
            grads, shares = shard.backward(a["rows"], dfinal_x)
            got = dict(zip(_ARGS[:5], grads), initial_state=shares["dinitial_state"], A_log=shares["dA_log"],
                       dt_bias=shares["ddt_bias"])
            for (n, _), out in zip(wrt, outs):
                out[...] = 0 if got[n] is None else got[n].reshape(out.shape)
        outs[-1][...] = steps.capture(step)[1]

    outs = [_struct(shapes.get(n, x.shape), x.dtype if n in _ARGS[:5] else xdtype) for n, x in wrt]
    res = _run(names + extra + ("rows", "statuses"), outs + [_status_struct()], backward, *present, rows, st,
               axes=axes)
    grads = {}
    for (n, x), d in zip(wrt, res):
        d = manual.like(d, x, axes)  # the shared arguments: the devices' shares summed
        if n == "initial_state" and opts.state_layout == "vk":
            d = jnp.swapaxes(d, -1, -2)
        grads[n] = d.astype(x.dtype)
    grads["q"] = _checked("running its local backward", gather(res[-1]), grads["q"], axes)
    return tuple(grads.get(n) for n in _ARGS[:8]) + (None,)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _kda_cp(opts, q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens):
    return _forward(opts, (q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens))


def _kda_cp_fwd(opts, *args):
    return _forward(opts, args), args


def _kda_cp_bwd(opts, args, cotangents):
    do, dfinal = cotangents
    return _backward(opts, args, do, dfinal if opts.output_final_state else None)


_kda_cp.defvjp(_kda_cp_fwd, _kda_cp_bwd)


def _axis_size(axis_name):
    size = getattr(jax.lax, "axis_size", None)
    return int(size(axis_name)) if size is not None else int(jax.lax.psum(1, axis_name))


def kda_cp(q, k, v, g, beta=None, *, axis_name, scale=None, initial_state=None, output_final_state=False,
           cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None,
           dt_bias=None, lower_bound=None, state_layout="kv", state_dtype=None, state_precision="bf16",
           backend=None):
    """Kimi Delta Attention on this device's slice of the tokens, inside ``jax.shard_map`` over
    the mesh axis ``axis_name`` that shards the token dimension: ``(o_local, final_state)``,
    as ``kdacupy.distributed.kda_forward_cp``; differentiable (``jax.custom_vjp``, the backward
    as ``kda_backward_cp``), under ``jit`` and ``grad`` with shard_map's default checks.

    q, k, v, g, beta: this device's ``[B, T / devices, ...]`` shard, or with ``cu_seqlens``
    (the GLOBAL packed offsets, the same on every device, B = 1) its slice of the packed
    stream, so sequences may span devices. initial_state, A_log and dt_bias: the same on every
    device; ``final_state`` comes back the same on every device, and the gradients of those
    three are the whole loss's (the devices' shares summed over the axis). Other keywords are
    ``kdacupy.jax.kda``'s; no ``vmap`` and no ``sequence_parallel``.
    """
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("initial_state", initial_state)):
        _rank(name, x, (4,))
    _rank("beta", beta, (3,))
    _rank("A_log", A_log, (1, 4))
    _rank("dt_bias", dt_bias, (1, 2))
    A_log, dt_bias = _gate_params(A_log, dt_bias)  # as kda: the parameters as a model holds them
    _rank("cu_seqlens", cu_seqlens, (1,))
    if state_dtype is not None:
        state_dtype = "bfloat16" if str(state_dtype) in ("bf16", "bfloat16") else np.dtype(state_dtype).name
    if axis_name not in manual.varying(q):
        raise ValueError(f"q: expected a shard that varies over the mesh axis {axis_name!r} (kda_cp runs inside "
                         f"jax.shard_map, the tokens sharded over that axis, with shard_map's check_vma=True, the "
                         f"default), got one typed as the same on every device")
    opts = CPOptions(axis_name=axis_name, ranks=_axis_size(axis_name), scale=_real("scale", scale),
                     output_final_state=_flag("output_final_state", output_final_state),
                     qk_l2norm=_flag("qk_l2norm", qk_l2norm), beta_sigmoid=_flag("beta_sigmoid", beta_sigmoid),
                     allow_neg_eigval=_flag("allow_neg_eigval", allow_neg_eigval), gate=gate,
                     lower_bound=_real("lower_bound", lower_bound), state_layout=state_layout,
                     state_dtype=state_dtype, state_precision=state_precision, backend=backend)
    return _kda_cp(opts, q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens)

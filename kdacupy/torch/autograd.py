"""Autograd for ``torch.ops.kdacupy.forward`` and ``forward_saving``: ``torch.library.register_autograd``.

``forward`` saves only its inputs (kdacupy's backward is stateless: it recomputes
what it needs, docs/design.md section 9); its backward is the custom op
``torch.ops.kdacupy.backward``, so ``torch.compile`` traces it as one opaque call
too. ``forward_saving`` (``kdacupy.torch.kda(..., save_for_backward=True)``) saves its
kept buffer beside them (the prepare's workspace and the chunk states, section 9.5),
which ``torch.ops.kdacupy.backward_saved`` reads instead of recomputing.
Second derivatives are not provided (the backward ops have no autograd of their
own: differentiating through them raises).
"""
from __future__ import annotations

import torch

from . import ops  # noqa: F401  (defines the ops whose autograd this registers)

#: the forward op's tensor arguments, in its schema's order
_TENSORS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias")
#: its other arguments, in order
_OPTIONS = ("scale", "output_final_state", "qk_l2norm", "beta_sigmoid", "allow_neg_eigval", "gate", "lower_bound",
            "state_layout", "state_dtype", "state_precision", "sequence_parallel", "backend")
#: the options that change the result, which the backward takes
_BACKWARD_OPTIONS = ("scale", "qk_l2norm", "beta_sigmoid", "allow_neg_eigval", "gate", "lower_bound",
                     "state_layout", "state_precision", "backend")


def _setup_context(ctx, inputs, output):
    tensors, options = inputs[:len(_TENSORS)], inputs[len(_TENSORS):]
    ctx.save_for_backward(*tensors)
    ctx.options = dict(zip(_OPTIONS, options))


def _backward(ctx, do, dfinal_state):
    q, k, v, g, beta, h0, cu, A_log, dt_bias = ctx.saved_tensors
    opts = ctx.options
    dfinal = dfinal_state if opts["output_final_state"] else None
    grads = torch.ops.kdacupy.backward(
        do.contiguous(), None if dfinal is None else dfinal.contiguous(), q, k, v, g, beta, h0, cu, A_log,
        dt_bias, *(opts[n] for n in _BACKWARD_OPTIONS))
    dq, dk, dv, dg, dbeta, dh0, dA, ddt = (None if x is None else d
                                          for x, d in zip((q, k, v, g, beta, h0, A_log, dt_bias), grads))
    return (dq, dk, dv, dg, dbeta, dh0, None, dA, ddt) + (None,) * len(_OPTIONS)


torch.library.register_autograd("kdacupy::forward", _backward, setup_context=_setup_context)

#: forward_saving's other arguments, in order (forward's without sequence_parallel: the kept states are the serial
#: recurrence's)
_SAVING_OPTIONS = tuple(n for n in _OPTIONS if n != "sequence_parallel")


def _setup_saving(ctx, inputs, output):
    tensors, options = inputs[:len(_TENSORS)], inputs[len(_TENSORS):]
    ctx.save_for_backward(*tensors, output[2])
    ctx.options = dict(zip(_SAVING_OPTIONS, options))


def _backward_saving(ctx, do, dfinal_state, _kept_grad):
    *tensors, kept = ctx.saved_tensors
    q, k, v, g, beta, h0, cu, A_log, dt_bias = tensors
    opts = ctx.options
    dfinal = dfinal_state if opts["output_final_state"] else None
    grads = torch.ops.kdacupy.backward_saved(
        do.contiguous(), None if dfinal is None else dfinal.contiguous(), kept, q, k, v, g, beta, h0, cu, A_log,
        dt_bias, *(opts[n] for n in _BACKWARD_OPTIONS))
    dq, dk, dv, dg, dbeta, dh0, dA, ddt = (None if x is None else d
                                          for x, d in zip((q, k, v, g, beta, h0, A_log, dt_bias), grads))
    return (dq, dk, dv, dg, dbeta, dh0, None, dA, ddt) + (None,) * len(_SAVING_OPTIONS)


torch.library.register_autograd("kdacupy::forward_saving", _backward_saving, setup_context=_setup_saving)

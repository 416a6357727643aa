"""The ``torch.library`` custom ops: ``torch.ops.kdacupy.forward``, ``forward_saving``, ``forward_pool``,
``backward``, ``backward_saved`` and ``decode``, each with a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces through them without running them.

Each op converts its tensors with ``bridge.to_array`` (no copy), calls the public
kdacupy function (``kdacupy.kda_forward``, ``kdacupy.kda_backward``,
``kdacupy.kda_decode``) on torch's current stream, and hands the results back as
tensors without a copy. Outputs that kdacupy can write through ``out=`` are
allocated by torch's allocator first. Absent optional results (a final state not
asked for, the gradient of an argument not given) are empty tensors: a custom op
returns tensors only; the user-facing functions (kdacupy/torch/api.py) turn them
back into None.

Arguments are checked by kdacupy itself when an op runs (its ValueError /
TypeError reaches the caller unchanged); the fake implementations only compute
result shapes and dtypes.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

import kdacupy

from .bridge import empty_like_rows, numpy_dtype, on_torch_stream, to_array, to_tensor


def _final_state_dtype(q, initial_state, state_dtype):
    """kda_forward's rule: state_dtype, else the initial state's dtype, else float32 (float64 for float64 q)."""
    if state_dtype is not None:
        return state_dtype
    if initial_state is not None:
        return initial_state.dtype
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _nothing(x):
    """The placeholder for an absent result: an empty tensor on x's device."""
    return x.new_empty((0,))


def _forward_outputs_fake(q, v, initial_state, cu_seqlens, output_final_state, state_layout, state_dtype):
    """(o, final state) as a forward op returns them: shapes, dtypes, C order (the fake tensors of
    kdacupy::forward and kdacupy::forward_cp)."""
    o = v.new_empty(v.shape)
    if not output_final_state:
        return o, _nothing(v)
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    shape = (N, HV, K, V) if state_layout == "kv" else (N, HV, V, K)
    return o, q.new_empty(shape, dtype=_final_state_dtype(q, initial_state, state_dtype))


@torch.library.custom_op("kdacupy::forward", mutates_args=(), device_types=("cpu", "cuda"))
def forward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Optional[Tensor], initial_state: Optional[Tensor],
            cu_seqlens: Optional[Tensor], A_log: Optional[Tensor], dt_bias: Optional[Tensor], scale: Optional[float],
            output_final_state: bool, qk_l2norm: bool, beta_sigmoid: bool, allow_neg_eigval: bool, gate: str,
            lower_bound: Optional[float], state_layout: str, state_dtype: Optional[torch.dtype],
            state_precision: str, sequence_parallel: Optional[int],
            backend: Optional[str]) -> tuple[Tensor, Tensor]:
    """``kdacupy.kda_forward``: returns (o, final_state or an empty tensor)."""
    with on_torch_stream(q.device):
        o = empty_like_rows(v)
        _, final = kdacupy.kda_forward(
            to_array(q), to_array(k), to_array(v), to_array(g), to_array(beta), scale=scale,
            initial_state=to_array(initial_state), output_final_state=output_final_state,
            cu_seqlens=to_array(cu_seqlens), qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
            allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=to_array(A_log), dt_bias=to_array(dt_bias),
            lower_bound=lower_bound, state_layout=state_layout, state_dtype=numpy_dtype(state_dtype),
            state_precision=state_precision, sequence_parallel=sequence_parallel, out=to_array(o),
            backend=backend)
        return o, (to_tensor(final).contiguous() if final is not None else _nothing(v))  # as the fake: C order


@forward.register_fake
def _forward_fake(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, output_final_state, qk_l2norm,
                  beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_dtype, state_precision,
                  sequence_parallel, backend):
    return _forward_outputs_fake(q, v, initial_state, cu_seqlens, output_final_state, state_layout, state_dtype)


def _runs_kernels(q, backend) -> bool:
    """Whether a call runs the kernels (which keep a buffer for the backward) or a NumPy backend (which keeps
    nothing): kdacupy's rule, CUDA tensors -> "cuda", CPU ones -> "reference", unless named."""
    return backend in ("cuda", "emulate") or (backend is None and q.device.type == "cuda")


def _kept_tensor(q, v, cu_seqlens, state_precision, backend):
    """The buffer ``kdacupy::forward_saving`` keeps for the backward, from torch's allocator (uint8, 1-D;
    empty where a NumPy backend keeps nothing): its fake and its real implementation alike."""
    if not _runs_kernels(q, backend):
        return q.new_empty((0,), dtype=torch.uint8)
    n_seqs = None if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return q.new_empty((kdacupy.saved_nbytes(q.shape, v.shape, n_seqs, state_precision),), dtype=torch.uint8)


@torch.library.custom_op("kdacupy::forward_saving", mutates_args=(), device_types=("cpu", "cuda"))
def forward_saving(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Optional[Tensor], initial_state: Optional[Tensor],
                   cu_seqlens: Optional[Tensor], A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                   scale: Optional[float], output_final_state: bool, qk_l2norm: bool, beta_sigmoid: bool,
                   allow_neg_eigval: bool, gate: str, lower_bound: Optional[float], state_layout: str,
                   state_dtype: Optional[torch.dtype], state_precision: str,
                   backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor]:
    """``kdacupy.kda_forward(save_for_backward=...)``: returns (o, final_state or an empty tensor, the kept
    buffer: the prepare's workspace and the chunk states, which ``kdacupy::backward_saved`` reads)."""
    with on_torch_stream(q.device):
        o = empty_like_rows(v)
        kept = _kept_tensor(q, v, cu_seqlens, state_precision, backend)
        _, final, _ = kdacupy.kda_forward(
            to_array(q), to_array(k), to_array(v), to_array(g), to_array(beta), scale=scale,
            initial_state=to_array(initial_state), output_final_state=output_final_state,
            cu_seqlens=to_array(cu_seqlens), qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
            allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=to_array(A_log), dt_bias=to_array(dt_bias),
            lower_bound=lower_bound, state_layout=state_layout, state_dtype=numpy_dtype(state_dtype),
            state_precision=state_precision, out=to_array(o), backend=backend,
            save_for_backward=to_array(kept) if kept.numel() else True)
        return o, (to_tensor(final).contiguous() if final is not None else _nothing(v)), kept


@forward_saving.register_fake
def _forward_saving_fake(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, output_final_state,
                         qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_dtype,
                         state_precision, backend):
    o, final = _forward_outputs_fake(q, v, initial_state, cu_seqlens, output_final_state, state_layout, state_dtype)
    return o, final, _kept_tensor(q, v, cu_seqlens, state_precision, backend)


@torch.library.custom_op("kdacupy::forward_pool", mutates_args=("state_pool",), device_types=("cpu", "cuda"))
def forward_pool(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Optional[Tensor], state_pool: Tensor,
                 state_indices: Tensor, cu_seqlens: Optional[Tensor], A_log: Optional[Tensor],
                 dt_bias: Optional[Tensor], scale: Optional[float], qk_l2norm: bool, beta_sigmoid: bool,
                 allow_neg_eigval: bool, gate: str, lower_bound: Optional[float], state_layout: str,
                 state_precision: str, backend: Optional[str]) -> Tensor:
    """Chunked prefill through a state pool (docs/design.md section 7.1): each sequence
    starts from ``state_pool[idx[n]]`` and its final state is written back in place."""
    with on_torch_stream(q.device):
        o = empty_like_rows(v)
        kdacupy.kda_forward(
            to_array(q), to_array(k), to_array(v), to_array(g), to_array(beta), scale=scale,
            cu_seqlens=to_array(cu_seqlens), qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
            allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=to_array(A_log), dt_bias=to_array(dt_bias),
            lower_bound=lower_bound, state_layout=state_layout, state_precision=state_precision,
            state_pool=to_array(state_pool), state_indices=to_array(state_indices), out=to_array(o),
            backend=backend)
        return o


@forward_pool.register_fake
def _forward_pool_fake(q, k, v, g, beta, state_pool, state_indices, cu_seqlens, A_log, dt_bias, scale, qk_l2norm,
                       beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_precision, backend):
    return v.new_empty(v.shape)


@torch.library.custom_op("kdacupy::backward", mutates_args=(), device_types=("cpu", "cuda"))
def backward(do: Tensor, dfinal_state: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, g: Tensor,
             beta: Optional[Tensor], initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
             A_log: Optional[Tensor], dt_bias: Optional[Tensor], scale: Optional[float], qk_l2norm: bool,
             beta_sigmoid: bool, allow_neg_eigval: bool, gate: str, lower_bound: Optional[float],
             state_layout: str, state_precision: str,
             backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``kdacupy.kda_backward``: (dq, dk, dv, dg, dbeta, dinitial_state, dA_log, ddt_bias), each in its
    argument's dtype and shape; an empty tensor for an argument not given."""
    return _backward(do, dfinal_state, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, qk_l2norm,
                     beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_precision, backend, None)


@torch.library.custom_op("kdacupy::backward_saved", mutates_args=(), device_types=("cpu", "cuda"))
def backward_saved(do: Tensor, dfinal_state: Optional[Tensor], kept: Tensor, q: Tensor, k: Tensor, v: Tensor,
                   g: Tensor, beta: Optional[Tensor], initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
                   A_log: Optional[Tensor], dt_bias: Optional[Tensor], scale: Optional[float], qk_l2norm: bool,
                   beta_sigmoid: bool, allow_neg_eigval: bool, gate: str, lower_bound: Optional[float],
                   state_layout: str, state_precision: str,
                   backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``kdacupy.kda_backward(saved=...)`` reading ``kdacupy::forward_saving``'s kept buffer (the autograd
    context hands over the forward's own tensors with it: the call is the forward's by construction)."""
    saved = kdacupy.KDASaved(to_array(kept), None) if kept.numel() else None
    return _backward(do, dfinal_state, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, qk_l2norm,
                     beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_precision, backend, saved)


def _backward(do, dfinal_state, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, qk_l2norm,
              beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_precision, backend, saved):
    inputs = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    with on_torch_stream(q.device):
        grads = kdacupy.kda_backward(
            to_array(do), to_array(q), to_array(k), to_array(v), to_array(g), to_array(beta),
            dfinal_state=to_array(dfinal_state), scale=scale, initial_state=to_array(initial_state),
            cu_seqlens=to_array(cu_seqlens), qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
            allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=to_array(A_log), dt_bias=to_array(dt_bias),
            lower_bound=lower_bound, state_layout=state_layout, state_precision=state_precision, backend=backend,
            saved=saved)
        out = []
        for x, dx in zip(inputs, tuple(grads)):
            if x is None:
                out.append(_nothing(q))
            elif dx is None:  # an argument the result does not depend on
                out.append(torch.zeros_like(x))
            else:  # gradients come back in the argument's dtype and shape, as autograd requires
                out.append(to_tensor(dx).reshape(x.shape).to(x.dtype).contiguous())
        return tuple(out)


@backward.register_fake
def _backward_fake(do, dfinal_state, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, qk_l2norm,
                   beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_precision, backend):
    return tuple(_nothing(q) if x is None else x.new_empty(x.shape)
                 for x in (q, k, v, g, beta, initial_state, A_log, dt_bias))


@backward_saved.register_fake
def _backward_saved_fake(do, dfinal_state, kept, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale,
                         qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_precision,
                         backend):
    return _backward_fake(do, dfinal_state, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale,
                          qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_precision,
                          backend)


@torch.library.custom_op("kdacupy::decode", mutates_args=("state_pool", "out"), device_types=("cpu", "cuda"))
def decode(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Optional[Tensor], state_pool: Tensor,
           state_indices: Tensor, num_accepted_tokens: Optional[Tensor], A_log: Optional[Tensor],
           dt_bias: Optional[Tensor], out: Tensor, scale: Optional[float], qk_l2norm: bool, beta_sigmoid: bool,
           allow_neg_eigval: bool, gate: str, lower_bound: Optional[float], state_layout: str,
           backend: Optional[str], null_slot: int, cu_seqlens: Optional[Tensor]) -> None:
    """``kdacupy.kda_decode``: o written into ``out``, the pool updated in place (both declared mutated)."""
    with on_torch_stream(q.device):
        kdacupy.kda_decode(
            to_array(q), to_array(k), to_array(v), to_array(g), to_array(beta), state_pool=to_array(state_pool),
            state_indices=to_array(state_indices), num_accepted_tokens=to_array(num_accepted_tokens), scale=scale,
            qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval, gate=gate,
            A_log=to_array(A_log), dt_bias=to_array(dt_bias), lower_bound=lower_bound, state_layout=state_layout,
            out=to_array(out), backend=backend, null_slot=null_slot, cu_seqlens=to_array(cu_seqlens))


@decode.register_fake
def _decode_fake(q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens, A_log, dt_bias, out, scale,
                 qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, backend, null_slot,
                 cu_seqlens):
    return None

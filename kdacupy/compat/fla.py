"""fla-core 0.6.0's KDA entry points on kdacupy: ``chunk_kda``, ``fused_recurrent_kda``,
``fused_recurrent_kda_fwd`` and ``fused_kda_gate``, with FLA's signatures, defaults and
return values, for code that imports fla-core (FLA's own layers, the Kimi Linear modeling
code): ``from kdacupy.compat.fla import chunk_kda`` replaces FLA's import; ``patch()``
swaps them into an imported ``fla.ops.kda`` and ``unpatch()`` restores FLA's own. (vLLM
and SGLang vendor their own FLA copies, with other signatures and layouts:
kdacupy.compat.vllm and kdacupy.compat.sglang.)

They run on kdacupy.torch (autograd, ``torch.compile``, torch's stream; CPU tensors on
the NumPy backends). FLA's keywords map to kdacupy's (docs/guide/forward.md, "Keyword mapping");
``return_intermediate_states=True`` (inference mode) returns FLA's h, the state entering each
chunk, from kda_forward's checkpoints; ``cp_context`` (FLA's context parallelism) runs
kdacupy.torch.kda_cp (kdacupy/compat/fla_cp.py). What kdacupy cannot honour raises an error that names
the argument: a per-channel beta ``[B, T, HV, V]``, head dims outside [16, 256] (FLA's own grid's 60
and 100 run, forward and backward),
``use_gate_in_kernel=True`` with neither ``A_log`` nor ``lower_bound`` in
``fused_recurrent_kda`` and ``fused_kda_gate`` (fla-core then multiplies the softplus by
e, an undocumented constant; ``chunk_kda`` refuses the same call), unknown keywords
(fla-core ignores them silently; a misspelt option should not be), and
``ssm_state_indices`` uses that fla-core only defines for one token per sequence (below).
One departure on purpose: ``A_log``, ``dt_bias`` or ``lower_bound`` without
``use_gate_in_kernel=True`` raise, naming the flag (fla-core drops them silently, and a
call that passes them meant the gate: read as a log decay, a raw gate is wrong by orders
of magnitude).
``disable_recompute=True`` keeps the forward's workspace and chunk states for the backward
(``kdacupy.torch.kda(save_for_backward=True)``: the same results, a faster backward, more memory).
Performance knobs that do not change results are accepted and have no effect:
``cu_seqlens_cpu``, ``use_graph`` / ``max_num_seqs`` (kdacupy's forward is
graph-capturable with device ``cu_seqlens`` as it is), ``chunk_size`` (32 or 64, as
FLA checks) and ``safe_gate`` beyond its checks. ``A_log`` and ``dt_bias`` may be
bf16 or fp16 (converted to float32 on their device by kdacupy.torch).

Final states come back in float32, as FLA's do (float64 for float64 inputs, which run
on kdacupy's float64 reference). Negative ``ssm_state_indices`` are padding (the
sequence's output is zeros, the pool untouched); fla-core 0.6.0 does not define them.
"""
from __future__ import annotations

import functools
import sys
import warnings

from kdacupy.torch import kda as _kda
from kdacupy.torch.decode_cache import front, front_key
from kdacupy.torch.tensors import fp32_state_dtype, is_tensor, slots

from .gate import FLOAT32, activate, kernel_gate
from .pool import caller_names, check_out, index_tensor, into, rows, sequences, step, tensors, token_slots

__all__ = ["chunk_kda", "fused_kda_gate", "fused_recurrent_kda", "fused_recurrent_kda_fwd", "patch", "unpatch"]


def _state_v_first(fn, state_v_first, kwargs):
    """FLA's deprecated alias ``transpose_state_layout`` (a warning, as FLA gives)."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                      DeprecationWarning, stacklevel=3)
        state_v_first = kwargs.pop("transpose_state_layout")
    return state_v_first


def _refuse_unknown(fn, kwargs):
    if kwargs:
        name = next(iter(kwargs))
        raise TypeError(f"{fn}() got an unexpected keyword argument {name!r} (fla-core 0.6.0 ignores keywords it "
                        f"does not know; kdacupy.compat.fla refuses them, so a misspelt option is not dropped)")


def _gate(fn, use_gate_in_kernel, A_log, dt_bias, lower_bound, safe_gate=False):
    """FLA's gate switches as kdacupy's gate options. Without ``use_gate_in_kernel`` fla-core
    ignores A_log, dt_bias and lower_bound (g is then the log decay); a call that passes them
    meant the gate, so kdacupy refuses it, naming the flag (docs/guide/frameworks.md, "FLA"). (chunk_kda's
    ``safe_gate=True`` with a log decay g takes ``lower_bound`` as g's declared bound: FLA's own
    tests pass it so.)"""
    if not use_gate_in_kernel:
        for name, x in (("A_log", A_log), ("dt_bias", dt_bias), ("lower_bound", None if safe_gate else lower_bound)):
            if x is not None:
                raise ValueError(f"{name}: {fn}() applies A_log, dt_bias and lower_bound only with "
                                 f"use_gate_in_kernel=True (g the raw gate); with use_gate_in_kernel=False g is the "
                                 f"log decay and fla-core drops them silently: pass use_gate_in_kernel=True or "
                                 f"leave {name} out")
        return dict(gate="log")
    if A_log is None and lower_bound is None:
        raise ValueError(f"A_log: {fn}() needs `A_log` when `use_gate_in_kernel=True` and `lower_bound` is not set")
    return kernel_gate(A_log, dt_bias, lower_bound)  # FLA takes A_log in any shape with HV elements


def _check_beta(beta, v):
    if beta is not None and beta.dim() == v.dim():
        raise NotImplementedError(f"beta: kdacupy takes one beta per token and value head [B, T, HV], got a "
                                  f"per-channel beta of shape {tuple(beta.shape)}")


def _options(fn, *, scale, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
             use_gate_in_kernel, A_log, dt_bias, lower_bound):
    """FLA's keywords as kdacupy.torch's (docs/guide/forward.md, "Keyword mapping")."""
    return dict(scale=scale, qk_l2norm=use_qk_l2norm_in_kernel, beta_sigmoid=use_beta_sigmoid_in_kernel,
                allow_neg_eigval=allow_neg_eigval, state_layout="vk" if state_v_first else "kv",
                **_gate(fn, use_gate_in_kernel, A_log, dt_bias, lower_bound))


def _forward(fn, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, save_for_backward=False, **fla):
    """What chunk_kda and fused_recurrent_kda do after their own checks: refuse allow_neg_eigval
    without sigmoid beta and a per-channel beta, as FLA does, then run with a float32 final state
    (``save_for_backward``: chunk_kda's disable_recompute, kdacupy.torch.kda's kept states)."""
    if fla["allow_neg_eigval"] and not fla["use_beta_sigmoid_in_kernel"]:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    _check_beta(beta, v)
    return _kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                cu_seqlens=cu_seqlens, state_dtype=fp32_state_dtype(q) if output_final_state else None,
                save_for_backward=save_for_backward, **_options(fn, **fla))


def _check_varlen(q, initial_state, cu_seqlens):
    """FLA's own checks of packed inputs, with its messages."""
    if cu_seqlens is None:
        return
    if q.shape[0] != 1:
        raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
                         f"Please flatten variable-length inputs before processing.")
    if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
        raise ValueError(f"The number of initial states is expected to be equal to the number of input sequences, "
                         f"i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}.")


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    """fla-core 0.6.0's ``fla.ops.kda.chunk_kda`` on kdacupy: returns ``(o, final_state)``
    (final_state float32, None unless ``output_final_state``); ``A_log``, ``dt_bias`` and
    ``chunk_size`` come through ``**kwargs`` as in FLA. Differentiable."""
    state_v_first = _state_v_first("chunk_kda", state_v_first, kwargs)
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (32, 64):
        raise ValueError(f"`chunk_size` must be either 32 or 64 for KDA, got {chunk_size}.")
    _refuse_unknown("chunk_kda", kwargs)
    if cp_context is not None:  # FLA's context parallelism (fla/ops/cp) on kdacupy.torch.kda_cp
        from .fla_cp import cp_call
        cu_seqlens, forward_cp = cp_call(cp_context, q, initial_state, output_final_state,
                                         return_intermediate_states, use_graph, options=_options,
                                         check_beta=_check_beta)
    _check_varlen(q, initial_state, cu_seqlens)
    if use_graph and cu_seqlens is not None and max_num_seqs is not None and cu_seqlens.shape[0] - 1 != max_num_seqs:
        raise ValueError(f"cu_seqlens must be padded with zero-length tail sequences to exactly max_num_seqs + 1 "
                         f"entries, got {cu_seqlens.shape[0] - 1} sequences with max_num_seqs={max_num_seqs}")
    if use_gate_in_kernel and A_log is None and lower_bound is None:
        raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not set.")
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError("`lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`.")
        if not (-5 <= lower_bound < 0):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    if not isinstance(disable_recompute, bool):
        raise TypeError(f"disable_recompute: expected a bool, got {disable_recompute!r}")
    forward = functools.partial(_forward_with_chunk_states, chunk_size=chunk_size) if return_intermediate_states \
        else functools.partial(_forward, save_for_backward=disable_recompute)
    if cp_context is not None:
        forward = forward_cp
    return forward("chunk_kda", q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, scale=scale,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                   state_v_first=state_v_first, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
                   # safe_gate with a log decay g: lower_bound is g's declared bound (FLA's tests pass it so)
                   dt_bias=dt_bias, lower_bound=None if safe_gate and not use_gate_in_kernel else lower_bound)


def _forward_with_chunk_states(fn, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, chunk_size,
                               **fla):
    """``chunk_kda(..., return_intermediate_states=True)``: ``(o, final_state, h)``, h [B, NT, HV, K, V]
    (``state_v_first``: [.., V, K]) in q's dtype, the state entering every ``chunk_size``-token chunk
    (varlen: B = 1, each sequence's chunks after those before it), as FLA returns it: kda_forward's
    checkpoints, each sequence's first chunk its initial state. Inference only, as in FLA."""
    from kdacupy.torch.states import forward_with_chunk_states, inference_mode
    if not inference_mode():  # fla-core's AssertionError, kept under python -O: the gradient would be lost
        raise AssertionError("return_intermediate_states is only allowed in inference mode")
    if fla["allow_neg_eigval"] and not fla["use_beta_sigmoid_in_kernel"]:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    _check_beta(beta, v)
    state_dtype = fp32_state_dtype(q) if output_final_state else None
    init = None if initial_state is None else initial_state.contiguous()
    return forward_with_chunk_states(q, k, v, g, beta, chunk=chunk_size, cu_seqlens=cu_seqlens,
                                     opts=_options(fn, **fla), initial=init, initial_state=init,
                                     output_final_state=output_final_state, state_dtype=state_dtype)


def fused_kda_gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=FLOAT32):
    """fla-core 0.6.0's ``fla.ops.kda.gate.fused_kda_gate`` on the kernels' gate arithmetic
    (kdacupy/compat/gate.py): g [..., HV, K] -> the log decay in ``output_dtype``;
    ``-exp(A_log) * softplus(g + dt_bias)``, or ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``
    (without A_log, ``lower_bound * sigmoid(g + dt_bias)``). Differentiable (g, A_log, dt_bias).
    A softplus gate without A_log is refused, as in ``fused_recurrent_kda`` (fla-core's kernel then
    multiplies by e)."""
    if A_log is None and lower_bound is None:
        raise ValueError("A_log: fused_kda_gate() needs `A_log` when `lower_bound` is not set (fla-core then "
                         "multiplies the softplus by e, an undocumented constant)")
    return activate(g, A_log, dt_bias, lower_bound).to(output_dtype)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, **kwargs):
    """fla-core 0.6.0's ``fla.ops.kda.fused_recurrent_kda`` on kdacupy: ``(o, final_state)``,
    final_state float32 (None unless ``output_final_state``). Differentiable (FLA's is not)."""
    state_v_first = _state_v_first("fused_recurrent_kda", state_v_first, kwargs)
    _refuse_unknown("fused_recurrent_kda", kwargs)
    _check_varlen(q, initial_state, cu_seqlens)
    return _forward("fused_recurrent_kda", q, k, v, g, beta, initial_state, output_final_state, cu_seqlens,
                    scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                    use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                    state_v_first=state_v_first, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
                    dt_bias=dt_bias, lower_bound=lower_bound)


def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                            output_final_state=False, inplace_final_state=True, state_v_first=False,
                            cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, out=None,
                            **kwargs):
    """fla-core 0.6.0's ``fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd`` (the serving
    entry vLLM calls) on kdacupy: returns ``(o, final_state)`` (o written into ``out`` when given).

    ``inplace_final_state=True`` (the default): ``initial_state`` is the state pool and is
    updated in place (final_state is that same tensor). Without ``ssm_state_indices``
    sequence n reads and writes ``initial_state[n]`` (any lengths, ``cu_seqlens`` too:
    kdacupy's pooled forward). With ``ssm_state_indices`` (continuous batching, one
    ``kdacupy.kda_decode`` launch): ``[N]`` slots for one token per sequence, or
    ``[N, C]`` slots (C >= T, the first T used) for T tokens per sequence: it starts from
    ``idx[n, num_accepted_tokens[n] - 1]`` (default ``idx[n, 0]``) and the state after
    token t goes to ``idx[n, t]``. Inputs are ``[N, T, ...]``, or packed ``[1, N*T, ...]``
    with ``cu_seqlens`` of equal lengths T.
    ``inplace_final_state=False``: a plain forward from ``initial_state`` (if given);
    final_state is a new float32 tensor when ``output_final_state``, else None.
    """
    _refuse_unknown("fused_recurrent_kda_fwd", kwargs)
    tensors(dict(q=q, k=k, v=v, g=g), dict(beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
                                           num_accepted_tokens=num_accepted_tokens, A_log=A_log, dt_bias=dt_bias))
    if ssm_state_indices is not None:
        ssm_state_indices = index_tensor("ssm_state_indices", ssm_state_indices)
    if out is not None and (not is_tensor(out) or out.shape != v.shape):
        rows(q, k, v, g, beta if beta is None or beta.dim() != v.dim() else None)
    check_out(out, v, q=q, k=k, v=v, initial_state=initial_state)  # before the pool is touched
    fkey = None
    if inplace_final_state and ssm_state_indices is not None:  # a pool step
        raw = (q, k, v, g, beta, initial_state, ssm_state_indices, num_accepted_tokens)
        fkey = front_key("fused_recurrent_kda_fwd", raw + (cu_seqlens,), (A_log, dt_bias), (
            scale, output_final_state, state_v_first, use_qk_l2norm_in_kernel, use_gate_in_kernel,
            use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound))
        o = front(fkey, raw + (A_log, dt_bias), v, initial_state, cu_seqlens)
        if o is not None:  # this call, as the engine makes it, seen before: its step's launch
            return into(out, o), initial_state
    _check_beta(beta, v)
    rows(q, k, v, g, beta)
    opts = _options("fused_recurrent_kda_fwd", scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                    use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                    # FLA applies allow_neg_eigval only to sigmoid-activated beta (its kernel ignores it otherwise)
                    allow_neg_eigval=allow_neg_eigval and use_beta_sigmoid_in_kernel, state_v_first=state_v_first,
                    use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)
    if not inplace_final_state:
        if ssm_state_indices is not None:
            raise NotImplementedError("ssm_state_indices with inplace_final_state=False: fla-core then writes "
                                      "token t's state to final_state[bos + t], defined for one token per "
                                      "sequence only; kdacupy takes ssm_state_indices with "
                                      "inplace_final_state=True (the pool updated in place)")
        o, final = _kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                        cu_seqlens=cu_seqlens, state_dtype=fp32_state_dtype(q) if output_final_state else None,
                        **opts)
        return into(out, o), final
    if initial_state is None:
        raise ValueError("initial_state: expected the state pool (updated in place) with inplace_final_state=True, "
                         "got None")
    if ssm_state_indices is None:
        N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
        with caller_names(state_pool="initial_state"):
            o, _ = _kda(q, k, v, g, beta, cu_seqlens=cu_seqlens, state_pool=initial_state,
                        state_indices=slots(N, initial_state), **opts)
        return into(out, o), initial_state
    N, T, cu = sequences(q, cu_seqlens)
    idx = token_slots(ssm_state_indices, T, num_accepted_tokens)
    with caller_names(state_pool="initial_state", state_indices="ssm_state_indices"):
        o = step(q, k, v, g, beta, initial_state, idx, num_accepted_tokens, N, T, opts, front=fkey,
                 raw=(q, k, v, g, beta, initial_state, ssm_state_indices, num_accepted_tokens), cu_seqlens=cu)
    return into(out, o), initial_state


# ---------------------------------------------------------------------------
# patch / unpatch

_NAMES = ("chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd", "fused_kda_gate")
_patched: list = []  # (module, name, FLA's object) for every attribute patch() replaced


def patch():
    """Swap kdacupy's functions into an imported (importing it if needed) ``fla.ops.kda``:
    ``fla.ops.kda``, its ``chunk`` and ``fused_recurrent`` modules, ``fla.ops`` and every
    other loaded ``fla`` module that holds FLA's function under its name (e.g. a layer
    module that imported it). Modules imported afterwards pick kdacupy's up from
    ``fla.ops.kda``. Calling it again does nothing; ``unpatch()`` restores FLA's."""
    if _patched:
        return
    import fla.ops.kda.chunk
    import fla.ops.kda.fused_recurrent
    import fla.ops.kda.gate

    originals = {"chunk_kda": fla.ops.kda.chunk.chunk_kda,
                 "fused_recurrent_kda": fla.ops.kda.fused_recurrent.fused_recurrent_kda,
                 "fused_recurrent_kda_fwd": fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd,
                 "fused_kda_gate": fla.ops.kda.gate.fused_kda_gate}
    ours = {"chunk_kda": chunk_kda, "fused_recurrent_kda": fused_recurrent_kda,
            "fused_recurrent_kda_fwd": fused_recurrent_kda_fwd, "fused_kda_gate": fused_kda_gate}
    for modname, mod in list(sys.modules.items()):
        if mod is None or not (modname == "fla" or modname.startswith("fla.")):
            continue
        for name in _NAMES:
            if getattr(mod, name, None) is originals[name]:
                _patched.append((mod, name, originals[name]))
                setattr(mod, name, ours[name])


def unpatch():
    """Restore FLA's functions where ``patch()`` replaced them."""
    while _patched:
        mod, name, original = _patched.pop()
        setattr(mod, name, original)

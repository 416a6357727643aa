"""fla-core 0.6.0's KDA entry points on kdacupy: ``chunk_kda``, ``fused_recurrent_kda``,
``fused_recurrent_kda_fwd``, with FLA's signatures, defaults and return values, so
``from kdacupy.compat.fla import chunk_kda`` replaces FLA's import in a vLLM or SGLang
KDA layer; ``patch()`` swaps them into an imported ``fla.ops.kda`` and ``unpatch()``
restores FLA's own.

They run on kdacupy.torch (autograd, ``torch.compile``, torch's stream; CPU tensors on
the NumPy backends). FLA's keywords map to kdacupy's (README "Keyword mapping");
what kdacupy cannot honour raises an error that names the argument:
``return_intermediate_states``, ``cp_context`` (kdacupy.distributed does context
parallelism), a per-channel beta ``[B, T, HV, V]``, head dims outside {64, 128, 256},
``use_gate_in_kernel=True`` with neither ``A_log`` nor ``lower_bound`` in
``fused_recurrent_kda`` (fla-core then multiplies the softplus by e, an undocumented
constant; ``chunk_kda`` refuses the same call), unknown keywords (fla-core ignores
them silently; a misspelt option should not be), and ``ssm_state_indices`` uses that
fla-core only defines for one token per sequence (below).
Performance knobs that do not change results are accepted and have no effect:
``disable_recompute`` (kdacupy's backward always recomputes from the saved inputs),
``cu_seqlens_cpu``, ``use_graph`` / ``max_num_seqs`` (kdacupy's forward is
graph-capturable with device ``cu_seqlens`` as it is), ``chunk_size`` (32 or 64, as
FLA checks) and ``safe_gate`` beyond its checks.

Final states come back in float32, as FLA's do (float64 for float64 inputs, which run
on kdacupy's float64 reference). Negative ``ssm_state_indices`` are padding (the
sequence's output is zeros, the pool untouched); fla-core 0.6.0 does not define them.
"""
from __future__ import annotations

import sys
import warnings

from kdacupy.torch import kda as _kda
from kdacupy.torch import kda_decode as _kda_decode
from kdacupy.torch.tensors import check_equal_lengths, fp32_state_dtype, slots

__all__ = ["chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd", "patch", "unpatch"]


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


def _gate(fn, use_gate_in_kernel, A_log, dt_bias, lower_bound):
    """FLA's gate switches as kdacupy's gate options. Without ``use_gate_in_kernel`` FLA
    ignores A_log, dt_bias and lower_bound (g is the log decay), and so does this."""
    if not use_gate_in_kernel:
        return dict(gate="log")
    if A_log is None and lower_bound is None:
        raise ValueError(f"A_log: {fn}() needs `A_log` when `use_gate_in_kernel=True` and `lower_bound` is not set")
    params = dict(A_log=None if A_log is None else A_log.reshape(-1),  # FLA takes any shape with HV elements
                  dt_bias=None if dt_bias is None else dt_bias.reshape(-1))
    if lower_bound is None:
        return dict(gate="softplus", **params)
    return dict(gate="sigmoid", lower_bound=lower_bound, **params)


def _check_beta(beta, v):
    if beta is not None and beta.dim() == v.dim():
        raise NotImplementedError(f"beta: kdacupy takes one beta per token and value head [B, T, HV], got a "
                                  f"per-channel beta of shape {tuple(beta.shape)}")


def _options(fn, *, scale, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
             use_gate_in_kernel, A_log, dt_bias, lower_bound):
    """FLA's keywords as kdacupy.torch's (README "Keyword mapping")."""
    return dict(scale=scale, qk_l2norm=use_qk_l2norm_in_kernel, beta_sigmoid=use_beta_sigmoid_in_kernel,
                allow_neg_eigval=allow_neg_eigval, state_layout="vk" if state_v_first else "kv",
                **_gate(fn, use_gate_in_kernel, A_log, dt_bias, lower_bound))


def _forward(fn, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, **fla):
    """What chunk_kda and fused_recurrent_kda do after their own checks: refuse allow_neg_eigval
    without sigmoid beta and a per-channel beta, as FLA does, then run with a float32 final state."""
    if fla["allow_neg_eigval"] and not fla["use_beta_sigmoid_in_kernel"]:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    _check_beta(beta, v)
    return _kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                cu_seqlens=cu_seqlens, state_dtype=fp32_state_dtype(q) if output_final_state else None,
                **_options(fn, **fla))


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
    if return_intermediate_states:
        raise NotImplementedError("return_intermediate_states: kdacupy does not return FLA's per-chunk states "
                                  "h [B, NT, HV, K, V]; its forward needs none (use output_final_state)")
    if cp_context is not None:
        raise NotImplementedError("cp_context: kdacupy does context parallelism with "
                                  "kdacupy.distributed.kda_forward_cp (README), not with FLA's FLACPContext")
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
    return _forward("chunk_kda", q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, scale=scale,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                    use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                    state_v_first=state_v_first, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
                    dt_bias=dt_bias, lower_bound=lower_bound)


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
    _check_beta(beta, v)
    if out is not None and tuple(out.shape) != tuple(v.shape):
        raise ValueError(f"out: expected the shape of v {tuple(v.shape)}, got {tuple(out.shape)}")
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
        return _into(out, o), final
    if initial_state is None:
        raise ValueError("initial_state: expected the state pool (updated in place) with inplace_final_state=True, "
                         "got None")
    if ssm_state_indices is None:
        N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
        o, _ = _kda(q, k, v, g, beta, cu_seqlens=cu_seqlens, state_pool=initial_state,
                    state_indices=slots(N, initial_state), **opts)
        return _into(out, o), initial_state
    o = _decode(q, k, v, g, beta, initial_state, cu_seqlens, ssm_state_indices, num_accepted_tokens, opts)
    return _into(out, o), initial_state


def _decode(q, k, v, g, beta, pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, opts):
    """Continuous batching through ``kdacupy.torch.kda_decode``: inputs as [N, T, ...]."""
    B, TT = q.shape[0], q.shape[1]
    if cu_seqlens is None:
        N, T = B, TT
    else:
        if B != 1:
            raise ValueError(f"q: expected batch size 1 with cu_seqlens (packed sequences), got {B}")
        N = cu_seqlens.shape[0] - 1
        if N < 1 or TT % N:
            raise ValueError(f"cu_seqlens: expected N >= 1 sequences of equal length with ssm_state_indices, got "
                             f"{N} sequences for {TT} tokens")
        T = TT // N
        check_equal_lengths(cu_seqlens, T)
    idx = ssm_state_indices
    if idx.dim() == 1:
        if T != 1:
            raise NotImplementedError(f"ssm_state_indices: [N] slots serve one token per sequence (fla-core then "
                                      f"writes token t's state to ssm_state_indices[n + t]); for T = {T} tokens "
                                      f"pass [N, T] slots")
        if num_accepted_tokens is not None:
            raise ValueError("num_accepted_tokens: expected None with [N] ssm_state_indices (it picks the start "
                             "slot among [N, T] ones)")
    elif idx.dim() == 2:
        if idx.shape[1] < T:
            raise ValueError(f"ssm_state_indices: expected [N, C] slots with C >= T = {T}, got "
                             f"{tuple(idx.shape)}")
        idx = idx[:, :T]
    if T == 0:
        return v.new_zeros(v.shape)
    split = lambda x: None if x is None else x.reshape((N, T) + tuple(x.shape[2:]))  # noqa: E731
    o = _kda_decode(split(q), split(k), split(v), split(g), split(beta), state_pool=pool, state_indices=idx,
                    num_accepted_tokens=num_accepted_tokens, **opts)
    return o.reshape(v.shape)


def _into(out, o):
    if out is None:
        return o
    out.copy_(o)
    return out


# ---------------------------------------------------------------------------
# patch / unpatch

_NAMES = ("chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd")
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

    originals = {"chunk_kda": fla.ops.kda.chunk.chunk_kda,
                 "fused_recurrent_kda": fla.ops.kda.fused_recurrent.fused_recurrent_kda,
                 "fused_recurrent_kda_fwd": fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd}
    ours = {"chunk_kda": chunk_kda, "fused_recurrent_kda": fused_recurrent_kda,
            "fused_recurrent_kda_fwd": fused_recurrent_kda_fwd}
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

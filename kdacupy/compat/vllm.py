"""vLLM's vendored KDA ops on kdacupy: ``chunk_kda``, ``chunk_kda_with_fused_gate``,
``fused_recurrent_kda``, ``fused_recurrent_kda_fwd`` and ``fused_kda_gate`` with vLLM's
signatures, defaults, state layout and return values; ``patch()`` swaps them into vLLM's
op modules (and every loaded vLLM module holding them, e.g. the KDA layer), ``unpatch()``
restores vLLM's.

Matched revision (vLLM's public repository): the signatures of
``vllm/third_party/flash_linear_attention/ops/kda.py`` at
933876c388fb129ad82590660e6506614559cb86, a superset of the same functions'
earlier home ``vllm/model_executor/layers/fla/ops/kda.py`` at
00bb9c07e50bdfe206d2afd78975eb132a1ba364, with the slot convention of its kernel
(``ops/fused_recurrent.py`` at 03c20345bb2534b98224519afacb78a4baa6ccfa); the calls are
those of ``vllm/model_executor/layers/kda.py`` at 01a7e5d91d42e6232d746d12f898a590f1ee77f9
(``chunk_kda`` prefill, ``fused_kda_gate`` + ``fused_recurrent_kda`` decode) and
``vllm/model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py`` at
0195c9ec6ea9cda412d1c69034fc5926a2c29528 (``chunk_kda_with_fused_gate`` prefill).

What vLLM's copy does differently from fla-core, and kdacupy does as vLLM:
- states are ``[N, HV, V, K]``, always (no layout flag): the pool, ``initial_state`` and the
  returned final state (float32);
- slot ``NULL_BLOCK_ID`` (0) and below are padding: the sequence's output is zeros and the
  pool is neither read nor written (vLLM reserves block 0; kdacupy's own padding is -1). Earlier
  vLLM padded with PAD_SLOT_ID -1 and kept a state in slot 0: set ``NULL_BLOCK_ID = -1`` there;
- ``fused_recurrent_kda`` defaults to ``use_qk_l2norm_in_kernel=True``; its in-kernel gate
  (``compute_gate=True``) is the bounded one, ``lower_bound * sigmoid(exp(a_log) * (g + g_bias))``;
  ``chunk_kda_with_fused_gate`` takes the raw gate: ``-exp(A_log) * softplus(raw_g + g_bias)``,
  or the bounded gate with ``safe_gate=True``.
Both prefill calls keep the state in fp32 through the chunks (``state_precision="fp32"``), as
vLLM's Triton kernels hold it. ``A_log`` in the layer's ``[1, 1, H, 1]`` shape and bf16 / fp16
parameters are taken as they are.

``[N]`` slots with several tokens per sequence, or unequal lengths, run as vLLM's CPU ops define
them (each sequence starts from its slot and its final state goes back there; vLLM's Triton kernel
would write token t's state to ``idx[n + t]``, another sequence's slot): one pooled chunked forward.
What kdacupy cannot honour raises an error that names it: ``inplace_final_state=False``
(vLLM then writes every token's state to a new ``[T, HV, V, K]``), a pool call without
``ssm_state_indices``, and unknown keywords (vLLM's ``**kwargs`` drops them silently). Gate arguments without the flag that uses
them raise, naming the flag: ``a_log`` / ``g_bias`` / a ``lower_bound`` other than the default
without ``compute_gate=True``, and a ``lower_bound`` other than the default without
``safe_gate=True`` (vLLM ignores them).
"""
from __future__ import annotations

from kdacupy.torch import kda as _kda
from kdacupy.torch.decode_cache import front, front_key
from kdacupy.torch.tensors import fp32_state_dtype, is_tensor, padding_slots, zero_sequences

from .gate import activate, kernel_gate
from .patching import Patcher
from .pool import caller_names, check_out, index_tensor, into, rows, sequences, step, tensors, token_slots

__all__ = ["chunk_kda", "chunk_kda_with_fused_gate", "fused_recurrent_kda", "fused_recurrent_kda_fwd",
           "fused_kda_gate", "patch", "unpatch", "NULL_BLOCK_ID"]

NULL_BLOCK_ID = 0
"""vLLM's null block: a slot at or below it is padding (earlier vLLM: set it to -1, PAD_SLOT_ID)."""
#: vLLM's default lower bound of the bounded gate (its keyword's default, so "not given")
DEFAULT_LOWER_BOUND = -5.0


def _refuse_unknown(fn, kwargs):
    if kwargs:
        name = next(iter(kwargs))
        raise TypeError(f"{fn}() got an unexpected keyword argument {name!r} (vLLM's **kwargs drops keywords it "
                        f"does not know; kdacupy.compat.vllm refuses them, so a misspelt option is not dropped)")


def _bounded(fn, flag, on, params, lower_bound, softplus):
    """A gate that vLLM applies only under ``flag``: the gate options with it, the log decay
    without it (where any of ``params`` or a non-default ``lower_bound`` would be dropped by vLLM:
    refused, naming the flag). ``softplus``: what the call computes with the flag off."""
    A_log, g_bias = params.values()
    if on:
        if lower_bound is None:
            raise ValueError(f"lower_bound: {fn}() needs a number with {flag}=True (vLLM's bounded gate), got None")
        return kernel_gate(A_log, g_bias, lower_bound)
    if lower_bound not in (None, DEFAULT_LOWER_BOUND):
        raise ValueError(f"lower_bound: {fn}() applies lower_bound only with {flag}=True (vLLM drops it "
                         f"silently); pass {flag}=True or leave lower_bound at its default")
    if softplus:
        return kernel_gate(A_log, g_bias, None)
    for name, x in params.items():
        if x is not None:
            raise ValueError(f"{name}: {fn}() applies {' and '.join(params)} only with {flag}=True (g the raw "
                             f"gate); without it g is the log decay and vLLM drops {name} silently")
    return dict(gate="log")


def _prefill(fn, q, k, v, g, beta, scale, initial_state, output_final_state, l2, cu_seqlens, gate):
    """A chunked forward from ``initial_state`` ([N, HV, V, K], gathered from the pool by the
    layer): (o, final state [N, HV, V, K] float32 or None)."""
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
                         f"Please flatten variable-length inputs before processing.")
    return _kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                cu_seqlens=cu_seqlens, qk_l2norm=l2, state_layout="vk", state_precision="fp32",
                state_dtype=fp32_state_dtype(q) if output_final_state else None, **gate)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """vLLM's ``chunk_kda`` (prefill; g the log decay): ``(o, final_state)``, states [N, HV, V, K]."""
    _refuse_unknown("chunk_kda", kwargs)
    return _prefill("chunk_kda", q, k, v, g, beta, scale, initial_state, output_final_state,
                    use_qk_l2norm_in_kernel, cu_seqlens, dict(gate="log"))


def chunk_kda_with_fused_gate(q, k, v, raw_g, beta, A_log, g_bias, scale=None, initial_state=None,
                              output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                              safe_gate=False, lower_bound=-5.0, **kwargs):
    """vLLM's ``chunk_kda_with_fused_gate`` (prefill from the raw gate, the gate in kdacupy's
    kernel): ``(o, final_state)``, states [N, HV, V, K]."""
    _refuse_unknown("chunk_kda_with_fused_gate", kwargs)
    if A_log is None:
        raise ValueError("A_log: chunk_kda_with_fused_gate() needs A_log (the gate's per-head rate), got None")
    gate = _bounded("chunk_kda_with_fused_gate", "safe_gate", safe_gate, dict(A_log=A_log, g_bias=g_bias),
                    lower_bound, softplus=True)
    return _prefill("chunk_kda_with_fused_gate", q, k, v, raw_g, beta, scale, initial_state, output_final_state,
                    use_qk_l2norm_in_kernel, cu_seqlens, gate)


def _entry(q, k, v, g, beta, pool, cu_seqlens, idx, acc, out, a_log, g_bias):
    """A decode call's checks before anything runs: every array a tensor (the slot table as one),
    out checked (and first the rows it is checked against, when its shape differs); returns the
    slots. On a step's fast path: isinstance checks and one shape comparison."""
    tensors(dict(q=q, k=k, v=v, g=g), dict(beta=beta, initial_state=pool, cu_seqlens=cu_seqlens,
                                           num_accepted_tokens=acc, a_log=a_log, g_bias=g_bias))
    if out is not None and (not is_tensor(out) or out.shape != v.shape):
        rows(q, k, v, g, beta)
    check_out(out, v, q=q, k=k, v=v, initial_state=pool)  # before the pool is touched
    return None if idx is None else index_tensor("ssm_state_indices", idx)


def _front(fn, q, k, v, g, beta, pool, cu_seqlens, idx, acc, a_log, g_bias, scalars):
    """(the call's own key, o where a call like it was mapped to a step before: decode_cache.front)."""
    fkey = front_key(fn, (q, k, v, g, beta, pool, cu_seqlens, idx, acc), (a_log, g_bias), scalars + (NULL_BLOCK_ID,))
    return fkey, front(fkey, (q, k, v, g, beta, pool, idx, acc, a_log, g_bias), v, pool, cu_seqlens)


def fused_recurrent_kda_fwd(q, k, v, g, beta, scale, initial_state, inplace_final_state=True, cu_seqlens=None,
                            ssm_state_indices=None, num_accepted_tokens=None, use_qk_l2norm_in_kernel=False,
                            out=None, sigmoid_beta=False, a_log=None, g_bias=None, compute_gate=False,
                            lower_bound=-5.0):
    """vLLM's ``fused_recurrent_kda_fwd``: one ``kdacupy.kda_decode`` launch on the pool
    ``initial_state`` [P, HV, V, K], updated in place; returns ``(o, initial_state)``.
    ``ssm_state_indices`` [N] (one token per sequence) or [N, C] (speculative decode: start
    from ``idx[n, num_accepted_tokens[n] - 1]``, the state after token t to ``idx[n, t]``)."""
    ssm_state_indices = _entry(q, k, v, g, beta, initial_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                               out, a_log, g_bias)
    fkey, o = _front("fused_recurrent_kda_fwd", q, k, v, g, beta, initial_state, cu_seqlens, ssm_state_indices,
                     num_accepted_tokens, a_log, g_bias, (scale, inplace_final_state, use_qk_l2norm_in_kernel,
                                                          sigmoid_beta, compute_gate, lower_bound))
    if o is not None:  # this call, as the engine makes it, seen before: its step's launch
        return into(out, o), initial_state
    return _recurrent(q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
                      num_accepted_tokens, use_qk_l2norm_in_kernel, out, sigmoid_beta, a_log, g_bias, compute_gate,
                      lower_bound, fkey)


def _recurrent(q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
               num_accepted_tokens, use_qk_l2norm_in_kernel, out, sigmoid_beta, a_log, g_bias, compute_gate,
               lower_bound, fkey):
    """``fused_recurrent_kda_fwd``'s arguments mapped to one step (kdacupy/compat/pool.py)."""
    if not inplace_final_state:
        raise NotImplementedError("inplace_final_state: kdacupy.compat.vllm updates the pool in place (vLLM's "
                                  "inplace_final_state=False writes every token's state to a new [T, HV, V, K])")
    if initial_state is None:
        raise ValueError("initial_state: expected the state pool [P, HV, V, K] (updated in place), got None")
    if ssm_state_indices is None:
        raise ValueError("ssm_state_indices: expected the pool slots of the sequences, got None")
    if compute_gate and (a_log is None or g_bias is None):
        raise ValueError(f"{'a_log' if a_log is None else 'g_bias'}: fused_recurrent_kda_fwd() needs a_log and "
                         f"g_bias with compute_gate=True (vLLM asserts so), got None")
    gate = _bounded("fused_recurrent_kda_fwd", "compute_gate", compute_gate, dict(a_log=a_log, g_bias=g_bias),
                    lower_bound, softplus=False)
    rows(q, k, v, g, beta)
    ssm_state_indices = index_tensor("ssm_state_indices", ssm_state_indices)
    if ssm_state_indices.dim() == 1 and not _one_token_each(q, cu_seqlens):
        return into(out, _per_sequence_slots(q, k, v, g, beta, scale, initial_state, cu_seqlens, ssm_state_indices,
                                             num_accepted_tokens, dict(qk_l2norm=use_qk_l2norm_in_kernel,
                                                                       beta_sigmoid=sigmoid_beta, **gate))), \
            initial_state
    N, T, cu = sequences(q, cu_seqlens)
    idx = token_slots(ssm_state_indices, T, num_accepted_tokens)
    # the null block as padding in the kernel: vLLM's slot table as it is, no per-step transform of it
    opts = dict(scale=scale, qk_l2norm=use_qk_l2norm_in_kernel, beta_sigmoid=sigmoid_beta, state_layout="vk",
                null_slot=NULL_BLOCK_ID, **gate)
    with caller_names(state_pool="initial_state", state_indices="ssm_state_indices"):
        o = step(q, k, v, g, beta, initial_state, idx, num_accepted_tokens, N, T, opts, front=fkey,
                 raw=(q, k, v, g, beta, initial_state, ssm_state_indices, num_accepted_tokens), cu_seqlens=cu)
    return into(out, o), initial_state


def _one_token_each(q, cu_seqlens) -> bool:
    """One token per sequence (a decode step for kda_decode): host offsets are read; device ones
    with as many tokens as sequences are left to the decode kernel, which checks them."""
    if cu_seqlens is None:
        return q.shape[1] == 1
    if q.shape[1] != cu_seqlens.shape[0] - 1:
        return False
    return cu_seqlens.get_device() >= 0 or bool((cu_seqlens[1:] - cu_seqlens[:-1] == 1).all())


def _per_sequence_slots(q, k, v, g, beta, scale, pool, cu_seqlens, idx, num_accepted_tokens, opts):
    """``[N]`` slots with several tokens, or unequal lengths, per sequence: each sequence starts
    from ``pool[idx[n]]`` and its final state goes back there, as vLLM's CPU ops do it
    (``vllm/models/glm5next/cpu/ops/kda.py``, pinned by ``tests/kernels/mamba/cpu/test_cpu_kda_ops.py``
    at 1b12080ef628534debf5cd9d173b4235b382142a: 3 sequences of 17, 13 and 10 tokens); slots at or
    below the null block are skipped (zero output, the pool untouched). One pooled kda_forward
    (chunked; the state kept in fp32 through the chunks, as vLLM's kernel holds it)."""
    if num_accepted_tokens is not None:
        raise ValueError("num_accepted_tokens: expected None with [N] ssm_state_indices (it picks the start slot "
                         "among [N, C] ones)")
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"q: expected batch size 1 with cu_seqlens (packed sequences), got {q.shape[0]}")
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if tuple(idx.shape) != (N,):
        raise ValueError(f"ssm_state_indices: expected [N] = [{N}] slots (one per sequence), got {tuple(idx.shape)}")
    with caller_names(state_pool="initial_state", state_indices="ssm_state_indices"):
        o, _ = _kda(q, k, v, g, beta, scale=scale, cu_seqlens=cu_seqlens, state_pool=pool,
                    state_indices=padding_slots(idx, NULL_BLOCK_ID), state_layout="vk", state_precision="fp32",
                    **opts)
    return zero_sequences(o, idx <= NULL_BLOCK_ID, cu_seqlens)


def fused_recurrent_kda(q, k, v, g, beta=None, scale=None, initial_state=None, inplace_final_state=True,
                        use_qk_l2norm_in_kernel=True, cu_seqlens=None, ssm_state_indices=None,
                        num_accepted_tokens=None, out=None, sigmoid_beta=False, a_log=None, g_bias=None,
                        compute_gate=False, lower_bound=-5.0, **kwargs):
    """vLLM's ``fused_recurrent_kda`` (decode on the pool): ``(o, initial_state)``, as
    ``fused_recurrent_kda_fwd`` with vLLM's defaults (``use_qk_l2norm_in_kernel=True``)."""
    _refuse_unknown("fused_recurrent_kda", kwargs)
    ssm_state_indices = _entry(q, k, v, g, beta, initial_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                               out, a_log, g_bias)
    fkey, o = _front("fused_recurrent_kda", q, k, v, g, beta, initial_state, cu_seqlens, ssm_state_indices,
                     num_accepted_tokens, a_log, g_bias, (scale, inplace_final_state, use_qk_l2norm_in_kernel,
                                                          sigmoid_beta, compute_gate, lower_bound))
    if o is not None:
        return into(out, o), initial_state
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
                         f"Please flatten variable-length inputs before processing.")
    return _recurrent(q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
                      num_accepted_tokens, use_qk_l2norm_in_kernel, out, sigmoid_beta, a_log, g_bias, compute_gate,
                      lower_bound, fkey)


def fused_kda_gate(g, A, head_k_dim, g_bias=None, beta=1.0, threshold=20.0, safe_gate=False, lower_bound=-5.0):
    """vLLM's ``fused_kda_gate``: g [..., H * D] -> the log decay [..., H, D] in float32:
    ``-exp(A) * softplus(g + g_bias)`` (torch's softplus with vLLM's ``beta`` and ``threshold``),
    or with ``safe_gate=True`` ``lower_bound * sigmoid(exp(A) * (g + g_bias))``. A: H elements
    ([H] or the layer's [1, 1, H, 1])."""
    H = A.numel()
    if H * head_k_dim != g.shape[-1]:
        raise ValueError(f"g: expected a last dim of H * head_k_dim = {H} * {head_k_dim} (A has H elements), got "
                         f"{g.shape[-1]}")
    if not safe_gate and lower_bound not in (None, DEFAULT_LOWER_BOUND):
        raise ValueError("lower_bound: fused_kda_gate() applies lower_bound only with safe_gate=True (vLLM drops "
                         "it silently); pass safe_gate=True or leave lower_bound at its default")
    if safe_gate and lower_bound is None:
        raise ValueError("lower_bound: fused_kda_gate() needs a number with safe_gate=True, got None")
    x = g.reshape(tuple(g.shape[:-1]) + (H, head_k_dim))
    return activate(x, A, g_bias, lower_bound if safe_gate else None, softplus_beta=beta,
                    softplus_threshold=threshold).float()


_PATCHER = Patcher("vllm", ("vllm.third_party.flash_linear_attention.ops.kda",
                            "vllm.model_executor.layers.fla.ops.kda"),
                   {"chunk_kda": chunk_kda, "chunk_kda_with_fused_gate": chunk_kda_with_fused_gate,
                    "fused_recurrent_kda": fused_recurrent_kda, "fused_recurrent_kda_fwd": fused_recurrent_kda_fwd,
                    "fused_kda_gate": fused_kda_gate})


def patch():
    """Swap kdacupy's functions into vLLM's KDA op modules (``vllm.third_party.flash_linear_attention.ops.kda``
    or the older ``vllm.model_executor.layers.fla.ops.kda``, whichever imports) and every loaded
    ``vllm`` module holding vLLM's function under its name (the KDA layers import them by name).
    Calling it again does nothing; ``unpatch()`` restores vLLM's."""
    _PATCHER.patch()


def unpatch():
    """Restore vLLM's functions where ``patch()`` replaced them."""
    _PATCHER.unpatch()

"""The user-facing torch calls: ``kda`` (autograd, ``torch.compile``) and ``kda_decode``.

They take kdacupy's keywords (docs/guide/forward.md; FLA's names are in
kdacupy/compat/fla.py), put Python scalars into the types the op schemas want,
and call the custom ops of kdacupy/torch/ops.py.
"""
from __future__ import annotations

import numbers

import torch

from . import autograd  # noqa: F401  (registers the forward op's autograd)
from . import decode_cache, eager, ops
from .tensors import CONVERTED_PARAM_DTYPES, _index_tensor, tensors  # noqa: F401  (_index_tensor: cp.py's too)


def _flag(name, x):
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected a bool, got {x!r}")
    return x


def _real(name, x):
    if x is None:
        return None
    if not isinstance(x, numbers.Real) or isinstance(x, bool):
        raise TypeError(f"{name}: expected a real number or None, got {x!r}")
    return float(x)


def _slot(name, x):
    if not isinstance(x, numbers.Integral) or isinstance(x, bool):
        raise TypeError(f"{name}: expected an int, got {x!r}")
    return int(x)


def _name(name, x):
    if x is not None and not isinstance(x, str):
        raise TypeError(f"{name}: expected a str, got {x!r}")
    return x


#: B * T of one call at most, as kdacupy's validation says (kdacupy/validation/shapes.py; a test holds them equal)
MAX_TOKENS = (1 << 31) - 1


def _tensors(required, optional):
    """Every array argument a torch tensor (optional ones may be None): a TypeError naming the first
    that is not, before anything reads it. Then no [B, T] of 2^31 tokens or more (the kernels take
    token counts as 32-bit ints; kdacupy's validation says the same), before a copy is made of it."""
    tensors(required, optional)
    q = required["q"]
    if q.dim() >= 2 and q.shape[0] * q.shape[1] > MAX_TOKENS:
        raise ValueError(f"q: expected at most 2^31 - 1 tokens (B * T; the kernels take token counts as 32-bit "
                         f"ints), got B * T = {q.shape[0] * q.shape[1]} (shape {tuple(q.shape)})")


def _rows(x):
    """x as kdacupy reads it: strided views (e.g. of a fused projection) as they are when the
    last dim is contiguous, a contiguous copy otherwise (as torch ops take any strides)."""
    return x if x is None or x.dim() == 0 or x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _dense(x):
    """States and per-head parameters: kdacupy reads them C-contiguous (a copy only if they are not)."""
    return None if x is None else x.contiguous()


def _gate_params(A_log, dt_bias):
    """A_log in a model's parameter shape [1, 1, HV, 1] as [HV], and bf16 / fp16 A_log and dt_bias
    as float32 (the kernels' parameter type): torch ops on the tensors' own device, so autograd
    hands the gradients back in the parameters' own shape and dtype, and a capture in
    ``torch.cuda.graph`` takes the conversion from torch's graph pool. Other shapes are left to
    kdacupy's checks."""
    if A_log is not None and A_log.dim() == 4 and A_log.shape[:2] == (1, 1) and A_log.shape[3] == 1:
        A_log = A_log.reshape(-1)
    A_log, dt_bias = (x.float() if x is not None and x.dtype in CONVERTED_PARAM_DTYPES else x
                      for x in (A_log, dt_bias))
    return _dense(A_log), _dense(dt_bias)


def _unexpected(fn, unknown):
    name = next(iter(unknown))
    hint = (" (kdacupy.torch returns new tensors: torch custom ops may not return their inputs)" if name == "out"
            else "; FLA's keywords are taken by kdacupy.compat.fla, kdacupy's are listed in docs/guide/forward.md")
    raise TypeError(f"{fn}() got an unexpected keyword argument {name!r}{hint}")


def kda(q, k, v, g, beta=None, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
        lower_bound=None, state_layout="kv", state_dtype=None, state_precision="bf16", sequence_parallel=None,
        state_pool=None, state_indices=None, backend=None, save_for_backward=False, **unknown):
    """Kimi Delta Attention forward on torch tensors: ``(o, final_state)``, as ``kdacupy.kda_forward``.

    Differentiable with respect to q, k, v, g, beta, initial_state, A_log and dt_bias
    (``kdacupy.kda_backward``); traceable by ``torch.compile(fullgraph=True)``.
    CUDA tensors run the CUDA kernels on torch's current stream; CPU tensors run
    the NumPy backends (``backend=None``: the float64 reference, results rounded
    to the inputs' dtype; ``"model"``, ``"emulate"`` as in kdacupy).
    ``state_dtype``: a torch dtype or None. With ``state_pool``/``state_indices``
    (chunked prefill, no autograd) the final states go to the pool in place and
    ``final_state`` is None. ``save_for_backward=True`` (training): the forward keeps its
    workspace and chunk states for the backward in autograd's saved tensors (from torch's
    allocator), so the backward skips recomputing them: faster, same gradients to the bit,
    ``kdacupy.KDASaved``'s memory per call (docs/design.md section 9.5); kept only when
    autograd will use it (grad mode on and an input that requires grad).
    """
    if unknown:
        _unexpected("kda", unknown)
    _tensors(dict(q=q, k=k, v=v, g=g), dict(beta=beta, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias,
                                            state_pool=state_pool))
    if state_dtype is not None and not isinstance(state_dtype, torch.dtype):
        raise TypeError(f"state_dtype: expected a torch dtype or None, got {state_dtype!r}")
    if sequence_parallel is not None and (not isinstance(sequence_parallel, int) or isinstance(sequence_parallel,
                                                                                                 bool)):
        raise TypeError(f"sequence_parallel: expected None or an int, got {sequence_parallel!r}")
    common = dict(scale=_real("scale", scale), qk_l2norm=_flag("qk_l2norm", qk_l2norm),
                  beta_sigmoid=_flag("beta_sigmoid", beta_sigmoid),
                  allow_neg_eigval=_flag("allow_neg_eigval", allow_neg_eigval), gate=_name("gate", gate),
                  lower_bound=_real("lower_bound", lower_bound), state_layout=_name("state_layout", state_layout))
    cu = _index_tensor("cu_seqlens", cu_seqlens)
    q, k, v, g, beta = (_rows(x) for x in (q, k, v, g, beta))
    initial_state = _dense(initial_state)
    A_log, dt_bias = _gate_params(A_log, dt_bias)
    if state_pool is not None or state_indices is not None:
        for n, x in (("initial_state", initial_state), ("state_dtype", state_dtype)):
            if x is not None:
                raise ValueError(f"{n}: expected None with state_pool (states come from and go to the pool), "
                                 f"got {x!r}")
        if output_final_state:
            raise ValueError("output_final_state: expected False with state_pool (final states are written to "
                             "the pool), got True")
        if state_pool is None:
            raise TypeError("state_pool: expected a state pool tensor with state_indices, got None")
        o = ops.forward_pool(q, k, v, g, beta, state_pool, _index_tensor("state_indices", state_indices), cu,
                             A_log, dt_bias, common["scale"], common["qk_l2norm"], common["beta_sigmoid"],
                             common["allow_neg_eigval"], common["gate"], common["lower_bound"],
                             common["state_layout"], _name("state_precision", state_precision),
                             _name("backend", backend))
        return o, None
    output_final_state = _flag("output_final_state", output_final_state)
    if _flag("save_for_backward", save_for_backward) and torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in (q, k, v, g, beta, initial_state, A_log, dt_bias)):
        if sequence_parallel not in (None, 1):
            raise ValueError(f"sequence_parallel: expected None or 1 with save_for_backward=True (the kept chunk "
                             f"states come from the serial recurrence), got {sequence_parallel}")
        o, final, _ = ops.forward_saving(
            q, k, v, g, beta, initial_state, cu, A_log, dt_bias, common["scale"], output_final_state,
            common["qk_l2norm"], common["beta_sigmoid"], common["allow_neg_eigval"], common["gate"],
            common["lower_bound"], common["state_layout"], state_dtype, _name("state_precision", state_precision),
            _name("backend", backend))
        return o, (final if output_final_state else None)
    o, final = ops.forward(q, k, v, g, beta, initial_state, cu, A_log, dt_bias, common["scale"], output_final_state,
                           common["qk_l2norm"], common["beta_sigmoid"], common["allow_neg_eigval"], common["gate"],
                           common["lower_bound"], common["state_layout"], state_dtype,
                           _name("state_precision", state_precision), sequence_parallel, _name("backend", backend))
    return o, (final if output_final_state else None)


def kda_decode(q, k, v, g, beta=None, *, state_pool, state_indices, num_accepted_tokens=None, scale=None,
               qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
               lower_bound=None, state_layout="vk", backend=None, null_slot=-1, cu_seqlens=None, **unknown):
    """One decode or speculative-verify step on a state pool, as ``kdacupy.kda_decode``:
    returns o ``[N, T, HV, V]``; ``state_pool`` is updated in place (no autograd). ``null_slot``:
    slots at or below it are padding (default -1: the negative ones); ``cu_seqlens``: an engine's
    packed offsets of the N sequences, [0, T, ..., N T] (device ones checked in the kernel)."""
    if unknown:
        _unexpected("kda_decode", unknown)
    _tensors(dict(q=q, k=k, v=v, g=g), dict(beta=beta, state_pool=state_pool, A_log=A_log, dt_bias=dt_bias))
    # this call as made, found by its own key (no options dict, no step key): decode_cache.front
    tensors = (q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens, cu_seqlens)
    fkey = decode_cache.front_key("kdacupy.torch.kda_decode", tensors, (A_log, dt_bias), (
        scale, qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, backend, null_slot))
    o = decode_cache.front(fkey, tensors + (A_log, dt_bias), v, state_pool, None)  # cu_seqlens: the step's own
    if o is not None:
        return o
    opts = dict(scale=scale, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval,
                gate=gate, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_layout=state_layout,
                backend=backend, null_slot=null_slot)
    o, key = decode_cache.repeated(q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens, opts,
                                   cu_seqlens)
    if o is not None:  # a call signature seen before (kdacupy/torch/decode_cache.py)
        decode_cache.alias(fkey, key, None, tensors, tensors)  # the step's key is this call's own tensors'
        return o
    for n, x in (("state_pool", state_pool), ("state_indices", state_indices)):
        if x is None:
            raise TypeError(f"{n}: expected a tensor, got None")
    given = (q, k, v, g, beta)  # the call's own tensors: the cache's key is theirs
    q, k, v, g, beta = (_rows(x) for x in (q, k, v, g, beta))
    A_log, dt_bias = eager.gate_params(A_log, dt_bias, _gate_params)  # bf16 ones converted once per version
    out = torch.empty(tuple(v.shape), dtype=v.dtype, device=v.device)
    args = (q, k, v, g, beta, state_pool, _index_tensor("state_indices", state_indices),
            _index_tensor("num_accepted_tokens", num_accepted_tokens), A_log, dt_bias, out,
            _real("scale", scale), _flag("qk_l2norm", qk_l2norm), _flag("beta_sigmoid", beta_sigmoid),
            _flag("allow_neg_eigval", allow_neg_eigval), _name("gate", gate), _real("lower_bound", lower_bound),
            _name("state_layout", state_layout), _name("backend", backend), _slot("null_slot", null_slot),
            _index_tensor("cu_seqlens", cu_seqlens))
    if not eager.decode(*args):  # the op's body without the op, where that is the same (kdacupy/torch/eager.py)
        ops.decode(*args)
    decode_cache.remember(key, *given, state_pool, state_indices, num_accepted_tokens, q.shape[0], q.shape[1], opts,
                          cu_seqlens)
    decode_cache.alias(fkey, key, None, tensors, tensors)
    return out

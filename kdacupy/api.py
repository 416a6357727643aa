"""``kda_forward``: validation, then dispatch to a backend."""
from __future__ import annotations

import math

import numpy as np

from .validation import check_keywords, validate


def kda_forward(
    q, k, v, g, beta=None, *, scale=None, initial_state=None, output_final_state=False,
    cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log",
    A_log=None, dt_bias=None, lower_bound=None, state_layout=None, state_dtype=None, out=None,
    backend=None, state_precision="bf16", state_pool=None, state_indices=None, sequence_parallel=None,
    checkpoint_every=None, checkpoints=None, checkpoint_indices=None, save_for_backward=False, **unknown,
):
    """Kimi Delta Attention forward.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g: [B, T, HV, K]; beta: [B, T, HV] or None.
    Returns ``(o, final_state)``: o has v's shape and dtype (written into ``out``
    when given); final_state is ``[N, HV, K, V]`` (``state_layout="vk"``:
    ``[N, HV, V, K]``) in ``state_dtype`` when ``output_final_state``, else None.
    state_layout: "kv" or "vk"; None (the default) means "kv" for initial_state /
    final_state and "vk" with a state_pool, the default of ``kda_decode``, so that one
    pool has one layout for prefill and decode.

    backend: None picks by array type (CuPy -> "cuda", NumPy -> "reference");
    "cuda" (CuPy arrays), "reference" (float64 NumPy; float64 inputs give
    float64 results, the others are rounded back to their dtype), "model" (the NumPy
    precision model of the CUDA kernels), "emulate" (the CUDA kernels compiled
    for the CPU). state_precision: "bf16" keeps the recurrent state in bf16
    between chunks (FlashKDA's contract), "fp32" keeps it in fp32.
    sequence_parallel: None (the library decides), 1 (off) or n >= 2 segments
    per sequence, computed in parallel (kdacupy/seqpar.py, docs/design.md section 7.2).
    See docs/design.md section 1 for the semantics of every option, and the
    keyword mapping for FLA's and FlashKDA's names (docs/guide/forward.md).
    state_pool, state_indices (chunked prefill, docs/design.md section 7.1): the pool
    of ``kda_decode`` and int32/int64 slots [N]; sequence n starts from
    ``state_pool[idx[n]]`` and its final state is written back there in place
    (a negative slot starts from zeros and writes nothing); final_state is then
    None. Excludes initial_state, output_final_state and state_dtype. Host
    (NumPy) slots are checked; device slots are not read by the host: a slot
    outside ``[0, P)`` is padding, and two sequences given the same slot race
    (the result is undefined), so distinct slots are the caller's duty there.
    checkpoint_every, checkpoints, checkpoint_indices (prefix caching, docs/design.md
    section 7.1): the state after every ``checkpoint_every`` tokens (a multiple of 16) of each
    sequence, counted from that sequence's own first token (cu_seqlens too), as the
    recurrence holds it (``state_precision``), rounded to the checkpoints' dtype (bf16 or fp32):
    boundary j (the state after j * checkpoint_every tokens, j = 1 .. J, where that is at most
    the sequence's length; the initial state is not one) goes to ``checkpoints[n, j - 1]`` of a
    [N, J, HV, K, V] array ("vk": [N, J, HV, V, K]), or, with ``checkpoint_indices`` [N, J]
    int32/int64, to row ``checkpoint_indices[n, j - 1]`` of a [R, HV, K, V] / [R, HV, V, K] array
    (the state pool itself included; a negative row: not written). Each checkpoint equals, to the
    bit, the final state of the same forward stopped at its boundary. Written in the same launch,
    on the device, without a host synchronisation (capturable); host rows are checked (< R,
    distinct, apart from the pool slots the call uses), device rows outside [0, R) are skipped.
    Excludes sequence_parallel > 1.
    save_for_backward (training, docs/design.md section 9.5): True (or a 1-D uint8 buffer of
    ``kdacupy.saved_nbytes(...)`` bytes) returns ``(o, final_state, saved)``: the workspace and the
    state entering every chunk, which ``kda_backward(..., saved=saved)`` reads instead of recomputing
    (the same gradients; ``saved.nbytes`` of memory). Excludes state_pool, checkpoints and
    sequence_parallel > 1; the NumPy backends keep nothing.
    """
    if unknown:
        check_keywords(unknown)
    from .saved import check_exclusions, save_option
    save_for_backward, keep_into = save_option(save_for_backward)  # keep_into: a framework's buffer
    from .seqpar import check_sequence_parallel, choose_segments
    sequence_parallel = check_sequence_parallel(sequence_parallel)
    pooled = state_pool is not None or state_indices is not None
    if state_layout is None:  # one pool, one layout: kda_decode's default, "vk"
        state_layout = "vk" if pooled else "kv"
    problem, a = validate(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval,
        gate=gate, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_layout=state_layout,
        state_dtype=state_dtype, state_precision=state_precision, out=out, backend=backend)
    if state_dtype is not None and not pooled and problem.state_out_dtype is None:
        raise ValueError(f"state_dtype: expected None without output_final_state=True (it is the final state's "
                         f"dtype), got {state_dtype!r}")
    if save_for_backward:
        check_exclusions(state_pool=state_pool, checkpoints=checkpoints, checkpoint_every=checkpoint_every,
                         sequence_parallel=sequence_parallel)
    if pooled and sequence_parallel not in (None, 1):
        raise ValueError(f"sequence_parallel: expected None or 1 with state_pool (the split forward does not "
                         f"read or write a pool yet), got {sequence_parallel}")
    if pooled:
        from .validation.pool import validate_forward_pool
        problem, a = validate_forward_pool(problem, a, state_pool, state_indices, initial_state=initial_state,
                                           output_final_state=output_final_state, state_dtype=state_dtype)
    ck = None
    if checkpoints is not None or checkpoint_every is not None or checkpoint_indices is not None:
        from .validation.checkpoints import validate_checkpoints
        ck = validate_checkpoints(checkpoint_every, checkpoints, checkpoint_indices, problem=problem, arrays=a)
        if ck is not None and sequence_parallel not in (None, 1):
            raise ValueError(f"sequence_parallel: expected None or 1 with checkpoints (the split forward writes no "
                             f"checkpoints yet), got {sequence_parallel}")
        a = dict(a, checkpoints=ck)
    if pooled:
        if problem.backend not in ("cuda", "emulate"):
            from .numerics.decode_reference import forward_through_pool
            return forward_through_pool(kda_forward, problem, a, q=q, k=k, v=v, g=g, beta=beta, scale=scale,
                                        cu_seqlens=cu_seqlens, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
                                        allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=A_log,
                                        dt_bias=dt_bias, lower_bound=lower_bound, state_layout=state_layout,
                                        out=out, backend=problem.backend, state_precision=state_precision,
                                        checkpoint_every=checkpoint_every, checkpoints=checkpoints,
                                        checkpoint_indices=checkpoint_indices)
    if save_for_backward:
        return _forward_saving(problem, a, dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                                cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias), keep_into,
                               output_final_state=output_final_state, beta_sigmoid=beta_sigmoid,
                               allow_neg_eigval=allow_neg_eigval, gate=gate)
    segments = 1 if pooled or ck is not None else choose_segments(problem, sequence_parallel)
    if segments > 1:
        from .ops.seqpar.split import forward_split
        return forward_split(problem, a, segments)
    if problem.backend in ("cuda", "emulate"):
        from .ops.forward.kernels import forward  # launchers import the JIT machinery: load it only when used
        return forward(problem, a)

    return _numpy_forward(problem, a, ck, output_final_state=output_final_state, beta_sigmoid=beta_sigmoid,
                          allow_neg_eigval=allow_neg_eigval, gate=gate)


def _forward_saving(problem, a, given, into, **options):
    """``kda_forward(save_for_backward=True or a buffer)``: (o, final_state, KDASaved)."""
    from .ops.backward.saved import KDASaved, allocate, fingerprint
    from . import saved as checks

    key = fingerprint(problem, checks.given(given))
    if problem.backend not in ("cuda", "emulate"):
        o, final = _numpy_forward(problem, a, None, **options)
        return o, final, KDASaved(None, key)
    from .ops.forward.kernels import forward

    buf, views = allocate(problem, None if into is None else checks.check_buffer(into, problem, a["q"]))  # before a launch
    o, final = forward(problem, a, keep=views)
    return o, final, KDASaved(buf, key)


def _numpy_forward(problem, a, ck, *, output_final_state, beta_sigmoid, allow_neg_eigval, gate):
    """The NumPy backends ("model", "reference") of a validated call, checkpoints included."""
    options = dict(
        scale=problem.scale, initial_state=a["initial_state"], output_final_state=output_final_state,
        cu_seqlens=a["cu_seqlens"], qk_l2norm=problem.qk_l2norm, beta_sigmoid=beta_sigmoid,
        allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=a["A_log"], dt_bias=a["dt_bias"],
        lower_bound=problem.lower_bound, state_layout=problem.state_layout)
    on_chunk, states = None, None
    if ck is not None:
        from .numerics import checkpoints as boundary
        from .numerics.reference import sequence_bounds
        lengths = [eos - bos for bos, eos in sequence_bounds(problem.B, problem.T, a["cu_seqlens"])]
        on_chunk, states = boundary.collector(ck.every, lengths, ck.per_seq)
    if problem.backend == "model":
        from .numerics.precision import kda_model
        o, final = kda_model(a["q"], a["k"], a["v"], a["g"], a["beta"], state_dtype=problem.state_out_dtype,
                             state_precision=problem.state_precision, on_chunk=on_chunk, **options)
    else:
        from .numerics.reference import kda_reference
        o, final = kda_reference(a["q"], a["k"], a["v"], a["g"], a["beta"], on_chunk=on_chunk,
                                 chunk_size=64 if ck is None else math.gcd(64, ck.every), **options)
        o = o if problem.dtype == np.float64 else o.astype(np.float32).astype(problem.dtype)
        if final is not None and problem.state_out_dtype != np.float64:
            final = final.astype(np.float32).astype(problem.state_out_dtype)
    if ck is not None:
        boundary.store(ck, states, problem.state_layout)
    if a["out"] is not None:
        a["out"][...] = o
        o = a["out"]
    return o, final

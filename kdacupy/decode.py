"""``kda_decode``: one decode (T = 1) or speculative-verify (T = 1 + S) step on a
state pool (docs/design.md section 7.1): validation, then dispatch to a backend."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .numerics.decode_reference import decode_plan
from .ops.decode import fastpath
from .validation import validate
from .validation.arrays import is_device
from .validation.keywords import DECODE_KEYWORDS, check_keywords
from .validation.pool import check_decode_offsets, check_null_slot, validate_pool
from .validation.steps import validate_steps


#: what a kda_decode call's result depends on, in the order of its fast path's key: the arrays
#: (``arrays`` there) and the options (``options``); together every parameter of kda_decode, which
#: tests/test_cache_keys.py holds (a parameter missing here would let two calls share a cache entry)
ARRAY_NAMES = ("q", "k", "v", "g", "beta", "state_pool", "state_indices", "num_accepted_tokens", "out", "A_log",
               "dt_bias", "parent_indices", "step_states", "step_state_indices", "cu_seqlens")
OPTION_NAMES = ("scale", "qk_l2norm", "beta_sigmoid", "allow_neg_eigval", "gate", "lower_bound", "state_layout",
                "backend", "update_pool", "null_slot")


def prepared_decode(arrays, options):
    """The call ``kda_decode`` cached for ``arrays`` (kda_decode's q, k, v, g, beta, state_pool,
    state_indices, num_accepted_tokens, out, A_log, dt_bias, parent_indices, step_states,
    step_state_indices, cu_seqlens, None where not passed) and its keyword ``options`` (missing ones at
    kda_decode's defaults): a call whose ``bind(pointers)`` gives a launch from raw data pointers
    (only out's varying; a framework face keys its step on its own tensors' metadata and skips
    kda_decode's key and views), or None where none is cached (kda_decode's next call with these
    arrays runs the full path and caches it)."""
    defaults = _option_defaults()
    key = fastpath.call_key(arrays, tuple(options.get(n, defaults[n]) for n in OPTION_NAMES))
    return None if key is None else fastpath.lookup(key)


_DEFAULTS: list = []


def _option_defaults() -> dict:
    if not _DEFAULTS:
        import inspect
        _DEFAULTS.append({n: p.default for n, p in inspect.signature(kda_decode).parameters.items()
                          if n in OPTION_NAMES})
    return _DEFAULTS[0]


def kda_decode(
    q, k, v, g, beta=None, *, state_pool, state_indices, num_accepted_tokens=None, scale=None,
    qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
    lower_bound=None, state_layout="vk", out=None, backend=None, parent_indices=None, step_states=None,
    step_state_indices=None, update_pool=True, null_slot=-1, cu_seqlens=None, **unknown,
):
    """Kimi Delta Attention, token by token from states held in a pool.

    q, k: [N, T, H, K]; v: [N, T, HV, V]; g: [N, T, HV, K]; beta: [N, T, HV] or None.
    state_pool: [P, HV, V, K] (``state_layout="vk"``) or [P, HV, K, V] ("kv"),
    float32 or bfloat16, read and updated in place.
    state_indices (int32/int64): [N] -- sequence n starts from slot idx[n] and
    its state after the last token is written back there; or [N, T] -- it
    starts from idx[n, a_n - 1] (a_n = num_accepted_tokens[n], default 1) and
    the state after token t is written to idx[n, t]. Negative start slots pad
    (output zeros, the pool untouched); a negative idx[n, t] skips that write.
    null_slot (int >= -1, default -1): slots at or below it are padding, as the
    negative ones are by default (vLLM reserves slot 0, its null block, as padding:
    ``null_slot=0`` reads its slot table as it is, with no per-step transform).
    cu_seqlens ([N + 1] int32/int64, optional): the offsets of the N sequences in an
    engine's packed [1, N * T] stream, which must be [0, T, ..., N T] (one launch's rows):
    host values are checked (ValueError); device ones in the kernel, which traps where
    they differ (a device-side error, as a failed device assert), with no host work.
    Returns o [N, T, HV, V] in v's dtype (written into ``out`` when given).
    The state is kept in fp32 across the tokens of a call and rounded to the
    pool's dtype only when stored. backend: as for ``kda_forward`` ("cuda",
    "reference", "model", "emulate"; None picks by array type).
    Host (NumPy) indices are checked (``< P``, no slot written twice); device
    indices are not read by the host: a slot outside ``[0, P)`` pads (or skips
    its store) and ``num_accepted_tokens`` is clamped to ``[1, T]`` in the kernel,
    but a slot that two sequences write (or one reads while another writes)
    races across CTAs and the result is undefined: distinct slots are the
    caller's duty there. FLA's and FlashInfer's keywords raise a TypeError that
    names kdacupy's spelling.

    Tree speculative verify and step states (docs/design.md section 7.1):
    step_states: [R, S, HV, V, K] ("vk"; "kv": [R, S, HV, K, V]), S >= T, float32 or
    bfloat16: the state after token t of sequence n is written to
    ``step_states[step_state_indices[n], t]`` (``step_state_indices`` [N] int32/int64;
    None: row n; a negative row: no step states for that sequence).
    parent_indices: [N, T] int32/int64, with [N] state_indices and step_states: token t >= 1
    starts from the state after token ``parent_indices[n, t]`` of its draft (a value in
    [-1, t); -1: from the start slot's state, like token 0, whose entry is not read). SGLang's
    ``retrieve_parent_token``. A parent other than t - 1 is read back from its step state, so
    a bfloat16 step buffer rounds the state there; with a float32 one every root-to-leaf path
    gives, to the bit, that path run alone.
    update_pool: False leaves the pool unwritten (the engine commits the accepted path's step
    state itself; SGLang's ``disable_state_update=True``); True writes as above (in a tree, the
    last token's state goes to idx[n]). Padded sequences write no step states. Host values are
    checked (parents in range, rows < R, distinct, one per live sequence of a tree); on the
    device a parent outside [-1, t) reads as -1 and a row outside [0, R) as none (the tokens
    then run as a chain). One launch, no host synchronisation: capturable in a CUDA graph.
    """
    if unknown:
        check_keywords(unknown, "kda_decode", DECODE_KEYWORDS)
    options = (scale, qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, backend, update_pool,
               null_slot)
    arrays = (q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens, out, A_log, dt_bias, parent_indices,
              step_states, step_state_indices, cu_seqlens)
    key = fastpath.call_key(arrays, options)
    call = None if key is None else fastpath.lookup(key)
    if call is not None:
        ptrs = call.checked(arrays)
        if ptrs is not None:
            return call.launch(arrays, ptrs)

    problem, a = validate(
        q, k, v, g, beta, scale=scale, initial_state=None, output_final_state=False, cu_seqlens=None,
        qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval, gate=gate,
        A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_layout=state_layout, state_dtype=None,
        state_precision="fp32", out=out, backend=backend, path="decode")
    null_slot = check_null_slot(null_slot)
    cu = check_decode_offsets(cu_seqlens, N=problem.N, T=problem.T, device=problem.device)
    pool, idx, acc, pool_arr = validate_pool(state_pool, state_indices, num_accepted_tokens, problem, a,
                                             T=problem.T, null_slot=null_slot)
    host = not is_device(idx) and (acc is None or not is_device(acc))  # start slots the host may read
    steps, parents, step_arr, rows, update_pool = validate_steps(
        parent_indices, step_states, step_state_indices, update_pool, problem=problem, pool=pool, idx=idx,
        start=decode_plan(idx, acc, problem.N, problem.T, pool.P, null_slot=null_slot)[0] if host else None,
        arrays=dict(a, state_pool=pool_arr))
    pool = replace(pool, update=update_pool, steps=steps)
    if problem.backend in ("cuda", "emulate"):
        checked = (a["q"], a["k"], a["v"], a["g"], a["beta"], pool_arr, idx, acc, a["out"], a["A_log"],
                   a["dt_bias"], parents, step_arr, rows, cu)
        call = fastpath.DecodeCall(problem, pool, checked)
        if key is not None and all(x is y for x, y in zip(checked, arrays)):
            fastpath.store(key, call)  # the arrays were used as given: the next call with this key may skip this
        return call.launch(checked, [call._ptr(x) for x in checked])

    options = dict(
        state_pool=pool_arr, state_indices=idx, num_accepted_tokens=acc, scale=problem.scale,
        qk_l2norm=problem.qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval, gate=gate,
        A_log=a["A_log"], dt_bias=a["dt_bias"], lower_bound=problem.lower_bound, state_layout=problem.state_layout,
        parent_indices=parents, step_states=step_arr, step_state_indices=rows, update_pool=update_pool,
        null_slot=null_slot)
    if problem.backend == "model":
        from .numerics.decode_model import kda_decode_model
        o = kda_decode_model(a["q"], a["k"], a["v"], a["g"], a["beta"], **options)
    else:
        from .numerics.decode_reference import kda_decode_reference
        o = kda_decode_reference(a["q"], a["k"], a["v"], a["g"], a["beta"], **options)
        o = o.astype(np.float32).astype(problem.dtype)
    if a["out"] is not None:
        a["out"][...] = o
        o = a["out"]
    return o

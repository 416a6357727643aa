"""SGLang's vendored KDA ops on kdacupy: ``chunk_kda`` (prefill / extend) and
``fused_sigmoid_gating_delta_rule_update`` (decode) with SGLang's signatures, defaults,
state layout and return values; ``patch()`` swaps them into SGLang's op modules (and every
loaded SGLang module holding them, e.g. its KDA kernel backend), ``unpatch()`` restores
SGLang's.

Matched revision (SGLang's public repository): ``chunk_kda`` of
``python/sglang/kernels/ops/attention/fla/kda.py`` at 2cd7fdddeda38d5df2e08b34331979474fed8ae0
and ``fused_sigmoid_gating_delta_rule_update`` of
``python/sglang/kernels/ops/attention/fla/fused_sigmoid_gating_recurrent.py`` at
7e1816db07b10f1e1cd0ecc6b7095725bf31f45e, with the ``lower_bound`` keyword (after ``is_kda``)
that the later revisions of that file add; called as
``python/sglang/srt/layers/attention/linear/kernels/kda_triton.py`` at
007d1d93beabe99478bc855e6ccdc4ac0bfcdf7d calls them (``extend``, ``decode``,
``target_verify``). Older SGLang keeps the same functions under
``sglang.srt.layers.attention.fla``; ``patch()`` covers both homes.

SGLang's calls, as kdacupy does them:
- the pool is ``[P, HV, V, K]`` and is updated in place; ``chunk_kda`` returns ``o`` only;
- a slot of -1 is padding: the pool is neither read nor written (SGLang computes that row's
  output from a zero state; kdacupy returns zeros there: nothing reads it);
- ``A_log`` (HV elements: the layer's ``[1, 1, H, 1]`` parameter) switches the gate on: g is
  then the raw gate, ``-exp(A_log) * softplus(g + dt_bias)``, bounded
  ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` with ``lower_bound``; without A_log g is
  the log decay. ``dt_bias`` has HV * K elements;
- decode passes the raw gate ``a`` flat ([T, HV * K], [B, T, HV * K] or [B, T, HV, K]) and beta
  logits ``b``; ``is_kda=False`` (GDN, one gate per head: a [.., HV], dt_bias [HV]) runs as KDA
  with the gate repeated over K. Sequences are packed with ``cu_seqlens`` of equal lengths
  (one ``kdacupy.kda_decode`` launch); each starts from ``idx[n]`` and its final state goes back
  there. A softplus other than SGLang's (softplus_beta 1, threshold >= 15, where kdacupy's kernel
  gives the same float32 values) is computed by torch ops and passed as the log decay.
Prefill keeps the state in fp32 through the chunks (``state_precision="fp32"``), as SGLang's
Triton kernels hold it.

``fused_recurrent_kda_packed_decode`` (``python/sglang/kernels/ops/attention/fla/fused_recurrent.py`` at
047d31af2516212c09b8ce356fae8298ba8526d7: one token per request, q, k, v packed in one row) is the
same decode on views of the packed rows; ``kda_gate_chunk_cumsum`` (FLA's, which SGLang's chunked
prefill and kernel tests call) is the gate and its chunk-local cumulative sum as torch ops.
``output_intermediate_states=True`` returns ``(o, h)``, h the state entering every 64-token
chunk (kda_forward's checkpoints). target_verify (``retrieve_parent_token``,
``intermediate_states_buffer`` [.., cache_steps, HV, V, K], ``intermediate_state_indices``,
``disable_state_update``) is kda_decode's tree verify, one launch; a padded row (-1) writes no
intermediate states (SGLang runs it from zeros; nothing reads them).
What kdacupy cannot honour raises an error that names it: a tree or rows without the
buffer, ``cache_steps`` < T, a pool call without a pool or its indices, unequal decode lengths, and unknown
keywords (SGLang's ``**kwargs`` drops them silently). ``dt_bias`` or ``lower_bound`` without
``A_log`` raise, naming A_log (SGLang ignores them).
"""
from __future__ import annotations

from kdacupy.torch import kda as _kda
from kdacupy.torch.decode_cache import front, front_key
from kdacupy.torch.tensors import FLOAT32, chunk_cumsum

from .gate import SOFTPLUS_THRESHOLD, activate, kernel_gate
from .patching import Patcher
from .pool import caller_names, index_tensor, overlaps, rows, sequences, step, tensors

__all__ = ["chunk_kda", "fused_sigmoid_gating_delta_rule_update", "fused_recurrent_kda_packed_decode",
           "kda_gate_chunk_cumsum", "patch", "unpatch"]


def _refuse_unknown(fn, kwargs):
    if kwargs:
        name = next(iter(kwargs))
        raise TypeError(f"{fn}() got an unexpected keyword argument {name!r} (SGLang's **kwargs drops keywords it "
                        f"does not know; kdacupy.compat.sglang refuses them, so a misspelt option is not dropped)")


def _need_pool(fn, pool, idx, pool_name, idx_name):
    for name, x in ((pool_name, pool), (idx_name, idx)):
        if x is None:
            raise ValueError(f"{name}: {fn}() runs on the state pool [P, HV, V, K] and its slots (updated in "
                             f"place), got None")


def _gate(fn, A_log, dt_bias, lower_bound):
    """SGLang's gate switch: A_log given means g is the raw gate."""
    if A_log is None:
        for name, x in (("dt_bias", dt_bias), ("lower_bound", lower_bound)):
            if x is not None:
                raise ValueError(f"{name}: {fn}() applies dt_bias and lower_bound only with A_log (SGLang reads g "
                                 f"as the raw gate when A_log is given, else as the log decay, and drops {name} "
                                 f"silently): pass A_log or leave {name} out")
        return dict(gate="log")
    return kernel_gate(A_log, dt_bias, lower_bound)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, initial_state_indices=None,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, A_log=None, dt_bias=None, lower_bound=None,
              output_intermediate_states=False, **kwargs):
    """SGLang's ``chunk_kda`` (extend): sequence n starts from ``initial_state[idx[n]]`` and its
    final state is written back there in place; returns o."""
    _refuse_unknown("chunk_kda", kwargs)
    tensors(dict(q=q, k=k, v=v, g=g), dict(beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens, A_log=A_log,
                                           dt_bias=dt_bias))
    _need_pool("chunk_kda", initial_state, initial_state_indices, "initial_state", "initial_state_indices")
    opts = dict(scale=scale, qk_l2norm=use_qk_l2norm_in_kernel, state_layout="vk", state_precision="fp32",
                **_gate("chunk_kda", A_log, dt_bias, lower_bound))
    if output_intermediate_states:
        return _extend_with_chunk_states(q, k, v, g, beta, initial_state, initial_state_indices, cu_seqlens, opts)
    with caller_names(state_pool="initial_state", state_indices="initial_state_indices"):
        o, _ = _kda(q, k, v, g, beta, cu_seqlens=cu_seqlens, state_pool=initial_state,
                    state_indices=initial_state_indices, **opts)
    return o


def _extend_with_chunk_states(q, k, v, g, beta, pool, idx, cu_seqlens, opts):
    """``chunk_kda(..., output_intermediate_states=True)``: SGLang then also returns the state
    entering every 64-token chunk, h [B, NT, HV, V, K] in q's dtype (prefix caching): kda_forward's
    checkpoints every 64 tokens, each sequence's first chunk its slot's state (zeros for -1)."""
    from kdacupy.torch.states import forward_with_chunk_states
    idx = index_tensor("initial_state_indices", idx)
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if idx.dim() != 1 or idx.shape[0] != N:
        raise ValueError(f"initial_state_indices: expected [N] = [{N}] slots (one per sequence), got "
                         f"{tuple(idx.shape)}")
    # the slots' states gathered on the device, out-of-range slots read as padding (zeros), as the
    # kernels treat device slots outside [0, P); host slots past the pool are refused by kda_forward
    P = pool.shape[0]
    real = (idx >= 0) & (idx < P)
    initial = pool[idx.clamp(0, max(P - 1, 0))] * real.reshape(-1, 1, 1, 1).to(pool.dtype)
    with caller_names(state_pool="initial_state", state_indices="initial_state_indices"):
        o, _, h = forward_with_chunk_states(q, k, v, g, beta, chunk=64, cu_seqlens=cu_seqlens, opts=opts,
                                            initial=initial, state_pool=pool, state_indices=idx)
    return o, h


def _shaped(x, shape):
    """x in ``shape`` (no reshape where it has it: each costs microseconds of a decode step)."""
    return x if x.shape == shape else x.reshape(shape)


def _decode_gate(a, A_log, dt_bias, lower_bound, softplus_beta, softplus_threshold, is_kda, shape):
    """(g [B, T, HV, K], gate options) for the decode call's raw gate ``a``."""
    B, T, HV, K = shape
    per_token = HV * K if is_kda else HV
    if a.numel() != B * T * per_token:
        raise ValueError(f"a: expected the raw gate of the {B * T} tokens, {per_token} values each ([T, "
                         f"{'HV * K' if is_kda else 'HV'}] or [B, T, ...]), got shape {tuple(a.shape)}")
    if is_kda:
        g, dtb = _shaped(a, (B, T, HV, K)), dt_bias
    else:  # GDN: one gate per head, repeated over the key channels
        g = a.reshape(B, T, HV, 1).expand(B, T, HV, K)
        dtb = None if dt_bias is None else dt_bias.reshape(HV, 1).expand(HV, K)
    if lower_bound is not None or (softplus_beta == 1.0 and softplus_threshold >= SOFTPLUS_THRESHOLD):
        return g, kernel_gate(A_log, dtb, lower_bound)
    return activate(g, A_log, dtb, None, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold), \
        dict(gate="log")


def fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                                           initial_state_source, initial_state_indices, scale=None,
                                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, is_kda=False,
                                           lower_bound=None, disable_state_update=False,
                                           intermediate_states_buffer=None, intermediate_state_indices=None,
                                           cache_steps=None, retrieve_parent_token=None):
    """SGLang's decode step on the pool ``initial_state_source`` [P, HV, V, K]: the gate from the
    raw ``a`` and A_log / dt_bias (/ lower_bound), beta = sigmoid(b), one ``kdacupy.kda_decode``
    launch; sequence n starts from slot ``initial_state_indices[n]`` and its state after its
    tokens is written back there (-1: padding). Returns o [B, T, HV, V]."""
    fn = "fused_sigmoid_gating_delta_rule_update"
    tensors(dict(a=a, q=q, k=k, v=v, b=b), dict(A_log=A_log, dt_bias=dt_bias, initial_state_source=initial_state_source,
                                               cu_seqlens=cu_seqlens))
    if initial_state_indices is not None:
        initial_state_indices = index_tensor("initial_state_indices", initial_state_indices)
    fkey = None
    if not disable_state_update and intermediate_states_buffer is intermediate_state_indices is cache_steps \
            is retrieve_parent_token is None:  # a decode step (target_verify maps its arguments every call)
        raw = (a, q, k, v, b, initial_state_source, initial_state_indices)
        fkey = front_key(fn, raw + (cu_seqlens,), (A_log, dt_bias), (softplus_beta, softplus_threshold, scale,
                                                                     use_qk_l2norm_in_kernel, is_kda, lower_bound))
        o = front(fkey, raw + (A_log, dt_bias), v, initial_state_source, cu_seqlens)
        if o is not None:  # this call, as the engine makes it, seen before: its step's launch
            return o
    _need_pool(fn, initial_state_source, initial_state_indices, "initial_state_source", "initial_state_indices")
    rows(q, k, v, None, None)
    N, T, cu = sequences(q, cu_seqlens)
    B, TT, HV, K = q.shape[0], q.shape[1], v.shape[2], q.shape[3]
    g, gate = _decode_gate(a, A_log, dt_bias, lower_bound, softplus_beta, softplus_threshold, is_kda, (B, TT, HV, K))
    opts = dict(scale=scale, qk_l2norm=use_qk_l2norm_in_kernel, beta_sigmoid=True, state_layout="vk", **gate)
    if b.numel() != B * TT * HV:
        raise ValueError(f"b: expected the beta logits of the {B * TT} tokens, HV = {HV} each, got shape "
                         f"{tuple(b.shape)}")
    beta = _shaped(b, (B, TT, HV))
    if disable_state_update or not (intermediate_states_buffer is intermediate_state_indices is cache_steps
                                    is retrieve_parent_token is None):
        return _target_verify(q, k, v, g, beta, initial_state_source, initial_state_indices, N, T, opts,
                              disable_state_update=disable_state_update,
                              intermediate_states_buffer=intermediate_states_buffer,
                              intermediate_state_indices=intermediate_state_indices, cache_steps=cache_steps,
                              retrieve_parent_token=retrieve_parent_token, cu_seqlens=cu)
    with caller_names(state_pool="initial_state_source", state_indices="initial_state_indices"):
        return step(q, k, v, g, beta, initial_state_source, initial_state_indices, None, N, T, opts, front=fkey,
                    raw=(a, q, k, v, b, initial_state_source, initial_state_indices), cu_seqlens=cu)


def _target_verify(q, k, v, g, beta, pool, idx, N, T, opts, *, disable_state_update, intermediate_states_buffer,
                   intermediate_state_indices, cache_steps, retrieve_parent_token, cu_seqlens):
    """SGLang's target_verify mode (EAGLE tree speculative verify): token t > 0 starts from the
    state after its parent ``retrieve_parent_token[n, t]``, the state after every step goes to
    ``intermediate_states_buffer[intermediate_state_indices[n], t]`` ([HV, V, K]; ``cache_steps``
    steps per row), and ``disable_state_update=True`` leaves the pool untouched until the engine
    commits the accepted path: kda_decode's parent_indices, step_states (the buffer as
    [R, cache_steps, HV, V, K] rows), step_state_indices and update_pool, one launch. SGLang reads
    no tree without a buffer; kdacupy refuses retrieve_parent_token there, naming it."""
    from kdacupy.torch.states import verify
    steps = None
    if intermediate_states_buffer is not None:
        if cache_steps is None or cache_steps < T:
            raise ValueError(f"cache_steps: expected the steps per row of intermediate_states_buffer, >= T = {T}, "
                             f"got {cache_steps}")
        if not intermediate_states_buffer.is_contiguous():
            raise ValueError("intermediate_states_buffer: expected a contiguous buffer of [HV, V, K] states "
                             f"(rows of cache_steps), got strides {intermediate_states_buffer.stride()}")
        steps = intermediate_states_buffer.view((-1, cache_steps) + tuple(pool.shape[1:]))
    else:
        for name, x in (("retrieve_parent_token", retrieve_parent_token),
                        ("intermediate_state_indices", intermediate_state_indices)):
            if x is not None:
                raise ValueError(f"{name}: expected None without intermediate_states_buffer (SGLang then reads no "
                                 f"tree and no rows: the parents' states live in that buffer)")
    return verify(q, k, v, g, beta, pool, idx, N, T, opts, parents=retrieve_parent_token, steps=steps,
                  rows=intermediate_state_indices, update_pool=not disable_state_update, cu_seqlens=cu_seqlens)


def _tensor(fn, name, x, dims=None):
    tensors({name: x})
    if dims is not None and x.dim() != dims:
        raise ValueError(f"{name}: {fn}() expected a {dims}-D tensor, got shape {tuple(x.shape)}")


def fused_recurrent_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                                      use_qk_l2norm_in_kernel=False, lower_bound=None):
    """SGLang's one-token KDA decode from the packed post-convolution projection: ``mixed_qkv``
    [B, 2 * H * K + HV * V] (q, k, v side by side), the raw gate ``a`` [B, HV * K], beta logits ``b``
    [B, HV], ``A_log`` [HV], ``dt_bias`` [HV * K]; the pool ``initial_state`` [P, HV, V, K] updated in
    place at ``ssm_state_indices`` [B] (-1: skipped, zero output); o written into ``out``
    [B, 1, HV, V]. Returns ``(out, initial_state)``. One ``kdacupy.kda_decode`` launch on views of
    ``mixed_qkv`` (no copy of it), as ``fused_sigmoid_gating_delta_rule_update`` with ``is_kda=True``.
    Every argument is checked before the pool or ``out`` is written."""
    fn = "fused_recurrent_kda_packed_decode"
    for name, x, dims in (("mixed_qkv", mixed_qkv, 2), ("a", a, 2), ("b", b, 2), ("A_log", A_log, None),
                          ("dt_bias", dt_bias, None), ("initial_state", initial_state, 4), ("out", out, 4)):
        _tensor(fn, name, x, dims)
    idx = index_tensor("ssm_state_indices", ssm_state_indices)
    B = mixed_qkv.shape[0]
    HV, V, K = initial_state.shape[1:]
    if idx.shape != (B,):
        raise ValueError(f"ssm_state_indices: expected [B] = [{B}] slots, got {tuple(idx.shape)}")
    for name, x, want in (("a", a, (B, HV * K)), ("b", b, (B, HV)), ("out", out, (B, 1, HV, V))):
        if tuple(x.shape) != want:
            raise ValueError(f"{name}: expected shape {want}, got {tuple(x.shape)}")
    for name, x, n in (("A_log", A_log, HV), ("dt_bias", dt_bias, HV * K)):
        if x.numel() != n:
            raise ValueError(f"{name}: expected {n} elements, got {x.numel()}")
    qk = mixed_qkv.shape[1] - HV * V
    if qk <= 0 or qk % (2 * K) or HV % (qk // (2 * K)):
        raise ValueError(f"mixed_qkv: expected a last dim of 2 * H * K + HV * V with K = {K}, HV = {HV}, V = {V} "
                         f"and HV a multiple of H, got {mixed_qkv.shape[1]}")
    if out.dtype != mixed_qkv.dtype:
        raise TypeError(f"out: expected mixed_qkv's dtype {mixed_qkv.dtype}, got {out.dtype}")
    for name, x in (("mixed_qkv", mixed_qkv), ("a", a), ("b", b), ("initial_state", initial_state),
                    ("ssm_state_indices", idx)):
        if overlaps(out, x):
            raise ValueError(f"out: expected memory separate from {name}, got a tensor overlapping {name}")
    H = qk // (2 * K)
    q = mixed_qkv[:, :H * K].view(B, 1, H, K)
    k = mixed_qkv[:, H * K:2 * H * K].view(B, 1, H, K)
    v = mixed_qkv[:, 2 * H * K:].view(B, 1, HV, V)
    o = fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, initial_state, idx,
                                               scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                               is_kda=True, lower_bound=lower_bound)
    out.copy_(o.reshape(out.shape))
    return out, initial_state


def kda_gate_chunk_cumsum(g, A_log, chunk_size, scale=None, dt_bias=None, cu_seqlens=None,
                          output_dtype=FLOAT32, chunk_indices=None, lower_bound=None, **kwargs):
    """The chunked prefill's fused gate (FLA's ``kda_gate_chunk_cumsum``, which SGLang's KDA kernels and
    kernel tests call): the gate of raw ``g`` [B, T, H, K] (``-exp(A_log) * softplus(g + dt_bias)``, or
    ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``), summed cumulatively within each
    ``chunk_size``-token chunk of each sequence (``cu_seqlens``: B = 1, chunks restart at every
    sequence), times ``scale``; float32 arithmetic (torch ops), ``output_dtype`` out. A_log: H
    elements; dt_bias: H * K. ``chunk_indices`` (FLA's precomputed chunk table) is not needed."""
    fn = "kda_gate_chunk_cumsum"
    _refuse_unknown(fn, kwargs)
    _tensor(fn, "g", g, 4)
    _tensor(fn, "A_log", A_log)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1 or \
            chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size: expected a power of 2, got {chunk_size!r}")
    if cu_seqlens is not None:
        cu_seqlens = index_tensor("cu_seqlens", cu_seqlens)
        if g.shape[0] != 1:
            raise ValueError(f"g: expected batch size 1 with cu_seqlens (packed sequences), got {g.shape[0]}")
    B, T, H, K = g.shape
    if A_log.numel() != H or (dt_bias is not None and dt_bias.numel() != H * K):
        raise ValueError(f"{'A_log' if A_log.numel() != H else 'dt_bias'}: expected {H if A_log.numel() != H else H * K}"
                         f" elements (H = {H}, K = {K})")
    gate = activate(g, A_log, dt_bias, lower_bound)
    out = chunk_cumsum(gate, chunk_size, cu_seqlens)
    if scale is not None:
        out = out * scale
    return out.to(output_dtype or g.dtype)


_HOMES = ("sglang.kernels.ops.attention.fla.kda", "sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent",
          "sglang.kernels.ops.attention.fla.fused_recurrent", "sglang.kernels.ops.attention.fla.gate",
          "sglang.srt.layers.attention.fla.kda", "sglang.srt.layers.attention.fla.fused_sigmoid_gating_recurrent",
          "sglang.srt.layers.attention.fla.fused_recurrent")
_PATCHER = Patcher("sglang", _HOMES, {"chunk_kda": chunk_kda,
                                      "fused_sigmoid_gating_delta_rule_update": fused_sigmoid_gating_delta_rule_update,
                                      "fused_recurrent_kda_packed_decode": fused_recurrent_kda_packed_decode,
                                      "kda_gate_chunk_cumsum": kda_gate_chunk_cumsum})


def patch():
    """Swap kdacupy's functions into SGLang's KDA op modules (``sglang.kernels.ops.attention.fla``'s
    ``kda`` and ``fused_sigmoid_gating_recurrent``, or the older ``sglang.srt.layers.attention.fla``
    ones, whichever import) and every loaded ``sglang`` module holding SGLang's function under its
    name (the kernel backends import them by name). Calling it again does nothing; ``unpatch()``
    restores SGLang's. Both SGLang's KDA and GDN (Qwen3-Next) decode call the decode function:
    kdacupy serves both."""
    _PATCHER.patch()


def unpatch():
    """Restore SGLang's functions where ``patch()`` replaced them."""
    _PATCHER.unpatch()

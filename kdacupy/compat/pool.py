"""The decode / verify step the engines' pool calls share: packed equal-length sequences as
``[N, T, ...]`` rows for one ``kdacupy.torch.kda_decode`` launch, the engines' slot indices
as kdacupy's (docs/design.md section 7.1), and results written into a caller's ``out``."""
from __future__ import annotations

import contextlib

from kdacupy.torch import decode_cache, kda_decode
from kdacupy.torch.tensors import index_tensor, is_tensor, tensors  # noqa: F401  (the faces' checks)


def sequences(q, cu_seqlens):
    """(N, T, device cu_seqlens or None): the number of sequences, their common length, and the
    offsets for the kernel to check. Without ``cu_seqlens`` q is [N, T, ...]; with it q is packed
    [1, N*T, ...] and every sequence must hold T tokens: host ``cu_seqlens`` are checked here,
    device ones by the decode kernel itself (a device-side trap where they differ), so a step
    launches nothing else."""
    B, TT = q.shape[0], q.shape[1]
    if cu_seqlens is None:
        return B, TT, None
    if B != 1:
        raise ValueError(f"q: expected batch size 1 with cu_seqlens (packed sequences), got {B}")
    N = cu_seqlens.shape[0] - 1
    if N < 1 or TT % N:
        raise ValueError(f"cu_seqlens: expected N >= 1 sequences of equal length (one pool step), got {N} "
                         f"sequences for {TT} tokens")
    if cu_seqlens.get_device() >= 0:
        return N, TT // N, cu_seqlens
    decode_cache.check_lengths(cu_seqlens, TT // N)
    return N, TT // N, None


def step(q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts, front=None, raw=(), cu_seqlens=None):
    """One ``kda_decode`` launch over N sequences of T tokens; o in v's shape. ``idx``: kdacupy's
    [N] slots (start from and write the final state back to idx[n]) or [N, T] slots (start from
    idx[n, a_n - 1], the state after token t to idx[n, t]); padding as ``opts["null_slot"]`` says
    (default: negative slots); ``cu_seqlens``: device offsets for the kernel to check (sequences).
    ``front``: the engine call's own key (``decode_cache.front_key`` over its tensors ``raw``),
    which then finds this step without mapping its arguments again."""
    if T == 0:
        return v.new_zeros(v.shape)
    o, key = decode_cache.cached(q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts, cu_seqlens)
    if o is None:  # not a call signature seen before (kdacupy/torch/decode_cache.py)
        split = lambda x: None if x is None else x.reshape((N, T) + tuple(x.shape[2:]))  # noqa: E731
        o = kda_decode(split(q), split(k), split(v), split(g), split(beta), state_pool=pool, state_indices=idx,
                       num_accepted_tokens=num_accepted_tokens, cu_seqlens=cu_seqlens, **opts).reshape(v.shape)
        decode_cache.remember(key, q, k, v, g, beta, pool, idx, num_accepted_tokens, N, T, opts, cu_seqlens)
    if front is not None:
        decode_cache.alias(front, key, T, raw, (q, k, v, g, beta, pool, idx, num_accepted_tokens))
    return o


def rows(q, k, v, g, beta, names=("q", "k", "v", "g", "beta")):
    """The per-token tensors' ranks and shapes (q, k [B, T, H, K]; v [B, T, HV, V] with HV a multiple
    of H; g [B, T, HV, K]; beta [B, T, HV]; g or beta None: not checked), before a face derives
    anything from them (sequence counts, out's shape, reshapes); ``names``: the caller's spellings.
    A ValueError naming the first that does not fit."""
    n = dict(zip(("q", "k", "v", "g", "beta"), names))
    for key, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        if x is not None and x.dim() != 4:
            raise ValueError(f"{n[key]}: expected a 4-D tensor [B, T, heads, head dim], got shape {tuple(x.shape)}")
    B, T, H, K = q.shape
    HV = v.shape[2]
    if k.shape != q.shape:
        raise ValueError(f"{n['k']}: expected q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if tuple(v.shape[:2]) != (B, T) or HV % H:
        raise ValueError(f"{n['v']}: expected shape ({B}, {T}, HV, V) with HV a multiple of H = {H}, got "
                         f"{tuple(v.shape)}")
    if g is not None and tuple(g.shape) != (B, T, HV, K):
        raise ValueError(f"{n['g']}: expected shape {(B, T, HV, K)} ([B, T, HV, K]), got {tuple(g.shape)}")
    if beta is not None and tuple(beta.shape) != (B, T, HV):
        raise ValueError(f"{n['beta']}: expected shape {(B, T, HV)} ([B, T, HV]), got {tuple(beta.shape)}")


@contextlib.contextmanager
def caller_names(**names):
    """kdacupy's argument names in errors raised inside, as the caller spelled them (e.g.
    ``state_indices`` -> ``ssm_state_indices``): an error names the argument the caller passed."""
    try:
        yield
    except (ValueError, TypeError) as e:
        head, sep, rest = str(e).partition(":")
        if not sep or head not in names or names[head] == head:
            raise
        try:
            renamed = type(e)(f"{names[head]}:{rest}")
        except Exception:  # noqa: BLE001  (an exception type with another constructor)
            raise e from None
        raise renamed from e


def token_slots(idx, T, num_accepted_tokens, name="ssm_state_indices"):
    """FLA's (and vLLM's copy of FLA's) slot tables as kdacupy's: ``[N]`` slots for one token per
    sequence, ``[N, C]`` slots (C >= T, the first T used) with ``num_accepted_tokens``. Their
    kernels write token t's state to slot ``idx[n * C + t]``, which for ``[N]`` slots and T > 1
    is ``idx[n + t]``, another sequence's slot: that use is refused."""
    idx = index_tensor(name, idx)
    if idx.dim() == 1:
        if T != 1:
            raise NotImplementedError(f"{name}: [N] slots serve one token per sequence (FLA's kernel, and vLLM's "
                                      f"copy of it, then write token t's state to {name}[n + t]); for T = {T} "
                                      f"tokens pass [N, T] slots")
        if num_accepted_tokens is not None:
            raise ValueError(f"num_accepted_tokens: expected None with [N] {name} (it picks the start slot among "
                             f"[N, T] ones)")
        return idx
    if idx.dim() != 2 or idx.shape[1] < T:
        raise ValueError(f"{name}: expected [N] slots or [N, C] slots with C >= T = {T}, got {tuple(idx.shape)}")
    return idx[:, :T]


def _span(x) -> tuple:
    """The bytes a torch tensor view covers: [first, end)."""
    first = x.data_ptr()
    if x.is_contiguous():
        return first, first + x.nbytes
    last = sum((n - 1) * st for n, st in zip(x.shape, x.stride())) if x.numel() else -1
    return first, first + (last + 1) * x.element_size()


def check_out(out, like, **inputs) -> None:
    """A caller's ``out=`` (FLA's and vLLM's), checked before anything runs or is written: a tensor of
    the shape and dtype of ``like`` (v: o's), apart from every input (a step would read what it writes)."""
    if out is None:
        return
    if not (hasattr(out, "shape") and hasattr(out, "dtype") and hasattr(out, "data_ptr")):
        raise TypeError(f"out: expected a tensor of v's shape and dtype, got {type(out).__name__}")
    if tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"out: expected the shape of v {tuple(like.shape)}, got {tuple(out.shape)}")
    if out.dtype != like.dtype:
        raise TypeError(f"out: expected v's dtype {like.dtype} (o's), got {out.dtype}")
    for name, x in inputs.items():
        if x is not None and overlaps(out, x):
            raise ValueError(f"out: expected memory separate from {name}, got a tensor overlapping {name}")


def overlaps(a, b) -> bool:
    """Do two torch tensors' byte spans meet (on one device)?"""
    if not hasattr(b, "data_ptr") or a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def into(out, o):
    """o written into the caller's ``out`` when one is given (FLA's and vLLM's ``out=``)."""
    if out is None:
        return o
    out.copy_(o)
    return out

"""Tree verify and chunk-boundary states on torch tensors, for the engines' calls (kdacupy.compat) (docs/design.md section
7.1): ``kdacupy.kda_decode``'s ``parent_indices`` / ``step_states`` / ``update_pool`` and
``kdacupy.kda_forward``'s checkpoints, called through the torch bridge (CUDA tensors on torch's
current stream, zero-copy; CPU tensors on the NumPy backends), results in torch tensors.

FLA's and SGLang's h [B, NT, HV, ., .] is the state entering each ``chunk``-token chunk of each
sequence, its chunks consecutive (varlen: sequence n's first chunk after all the chunks of the
sequences before it), a sequence's first being its initial state. kda_forward writes boundary j
(the state after j * chunk tokens) of sequence n to the row of its chunk j, for the chunks that
exist (``chunk_rows``); the initial rows are copied in here before the forward runs.
"""
from __future__ import annotations

import numpy as np
import torch

import kdacupy
from .bridge import numpy_dtype, on_torch_stream, to_array, to_tensor
from .tensors import CONVERTED_PARAM_DTYPES


def _params(opts):
    """The options with the gate parameters as the kernels read them (as kdacupy.torch does):
    [HV] A_log from a model's [1, 1, HV, 1], float32 from bf16 / fp16, C-contiguous arrays."""
    out = dict(opts)
    for n in ("A_log", "dt_bias"):
        x = out.get(n)
        if x is not None:
            if n == "A_log" and x.dim() == 4:
                x = x.reshape(-1)
            out[n] = to_array((x.float() if x.dtype in CONVERTED_PARAM_DTYPES else x).contiguous())
    return out


def _rows(x):
    """Strided rows as they are when the last dim is contiguous (kdacupy reads them so)."""
    return x if x is None or x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _array(x):
    """Tensors as their arrays, torch dtypes as NumPy's, the rest as given."""
    if isinstance(x, torch.Tensor):
        return to_array(x)
    return numpy_dtype(x) if isinstance(x, torch.dtype) else x


def inference_mode() -> bool:
    return torch.is_inference_mode_enabled()


def verify(q, k, v, g, beta, pool, idx, N, T, opts, *, parents, steps, rows, update_pool, cu_seqlens=None):
    """One ``kda_decode`` launch over N sequences of T tokens (q.. packed [B, TT, ...] rows) with
    tree parents, step states and update_pool (``cu_seqlens``: device offsets the kernel checks);
    returns o in v's shape."""
    split = lambda x: None if x is None else _rows(x).reshape((N, T) + tuple(x.shape[2:]))  # noqa: E731
    o = torch.empty((N, T) + tuple(v.shape[2:]), dtype=v.dtype, device=v.device)
    if N and T:
        with on_torch_stream(q.device):
            kdacupy.kda_decode(*(to_array(split(x)) for x in (q, k, v, g, beta)), state_pool=to_array(pool),
                               state_indices=_array(idx), parent_indices=_array(parents), step_states=_array(steps),
                               step_state_indices=_array(rows), update_pool=update_pool, out=to_array(o),
                               cu_seqlens=_array(cu_seqlens), **_params(opts))
        for x in (pool, steps):
            if x is not None:
                torch.autograd.graph.increment_version(x)
    return o.reshape(v.shape)


def chunk_rows(lengths, chunk):
    """(rows [N, J], first [N], NT): boundary j of sequence n (j = 1 .. J) to row first[n] + j
    where its chunk j exists, else -1; first[n] is its initial state's row; NT rows in all."""
    n_chunks = [-(-int(L) // chunk) for L in lengths]
    first = np.concatenate([[0], np.cumsum(n_chunks)[:-1]]).astype(int) if n_chunks else np.zeros(0, int)
    J = max([c - 1 for c in n_chunks] + [1])
    rows = [[int(first[n]) + j if j < n_chunks[n] else -1 for j in range(1, J + 1)] for n in range(len(n_chunks))]
    return torch.tensor(rows, dtype=torch.int64).reshape(len(n_chunks), J), first, n_chunks, int(sum(n_chunks))


def lengths_of(q, cu_seqlens):
    """Each sequence's length on the host (varlen: from cu_seqlens, read as FLA's and SGLang's
    chunk index preparation read it)."""
    if cu_seqlens is None:
        return [q.shape[1]] * q.shape[0]
    cu = [int(c) for c in cu_seqlens.tolist()]
    return [b - a for a, b in zip(cu[:-1], cu[1:])]


def forward_with_chunk_states(q, k, v, g, beta, *, chunk, cu_seqlens, opts, initial, **forward):
    """(o, final_state, h): kda_forward (``forward``: its pool / initial-state keywords) with h
    [B, NT, HV, ., .] (``opts["state_layout"]`` "vk": [.., V, K]) in q's dtype, the state entering
    every ``chunk``-token chunk. ``initial``: the sequences' initial states [N, HV, ., .] as they
    are before the forward (None: zeros), copied on their device. final_state as kda_forward
    returns it, a tensor or None."""
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    tail = (HV, V, K) if opts.get("state_layout") == "vk" else (HV, K, V)
    lengths = lengths_of(q, cu_seqlens)
    rows, first, n_chunks, NT = chunk_rows(lengths, chunk)
    store = torch.bfloat16 if q.dtype == torch.bfloat16 else torch.float32  # the checkpoints' dtypes
    h = torch.zeros((max(NT, 1),) + tail, dtype=store, device=q.device)
    live = [n for n in range(len(lengths)) if n_chunks[n]]
    if initial is not None and live:
        h[torch.as_tensor(first[live], device=q.device)] = initial[live].to(store)
    ck = dict(checkpoint_every=chunk, checkpoints=to_array(h), checkpoint_indices=to_array(rows.to(q.device)))
    o = torch.empty(tuple(v.shape), dtype=v.dtype, device=v.device)
    with on_torch_stream(q.device):
        _, final = kdacupy.kda_forward(
            *(to_array(_rows(x)) for x in (q, k, v, g, beta)), cu_seqlens=_array(cu_seqlens), out=to_array(o),
            **(ck if NT else {}), **_params(opts), **{n: _array(x) for n, x in forward.items()})
    B = q.shape[0] if cu_seqlens is None else 1
    h = h[:NT].reshape((B, NT // B) + tail)
    return o, to_tensor(final), (h if h.dtype == q.dtype else h.to(q.dtype))

"""Small tensor helpers for the faces built on kdacupy.torch (kdacupy/compat/), which keep
torch's own imports inside this package."""
from __future__ import annotations

import numpy as np
import torch


def fp32_state_dtype(q):
    """The final-state dtype FLA returns (float32); float64 for float64 inputs (the reference backend)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def slots(n, like):
    """int32 slots 0..n-1 on ``like``'s device: one state per sequence, in order."""
    return torch.arange(n, dtype=torch.int32, device=like.device)


def check_equal_lengths(cu_seqlens, T):
    """``cu_seqlens`` must be ``[0, T, 2T, ...]`` (every sequence T tokens). Host tensors are
    checked here (ValueError); device ones by an asynchronous device-side assert, which
    does not synchronise the host (a failure surfaces as a CUDA error at the next sync)."""
    expected = torch.arange(cu_seqlens.shape[0], device=cu_seqlens.device, dtype=cu_seqlens.dtype) * T
    if cu_seqlens.device.type == "cpu":
        if not torch.equal(cu_seqlens, expected):
            raise ValueError(f"cu_seqlens: expected {T} tokens in every sequence ([0, {T}, {2 * T}, ...]) with "
                             f"ssm_state_indices, got {cu_seqlens.tolist()}")
    else:
        torch._assert_async((cu_seqlens == expected).all(), f"cu_seqlens: expected {T} tokens in every sequence")


#: gate parameters (A_log, dt_bias) of these dtypes are converted to float32 before the kernels
#: read them: the one declaration that the conversion (api._gate_params, eager.gate_params) and
#: the decode cache's key (decode_cache._param_meta: their version, as a converted copy is kept) share
CONVERTED_PARAM_DTYPES = (torch.bfloat16, torch.float16)

#: the state dtypes the faces take (bf16 or fp32)
STATE_DTYPES = (torch.bfloat16, torch.float32)
#: the gate cumsum's output dtype by default (FLA's ``torch.float``)
FLOAT32 = torch.float32
no_grad = torch.no_grad


def tensors(required, optional=None):
    """Every array argument of a face call a torch tensor (``optional`` ones may be None): a
    TypeError naming the first that is not, before anything reads one (cheap: isinstance only,
    so a decode step's fast path may run it every call)."""
    for name, x in required.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
    for name, x in (optional or {}).items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor or None, got {type(x).__name__}")


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def index_tensor(name, x):
    """An engine's slot table as a torch integer tensor: tensors as given, lists of ints as int64
    tensors; anything else (floats, bools, other objects) refused, naming the argument."""
    x = _index_tensor(name, x)
    if x is None:
        raise ValueError(f"{name}: expected the pool slots of the sequences, got None")
    if x.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected an int32 or int64 tensor, got {x.dtype}")
    return x


def padding_slots(idx, null):
    """An engine's slot table with its null slots (at or below ``null``) as kdacupy's padding, -1."""
    return torch.where(idx <= null, torch.full_like(idx, -1), idx)


def zero_sequences(o, pad, cu_seqlens):
    """o [B, T, ...] with the rows of the sequences ``pad`` [N] marks zeroed: row n of B without
    ``cu_seqlens``, else the tokens of sequence n of the packed row (on o's device, no host sync)."""
    pad = pad.to(o.device)
    if cu_seqlens is None:
        return o.masked_fill(pad.reshape((-1,) + (1,) * (o.dim() - 1)), 0)
    N = pad.shape[0]
    if N == 0:
        return o
    cu = cu_seqlens.to(device=o.device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:], torch.arange(o.shape[1], device=o.device), right=True).clamp(max=N - 1)
    return o.masked_fill(pad[seq].reshape((1, -1) + (1,) * (o.dim() - 2)), 0)


def chunk_cumsum(x, BT, cu_seqlens):
    """Inclusive cumulative sums of x [B, T, H, K] along T within chunks of BT tokens (of each
    sequence with cu_seqlens): each token scattered to (its chunk, its place), one cumsum, gathered
    back; on x's device, no host sync (the chunk buffer is sized by its bound T / BT + N)."""
    B, T, H, K = x.shape
    if cu_seqlens is None:
        NT = -(-T // BT)
        padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, NT * BT - T))
        return padded.reshape(B, NT, BT, H, K).cumsum(2).reshape(B, NT * BT, H, K)[:, :T]
    cu = cu_seqlens.to(device=x.device, dtype=torch.int64)
    N = cu.shape[0] - 1
    chunks = torch.cat([cu.new_zeros(1), ((cu[1:] - cu[:-1] + BT - 1) // BT).cumsum(0)])
    t = torch.arange(T, device=x.device)
    seq = torch.searchsorted(cu[1:], t, right=True).clamp(max=max(N - 1, 0))
    local = t - cu[seq]
    row, col = chunks[seq] + local // BT, local % BT
    buf = x.new_zeros((T // BT + N + 1, BT, H, K))
    buf[row, col] = x[0]
    return buf.cumsum(1)[row, col].unsqueeze(0)


def _index_tensor(name, x):
    """Integer tensors as given; Python lists become int64 tensors on the CPU (kdacupy checks
    host values and copies them to the device itself). A list of anything but ints (a float, a
    bool) is refused, not truncated to slots or offsets nobody asked for."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        items = np.asarray(x, dtype=object).ravel()
        bad = next((e for e in items if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer))), None)
        if bad is not None:
            raise TypeError(f"{name}: expected an integer tensor, a list of ints or None, got a list holding {bad!r}")
        return torch.tensor(x, dtype=torch.int64)
    raise TypeError(f"{name}: expected an integer tensor, a list of ints or None, got {type(x).__name__}")

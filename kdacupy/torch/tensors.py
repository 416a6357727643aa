"""Small tensor helpers for the faces built on kdacupy.torch (kdacupy/compat/fla.py),
which keep torch's own imports inside this package."""
from __future__ import annotations

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

"""The engines' gate arguments as kdacupy's gate options (docs/design.md section 1), and the
gate as torch ops (kdacupy/torch/gate.py) for what the kernels do not fuse."""
from __future__ import annotations

from kdacupy.torch.gate import FLOAT32, SOFTPLUS_THRESHOLD, activate

__all__ = ["FLOAT32", "SOFTPLUS_THRESHOLD", "activate", "kernel_gate"]


def kernel_gate(A_log, dt_bias, lower_bound):
    """kdacupy's gate options for the engines' gate arguments: A_log (HV elements, any shape,
    as the engines take it) and dt_bias (HV * K elements) flattened; ``"sigmoid"`` with a lower
    bound, else ``"softplus"``."""
    params = dict(A_log=_flat(A_log), dt_bias=_flat(dt_bias))
    if lower_bound is None:
        return dict(gate="softplus", **params)
    return dict(gate="sigmoid", lower_bound=lower_bound, **params)


def _flat(x):
    """x with its elements in one dim (no reshape where it has one dim already: a decode step's
    host time is microseconds)."""
    return x if x is None or x.dim() == 1 else x.reshape(-1)

"""The engines' gate arguments as kdacupy's gate options (docs/design.md section 1), and the
gate as torch ops (kdacupy/torch/gate.py) for what the kernels do not fuse."""
from __future__ import annotations

from kdacupy.torch.gate import FLOAT32, SOFTPLUS_THRESHOLD, activate

__all__ = ["FLOAT32", "SOFTPLUS_THRESHOLD", "activate", "kernel_gate"]


def kernel_gate(A_log, dt_bias, lower_bound):
    """kdacupy's gate options for the engines' gate arguments: A_log (HV elements, any shape,
    as the engines take it) and dt_bias (HV * K elements) flattened; ``"sigmoid"`` with a lower
    bound, else ``"softplus"``."""
    params = dict(A_log=None if A_log is None else A_log.reshape(-1),
                  dt_bias=None if dt_bias is None else dt_bias.reshape(-1))
    if lower_bound is None:
        return dict(gate="softplus", **params)
    return dict(gate="sigmoid", lower_bound=lower_bound, **params)

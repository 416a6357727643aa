"""The KDA gate as torch ops, for the compat faces' stand-alone gate functions (FLA's and
vLLM's ``fused_kda_gate``) and for gates kdacupy's kernels do not fuse (kdacupy/compat/gate.py).

The arithmetic is the kernels' (docs/design.md section 1): ``-exp(A_log) * softplus(g + dt_bias)``,
or with a lower bound ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``, in float32 (float64
for float64 g), softplus taken as the identity past 15 as the kernels do (where the two differ by
less than float32 resolves). Differentiable through torch's autograd: the gradients come back in
the parameters' own shapes and dtypes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

#: where the kernels' softplus becomes the identity (kdacupy/numerics/precision.py gate_f32)
SOFTPLUS_THRESHOLD = 15.0
#: the gate's output dtype by default (fla-core's ``output_dtype``)
FLOAT32 = torch.float32


def activate(g, A_log, dt_bias, lower_bound, *, softplus_beta=1.0, softplus_threshold=SOFTPLUS_THRESHOLD):
    """The natural-log decay of raw gate ``g [..., HV, K]``. A_log: HV elements (any shape);
    dt_bias: HV * K elements; ``softplus_beta`` / ``softplus_threshold``: torch's softplus
    parameters ((1 / beta) log(1 + exp(beta x)), x once beta x exceeds the threshold)."""
    HV, K = g.shape[-2:]
    x = g.to(torch.float64 if g.dtype == torch.float64 else torch.float32)
    if dt_bias is not None:
        x = x + dt_bias.to(x.dtype).reshape(HV, K)
    a = None if A_log is None else A_log.to(x.dtype).reshape(HV, 1).exp()
    if lower_bound is not None:
        return float(lower_bound) * torch.sigmoid(x if a is None else a * x)
    if a is None:
        raise ValueError("A_log: the softplus gate -exp(A_log) * softplus(g + dt_bias) needs A_log (give "
                         "lower_bound for the sigmoid gate)")
    return -a * F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)

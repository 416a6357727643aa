"""``validate``: every check of docs/design.md section 1 for the per-token arrays
and options, in order, before any work starts, so a failing call writes
nothing; the validated call comes back as a ``Problem``. Each concern has its
module in this package; the head dims each path takes are said in one place,
``head_dims`` (every path any K, V in [16, 256]).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .arrays import as_array, capturing, check_bool, cupy_module, fail
from .head_dims import head_dims_problem
from .memory import check_backend, check_devices, check_kernel_layouts, check_out
from .options import check_beta, check_gate, check_scale, gate_params_as_read
from .seqlens import check_seqlens
from .shapes import Sizes, check_input_dtypes, check_shapes
from .state import check_state

BACKENDS = (None, "cuda", "reference", "model", "emulate")


@dataclass(frozen=True)
class Problem(Sizes):
    """The validated call: the sizes (B, T, H, HV, K, V), dtypes and options the backends specialise on."""
    N: int
    dtype: np.dtype  # q, k, v (and out)
    g_dtype: np.dtype
    beta_dtype: Optional[np.dtype]
    gate: str
    beta_mode: str  # "none", "raw", "sigmoid", "sigmoid2"
    qk_l2norm: bool
    scale: float
    lower_bound: Optional[float]
    state_layout: str
    state_in_dtype: Optional[np.dtype]
    state_out_dtype: Optional[np.dtype]
    state_precision: str
    varlen: bool
    device: bool  # CuPy arrays (else NumPy)
    backend: str


def validate(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens, qk_l2norm,
             beta_sigmoid, allow_neg_eigval, gate, A_log, dt_bias, lower_bound, state_layout,
             state_dtype, state_precision, out, backend, path="forward") -> tuple[Problem, dict[str, Any]]:
    """Check every argument; return the Problem and the arrays to use. ``path``: the call's
    kernels, for the head dims they take (``head_dims.HEAD_DIMS``)."""
    if backend not in BACKENDS:
        fail("backend", "one of " + ", ".join(map(repr, BACKENDS)), repr(backend))
    arrays = _arrays(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias,
                     out=out)
    device = check_devices(arrays)
    backend = check_backend(backend, device)
    sizes = check_shapes(arrays)
    reason = head_dims_problem(sizes, path)  # the kernels' limits, before anything that depends on the sizes
    if reason:
        raise ValueError(reason)
    B, T, HV, K, V = sizes.B, sizes.T, sizes.HV, sizes.K, sizes.V
    check_input_dtypes(arrays, backend)
    flags = {n: check_bool(n, x) for n, x in (("beta_sigmoid", beta_sigmoid), ("allow_neg_eigval", allow_neg_eigval),
                                               ("qk_l2norm", qk_l2norm), ("output_final_state", output_final_state))}
    beta_mode = check_beta(arrays, (B, T, HV), flags["beta_sigmoid"], flags["allow_neg_eigval"])
    lower_bound = check_gate(gate, arrays, dt_bias, lower_bound, HV, K)
    scale = check_scale(scale, K)
    cu, N = check_seqlens(cu_seqlens, B, T, device)
    s0, state_out = check_state(arrays, state_layout, state_precision, state_dtype, (N, HV, K, V),
                                 flags["output_final_state"])
    check_out(arrays, device)
    check_kernel_layouts(arrays)  # on every backend: code that runs on "model" runs on "cuda"
    gate_params_as_read(arrays, HV, lambda: device and capturing(cupy_module()))

    problem = Problem(
        **vars(sizes), N=N, dtype=arrays["q"].dtype, g_dtype=arrays["g"].dtype,
        beta_dtype=None if arrays["beta"] is None else arrays["beta"].dtype, gate=gate, beta_mode=beta_mode,
        qk_l2norm=flags["qk_l2norm"], scale=scale, lower_bound=lower_bound, state_layout=state_layout,
        state_in_dtype=None if s0 is None else s0.dtype, state_out_dtype=state_out,
        state_precision=state_precision, varlen=cu is not None, device=device, backend=backend)
    arrays["cu_seqlens"] = cu
    return problem, arrays


def _arrays(**given) -> dict:
    return {n: None if x is None and n not in ("q", "k", "v", "g") else as_array(n, x) for n, x in given.items()}

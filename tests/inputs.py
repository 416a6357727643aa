"""Random KDA inputs for the tests (NumPy, storage dtypes)."""
from __future__ import annotations

import numpy as np

from kdacupy.numerics.dtypes import BF16


def make_inputs(B=1, T=37, H=2, HV=None, K=64, V=64, dtype=BF16, seed=0, gate="sigmoid", beta="logits",
                state=None, state_layout="kv", cu_seqlens=None, g_scale=1.0, unit_qk=True):
    """Inputs plus matching options. ``beta``: "logits", "raw" or None;
    ``state``: None or a dtype for a random initial state; ``cu_seqlens``: a
    list of sequence lengths (B must be 1)."""
    rng = np.random.default_rng(seed)
    HV = HV or H
    if cu_seqlens is not None:
        T = int(sum(cu_seqlens))
    unit = (lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)) if unit_qk else (lambda x: x)
    x = dict(
        q=unit(rng.standard_normal((B, T, H, K))).astype(dtype),
        k=unit(rng.standard_normal((B, T, H, K))).astype(dtype),
        v=rng.standard_normal((B, T, HV, V)).astype(dtype),
    )
    opts = {}
    if gate == "log":
        x["g"] = (-g_scale * rng.uniform(0.0, 1.0, (B, T, HV, K))).astype(dtype)
    else:
        x["g"] = (g_scale * rng.standard_normal((B, T, HV, K))).astype(dtype)
        opts.update(gate=gate, A_log=rng.uniform(0, 1, HV).astype(np.float32),
                    dt_bias=rng.standard_normal((HV, K)).astype(np.float32))
        if gate == "sigmoid":
            opts["lower_bound"] = -5.0
    if beta == "logits":
        x["beta"] = rng.standard_normal((B, T, HV)).astype(dtype)
        opts["beta_sigmoid"] = True
    elif beta == "raw":
        x["beta"] = rng.uniform(0, 1, (B, T, HV)).astype(dtype)
    N = B
    if cu_seqlens is not None:
        assert B == 1
        opts["cu_seqlens"] = np.concatenate([[0], np.cumsum(cu_seqlens)]).astype(np.int64)
        N = len(cu_seqlens)
    if state is not None:
        shape = (N, HV, K, V) if state_layout == "kv" else (N, HV, V, K)
        opts["initial_state"] = (0.5 * rng.standard_normal(shape)).astype(state)
        opts["state_layout"] = state_layout
    return x, opts


def rmse_ratio(x, ref):
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))

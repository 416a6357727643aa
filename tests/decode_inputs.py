"""Random decode inputs: per-token arrays (tests/inputs.py) plus a state pool."""
from __future__ import annotations

import numpy as np

from .inputs import make_inputs


def make_decode(N=3, T=1, H=2, HV=None, K=64, V=64, P=None, pool_dtype=np.float32, layout="vk", seed=0,
                gate="sigmoid", beta="logits", dtype=None, indices=None, qk_l2norm=True, **kw):
    """(inputs, options, pool): ``indices`` defaults to slots 1, 3, 5, ... of a pool
    of P = 2N + 1 slots (so neighbouring slots are never touched)."""
    kw = dict(kw, dtype=dtype) if dtype is not None else kw
    x, opts = make_inputs(B=N, T=T, H=H, HV=HV, K=K, V=V, seed=seed, gate=gate, beta=beta, **kw)
    if beta is None:
        opts.pop("beta_sigmoid", None)
    HV = HV or H
    P = P or 2 * N + 1
    rng = np.random.default_rng(seed + 1000)
    shape = (P, HV, V, K) if layout == "vk" else (P, HV, K, V)
    pool = (0.5 * rng.standard_normal(shape)).astype(pool_dtype)
    idx = np.arange(1, 2 * N, 2, dtype=np.int32) if indices is None else np.asarray(indices)
    opts.update(state_indices=idx, state_layout=layout, qk_l2norm=qk_l2norm)
    return x, opts, pool


def gather_kv(pool, idx, layout):
    """Pool slots idx as [N, HV, K, V] float64 (zeros for negative slots)."""
    s = np.asarray(pool, dtype=np.float64)[np.maximum(idx, 0)]
    s = s if layout == "kv" else np.swapaxes(s, -1, -2)
    return np.where((np.asarray(idx) >= 0)[:, None, None, None], s, 0.0)

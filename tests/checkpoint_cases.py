"""Checkpointed forwards (``kda_forward(checkpoint_every=, checkpoints=)``, docs/design.md section
7.1) and what each checkpoint must equal: the same forward stopped at its boundary, run alone
for that sequence from its initial state (shared by the NumPy and the emulated suites)."""
from __future__ import annotations

import numpy as np

import kdacupy

from .inputs import make_inputs


def varlen_case(lengths=(70, 32, 0, 64), HV=2, K=64, V=64, layout="kv", state=np.float32, seed=0):
    x, opts = make_inputs(B=1, T=0, H=1, HV=HV, K=K, V=V, cu_seqlens=list(lengths), state=state,
                          state_layout=layout, seed=seed)
    opts["qk_l2norm"] = True
    return x, opts


def stopped(x, opts, n, end, backend, state_dtype, state_precision="bf16"):
    """Sequence n's final state after its first ``end`` tokens, run alone from its initial state."""
    cu = opts["cu_seqlens"]
    xs = {k: v[:, cu[n]:cu[n] + end] for k, v in x.items()}
    rest = {k: v for k, v in opts.items() if k not in ("cu_seqlens", "initial_state")}
    init = opts.get("initial_state")
    _, f = kdacupy.kda_forward(**xs, **rest, initial_state=None if init is None else init[n:n + 1],
                               output_final_state=True, state_dtype=state_dtype, state_precision=state_precision,
                               backend=backend)
    return f[0]


def expected_boundaries(lengths, every, J):
    """{(n, j)}: the boundaries written, by hand: j = 1 .. J with j * every <= length."""
    return {(n, j) for n, L in enumerate(lengths) for j in range(1, J + 1) if j * every <= L}

"""Small float64 problems for the backward's tests: inputs, options, the loss's cotangents."""
from __future__ import annotations

import numpy as np

#: name -> options of ``problem``; together they cover every option of kda_backward
FD_CASES = {
    "sigmoid-gva-l2norm-neg-eigval": dict(H=1, HV=2, gate="sigmoid", dt_bias="2d", beta="logits", neg=True,
                                          state=True, dfinal=True, l2norm=True, scale=0.3),
    "softplus-varlen-zero-vk": dict(lens=[3, 0, 6, 1], gate="softplus", dt_bias="flat", beta="raw",
                                    layout="vk", state=True, dfinal=True),
    "log-batched-no-beta": dict(B=2, T=5, gate="log", beta=None),
    "softplus-bare-sigmoid-beta": dict(T=6, gate="softplus", A_log=False, dt_bias=None, beta="logits", state=True,
                                       l2norm=True),
    "sigmoid-bias-only-state-only": dict(T=5, H=2, HV=4, gate="sigmoid", A_log=False, dt_bias="2d", beta="raw",
                                         dfinal=True, layout="vk"),
}


def problem(B=1, T=4, H=1, HV=None, K=64, V=64, lens=None, gate="log", A_log=True, dt_bias=None, beta="raw",
            neg=False, state=False, dfinal=False, l2norm=False, scale=None, layout="kv", seed=0, g_scale=1.0,
            dtype=np.float64):
    """(inputs, options, do, dfinal_state) of a random problem; arrays in ``dtype``."""
    rng = np.random.default_rng(seed)
    HV = HV or H
    if lens is not None:
        T = int(sum(lens))
    unit = K ** -0.5  # |q|, |k| ~ 1: with beta <= 1 the delta rule stays a contraction without l2norm too
    x = dict(q=unit * rng.standard_normal((B, T, H, K)), k=unit * rng.standard_normal((B, T, H, K)),
             v=rng.standard_normal((B, T, HV, V)))
    opts = dict(qk_l2norm=l2norm, gate=gate, state_layout=layout)
    if scale is not None:
        opts["scale"] = scale
    if gate == "log":
        x["g"] = -g_scale * rng.uniform(0.05, 0.5, (B, T, HV, K))
    else:
        x["g"] = g_scale * rng.standard_normal((B, T, HV, K))
        if A_log:
            opts["A_log"] = rng.uniform(0.0, 1.0, HV)
        if dt_bias:
            bias = rng.standard_normal((HV, K))
            opts["dt_bias"] = bias if dt_bias == "2d" else bias.reshape(HV * K)
        if gate == "sigmoid":
            opts["lower_bound"] = -2.0
    if beta == "logits":
        x["beta"] = rng.standard_normal((B, T, HV))
        opts.update(beta_sigmoid=True, allow_neg_eigval=neg)
    elif beta == "raw":
        x["beta"] = rng.uniform(0.2, 1.0, (B, T, HV))
    N = B
    if lens is not None:
        assert B == 1
        opts["cu_seqlens"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        N = len(lens)
    sshape = (N, HV, K, V) if layout == "kv" else (N, HV, V, K)
    if state:
        opts["initial_state"] = 0.5 * rng.standard_normal(sshape)
    do = rng.standard_normal((B, T, HV, V))
    ds = rng.standard_normal(sshape) if dfinal else None
    cast = lambda a: a if not isinstance(a, np.ndarray) or a.dtype.kind != "f" else a.astype(dtype)  # noqa: E731
    x = {n: cast(a) for n, a in x.items()}
    for n in ("initial_state",):
        if n in opts:
            opts[n] = cast(opts[n])
    if dtype != np.float64:  # gate parameters stay float32 (the contract)
        for n in ("A_log", "dt_bias"):
            if n in opts:
                opts[n] = opts[n].astype(np.float32)
    return x, opts, cast(do), None if ds is None else cast(ds)


#: argument name -> where it lives ("x": inputs, "o": options) for the gradient fields
FIELDS = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "dinitial_state": "initial_state",
          "dA_log": "A_log", "ddt_bias": "dt_bias"}


def chunks_in_pair_form(x, opts):
    """[N, HV, chunks]: which chunks of a problem's inputs take the pair form, by the precision
    model's rule (backward_recompute.prepare_exact's, the kernels'), as kda_backward_model sets it up."""
    from kdacupy.numerics.backward_recompute import l2norm_exact, prepare_exact
    from kdacupy.numerics.precision import Chunks, beta_f32, gate_f32, scale_f32
    q, k, g = (np.asarray(x[n], np.float64) for n in ("q", "k", "g"))
    B, T, H, K = q.shape
    HV = g.shape[2]
    if opts.get("qk_l2norm"):
        (q, _), (k, _) = l2norm_exact(q), l2norm_exact(k)
    g2 = gate_f32(g, opts.get("gate", "log"), opts.get("A_log"), opts.get("dt_bias"), opts.get("lower_bound"))
    beta = beta_f32(x.get("beta"), (B, T, HV), opts.get("beta_sigmoid", False), opts.get("allow_neg_eigval", False))
    ch = Chunks.of(B, T, opts.get("cu_seqlens"))
    q, k = (ch.split(np.repeat(a, HV // H, axis=2)) for a in (q, k))
    return prepare_exact(q, k, ch.split(g2), ch.split(beta), scale_f32(opts.get("scale"), K))["unsafe"]

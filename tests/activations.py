"""The gate and beta activations read back from the kernels and compared with the
definition written out here in plain NumPy (docs/design.md section 1), not through
the reference's helpers, which the precision model and the parity tests share.

Each check runs one-token sequences, where an activation shows directly:
- the gate: keys zero (no delta-rule update), initial state all ones, fp32 state:
  the final state is the decay exp(g_act), exactly as the kernels computed it
  (one fp32 product with 1), per token and channel;
- beta: a zero initial state (the gate has nothing to decay), keys whose entries are
  +-1/8 (powers of two: the products with them are exact) on 64 channels, fp32 state:
  the state is k (beta v)^T, so state / k is beta v, rounded once to bf16 in the
  forward (its corrected values U are a bf16 operand) and to fp32 in the decode;
  beta is fitted over the V values.

Tolerances: the gate is fp32 arithmetic in base 2 (a few roundings of the log decay,
ex2 / lg2 / rcp .approx within 2^-22 on a GPU): |log decay - g_act| within 4e-6 of
max(1, |g_act|) (measured: 2.5e-7, 7.7e-7 under KDACUPY_EMULATE_NUMERICS=hardware);
beta within one bf16 rounding in the forward, 2^-8 relative (bf16 keeps 8 significant
bits; every U_j is within it, so their fit is; measured 1.9e-3), and 1e-6 in the
decode (fp32; measured 4e-7). A 1% error in beta is 2.6x outside, in a gate 2500x.
"""
from __future__ import annotations

import numpy as np

from kdacupy.numerics.dtypes import BF16

N_TOK, HV = 48, 2
GATE_TOL = 4e-6
BETA_TOL = {"forward": 2.0 ** -8 + 1e-6, "decode": 1e-6}
GATES = ("log", "softplus", "sigmoid")
BETAS = ("none", "raw", "sigmoid", "neg_eigval")
#: (K, V, gate, beta mode, qk_l2norm) of each check: those of a tests/cases.py case (and of its
#: decode twin in tests/decode_cases.py), so the suite builds no kernel variant for these alone.
#: With zero keys (the gate checks) beta changes nothing; from a zero state (the beta checks) the
#: gate changes nothing.
GATE_CONFIG = {"log": (64, 128, "log", "none", True), "softplus": (128, 128, "softplus", "raw", True),
               "sigmoid": (64, 64, "sigmoid", "sigmoid", True)}
BETA_CONFIG = {"none": (64, 128, "log", "none", True), "raw": (128, 128, "softplus", "raw", True),
               "sigmoid": (64, 64, "sigmoid", "sigmoid", True), "neg_eigval": (64, 64, "sigmoid", "neg_eigval", False)}


def expected_log_decay(gate, g, A_log, dt_bias, lower_bound):
    """The natural-log decay of section 1, in float64, from the stored values."""
    g = np.asarray(g, np.float64)
    if gate == "log":
        return g
    a = np.exp(np.asarray(A_log, np.float64))[:, None]  # [HV, 1]
    x = g + np.asarray(dt_bias, np.float64)  # [..., HV, K]
    if gate == "softplus":
        return -a * np.log1p(np.exp(x))
    return lower_bound / (1.0 + np.exp(-a * x))


def expected_beta(mode, b):
    b = np.asarray(b, np.float64)
    if mode == "none":
        return np.ones_like(b)
    if mode == "raw":
        return b
    s = 1.0 / (1.0 + np.exp(-b))
    return 2.0 * s if mode == "neg_eigval" else s


def make_inputs(config, keys, seed):
    """One-token sequences (B = 1, T = N_TOK, varlen) of a config, with the given keys [N_TOK, K]."""
    K, V, gate, mode, l2norm = config
    rng = np.random.default_rng(seed)
    lo, hi = (-5.0, 0.0) if gate == "log" else (-8.0, 8.0)
    x = dict(q=rng.standard_normal((1, N_TOK, 1, K)).astype(BF16), k=keys.reshape(1, N_TOK, 1, K).astype(BF16),
             v=rng.standard_normal((1, N_TOK, HV, V)).astype(BF16),
             g=rng.uniform(lo, hi, (1, N_TOK, HV, K)).astype(BF16))
    opts = dict(gate=gate, qk_l2norm=l2norm)
    if gate != "log":
        opts.update(A_log=np.array([-0.7, 0.9], np.float32),
                    dt_bias=(2.0 * rng.standard_normal((HV, K))).astype(np.float32))
    if gate == "sigmoid":
        opts["lower_bound"] = -3.0  # not the usual -5: the kernels must use the argument
    if mode == "raw":
        x["beta"] = rng.uniform(0.05, 1.0, (1, N_TOK, HV)).astype(BF16)
    elif mode != "none":
        x["beta"] = rng.uniform(-6.0, 6.0, (1, N_TOK, HV)).astype(BF16)
        opts.update(beta_sigmoid=True, allow_neg_eigval=mode == "neg_eigval")
    return x, opts


def gate_inputs(gate, seed=0):
    """Zero keys: (x, opts) for kda_forward."""
    config = GATE_CONFIG[gate]
    return make_inputs(config, np.zeros((N_TOK, config[0])), seed)


def beta_inputs(mode, seed=0):
    """Keys of +-1/8 on 64 channels (unit norm, so l2norm leaves them as they are to within 5e-7,
    which bf16 rounds away), zero on the rest (K = 128)."""
    config = BETA_CONFIG[mode]
    rng = np.random.default_rng(seed + 1)
    keys = np.where(rng.uniform(size=(N_TOK, 64)) < 0.5, -0.125, 0.125)
    keys = np.concatenate([keys, np.zeros((N_TOK, config[0] - 64))], axis=1)
    return make_inputs(config, keys, seed + 2)


def l2normalised(k):
    k = np.asarray(k, np.float64)
    return k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)


def check_log_decay(decay, x, opts):
    """``decay`` [N_TOK, HV, K]: the kernels' decay per token, head and channel."""
    want = expected_log_decay(opts["gate"], x["g"][0], opts.get("A_log"), opts.get("dt_bias"),
                              opts.get("lower_bound"))
    assert np.all(decay > 0), "a decay flushed to zero or negative"
    err = np.abs(np.log(np.asarray(decay, np.float64)) - want) / np.maximum(1.0, np.abs(want))
    assert err.max() <= GATE_TOL, (opts["gate"], float(err.max()))


def check_beta(bv, x, mode, where):
    """``bv`` [N_TOK, HV, V]: the kernels' beta * v per token and head."""
    v = np.asarray(x["v"][0], np.float64)
    fit = np.sum(bv * v, axis=-1) / np.sum(v * v, axis=-1)
    want = expected_beta(mode, x["beta"][0] if "beta" in x else np.zeros((N_TOK, HV)))
    err = np.abs(fit / want - 1.0)
    assert err.max() <= BETA_TOL[where], (mode, where, float(err.max()))


def forward_per_token(run, x, opts, **extra):
    """``run(x, opts) -> (o, final_state)`` NumPy arrays, kda_forward on some backend, with every
    token its own sequence; returns the final states (fp32 state, as float64). ``opts`` is
    updated in place with what the run used."""
    opts.update(cu_seqlens=np.arange(N_TOK + 1, dtype=np.int32), output_final_state=True,
                state_precision="fp32", state_dtype=np.float32, **extra)
    _, s = run(x, opts)
    return np.asarray(s, np.float64)


def decode_per_token(run, x, opts, pool):
    """``run(x, opts, pool) -> (o, pool_after)`` NumPy arrays, kda_decode on some backend, with
    every token its own sequence [N_TOK, 1] in slot n of a [V, K] pool; returns (x as the
    decode took it, the pool after as float64)."""
    x = {n: a.reshape((N_TOK, 1) + a.shape[2:]) for n, a in x.items()}
    _, p = run(x, dict(opts, state_indices=np.arange(N_TOK, dtype=np.int32), state_layout="vk"), pool)
    return x, np.asarray(p, np.float64)


def forward_gate(run, gate):
    x, opts = gate_inputs(gate)
    K, V = GATE_CONFIG[gate][:2]
    s = forward_per_token(run, x, opts, initial_state=np.ones((N_TOK, HV, K, V), np.float32))
    assert np.all(s == s[..., :1]), "the decay must be one value per key channel"
    check_log_decay(s[..., 0], x, opts)


def beta_fit_input(s_over_k, x, mode, where):
    """Every key channel's state / k must hold the same beta v; fit beta from it."""
    live = np.asarray(x["k"][0, 0, 0], np.float64) != 0  # the same channels in every token
    bv = s_over_k[..., live, :]
    assert np.all(bv == bv[..., :1, :]), "state / k must be the same beta v for every key channel"
    check_beta(bv[..., 0, :], x, mode, where)


def forward_beta(run, mode):
    x, opts = beta_inputs(mode)
    s = forward_per_token(run, x, opts)  # [N, HV, K, V] = k_res (beta v)^T, k_res = bf16(l2norm(k)) = k here
    k = np.asarray(x["k"][0, :, 0], np.float64)  # [N, K]
    assert np.all(s[:, :, k[0] == 0] == 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta_fit_input(s / k[:, None, :, None], x, mode, "forward")


def decode_gate(run, gate):
    x, opts = gate_inputs(gate)
    K, V = GATE_CONFIG[gate][:2]
    x, p = decode_per_token(run, x, opts, np.ones((N_TOK, HV, V, K), np.float32))
    assert np.all(p == p[:, :, :1]), "the decay must be one value per key channel"
    check_log_decay(p[:, :, 0], {"g": x["g"][:, 0][None]}, opts)


def decode_beta(run, mode):
    x, opts = beta_inputs(mode)
    K, V = BETA_CONFIG[mode][:2]
    x, p = decode_per_token(run, x, opts, np.zeros((N_TOK, HV, V, K), np.float32))
    k = np.asarray(x["k"][:, 0, 0], np.float64)  # [N, K]
    kn = l2normalised(k) if opts["qk_l2norm"] else k  # the decode keeps l2norm(k) in fp32
    p = np.swapaxes(p, -1, -2)  # [N, HV, K, V] = kn (beta v)^T
    assert np.all(p[:, :, k[0] == 0] == 0)
    flat = {n: a[:, 0][None] for n, a in x.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        beta_fit_input(p / kn[:, None, :, None], flat, mode, "decode")

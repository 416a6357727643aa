"""The engines' calls recomputed in float64 from docs/design.md section 1, token by token, with
NumPy alone (nothing of kdacupy): the gates as the engines define them, and pools of [V, K]
states as vLLM and SGLang keep them. Inputs are the torch tensors the calls got, read exactly
(bf16 / fp16 / fp32 values are float64 values)."""
from __future__ import annotations

import numpy as np


def f64(x):
    return None if x is None else x.detach().double().numpy()


def softplus(x, beta=1.0):
    return np.logaddexp(0.0, beta * x) / beta


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus_gate(raw, A_log, dt_bias, beta=1.0):
    """-exp(A_log) * softplus(raw + dt_bias); raw [..., HV, K], A_log HV elements, dt_bias HV * K."""
    HV, K = raw.shape[-2:]
    x = raw + (0.0 if dt_bias is None else dt_bias.reshape(HV, K))
    return -np.exp(A_log.reshape(HV, 1)) * softplus(x, beta)


def bounded_gate(raw, A_log, dt_bias, lower_bound):
    """lower_bound * sigmoid(exp(A_log) * (raw + dt_bias))."""
    HV, K = raw.shape[-2:]
    x = raw + (0.0 if dt_bias is None else dt_bias.reshape(HV, K))
    return lower_bound * sigmoid(np.exp(A_log.reshape(HV, 1)) * x)


def l2norm(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def run(q, k, v, g, beta, S, scale=None, l2=True):
    """One sequence: q, k [T, H, K], v [T, HV, V], g [T, HV, K] (log decay), beta [T, HV], S the
    start state [HV, K, V] -> (o [T, HV, V], the states after each token [T, HV, K, V])."""
    T, H, K = q.shape
    HV = v.shape[1]
    rep = HV // H
    q, k = (l2norm(x) if l2 else x for x in (q, k))
    q, k = np.repeat(q, rep, axis=1), np.repeat(k, rep, axis=1)
    scale = K ** -0.5 if scale is None else scale
    S = S.copy()
    o, states = np.zeros((T, HV, v.shape[2])), np.zeros((T,) + S.shape)
    for t in range(T):
        S = np.exp(g[t])[:, :, None] * S
        u = v[t] - np.einsum("hk,hkv->hv", k[t], S)
        S = S + beta[t][:, None, None] * k[t][:, :, None] * u[:, None, :]
        o[t] = scale * np.einsum("hk,hkv->hv", q[t], S)
        states[t] = S
    return o, states


def vk(S):
    """[..., K, V] <-> [..., V, K]."""
    return np.swapaxes(S, -1, -2)


def rmse_ratio(x, ref):
    x = x.detach().double().numpy() if hasattr(x, "detach") else np.asarray(x, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))

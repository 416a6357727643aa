"""The float64 reference: its two forms agree, hand-computed cases, properties."""
import math

import numpy as np
import pytest

from kdacupy.numerics.reference import kda_reference

from ..inputs import make_inputs


def both_forms(x, opts, chunk_size):
    a = kda_reference(**x, **opts, output_final_state=True, form="recurrent")
    b = kda_reference(**x, **opts, output_final_state=True, form="chunked", chunk_size=chunk_size)
    return a, b


def rel(a, b):
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


CASES = {
    "sigmoid-gva-logits-kv": dict(H=2, HV=4, gate="sigmoid", beta="logits", state=np.float32),
    "softplus-raw-vk": dict(H=1, HV=2, gate="softplus", beta="raw", state=np.float32, state_layout="vk"),
    "log-nobeta": dict(H=2, gate="log", beta=None),
    "varlen-ragged-zero": dict(cu_seqlens=[5, 0, 21, 16, 3], gate="sigmoid", state=np.float32),
    "batched": dict(B=3, T=29, gate="softplus", beta="logits", state=np.float32, state_layout="vk"),
}


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("case", list(CASES))
def test_recurrent_and_chunked_agree(case, chunk_size):
    x, opts = make_inputs(K=16, V=8, **CASES[case])
    opts.update(qk_l2norm=True, scale=0.3)
    (o1, s1), (o2, s2) = both_forms(x, opts, chunk_size)
    assert rel(o2, o1) < 1e-10
    assert rel(s2, s1) < 1e-10


def test_chunked_handles_extreme_decay():
    # per-step decays of e^-60 overflow a naively factored chunk; the pair form takes over
    x, opts = make_inputs(K=16, V=8, gate="softplus", g_scale=1.0)
    opts["A_log"] = np.full(opts["A_log"].shape, 4.0, np.float32)
    (o1, s1), (o2, s2) = both_forms(x, opts, 64)
    assert np.isfinite(o2).all() and np.isfinite(s2).all()
    assert rel(o2, o1) < 1e-9


def test_scalar_recurrence_by_hand():
    # K = V = 1, g = 0, beta = 1, k = q = 1: S_t = S_{t-1} + (v_t - S_{t-1}) = v_t, o_t = scale * v_t
    v = np.array([1.0, 2.0, -3.0]).reshape(1, 3, 1, 1)
    one = np.ones((1, 3, 1, 1))
    for form in ("recurrent", "chunked"):
        o, s = kda_reference(one, one, v, 0 * one, None, scale=0.5, output_final_state=True, form=form,
                             chunk_size=2)
        np.testing.assert_allclose(o.ravel(), [0.5, 1.0, -1.5], rtol=0, atol=1e-15)
        np.testing.assert_allclose(s.ravel(), [-3.0], atol=1e-15)


def test_scalar_recurrence_with_decay_and_beta():
    # K = V = 1: S_t = a_t S + b_t k_t (v_t - a_t S k_t), o_t = scale q_t S_t, computed with Python floats
    rng = np.random.default_rng(1)
    T = 9
    q, k, v, g = (rng.standard_normal(T) for _ in range(4))
    beta = rng.uniform(0, 1, T)
    S, outs = 0.7, []
    for t in range(T):
        Sd = math.exp(g[t]) * S
        S = Sd + beta[t] * k[t] * (v[t] - Sd * k[t])
        outs.append(0.25 * q[t] * S)
    shape = (1, T, 1, 1)
    for form in ("recurrent", "chunked"):
        o, s = kda_reference(q.reshape(shape), k.reshape(shape), v.reshape(shape), g.reshape(shape),
                             beta.reshape(1, T, 1), scale=0.25, initial_state=np.full((1, 1, 1, 1), 0.7),
                             output_final_state=True, form=form, chunk_size=4)
        np.testing.assert_allclose(o.ravel(), outs, rtol=1e-12)
        np.testing.assert_allclose(s.ravel(), [S], rtol=1e-12)


def test_varlen_equals_separate_calls():
    lens = [7, 0, 20, 1]
    x, opts = make_inputs(K=16, V=8, cu_seqlens=lens, state=np.float32)
    o, s = kda_reference(**x, **opts, output_final_state=True)
    cu = opts.pop("cu_seqlens")
    s0 = opts.pop("initial_state")
    for n, (bos, eos) in enumerate(zip(cu[:-1], cu[1:])):
        part = {name: a[:, bos:eos] for name, a in x.items()}
        on, sn = kda_reference(**part, **opts, initial_state=s0[n:n + 1], output_final_state=True)
        np.testing.assert_allclose(o[:, bos:eos], on, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(s[n:n + 1], sn, rtol=1e-12, atol=1e-14)


def test_zero_length_sequence_keeps_its_state():
    x, opts = make_inputs(K=16, V=8, cu_seqlens=[4, 0, 3], state=np.float32)
    _, s = kda_reference(**x, **opts, output_final_state=True)
    np.testing.assert_array_equal(s[1], opts["initial_state"][1])


def test_split_and_chain_equals_one_call():
    x, opts = make_inputs(B=2, T=45, K=16, V=8, state=np.float32)
    o, s = kda_reference(**x, **opts, output_final_state=True)
    cut = 19
    first = {n: a[:, :cut] for n, a in x.items()}
    second = {n: a[:, cut:] for n, a in x.items()}
    o1, s1 = kda_reference(**first, **opts, output_final_state=True)
    opts2 = dict(opts, initial_state=s1)
    o2, s2 = kda_reference(**second, **opts2, output_final_state=True)
    np.testing.assert_allclose(np.concatenate([o1, o2], axis=1), o, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(s2, s, rtol=1e-11, atol=1e-13)


def test_gva_equals_repeated_heads():
    x, opts = make_inputs(H=2, HV=6, K=16, V=8, state=np.float32)
    o, s = kda_reference(**x, **opts, output_final_state=True)
    rep = dict(x, q=np.repeat(x["q"], 3, axis=2), k=np.repeat(x["k"], 3, axis=2))
    o2, s2 = kda_reference(**rep, **opts, output_final_state=True)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(s, s2)


def test_beta_none_equals_ones():
    x, opts = make_inputs(K=16, V=8, beta=None)
    o, s = kda_reference(**x, **opts, output_final_state=True)
    o2, s2 = kda_reference(**x, **opts, beta=np.ones(x["v"].shape[:3]), output_final_state=True)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(s, s2)


def test_state_layouts_are_transposes():
    x, opts = make_inputs(K=16, V=8, state=np.float32)
    o, s = kda_reference(**x, **opts, output_final_state=True)
    opts_vk = dict(opts, state_layout="vk", initial_state=np.swapaxes(opts["initial_state"], -1, -2).copy())
    o2, s2 = kda_reference(**x, **opts_vk, output_final_state=True)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(np.swapaxes(s2, -1, -2), s)


def test_gate_modes_follow_their_formulas():
    # one token, k = 0 (no delta update): the state only decays, so S_1 = exp(g_act) * S_0
    K = V = 4
    rng = np.random.default_rng(3)
    g = rng.standard_normal((1, 1, 1, K))
    A_log, dt = np.array([0.3], np.float32), rng.standard_normal((1, K)).astype(np.float32)
    S0 = np.ones((1, 1, K, V))
    zero = np.zeros((1, 1, 1, K))
    v = np.zeros((1, 1, 1, V))
    x = g[0, 0, 0] + dt[0]
    expect = {
        "log": g[0, 0, 0],
        "softplus": -math.exp(0.3) * np.log1p(np.exp(x)),
        "sigmoid": -2.5 / (1 + np.exp(-math.exp(0.3) * x)),
    }
    for gate, want in expect.items():
        extra = {} if gate == "log" else dict(A_log=A_log, dt_bias=dt)
        if gate == "sigmoid":
            extra["lower_bound"] = -2.5
        _, s = kda_reference(zero, zero, v, g, None, gate=gate, initial_state=S0, output_final_state=True, **extra)
        np.testing.assert_allclose(s[0, 0, :, 0], np.exp(want), rtol=1e-6)

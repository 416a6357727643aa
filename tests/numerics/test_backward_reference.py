"""The float64 reference gradient: central finite differences of the forward on every option, an
independent chunked derivation, and properties (varlen = separate calls, grouped heads)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.backward_reference import kda_backward_reference
from kdacupy.numerics.reference import kda_reference

from ..backward_cases import FD_CASES, FIELDS, problem


def loss(x, opts, do, ds):
    """sum(o * do) + sum(final_state * dfinal_state) through the token-by-token forward."""
    o, s = kda_reference(**x, **opts, output_final_state=True, form="recurrent")
    return float(np.sum(o * do) + (0.0 if ds is None else np.sum(s * ds)))


def directional(x, opts, do, ds, name, direction, eps=1e-6):
    """(L(arg + eps d) - L(arg - eps d)) / (2 eps) for one argument."""
    def moved(sign):
        xs, os_ = dict(x), dict(opts)
        where = xs if name in xs else os_
        where[name] = where[name] + sign * eps * direction
        return loss(xs, os_, do, ds)
    return (moved(1) - moved(-1)) / (2 * eps)


@pytest.mark.parametrize("case", list(FD_CASES))
def test_finite_differences_agree_with_the_gradient(case):
    x, opts, do, ds = problem(**FD_CASES[case])
    grads = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts)
    rng = np.random.default_rng(7)
    checked = 0
    for field, arg in FIELDS.items():
        given = x.get(arg, opts.get(arg))
        got = getattr(grads, field)
        if given is None:
            assert got is None, field
            continue
        assert got.shape == np.shape(given) and got.dtype == np.float64, field
        d = rng.standard_normal(np.shape(given))
        fd = directional(x, opts, do, ds, arg, d)
        an = float(np.sum(got * d))
        assert abs(fd - an) <= 1e-7 * max(1.0, abs(fd)), f"{field}: finite difference {fd}, gradient {an}"
        checked += 1
    assert checked >= 4


def test_single_elements_by_finite_differences():
    """Elementwise, where a directional check could hide compensating errors: a few entries of each."""
    x, opts, do, ds = problem(**{**FD_CASES["sigmoid-gva-l2norm-neg-eigval"], "T": 3})
    grads = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts)
    for field, arg, index in (("dq", "q", (0, 2, 0, 5)), ("dk", "k", (0, 0, 0, 63)), ("dg", "g", (0, 1, 1, 7)),
                              ("dbeta", "beta", (0, 2, 0)), ("dinitial_state", "initial_state", (0, 1, 3, 4)),
                              ("ddt_bias", "dt_bias", (1, 2)), ("dA_log", "A_log", (0,))):
        given = x.get(arg, opts.get(arg))
        e = np.zeros(np.shape(given))
        e[index] = 1.0
        fd = directional(x, opts, do, ds, arg, e)
        assert abs(fd - getattr(grads, field)[index]) <= 1e-7 * max(1.0, abs(fd)), field


@pytest.mark.parametrize("chunk_size", [4, 16])
@pytest.mark.parametrize("case", ["sigmoid-gva-l2norm-neg-eigval", "softplus-varlen-zero-vk", "log-batched-no-beta"])
def test_chunked_derivation_agrees_with_the_recurrent_one(case, chunk_size):
    x, opts, do, ds = problem(**{**FD_CASES[case], "T": 21})
    rec = kda_backward_reference(do, **x, dfinal_state=ds, **opts, form="recurrent")
    chk = kda_backward_reference(do, **x, dfinal_state=ds, **opts, form="chunked", chunk_size=chunk_size)
    for field, a, b in zip(FIELDS, rec, chk):
        if a is None:
            assert b is None
            continue
        assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(a)), field


def test_chunked_derivation_survives_extreme_decay():
    # e^-40 per token: factored exponentials would overflow within a chunk; the pairs do not
    x, opts, do, ds = problem(T=20, gate="log", g_scale=80.0, state=True, dfinal=True)
    rec = kda_backward_reference(do, **x, dfinal_state=ds, **opts, form="recurrent")
    chk = kda_backward_reference(do, **x, dfinal_state=ds, **opts, form="chunked", chunk_size=16)
    for field, a, b in zip(FIELDS, rec, chk):
        if a is not None:
            assert np.isfinite(b).all() and np.max(np.abs(a - b)) <= 1e-11 * np.max(np.abs(a)), field


def test_varlen_is_separate_calls():
    lens = [3, 0, 5]
    x, opts, do, ds = problem(lens=lens, gate="sigmoid", dt_bias="2d", beta="logits", state=True, dfinal=True)
    packed = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts)
    cu = opts["cu_seqlens"]
    dA, ddt = 0.0, 0.0
    for n, (bos, eos) in enumerate(zip(cu[:-1], cu[1:])):
        one = {k: a[:, bos:eos] for k, a in x.items()}
        o1 = {k: a for k, a in opts.items() if k != "cu_seqlens"}
        o1["initial_state"] = opts["initial_state"][n:n + 1]
        g1 = kdacupy.kda_backward(do[:, bos:eos], **one, dfinal_state=ds[n:n + 1], **o1)
        for field in ("dq", "dk", "dv", "dg", "dbeta"):
            np.testing.assert_allclose(getattr(packed, field)[:, bos:eos], getattr(g1, field), rtol=0, atol=1e-12)
        np.testing.assert_allclose(packed.dinitial_state[n], g1.dinitial_state[0], rtol=0, atol=1e-12)
        dA, ddt = dA + g1.dA_log, ddt + g1.ddt_bias
    np.testing.assert_array_equal(packed.dinitial_state[1], ds[1])  # zero length: the final state is the initial
    np.testing.assert_allclose(packed.dA_log, dA, rtol=1e-12)
    np.testing.assert_allclose(packed.ddt_bias, ddt, rtol=1e-12, atol=1e-12)


def test_grouped_heads_sum_the_query_gradients():
    x, opts, do, ds = problem(T=6, H=1, HV=2, gate="log", beta="raw", l2norm=True)
    gva = kdacupy.kda_backward(do, **x, **opts)
    rep = dict(x, q=np.repeat(x["q"], 2, axis=2), k=np.repeat(x["k"], 2, axis=2))
    full = kdacupy.kda_backward(do, **rep, **opts)  # H = HV = 2: one query head per value head
    np.testing.assert_allclose(gva.dq[:, :, 0], full.dq.sum(axis=2), atol=1e-12)
    np.testing.assert_allclose(gva.dk[:, :, 0], full.dk.sum(axis=2), atol=1e-12)
    np.testing.assert_allclose(gva.dv, full.dv, atol=1e-12)


def test_scalar_gradient_by_hand():
    """K = V = 1, one token, S0 = s: o = scale q (a s + b k (v - a s k)), a = e^g."""
    q, k, v, g, b, s, scale = 0.7, -1.3, 0.4, -0.2, 0.6, 0.9, 0.5
    a = np.exp(g)
    rec = kda_backward_reference(*(np.full((1, 1, 1, 1), x) for x in (1.0, q, k, v, g)), np.full((1, 1, 1), b),
                                 initial_state=np.full((1, 1, 1, 1), s), scale=scale)
    St = a * s + b * k * (v - a * s * k)
    expect = dict(dq=scale * St, dk=scale * q * b * (v - 2 * a * s * k), dv=scale * q * b * k,
                  dg=scale * q * (a * s - b * k * k * a * s), dbeta=scale * q * k * (v - a * s * k),
                  dinitial_state=scale * q * (a - b * k * k * a))
    for field, got in zip(FIELDS, rec):
        if field in expect:
            np.testing.assert_allclose(np.ravel(got), [expect[field]], rtol=1e-14, err_msg=field)

"""The precision model: its rounding points, and its error against the reference.

Bounds (RMSE ratio against the float64 reference, bf16 inputs and operands):
bf16 keeps 8 significant bits, so one rounding of a value costs at most 2^-8
relative (its unit roundoff) and about 1.7e-3 RMS on Gaussian values (the "bf16
floor" the accuracy report prints); the bounds count in u = 2^-9 ~ 1.95e-3, a
little above that RMS. On its way to the output a value passes through about
five bf16 roundings in series (decayed q/k, the state operand, the corrected
values, U, the output itself), which adds up in quadrature to ~3.7e-3, and the
bf16 state carries rounding from chunk to chunk for as long as the gate
remembers (up to ~1/(1 - decay) chunks). With the FlashKDA sweep's gates the
memory is short enough that we bound the output at 8u (1.6e-2) and the state at
12u; both are 2-3x above the worst measured values (6.4e-3, 6.3e-3 at T=2048),
so a real regression (a lost FMA, a rounding at the wrong place) is caught, and
the model must stay above the floor of rounding the exact output once.
"""
import itertools

import numpy as np
import pytest

from kdacupy.cli.accuracy import BIAS_REGIMES, G_REGIMES, OPTIONS, make_inputs as sweep_inputs
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.precision import kda_model, prepare_chunks, recurrence_step, solve_unit_lower
from kdacupy.numerics.reference import kda_reference

from ..inputs import make_inputs, rmse_ratio

U_BF16 = 2.0 ** -9  # the error unit u (above)
REF_OPTS = {n: x for n, x in OPTIONS.items() if n != "state_dtype"}


@pytest.mark.parametrize("g_regime,bias_regime", list(itertools.product(G_REGIMES, BIAS_REGIMES)))
def test_model_error_on_the_sweep(g_regime, bias_regime):
    x = sweep_inputs(512, 2, 64, 64, g_regime, bias_regime, seed=1)
    ref_o, ref_s = kda_reference(**x, **REF_OPTS)
    o, s = kda_model(**x, **OPTIONS)
    assert np.isfinite(o.astype(np.float32)).all() and np.isfinite(s).all()
    floor = rmse_ratio(ref_o.astype(np.float32).astype(BF16), ref_o)
    assert floor < rmse_ratio(o, ref_o) < 8 * U_BF16
    assert rmse_ratio(s, ref_s) < 12 * U_BF16


def test_fp32_state_is_more_accurate_with_long_memory():
    x = sweep_inputs(2048, 2, 64, 64, "-8", "-8", seed=2)  # decay ~ e^-0.002 per token
    ref_o, ref_s = kda_reference(**x, **REF_OPTS)
    _, s16 = kda_model(**x, **OPTIONS)
    _, s32 = kda_model(**x, **OPTIONS, state_precision="fp32")
    assert rmse_ratio(s32, ref_s) < 0.75 * rmse_ratio(s16, ref_s)


def test_state_update_is_one_fp32_fma():
    # H * a = 1 + 2^-11 + 2^-24 exactly; rounded on its own that loses 2^-24, fused it is kept
    K = V = 16
    H = np.full((1, K, V), 1 + 2.0 ** -12)
    ops = dict(q_dec=np.zeros((1, 16, K)), k_dec=np.zeros((1, 16, K)), k_res=np.eye(16, K)[None],
               INV=np.eye(16)[None], Mqk=np.zeros((1, 16, 16)), gexp=np.full((1, K), 1 + 2.0 ** -12))
    v = np.zeros((1, 16, V))
    v[0, 0, :] = -1.0  # U row 0 = -1, so dS = k_res^T U = -1 in row 0 of the state
    beta = np.ones((1, 16))
    H1, _ = recurrence_step(H, ops, v, beta, np.float32, "fp32")
    assert H1[0, 0, 0] == 2.0 ** -11 + 2.0 ** -24  # single rounding
    assert H1[0, 1, 0] == np.float32(1 + 2.0 ** -12) * np.float32(1 + 2.0 ** -12)  # dS = 0 there
    H2, _ = recurrence_step(H, ops, v, beta, np.float32, "bf16")
    assert H2[0, 0, 0] == float(np.float32(2.0 ** -11 + 2.0 ** -24).astype(BF16))


def test_intra_chunk_inverse_is_the_inverse():
    rng = np.random.default_rng(0)
    kn = rng.standard_normal((8, 16, 64))
    kn /= np.linalg.norm(kn, axis=-1, keepdims=True)
    g2 = -rng.uniform(0, 0.5, (8, 16, 64))
    beta = rng.uniform(0, 1, (8, 16))
    ops = prepare_chunks(kn, kn, g2, beta, 0.125)
    gc = np.cumsum(g2, axis=-2)
    L = np.einsum("bid,bjd,bijd->bij", kn, kn, np.exp2(gc[:, :, None] - gc[:, None, :]))
    L = np.tril(L, -1) * beta[..., None]
    exact = np.linalg.inv(np.eye(16) + L)
    assert np.max(np.abs(ops["INV"] - exact)) < 4 * U_BF16 * np.max(np.abs(exact))
    assert np.all(np.triu(ops["INV"], 1) == 0) and np.all(np.diagonal(ops["INV"], axis1=1, axis2=2) == 1)


@pytest.mark.parametrize("beta", [0.5, 0.999, 1.5, 1.999])
def test_inverse_of_repeated_keys_is_exact_to_bf16(beta):
    # one key 16 times, no decay: Lb is ~beta below the diagonal, and (I + Lb)^-1 has
    # entries -beta (1 - beta)^(i-j-1), at most 2 in size. Powers of Lb grow
    # binomially (Lb^8 ~ 6435 beta^8): the fp16 Neumann product lost every digit
    # at beta = 0.999 and overflowed (NaN) for beta > 1. The fp32 solve loses
    # ~16 fp32 ulps at most, so INV is the exact inverse rounded to bf16 (8 significant
    # bits: at most 2^-8 relative).
    k = np.random.default_rng(1).standard_normal(128)
    kn = np.broadcast_to(k / np.linalg.norm(k), (1, 16, 128))
    ops = prepare_chunks(kn, kn, np.zeros((1, 16, 128)), np.full((1, 16), beta), 0.125)
    kb = ops["k_dec"][0, 0]  # the bf16 key both factors of L are rounded to (no decay)
    Lb = np.tril(np.full((16, 16), np.float32(np.float32(kb @ kb) * np.float32(beta))), -1)
    exact = np.linalg.inv(np.eye(16) + Lb)
    assert np.isfinite(ops["INV"]).all()
    assert np.all(np.abs(ops["INV"] - exact) <= 2.0 ** -8 * np.abs(exact) + 2.0 ** -16)
    assert np.max(np.abs(solve_unit_lower(Lb) - exact)) < 2.0 ** -18


def test_extreme_log_decay_uses_the_pair_form():
    # g = -60 per token: 2^-gc overflows fp32 within a chunk, the pair form must take over
    x, opts = make_inputs(T=40, K=64, V=64, gate="log", g_scale=60.0)
    ref_o, ref_s = kda_reference(**x, **opts, output_final_state=True)
    o, s = kda_model(**x, **opts, output_final_state=True)
    assert np.isfinite(o.astype(np.float32)).all()
    assert rmse_ratio(o, ref_o) < 8 * U_BF16
    assert rmse_ratio(s, ref_s) < 8 * U_BF16


def test_varlen_equals_separate_calls_bitwise():
    lens = [17, 0, 40, 5]
    x, opts = make_inputs(K=64, V=64, cu_seqlens=lens, state=np.float32)
    o, s = kda_model(**x, **opts, output_final_state=True)
    cu = opts.pop("cu_seqlens")
    s0 = opts.pop("initial_state")
    for n, (bos, eos) in enumerate(zip(cu[:-1], cu[1:])):
        part = {name: a[:, bos:eos] for name, a in x.items()}
        on, sn = kda_model(**part, **opts, initial_state=s0[n:n + 1], output_final_state=True)
        np.testing.assert_array_equal(o[:, bos:eos].astype(np.float32), on.astype(np.float32))
        np.testing.assert_array_equal(s[n:n + 1], sn)


def test_zero_length_sequence_returns_initial_state_unrounded():
    x, opts = make_inputs(K=64, V=64, cu_seqlens=[3, 0], state=np.float32)
    _, s = kda_model(**x, **opts, output_final_state=True)
    np.testing.assert_array_equal(s[1], opts["initial_state"][1])
    assert not np.array_equal(s[0], opts["initial_state"][0])


def test_bf16_state_holds_bf16_values():
    x, opts = make_inputs(K=64, V=64, state=np.float32)
    _, s = kda_model(**x, **opts, output_final_state=True, state_dtype=np.float32)
    np.testing.assert_array_equal(s, s.astype(BF16).astype(np.float32))
    _, s32 = kda_model(**x, **opts, output_final_state=True, state_precision="fp32")
    assert not np.array_equal(s32, s32.astype(BF16).astype(np.float32))

"""The factored form's reference (precision.py step 4): each channel's in-chunk decay measured
from the centre of its range, so each factor spans half of it (docs/design.md section 2).

What must hold: the factors 2^(gc - gr), 2^(gr - gc) never leave [2^-100, 2^100] on the tensor
core path; a chunk takes the pair form only when some channel ranges over 2 SAFE_EXPONENT; at
FlashKDA's gate (sigmoid, lower_bound -5) no chunk does, whatever the inputs; and at the new
limit the factored products are the definition's to bf16 accuracy, with nothing overflowing or
flushed to zero.
"""
import numpy as np
import pytest

from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.precision import (
    CHUNK, LOG2E_F32, SAFE_EXPONENT, chunk_decay, decayed_operands, gate_f32, kda_model, pair_form_chunks,
    prepare_chunks,
)
from kdacupy.numerics.reference import kda_reference

from ..inputs import make_inputs, rmse_ratio

U_BF16 = 2.0 ** -9  # the tests' error unit (tests/numerics/test_precision.py says why)
f32 = np.float32


def chunk_with_range(span, where, K=64, seed=0):
    """Base-2 gates [1, 16, K] whose cumulative sums fall by ``span`` over the chunk's rows, the
    fall placed at the chunk's front, back, or spread; channel c's span scaled by (c + 1) / K."""
    rows = {"front": [1, 2], "back": [14, 15], "spread": list(range(1, CHUNK))}[where]
    g2 = np.zeros((1, CHUNK, K))
    g2[0, rows, :] = -span / len(rows) * (np.arange(1, K + 1) / K)
    g2 += -1e-3 * np.random.default_rng(seed).uniform(size=g2.shape)  # unequal rows
    return g2.astype(f32).astype(np.float64)


def unit_rows(shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(BF16).astype(np.float64)


def test_the_reference_is_the_centre_of_each_channels_range():
    rng = np.random.default_rng(3)
    g2 = f32(rng.normal(0.0, 4.0, (5, CHUNK, 32))).astype(np.float64)  # both signs: a log gate may grow
    gc, gt, gr = chunk_decay(g2)
    hi, lo = gc.max(axis=-2, keepdims=True), gc.min(axis=-2, keepdims=True)
    np.testing.assert_array_equal(gr, f32(f32(hi + lo) * f32(0.5)))
    np.testing.assert_array_equal(gt, gc[..., -1:, :])
    half = (hi - lo) / 2
    # each factor's exponent is at most half the range (to an fp32 rounding of the centre), never
    # more than the old first-row reference's |gc|
    assert np.all(np.abs(f32(gc - gr)) <= half * (1 + 2.0 ** -22) + 2.0 ** -126)
    assert np.all(half <= np.abs(gc).max(axis=-2, keepdims=True))


@pytest.mark.parametrize("where", ["front", "back", "spread"])
def test_a_chunk_takes_the_pair_form_only_past_twice_the_limit(where):
    limit = 2 * SAFE_EXPONENT
    under, over = chunk_with_range(limit - 0.5, where), chunk_with_range(limit + 0.5, where)
    assert not pair_form_chunks(*chunk_decay(under)[::2])[0]
    assert pair_form_chunks(*chunk_decay(over)[::2])[0]
    gc_under = chunk_decay(under)[0]
    assert np.abs(gc_under).max() > SAFE_EXPONENT  # the first-row reference took the pair form here


def test_flashkdas_gate_never_takes_the_pair_form():
    # sigmoid gate, lower_bound -5: at most 5 / ln 2 = 7.2 per token in base 2, 15 steps between a
    # chunk's first and last row: a range of 108, half 54 < 100, whatever the gate's inputs. Under
    # the first-row reference every saturated chunk took the pair form (16 x 7.2 = 115 > 100).
    HV, K = 2, 64
    g = np.full((1, 64, HV, K), 60.0)  # saturated: every token at the lower bound
    g[0, 20:40] = np.random.default_rng(0).normal(0, 30, (20, HV, K))
    g2 = gate_f32(g, "sigmoid", np.zeros(HV), None, -5.0)
    chunks = g2[0].reshape(4, CHUNK, HV, K).transpose(0, 2, 1, 3)  # [chunk, HV, 16, K]
    gc, _, gr = chunk_decay(chunks)
    assert not pair_form_chunks(gc, gr).any()
    assert (np.abs(gc).max(axis=(-1, -2)) > SAFE_EXPONENT)[[0, 3]].all()


@pytest.mark.parametrize("where", ["front", "back", "spread"])
def test_at_the_limit_the_factors_stay_normal_and_the_products_exact_to_bf16(where):
    K = 64
    g2 = chunk_with_range(2 * SAFE_EXPONENT - 0.5, where, K)
    q, k = unit_rows((1, CHUNK, K), 1), unit_rows((1, CHUNK, K), 2)
    gc, gt, gr = chunk_decay(g2)
    assert not pair_form_chunks(gc, gr)[0]
    op = decayed_operands(q, k, gc, gt, gr, 0.125)
    for name in ("q_m", "k_m", "k_i"):
        x = op[name]
        assert np.isfinite(x).all(), name
        # a factor of 2^-100 on a unit row's element (>= 2^-16 here): far above fp32's normal range
        assert np.all(np.abs(x) >= 2.0 ** -126), name
        assert np.all(np.abs(x) <= 2.0 ** 101), name
    beta = np.full((1, CHUNK), 0.7)
    ops = prepare_chunks(q, k, g2, beta, 0.125)
    # the definition: L_ij = sum_d k_id k_jd 2^(gc_id - gc_jd), i > j; Mf likewise with q scale
    E = np.exp2(gc[0, :, None, :] - gc[0, None, :, :])
    L = np.tril(np.einsum("id,jd,ijd->ij", k[0], k[0], E), -1)
    Mf = np.tril(np.einsum("id,jd,ijd->ij", 0.125 * q[0], k[0], E))
    below = np.tri(CHUNK, k=-1, dtype=bool)[:, :, None]
    assert np.max(np.abs(E * below)) <= 1.0  # decays only: every in-chunk product is at most 1
    # Mqk is bf16(Mf): within a bf16 rounding of each operand pair's magnitude (unit rows: <= 1)
    assert np.max(np.abs(ops["Mqk"][0] - Mf)) <= 4 * 2.0 ** -8 * 0.125
    # INV solves with L: (I + Lb) INV = I to bf16 accuracy
    Lb = L * beta[0][:, None]
    assert np.max(np.abs((np.eye(CHUNK) + Lb) @ ops["INV"][0] - np.eye(CHUNK))) <= 8 * 2.0 ** -8


@pytest.mark.parametrize("per_token", [9.0, 9.2])
def test_decays_at_the_new_limit_against_the_reference(per_token):
    # log gate, e^-9.2 per token: 13.3 per token in base 2, a range of 199 over 15 steps; the first
    # row's reference saw |gc| = 212 and took the pair form, the centre sees 99.5: tensor cores
    x, opts = make_inputs(T=48, H=1, K=64, V=64, gate="log", g_scale=1.0, state=np.float32)
    x["g"] = np.full(x["g"].shape, -per_token).astype(x["g"].dtype)
    g2 = f32(-per_token * LOG2E_F32)
    assert 15 * abs(g2) < 2 * SAFE_EXPONENT < 16 * abs(g2)
    ref_o, ref_s = kda_reference(**x, **opts, output_final_state=True)
    o, s = kda_model(**x, **opts, output_final_state=True)
    assert np.isfinite(o.astype(np.float32)).all() and np.isfinite(s).all()
    assert rmse_ratio(o, ref_o) < 8 * U_BF16
    assert rmse_ratio(s, ref_s) < 8 * U_BF16

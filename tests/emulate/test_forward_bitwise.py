"""The forward kernels on the CPU emulation bit for bit: the output and the final state of every
case of the option matrix (tests/cases.py), both state precisions.

precision.py's kda_model rounds some sums once where the kernels take mma steps, so the parity
suite (test_kernels_emulate.py) holds the forward within parity.EMULATE only, and an error of an
ulp in the output ([14]) or the final state ([16]) would pass it. The backward's recompute
(kdacupy/numerics/backward_recompute.py) models kda_prepare and kda_recurrence to the bit up to
the state entering each chunk; the output and the final state follow from those states here:
  o^T = out_dtype(mma(mma(Hop, q_dec^T), U^T, Mqk^T))   (one fp32 accumulator, [14])
with Hop = bf(S_c) and U^T as [11]-[13] compute them from S_c, and the final state is the state
entering one more chunk of padding (zero keys, gexp = 1: it passes the state through unchanged),
stored in the state dtype ([16]; a zero-length sequence: its initial state, converted only).
A head dim without variants of its own (K, V in [16, 256] outside {64, 128, 256}) runs on its tiles
over inputs padded with zeros, the padded channels' gate 0 (docs/design.md section 2): so does the
exact forward here, and the result is cut back to the true sizes."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.backward_arith import mma
from kdacupy.numerics.backward_recompute import chunk_states, l2norm_exact, prepare_exact
from kdacupy.numerics.dtypes import F32, round_bf16, round_f32, round_to
from kdacupy.numerics.precision import Chunks, beta_f32, gate_f32, scale_f32
from kdacupy.numerics.reference import state_from_kv, state_to_kv
from kdacupy.numerics.tiles import pad_to, tile_of

from ..cases import CASES, FP32_SAMPLE, case_inputs
from ..sweeps import sample

pytestmark = pytest.mark.emulate


def _T(x):
    return np.swapaxes(x, -1, -2)


def forward_exact(q, k, v, g, beta=None, *, scale=None, initial_state=None, output_final_state=False,
                  cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log",
                  A_log=None, dt_bias=None, lower_bound=None, state_layout="kv", state_dtype=None,
                  state_precision="bf16"):
    """kda_forward's (o, final state) on the emulation's default numerics, to the bit."""
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    KT, VT = tile_of(K), tile_of(V)
    qn, kn = (pad_to(np.asarray(x, np.float64), -1, KT) for x in (q, k))
    if qk_l2norm:
        (qn, _), (kn, _) = l2norm_exact(qn), l2norm_exact(kn)
    g2 = pad_to(gate_f32(np.asarray(g, np.float64), gate, A_log, dt_bias, lower_bound), -1, KT)
    v = pad_to(np.asarray(v), -1, VT)
    b = beta_f32(beta, (B, T, HV), beta_sigmoid, allow_neg_eigval)
    ch = Chunks.of(B, T, cu_seqlens)

    def chunks(x):  # [N, HV, chunks + 1, 16, ...]: one chunk of padding after the last
        c = ch.split(x)
        return np.concatenate([c, np.zeros_like(c[:, :, :1])], axis=2)
    qc, kc = (chunks(np.repeat(x, HV // H, axis=2)) for x in (qn, kn))
    vc, gc, bc = (chunks(x) for x in (np.asarray(v, np.float64), g2, b))
    ops = prepare_exact(qc, kc, gc, bc, scale_f32(scale, K))
    S0 = np.zeros((ch.N, HV, KT, VT)) if initial_state is None else pad_to(pad_to(state_to_kv(initial_state, state_layout),
                                                                               -2, KT), -1, VT)
    S = chunk_states(round_bf16(S0) if state_precision == "bf16" else round_f32(S0), ops, vc, bc, state_precision)
    Hop = round_bf16(S)                                                                 # [11]
    Wt = mma(None, Hop, _T(ops["k_dec"]))                                               # [12]
    vsub = round_bf16(round_f32(bc[..., None, :] * round_f32(_T(vc) - Wt)))
    Ut = round_bf16(mma(None, vsub, _T(ops["INV"])))                                    # [13]
    Ot = mma(mma(None, Hop, _T(ops["q_dec"])), Ut, _T(ops["Mqk"]))                       # [14]
    o = np.ascontiguousarray(round_to(ch.join(_T(Ot)[:, :, :-1])[..., :V], v.dtype).astype(v.dtype))
    if not output_final_state:
        return o, None
    if state_dtype is None:
        state_dtype = initial_state.dtype if initial_state is not None else F32
    final = np.where((ch.lengths == 0)[:, None, None, None], S0, _T(S[:, :, -1]))[..., :K, :V]  # [16]
    return o, np.ascontiguousarray(round_to(state_from_kv(final, state_layout), state_dtype).astype(state_dtype))


# the parity suite's sample (tests/cases.py, the builds test_kernels_emulate.py makes): every case at the bf16
# state, FP32_SAMPLE's at the fp32 state; the rest is a sweep (tests/sweeps.py)
@pytest.mark.parametrize("name, precision", sample([(n, p) for p in ("bf16", "fp32") for n in CASES],
                                                   lambda n, p: p == "bf16" or n in FP32_SAMPLE))
def test_emulated_forward_is_bit_for_bit(name, precision):
    x, opts = case_inputs(name, precision)
    got = kdacupy.kda_forward(**x, **opts, backend="emulate")
    for a, b in zip(got, forward_exact(**x, **opts)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("slots_per_cta", [3, 8])
def test_prepare_ctas_spanning_sequences_are_bit_for_bit(slots_per_cta, monkeypatch):
    """A kda_prepare CTA walks consecutive slots, finding each one's sequence by stepping on from the last
    (kernels/common.cuh, SlotWalk); the Kimi shapes give 8 slots a CTA, these small ones 1: here 3 and 8
    slots a CTA cross a zero-length sequence, ragged tails, the unused slots after them and sequence
    starts mid-CTA."""
    import kdacupy.ops.forward.layouts as layouts

    monkeypatch.setattr(layouts, "prepare_slots_per_cta", lambda nslots: slots_per_cta)
    x, opts = case_inputs("varlen-ragged-zero-vk-bf16", "bf16")
    got = kdacupy.kda_forward(**x, **opts, backend="emulate")
    for a, b in zip(got, forward_exact(**x, **opts)):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


#: The wgmma recurrence (kda_recurrence's KDA_MMA_WGMMA, docs/design.md section 5) on cases it
#: serves (K <= 128, BV = 64 or 128): each k16 wgmma adds the exact sum of its 16 products, rounded
#: once, in key order, as mma.sync's chain does, so the same exact forward holds it to the bit.
#: (case, state precision, BV): K = V = 128 bf16 in both precisions (one on two warpgroups; one
#: prepare build), fp32 values (4-byte value rows). Ragged sequences, a zero-length one and the "vk"
#: layout: test_forward_rings.py's wgmma ring and test_checkpoints_emulate.py's wgmma case.
WGMMA_RUNS = [("softplus-raw-beta", "bf16", 64), ("softplus-raw-beta", "fp32", 128), ("fp32-inputs", "bf16", 64)]


# (cover=False: fp32 inputs' wgmma build is a sweep; its mma.sync forward is bit for bit above)
@pytest.mark.parametrize("name, precision, BV", sample(WGMMA_RUNS, lambda n, p, b: n != "fp32-inputs",
                                                       ids=lambda n, p, b: f"{n}-{p}-BV{b}", cover=False))
def test_emulated_wgmma_forward_is_bit_for_bit(name, precision, BV, monkeypatch):
    import kdacupy.ops.forward.kernels as kernels
    from kdacupy.ops.forward.tuning import TileConfig

    launched, launch = [], kernels.launch_recurrence
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(BV, 2, "wgmma"))
    monkeypatch.setattr(kernels, "launch_recurrence",
                        lambda *a, **kw: launched.append(kw.get("ws_core")) or launch(*a, **kw))
    x, opts = case_inputs(name, precision)
    got = kdacupy.kda_forward(**x, **opts, backend="emulate")
    assert launched == [True]  # the wgmma variant on its core-matrix workspace
    for a, b in zip(got, forward_exact(**x, **opts)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_a_nan_gate_mid_chunk_gives_the_models_output():
    """The sigmoid gate's sums only fall, so kda_prepare takes their range from the first and last
    rows (kernels/prepare_steps.cuh, gate_cumsum): after a NaN gate that range is the first sum's,
    where the model's fmax / fmin over the rows skip the NaN row. Either way the chunk's outputs are
    NaN (the mma of Mqk and U carries a NaN row of U into every row), and so is everything after it
    in that head: the same elements."""
    x, opts = case_inputs("fixed-gva-sigmoid", "bf16")
    x["g"] = x["g"].copy()
    x["g"][0, 21, 1, 5] = np.nan  # sequence 0, value head 1, channel 5: row 5 of chunk 1
    got = kdacupy.kda_forward(**x, **opts, backend="emulate")
    want = forward_exact(**x, **opts)
    o = got[0].astype(np.float64)
    assert np.isnan(o[0, 16:, 1]).all() and np.isfinite(o[0, :16]).all() and np.isfinite(o[:, :, 0]).all()
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.astype(np.float64), b.astype(np.float64))


@pytest.mark.parametrize("ws_core", [False, True], ids=["row-major", "core-matrix"])
def test_l2norm_of_rows_far_from_unit_is_bit_for_bit(ws_core, monkeypatch):
    """The cases' q and k rows are unit already, so [1]'s norms are ~1 for both and a q norm applied to k
    (the prepare runs both sums as one pair chain, kernels/rows.cuh) would round away: here each row is
    scaled by its own factor in [1/8, 8] first, through both prepare builds (the core-matrix one takes the
    pair chain)."""
    import kdacupy.ops.forward.kernels as kernels
    from kdacupy.ops.forward.tuning import TileConfig

    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(64, 2, "wgmma" if ws_core else "sync"))
    x, opts = case_inputs("softplus-raw-beta", "bf16")
    rng = np.random.default_rng(11)
    for name in ("q", "k"):
        f = 2.0 ** rng.uniform(-3, 3, x[name].shape[:-1] + (1,))
        x[name] = (x[name].astype(np.float64) * f).astype(x[name].dtype)
    got = kdacupy.kda_forward(**x, **opts, backend="emulate")
    for a, b in zip(got, forward_exact(**x, **opts)):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))

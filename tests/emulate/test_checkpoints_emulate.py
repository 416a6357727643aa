"""Checkpoints on the forward kernels, emulated (docs/design.md section 7.1): each boundary's state
equals, to the bit, the emulated forward stopped there and the state the kernels hold after that
many chunks (kdacupy/numerics/backward_recompute.py models prepare and the recurrence to the bit
up to each chunk's state), and the precision model's within parity.EMULATE; varlen, both state
precisions and layouts; into rows of the state pool; device-style rows the host would refuse
are skipped by the kernel."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.backward_recompute import chunk_states, l2norm_exact, prepare_exact
from kdacupy.numerics.dtypes import BF16, round_bf16, round_f32, round_to
from kdacupy.numerics.parity import EMULATE, mismatch
from kdacupy.numerics.precision import Chunks, beta_f32, gate_f32, scale_f32
from kdacupy.numerics.reference import state_from_kv, state_to_kv

from ..checkpoint_cases import expected_boundaries, stopped, varlen_case

pytestmark = pytest.mark.emulate
F32 = np.float32
LENGTHS = (70, 32, 0, 64)


def same(a, b):
    np.testing.assert_array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def held_states(x, opts, precision):
    """[N, HV, chunks, K, V]: the state the kernels hold entering each chunk, to the bit."""
    q, k, v = (np.asarray(x[n], np.float64) for n in ("q", "k", "v"))
    (q, _), (k, _) = l2norm_exact(q), l2norm_exact(k)
    B, T, H, K = q.shape
    HV = v.shape[2]
    g2 = gate_f32(np.asarray(x["g"], np.float64), opts["gate"], opts["A_log"], opts["dt_bias"], opts["lower_bound"])
    b = beta_f32(x["beta"], (B, T, HV), True, False)
    ch = Chunks.of(B, T, opts["cu_seqlens"])
    qc, kc = (ch.split(np.repeat(a, HV // H, axis=2)) for a in (q, k))
    vc, gc, bc = ch.split(v), ch.split(g2), ch.split(b)
    S0 = state_to_kv(opts["initial_state"], opts["state_layout"])
    S0 = round_bf16(S0) if precision == "bf16" else round_f32(S0)
    return np.swapaxes(chunk_states(S0, prepare_exact(qc, kc, gc, bc, scale_f32(None, K)), vc, bc, precision), -1, -2)


@pytest.mark.parametrize("precision,layout,dtype", [("bf16", "kv", F32), ("fp32", "vk", BF16)])
def test_checkpoints_are_the_stopped_forward_and_the_held_state(precision, layout, dtype):
    x, opts = varlen_case(LENGTHS, layout=layout)
    J, every = 3, 32
    tail = (2, 64, 64)
    got = {}
    for backend in ("emulate", "model"):
        ck = np.full((4, J) + tail, 5.0, dtype)
        o, fin = kdacupy.kda_forward(**x, **opts, output_final_state=True, checkpoint_every=every, checkpoints=ck,
                                     state_precision=precision, backend=backend)
        got[backend] = o, fin, ck
    o, fin, ck = got["emulate"]
    plain = kdacupy.kda_forward(**x, **opts, output_final_state=True, state_precision=precision, backend="emulate")
    same(o, plain[0])  # checkpoints change nothing else
    same(fin, plain[1])
    held = held_states(x, opts, precision)
    want = expected_boundaries(LENGTHS, every, J)
    for n in range(4):
        for j in range(1, J + 1):
            if (n, j) not in want:
                assert np.all(ck[n, j - 1].astype(F32) == 5.0), (n, j)
                continue
            same(ck[n, j - 1], stopped(x, opts, n, j * every, "emulate", dtype, precision))
            c = j * every // 16  # the state entering chunk c is the state after c chunks
            same(ck[n, j - 1], round_to(state_from_kv(held[n, :, c], layout), dtype).astype(dtype))
    why = mismatch(ck.astype(F32), got["model"][2].astype(F32), EMULATE)
    assert why is None, why


def test_rows_of_the_pool_and_device_style_rows():
    """Rows of the state pool itself (the slots read and written apart); rows outside [0, R),
    which only device indices can bring past the host checks, are skipped by the kernel (the
    launcher called directly with them)."""
    from kdacupy.ops.forward.kernels import forward
    from kdacupy.validation import validate
    from kdacupy.validation.checkpoints import Checkpoints
    from kdacupy.validation.pool import validate_forward_pool
    x, opts = varlen_case((48, 33), HV=1, state=None)
    pool = (0.5 * np.random.default_rng(1).standard_normal((8, 1, 64, 64))).astype(F32)
    slots = np.array([0, 1], np.int32)
    rows = np.array([[2, 9, 3], [-7, 4, 5]], np.int64)  # 9 >= R and -7: skipped; boundary 3 of 48 tokens and
    # boundaries 2, 3 of 33 tokens do not exist (every 16): rows 3, 4 are written, 5 is not
    kw = {k: v for k, v in opts.items() if k not in ("cu_seqlens", "qk_l2norm", "beta_sigmoid", "state_layout")}
    p, a = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=None, initial_state=None,
                    output_final_state=False, cu_seqlens=opts["cu_seqlens"], qk_l2norm=True, beta_sigmoid=True,
                    allow_neg_eigval=False, **kw, state_layout="vk", state_dtype=None, state_precision="bf16",
                    out=None, backend="emulate")
    before = pool.copy()
    p, a = validate_forward_pool(p, a, pool, slots, initial_state=None, output_final_state=False, state_dtype=None)
    forward(p, dict(a, checkpoints=Checkpoints(pool, rows, 16, 3, 8)))
    ends = {2: (0, 16), 3: (0, 48), 4: (1, 32)}
    seq_opts = dict(opts, state_layout="vk")
    for row, (n, end) in ends.items():
        after = before.copy()
        cu = opts["cu_seqlens"]
        kdacupy.kda_forward(**{k: v[:, cu[n]:cu[n] + end] for k, v in x.items()},
                            **{k: v for k, v in seq_opts.items() if k != "cu_seqlens"}, state_pool=after,
                            state_indices=slots[n:n + 1], backend="emulate")
        same(pool[row], after[slots[n]])
    same(pool[[5, 6, 7]], before[[5, 6, 7]])


@pytest.mark.parametrize("every", [16, 32])
def test_wgmma_checkpoints_are_the_mma_sync_ones(monkeypatch, every):
    """The wgmma recurrence (docs/design.md section 5) stores the same checkpoints, output and
    final state as mma.sync, to the bit (K = V = 64, BV = 64: one warpgroup); every 16 tokens a
    boundary ends every chunk, the ring's first stage included."""
    import kdacupy.ops.forward.kernels as kernels
    from kdacupy.ops.forward.tuning import TileConfig

    x, opts = varlen_case(LENGTHS, layout="vk")
    runs = []
    for tiles in (None, TileConfig(64, 3, "wgmma")):  # the default's (the test above builds it), then wgmma
        if tiles is not None:
            monkeypatch.setattr(kernels, "select_tiles", lambda p: tiles)
        ck = np.full((4, 96 // every, 2, 64, 64), 5.0, F32)
        o, fin = kdacupy.kda_forward(**x, **opts, output_final_state=True, checkpoint_every=every, checkpoints=ck,
                                     state_precision="fp32", backend="emulate")
        runs.append((o, fin, ck))
    for a, b in zip(*runs):
        same(a, b)

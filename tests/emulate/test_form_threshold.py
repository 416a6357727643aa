"""The factored / pair form choice at its threshold, to the ulp (precision.py step 6).

A chunk takes the pair form when some channel's half range, fmaxf(hi - gr, gr - lo) in fp32,
passes SAFE_EXPONENT. The two sides are equal in exact arithmetic, but gr = (hi + lo) / 2 is
rounded, so they can differ by an ulp; a kernel that tests one side, or >= for >, decides such
a chunk unlike the model. The chunks here sit on that ulp: one whose only large side is gr - lo,
one whose only large side is hi - gr, one whose larger side is exactly SAFE_EXPONENT (factored).
Each chunk's form is the model's, bit for bit in the output and the final state.
"""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.precision import CHUNK, LOG2E_F32, SAFE_EXPONENT, chunk_decay, gate_f32, pair_form_chunks

from ..inputs import make_inputs
from .test_forward_bitwise import forward_exact

pytestmark = pytest.mark.emulate

f32 = np.float32


def sides(column):
    """hi - gr, gr - lo (fp32) of a channel whose log gates over a chunk are ``column`` (gate="log")."""
    gc, _, gr = chunk_decay(gate_f32(column.astype(np.float64)[:, None], "log", None, None, None))
    return f32(f32(gc.max()) - f32(gr[0, 0])), f32(f32(gr[0, 0]) - f32(gc.min()))


def find_gates(want, seed):
    """A chunk's log gates for one channel, fp32, whose sides satisfy ``want(hi - gr, gr - lo)``:
    a fall of about 2 SAFE_EXPONENT after the first row, then small unequal decays (so that the
    in-chunk factors are no powers of 2 and the two forms round differently), found by a random
    search near the threshold (one try in a few hundred qualifies)."""
    rng = np.random.default_rng(seed)
    column = np.zeros(CHUNK, np.float32)
    column[2:] = -rng.uniform(0.0, 0.1, CHUNK - 2)
    rest = float(np.sum(column[2:], dtype=np.float64)) * LOG2E_F32
    for _ in range(200_000):
        column[0] = -rng.uniform(0.0, 60.0) / LOG2E_F32
        column[1] = (-2 * SAFE_EXPONENT - rest + rng.uniform(-2e-4, 2e-4)) / LOG2E_F32
        if want(*sides(column)):
            return column
    raise AssertionError("no such gates found")


CHUNKS = {
    "gr - lo alone above": lambda up, down: up <= SAFE_EXPONENT < down,
    "hi - gr alone above": lambda up, down: down <= SAFE_EXPONENT < up,
    "at the threshold, neither above": lambda up, down: max(up, down) == SAFE_EXPONENT,
}


@pytest.mark.parametrize("mma", ["sync", "wgmma"])
def test_each_chunk_takes_the_models_form_at_the_threshold(mma, monkeypatch):
    """Both prepare builds: the row-major workspace's, and the core-matrix one of the wgmma recurrence
    (whose threads own whole channel ranges and finish the factored products from their accumulators)."""
    import kdacupy.ops.forward.kernels as kernels

    if mma == "wgmma":
        from kdacupy.ops.forward.tuning import TileConfig

        monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(64, 2, "wgmma"))
    launched, launch = [], kernels.launch_recurrence
    monkeypatch.setattr(kernels, "launch_recurrence", lambda *a, **kw: launched.append(kw.get("ws_core")) or launch(*a, **kw))
    K = 64
    x, opts = make_inputs(T=CHUNK * len(CHUNKS), H=1, K=K, V=64, gate="log", state=np.float32, seed=3)
    g = x["g"].astype(np.float32)  # the other channels' decays: small (their half ranges under 8)
    for i, want in enumerate(CHUNKS.values()):
        g[0, CHUNK * i: CHUNK * (i + 1), 0, 5] = find_gates(want, seed=i)
    x["g"] = g
    gc, _, gr = chunk_decay(gate_f32(g[0, :, 0].reshape(len(CHUNKS), CHUNK, K).astype(np.float64),
                                     "log", None, None, None))
    assert pair_form_chunks(gc, gr).tolist() == [True, True, False]
    got = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
    assert launched == [mma == "wgmma"]  # the prepare build the family reads
    for a, b in zip(got, forward_exact(**x, **opts, output_final_state=True)):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))

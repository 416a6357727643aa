"""kda_backward at head dims without variants of their own (K, V in [16, 256] outside
{64, 128, 256}, K != V included) on the emulated kernels: the forward's any-size prepare and
recurrence (storing each chunk's state), then kda_bwd_chain, kda_bwd_chunk and kda_bwd_reduce's
any-size variants, on the tiles above the true sizes with loads and stores masked at them.

Held bit for bit against the backward model, which runs over the same zero-padded arrays (its
docstring: a padded channel's gate 0, its dA_log terms +0); under the emulation's checks, with the
scratch NaN-filled, nothing unwritten is read (the states' and gradient states' value rows past V,
which no recurrence or chain CTA writes, among them); against the float64 reference gradient
within the model's own bound (tests/numerics/test_backward_model.py). Each case builds four variants
of its own (3-6 s of the cold run), so the default run takes a sample of the cases (SAMPLE below); the
rest is a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy
import kdacupy.ops.backward.kernels as bkernels
from kdacupy.numerics.backward_model import kda_backward_model
from kdacupy.numerics.backward_reference import kda_backward_reference
from kdacupy.numerics.dtypes import BF16, F32
from kdacupy.ops.forward.tuning import TileConfig

from ..backward_cases import FD_CASES, problem
from ..numerics.test_backward_model import BOUND, measured
from ..sweeps import sample
from .test_backward_checked import assert_no_unwritten_byte
from .test_backward_emulate import assert_bitwise

pytestmark = pytest.mark.emulate

#: name -> problem() options. K = 192 runs the 256 tile (kda_bwd_chunk's 16-column value blocks and
#: one n-tile per [B7] pass), with its first chunk in the pair form; 17 and 33 make rows that are not
#: 16-byte multiples (element-wise loads and stores); V = 100 on BV = 16 leaves the tile's last
#: value rows to no CTA.
ANY_CASES = {
    "K60-V100-sigmoid-gva-l2norm-neg-eigval": dict(FD_CASES["sigmoid-gva-l2norm-neg-eigval"], T=37, K=60, V=100),
    "K17-V33-softplus-varlen-vk-flat-bias": dict(FD_CASES["softplus-varlen-zero-vk"], lens=[5, 0, 21, 16, 3],
                                                 HV=2, K=17, V=33),
    "K192-V96-log-pair-chunk-l2norm": dict(T=20, K=192, V=96, gate="log", l2norm=True, state=True, dfinal=True),
    "K100-V60-fp32-sigmoid-bias-only": dict(FD_CASES["sigmoid-bias-only-state-only"], T=19, K=100, V=60,
                                            dtype=F32),
    # odd V in fp32: rows of 132 bytes (4-byte aligned), the element-wise path of the fp32 any-size kernels
    "K24-V33-fp32-log-odd-v": dict(T=19, K=24, V=33, dtype=F32, gate="log", beta="raw", state=True, dfinal=True),
    "K16-V96-log-batched": dict(B=2, T=21, K=16, V=96, gate="log", beta="raw", state=True, dfinal=True, l2norm=True),
}

#: the default run's cases: varlen with a zero-length sequence in the vk layout at K = 17, V = 33 (rows off
#: 16 bytes) and the batch at K = 16, V = 96 (test_backward_saved's builds); the K = 60 case runs by default
#: at V = 20 under the checks below. K = 192, the fp32 cases and K = 60, V = 100 are the sweep
SAMPLE = {"K17-V33-softplus-varlen-vk-flat-bias", "K16-V96-log-batched"}


def inputs(name, **over):
    opts_in = dict(ANY_CASES[name], **over)
    dtype = opts_in.pop("dtype", BF16)
    x, opts, do, ds = problem(**opts_in, dtype=dtype)
    if name.startswith("K192"):  # chunk 0's channel 0 decays 20 nats a token faster: the pair form
        x["g"][:, :16, :, 0] = (x["g"][:, :16, :, 0].astype(np.float32) - 20.0).astype(x["g"].dtype)
    if "initial_state" in opts:
        opts["initial_state"] = opts["initial_state"].astype(np.float32)
    return x, opts, do, None if ds is None else ds.astype(np.float32)


# (cover=False: the cases are named, one argument; the sample is SAMPLE's)
@pytest.mark.parametrize("name", sample(list(ANY_CASES), lambda n: n in SAMPLE, cover=False))
def test_any_head_dims_are_the_padded_model_bit_for_bit(name):
    x, opts, do, ds = inputs(name)
    got = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="emulate")
    want = kda_backward_model(do, **x, dfinal_state=ds, **opts)
    assert_bitwise(got, want)
    for g, arg in zip(got, (x["q"], x["k"], x["v"], x["g"], x.get("beta"), opts.get("initial_state"),
                            opts.get("A_log"), opts.get("dt_bias"))):
        assert (g is None) == (arg is None) and (g is None or g.shape == np.shape(arg))


def test_checked_any_head_dims_read_nothing_unwritten(monkeypatch):
    """Under KDACUPY_EMULATE_CHECK=all the scratch starts as NaN bytes: V = 20 runs one recurrence and chain
    CTA of BV = 32 value rows, which leaves rows 32-63 of the 64-row value tile's states and gradient
    states unwritten, and kda_bwd_chunk's one 64-column block must take them as zeros, not read them.
    (The backward's own BV = 64 covers each block of kda_bwd_chunk whole: the launcher takes any tiles,
    so the narrower ones are forced here.)"""
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    monkeypatch.setattr(bkernels, "backward_tiles", lambda p: TileConfig(32, 3))
    x, opts, do, ds = inputs("K60-V100-sigmoid-gva-l2norm-neg-eigval", V=20)
    checked = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="emulate")
    assert_no_unwritten_byte(checked)
    assert_bitwise(checked, kda_backward_model(do, **x, dfinal_state=ds, **opts))


# the default run: SAMPLE's case, on the bit-for-bit test's builds (cover=False: one case of the two)
@pytest.mark.parametrize("name", sample(["K60-V100-sigmoid-gva-l2norm-neg-eigval",
                                         "K17-V33-softplus-varlen-vk-flat-bias"], lambda n: n in SAMPLE, cover=False))
def test_any_head_dims_against_the_float64_gradient(name):
    x, opts, do, ds = inputs(name)
    got = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="emulate")
    refs = kda_backward_reference(do, **x, dfinal_state=ds, **opts)
    for f, e in measured(got, refs).items():
        if e is not None and f != "dA_log":
            assert e < BOUND, f"{f}: {e:.3g}"

"""kda_bwd_chunk's wide value block (128 columns at K = 128: the variant sm_90a and sm_100a run,
kdacupy/ops/backward/tiles.py ``chunk_block``) on the CPU emulation: bit for bit the precision model,
whose sums do not depend on the block; with two blocks (V = 256), grouped value heads, fp32 states,
any head dims, and under racecheck and eager copies. The emulation takes the block every arch builds
unless told, so these tests name the target. The default run takes one block count (V = 128; two blocks
run by default at any head dims) and racecheck; V = 256 and eager copies (2-3 s each of the cold run) are a
sweep (tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy
import kdacupy.ops.backward.kernels as kernels
from kdacupy.numerics.backward_model import kda_backward_model
from kdacupy.numerics.dtypes import BF16
from kdacupy.ops.backward.tiles import WIDE_BLOCK, chunk_block

from ..backward_cases import FD_CASES, problem
from ..sweeps import sample
from .test_backward_emulate import assert_bitwise

pytestmark = pytest.mark.emulate


@pytest.fixture
def wide(monkeypatch):
    """Every kda_bwd_chunk launch takes sm_90a's block; records the blocks launched."""
    seen = []
    real = kernels.chunk_variant

    def on_hopper(p, arch=None):
        var = real(p, "sm_90a")
        seen.append(var.bvc)
        return var

    monkeypatch.setattr(kernels, "chunk_variant", on_hopper)
    return seen


def case(K=128, V=128, **over):
    opts_in = {**FD_CASES["sigmoid-gva-l2norm-neg-eigval"], "T": 37, "K": K, "V": V, **over}
    x, opts, do, ds = problem(**opts_in, dtype=BF16)
    opts["initial_state"] = opts["initial_state"].astype(np.float32)
    return x, opts, do, ds.astype(np.float32)


def check(x, opts, do, ds, precision="bf16"):
    got = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, state_precision=precision, backend="emulate")
    assert_bitwise(got, kda_backward_model(do, **x, dfinal_state=ds, **opts, state_precision=precision))


def test_the_wide_block_is_sm_90a_and_sm_100a_at_k_128():
    assert [chunk_block(128, 128, a) for a in ("sm_80", "sm_90a", "sm_100a")] == [0, WIDE_BLOCK, WIDE_BLOCK]
    assert chunk_block(128, 256, "sm_90a") == WIDE_BLOCK and chunk_block(128, 64, "sm_90a") == 0
    assert chunk_block(64, 128, "sm_90a") == 0 and chunk_block(128, 128, None) == 0


def test_the_block_reaches_the_rendered_config_and_the_label():
    """Two variants differing in the block alone render different sources (the JIT's key) and labels."""
    from kdacupy.ops.backward.kernels import ChunkVariant

    narrow, wide = (ChunkVariant(128, BF16, BF16, BF16, "sigmoid", "sigmoid", True, bvc=b) for b in (0, WIDE_BLOCK))
    assert (narrow.config()["KDA_BVC"], wide.config()["KDA_BVC"]) == (64, WIDE_BLOCK)
    assert narrow.config()["CSM_TOTAL"] < wide.config()["CSM_TOTAL"] == wide.smem
    assert narrow.label() != wide.label() and narrow.only_arches is None and "sm_80" not in wide.only_arches


# (cover=False: V = 256's two blocks run by default in test_wide_block_any_head_dims, at V = 250)
@pytest.mark.parametrize("V", sample([128, 256], lambda V: V == 128, cover=False))
def test_wide_blocks_are_the_model_bit_for_bit(wide, V):
    check(*case(V=V))
    assert wide == [WIDE_BLOCK]


def test_wide_block_fp32_states(wide):
    check(*case(), precision="fp32")
    assert wide == [WIDE_BLOCK]


def test_wide_block_any_head_dims(wide):
    """K = 120, V = 250 run on the 128 x 256 tiles: two wide blocks, the second partly past v_true."""
    check(*case(K=120, V=250))
    assert wide == [WIDE_BLOCK]


# (cover=False: racecheck reports the write-after-read that eager copies show as wrong gradients; eager copies
# of the backward's rings run by default in test_backward_rings)
@pytest.mark.parametrize("mode", sample(["racecheck", "eager"], lambda m: m == "racecheck", cover=False))
def test_wide_block_under_racecheck_and_eager_copies(wide, monkeypatch, mode):
    """Three grouped value heads, 131 tokens with a ragged end: each head's first block copied at its start
    into the region the last head's gate phase read."""
    for k in ("KDACUPY_EMULATE_CHECK", "KDACUPY_EMULATE_CP_ASYNC", "KDACUPY_EMULATE_ORDER"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(*(("KDACUPY_EMULATE_CHECK", "all") if mode == "racecheck" else ("KDACUPY_EMULATE_CP_ASYNC", "eager")))
    check(*case(T=131, HV=3))
    assert wide == [WIDE_BLOCK]

"""The tcgen05 recurrence (sm_100a; kernels/recurrence_tcgen05.cuh, docs/design.md section 5) on the
emulation's twins, at BV = 128 (M = 128, a thread a value row) and BV = 64 (M = 64, a row's key halves in
lanes r and 16 + r): bit for bit the mma.sync forward, plain, under racecheck and under eager copies
(operands read at their issue), on the bulk-copy ring of 2 and 3 stages, with both state precisions,
the state pool, checkpoints, and the split forward's maps (no output, v = 0) and final launch.

The problem is test_forward_rings.py's (131 tokens: 9 chunks, every stage refilled, the last chunk
ragged; a zero-length sequence; 37 tokens) at V = 128 (tcgen05's M = 128, one CTA a head). Each run
builds its own variant (1-3 s of the cold run), so the default run takes a sample of each matrix that
still takes every tile, mode, stage count and precision; the rest is a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy
import kdacupy.ops.forward.kernels as kernels
from kdacupy.ops.forward.tuning import TileConfig

from ..cases import case_inputs
from ..inputs import make_inputs
from ..sweeps import sample
from .test_forward_rings import LENS, identical, set_mode

pytestmark = pytest.mark.emulate


def forward(monkeypatch, tiles, mode=None, precision="fp32", **kw):
    x, opts = make_inputs(cu_seqlens=LENS, H=1, HV=2, K=64, V=128, state=np.float32)
    monkeypatch.setattr(kernels, "select_tiles", lambda p: tiles)
    set_mode(monkeypatch, mode)
    return kdacupy.kda_forward(**x, **opts, output_final_state=True, state_precision=precision,
                               backend="emulate", **kw)


@pytest.fixture(scope="module")
def plain():
    """The mma.sync forward at both state precisions (BV = 32: test_forward_rings.py's plain run)."""
    with pytest.MonkeyPatch.context() as mp:
        return {p: forward(mp, TileConfig(32, 2), precision=p) for p in ("fp32", "bf16")}


#: (BV, mode, stages, state precision): M = 128 (a thread a row), M = 64 (two threads a row, dS's halves at
#: lane fields 0 and 16)
RUNS = [(128, None, 3, "fp32"), (128, None, 2, "bf16"), (128, "racecheck", 2, "fp32"), (128, "eager", 3, "bf16"),
        (64, None, 3, "bf16"), (64, None, 2, "fp32"), (64, "racecheck", 2, "bf16"), (64, "eager", 3, "fp32")]
#: the default run: one run a mode, racecheck at M = 128 (kimi-T8192-H96's tile), the plain one the pool test's build
RUNS_SAMPLE = {(128, None, 2, "bf16"), (128, "racecheck", 2, "fp32"), (64, "eager", 3, "fp32")}


def run_id(bv, mode, stages, precision):
    return f"BV{bv}-{mode or 'plain'}-{stages}-stages-{precision}"


@pytest.mark.parametrize("bv, mode, stages, precision", sample(RUNS, lambda *run: run in RUNS_SAMPLE, run_id))
def test_the_tcgen05_forward_equals_mma_sync(plain, bv, mode, stages, precision, monkeypatch):
    launched = []
    launch = kernels.launch_recurrence
    monkeypatch.setattr(kernels, "launch_recurrence", lambda *a, **kw: launched.append(kw["ws_core"]) or launch(*a, **kw))
    got = forward(monkeypatch, TileConfig(bv, stages, "tcgen05"), mode, precision)
    assert launched == [True]  # the prepare wrote the core-matrix workspace
    identical(got, plain[precision])


@pytest.mark.parametrize("layout, bv", [("vk", 128), ("kv", 128), ("vk", 64)])
def test_the_tcgen05_forward_through_a_pool(layout, bv, monkeypatch):
    """The state read from and written to a pool's slots (slot -1: zeros in, nothing out), either layout."""
    x, opts = make_inputs(cu_seqlens=[40, 0, 70], H=1, HV=2, K=64, V=128)
    shape = (5, 2, 128, 64) if layout == "vk" else (5, 2, 64, 128)
    pool = (0.5 * np.random.default_rng(8).standard_normal(shape)).astype(np.float32)
    idx = np.array([3, -1, 0], np.int32)

    def run(tiles):
        monkeypatch.setattr(kernels, "select_tiles", lambda p: tiles)
        p = pool.copy()
        o, _ = kdacupy.kda_forward(**x, **opts, state_layout=layout, state_pool=p, state_indices=idx, backend="emulate")
        return o, p
    identical(run(TileConfig(bv, 2, "tcgen05")), run(TileConfig(32, 2)))


# the default run: the bf16 state at M = 128 and the fp32 state at M = 64; fp32 at 128 is a sweep
@pytest.mark.parametrize("precision, bv", sample([("bf16", 128), ("fp32", 128), ("fp32", 64)],
                                                 lambda p, b: (p, b) != ("fp32", 128)))
def test_the_tcgen05_forward_with_checkpoints(precision, bv, monkeypatch):
    """The state as held at every second chunk boundary (bf16 checkpoints), as mma.sync stores them."""
    x, opts = make_inputs(cu_seqlens=[70, 0, 37], H=1, HV=2, K=64, V=128, state=np.float32)

    def run(tiles):
        monkeypatch.setattr(kernels, "select_tiles", lambda p: tiles)
        ck = np.full((3, 2, 2, 64, 128), 5.0, np.float32)  # [N, J, HV, K, V]: make_inputs' "kv" layout
        o, fin = kdacupy.kda_forward(**x, **opts, output_final_state=True, state_precision=precision,
                                     checkpoint_every=32, checkpoints=ck, backend="emulate")
        return o, fin, ck
    identical(run(TileConfig(bv, 3, "tcgen05")), run(TileConfig(32, 2)))


def split_forward_v128(monkeypatch):
    # test_forward_rings.py's split forward at K = V = 128 (the M map's rows are K: M = 128 needs both):
    # 200 tokens in 2 segments of 6 and 7 chunks
    x, opts = case_inputs("varlen-ragged-zero-vk-bf16", "bf16", cu_seqlens=[200, 0, 37], H=1, K=128, V=128)
    return kdacupy.kda_forward(**x, **opts, backend="emulate", sequence_parallel=2)


def test_the_split_forward_on_tcgen05_equals_mma_sync(monkeypatch):
    """The maps without the output (the M map's v = 0, the B map's value rows) and the final launch on
    tcgen05, the prepare's core-matrix workspace written once: bit for bit the mma.sync split."""
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(32, 2))
    plain_split = split_forward_v128(monkeypatch)
    launched = []
    launch = kernels.launch_recurrence
    monkeypatch.setattr(kernels, "launch_recurrence", lambda *a, **kw: launched.append(kw["ws_core"]) or launch(*a, **kw))
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(128, 3, "tcgen05"))
    got = split_forward_v128(monkeypatch)
    assert launched == [True, True]  # the merged maps, the forward
    identical(got, plain_split)

"""The forward's cp.async ring wrapping (kda_recurrence, docs/design.md section 5; which test wraps
which ring: docs/test-coverage.md), under racecheck and under eager copies: bit-identical to the
plain run.

The recurrence streams one chunk a stage through ``stages`` stages (2, or 3 from a tuning file);
chunk c + stages refills chunk c's stage after the barrier that ends chunk c. The checked suite's
long case (test_kernels_checked.py, 2000 tokens) wraps the 2-stage ring under racecheck; here
131 tokens (9 chunks: every stage refilled at least twice in either ring, the last chunk ragged)
next to a zero-length sequence and 37 tokens: the 3-stage ring, and both under eager copies.
The tile configurations compute the same bits (BV splits the value rows, the stages only
pipeline the copies), so every run is held to the plain 2-stage one. The sequence-parallel
forward runs the ring without its output (the segment maps, fp32 states, V = K and V) and then
with it from the segments' starts: 2 segments of 6 and 7 chunks. Every input's shape and option
is one of the suites' that build these variants already (no new build). The wgmma runs build their
own: the default run takes the ring under racecheck and the split plain, the rest is a sweep
(tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy
import kdacupy.ops.forward.kernels as kernels
from kdacupy.ops.forward.tuning import TileConfig

from ..cases import case_inputs
from ..inputs import make_inputs
from ..sweeps import sample

pytestmark = pytest.mark.emulate

LENS = [131, 0, 37]
MODES = {"racecheck": {"KDACUPY_EMULATE_CHECK": "all"}, "eager": {"KDACUPY_EMULATE_CP_ASYNC": "eager"}}


def set_mode(monkeypatch, mode):
    for k in ("KDACUPY_EMULATE_CHECK", "KDACUPY_EMULATE_CP_ASYNC", "KDACUPY_EMULATE_ORDER"):
        monkeypatch.delenv(k, raising=False)
    for k, v in MODES.get(mode, {}).items():
        monkeypatch.setenv(k, v)


def identical(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


def forward(monkeypatch, mode, stages):
    # test_kernels_emulate.py's tile test's problem (K = 64, V = 128: BV = 32 by default), longer
    x, opts = make_inputs(cu_seqlens=LENS, H=1, HV=2, K=64, V=128, state=np.float32)
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(32, stages))
    set_mode(monkeypatch, mode)
    return kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")


@pytest.fixture(scope="module")
def plain():
    with pytest.MonkeyPatch.context() as mp:
        return forward(mp, None, 2)


#: (mode, stages); racecheck at 2 stages: test_kernels_checked.py's long case
RUNS = [("eager", 2), ("racecheck", 3), ("eager", 3)]


@pytest.mark.parametrize("mode, stages", RUNS, ids=[f"{m}-{s}-stages" for m, s in RUNS])
def test_long_sequences_wrap_the_ring(plain, mode, stages, monkeypatch):
    identical(forward(monkeypatch, mode, stages), plain)


def split_forward(monkeypatch, mode):
    # test_kernels_checked.py's split forward's case, longer: 200 tokens in 2 segments of 6 and 7 chunks
    x, opts = case_inputs("varlen-ragged-zero-vk-bf16", "bf16", cu_seqlens=[200, 0, 37], H=1)
    set_mode(monkeypatch, mode)
    return kdacupy.kda_forward(**x, **opts, backend="emulate", sequence_parallel=2)


@pytest.mark.parametrize("mode", list(MODES))
def test_long_segments_wrap_the_maps_ring(mode, monkeypatch):
    identical(split_forward(monkeypatch, mode), split_forward(monkeypatch, None))


#: The wgmma recurrence's bulk-copy ring (one mbarrier a stage; docs/design.md section 5) on the same
#: problem at BV = 64 (one warpgroup): 3 stages plain and under eager copies (one build), 2 under
#: racecheck (the async proxy's checks: bulk destinations read before their phase completed, wgmma
#: operands written while read, proxy fences); each run bit for bit the plain mma.sync one.
WGMMA_RUNS = [(None, 3), ("racecheck", 2), ("eager", 3)]


def run_id(mode, stages):
    return f"{mode or 'plain'}-{stages}-stages"


# the default run: racecheck; the 3-stage build (plain, eager) is a sweep, the split below runs 3 stages
# (cover=False: the axis is the runs themselves)
@pytest.mark.parametrize("mode, stages", sample(WGMMA_RUNS, lambda m, s: m == "racecheck", run_id, cover=False))
def test_the_wgmma_ring_wraps_and_equals_mma_sync(plain, mode, stages, monkeypatch):
    x, opts = make_inputs(cu_seqlens=LENS, H=1, HV=2, K=64, V=128, state=np.float32)
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(64, stages, "wgmma"))
    set_mode(monkeypatch, mode)
    identical(kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate"), plain)


#: The split forward on the wgmma recurrence (sm_90a's choice): the prepare writes the core-matrix
#: workspace once, the merged maps' launch runs the ring without the output (an fp32 [K, K + V] state; the
#: block's q_dec and Mqk not copied) and the final launch with it. Bit for bit the mma.sync split: plain
#: at 3 stages, and under racecheck at 2 (the bulk copies' phases, the wgmma operands, the proxy fences).
SPLIT_WGMMA_RUNS = [(None, 3), ("racecheck", 2)]


# the default run: plain; racecheck's two checked builds are a sweep, the ring above runs racecheck
# (cover=False: the axis is the runs themselves)
@pytest.mark.parametrize("mode, stages", sample(SPLIT_WGMMA_RUNS, lambda m, s: m is None, run_id, cover=False))
def test_the_split_forward_on_wgmma_equals_mma_sync(mode, stages, monkeypatch):
    plain_split = split_forward(monkeypatch, None)
    launched = []
    launch = kernels.launch_recurrence
    monkeypatch.setattr(kernels, "launch_recurrence", lambda *a, **kw: launched.append(kw["ws_core"]) or launch(*a, **kw))
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(64, stages, "wgmma"))
    got = split_forward(monkeypatch, mode)
    assert launched == [True, True]  # the merged maps and the forward, both on the core-matrix workspace
    identical(got, plain_split)

"""The backward's cp.async rings wrapping, under racecheck and under eager copies, bit for bit
the precision model (docs/design.md section 9.3; which test wraps which ring: docs/test-coverage.md).

kda_bwd_chain and kda_recurrence's chunk-state store stream one chunk a stage through a ring of
``stages`` stages (3 by default, kdacupy/ops/backward/tiles.py; 2 too); chunk p + stages refills chunk p's stage once
every warp is done with it, which the barrier that ends a chunk guarantees. Only a sequence of
more chunks than stages refills a stage: 131 tokens are 9 chunks, every stage refilled at least
twice in either ring, the last chunk ragged (3 rows), next to a zero-length sequence and one of
37 tokens. kda_bwd_chunk refills its one V-block buffer (S_c and dS_c rows, by cp.async) per
block of 64 value columns and per value head: three value heads of one query head, and at V = 128
two blocks each (the barrier between them is that loop's first). Without these barriers
racecheck reports the write-after-read, and eager copies (landing at issue) overwrite a stage a
warp still reads: wrong gradients. The case is the checked suite's (test_backward_checked.py:
its variants, no new build at the default 3 stages), longer, with channel 0 of chunk 1 of the long sequence
decaying 20 nats a token more (the pair form); the 2-stage ring at V = 128 under racecheck alone
(its checked builds only: the same code as the 3-stage ring, which eager copies run too). The default run
takes the 3-stage ring in both modes (the checked suite's builds); the 2-stage one, two checked builds of its
own, is a sweep (tests/sweeps.py)."""
import functools

import pytest

import kdacupy
import kdacupy.ops.backward.kernels as kernels
from kdacupy.numerics.backward_model import kda_backward_model
from kdacupy.ops.forward.tuning import TileConfig

from ..backward_cases import chunks_in_pair_form
from ..sweeps import sample
from .test_backward_emulate import assert_bitwise, inputs, run

pytestmark = pytest.mark.emulate

CHECKED = "varlen-gva-softplus-vk-f32-gate-and-beta"
LENS = [131, 0, 37]
MODES = {"racecheck": {"KDACUPY_EMULATE_CHECK": "all"}, "eager": {"KDACUPY_EMULATE_CP_ASYNC": "eager"}}


#: (stages, V, mode): the default ring with the checked suite's builds, the 2-stage one with two V-blocks
RUNS = [(3, 64, "racecheck"), (3, 64, "eager"), (2, 128, "racecheck")]


@functools.lru_cache(maxsize=None)
def case(stages, V):
    x, opts, do, ds = inputs(CHECKED, lens=LENS, HV=3, V=V)
    # channel 0 of chunk 1 decays fast (softplus: x = g + dt_bias past 15, 20+ nats a token times
    # exp(A_log) >= 1): the pair form, whose terms the other channels' slow decay keeps large
    x["g"][:, 16:32, :, 0] += 20.0
    return (x, opts, do, ds), kda_backward_model(do, **x, dfinal_state=ds, **opts)


def set_mode(monkeypatch, mode):
    for k in ("KDACUPY_EMULATE_CHECK", "KDACUPY_EMULATE_CP_ASYNC", "KDACUPY_EMULATE_ORDER"):
        monkeypatch.delenv(k, raising=False)
    for k, v in MODES[mode].items():
        monkeypatch.setenv(k, v)


def test_the_long_case_takes_the_pair_form_in_chunk_1():
    x, opts = case(3, 64)[0][:2]
    assert chunks_in_pair_form(x, opts)[0, :, 1].all()


# (cover=False: the 2-stage ring is the 3-stage ring's code; kda_bwd_chunk's refills run by default: per head
# here, per V-block at K = 256 below)
@pytest.mark.parametrize("stages, V, mode", sample(RUNS, lambda s, v, m: s == 3, cover=False,
                                                   ids=lambda s, v, m: f"{s}-stages-V{v}-{m}"))
def test_long_sequences_wrap_the_rings(stages, V, mode, monkeypatch):
    (x, opts, do, ds), want = case(stages, V)
    monkeypatch.setattr(kernels, "backward_tiles", lambda p: TileConfig(64, stages))  # 64: the default's BV
    set_mode(monkeypatch, mode)
    assert_bitwise(kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="emulate"), want)


def test_k256_v_blocks_under_eager_copies(monkeypatch):
    """K = 256: four V-blocks of 16 columns, the buffer refilled three times (no checked build: the
    barrier's absence shows in the gradients)."""
    set_mode(monkeypatch, "eager")
    assert_bitwise(*run("K256-V64-l2norm-f32-gate"))

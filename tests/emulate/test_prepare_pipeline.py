"""kda_prepare's pipeline: a CTA takes several chunk slots of one value head, the next chunk's
rows in flight (cp.async) while the current one computes. Any slots-per-CTA must give the one-
chunk-per-CTA result bit for bit, through unused slots (varlen padding) and ragged tails, and
under every check and the stress modes (copies landing at issue: a missing wait or barrier
reads the next chunk's rows; threads in reverse order). The test shapes are short, so the
launcher's own choice (layouts.prepare_slots_per_cta) is one here: the tests force it."""
import numpy as np
import pytest

import kdacupy
import kdacupy.ops.forward.layouts as layouts

from ..inputs import make_inputs

pytestmark = pytest.mark.emulate


def run(monkeypatch, spc, x, opts):
    monkeypatch.setattr(layouts, "prepare_slots_per_cta", lambda nslots: spc)
    return kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")


def identical(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


def problem():
    # 6 sequences, 10 live chunks in 16 slots: unused slots inside a CTA's run, ragged tails
    return make_inputs(cu_seqlens=[19, 0, 33, 5, 40, 16], H=1, HV=2, K=64, V=64, gate="sigmoid", state=np.float32)


def test_the_launchers_choice():
    assert [layouts.prepare_slots_per_cta(n) for n in (1, 63, 64, 200, 512, 10 ** 6)] == [1, 1, 1, 3, 8, 8]


@pytest.mark.parametrize("spc", [2, 3, 16])
def test_every_slots_per_cta_is_one_chunk_per_cta_bit_for_bit(spc, monkeypatch):
    x, opts = problem()
    identical(run(monkeypatch, spc, x, opts), run(monkeypatch, 1, x, opts))


@pytest.mark.parametrize("stress", [{}, {"KDACUPY_EMULATE_CP_ASYNC": "eager"}, {"KDACUPY_EMULATE_ORDER": "reverse"}])
def test_the_pipeline_under_every_check(stress, monkeypatch):
    x, opts = problem()
    plain = run(monkeypatch, 1, x, opts)
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    for k, v in stress.items():
        monkeypatch.setenv(k, v)
    identical(run(monkeypatch, 4, x, opts), plain)

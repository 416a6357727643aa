"""The emulation's counters of Hopper's asynchronous instructions (KDACUPY_EMULATE_PROFILE,
kdacupy/emulate/profile.h; docs/design.md section 11): wgmma per warpgroup instruction, its B
operand's shared-memory bytes once per warpgroup (not per warp), cp.async.bulk bytes and the
threads' mbarrier waits, on the probes of test_async_sanitizers.py, whose counts are known."""
import numpy as np
import pytest

from kdacupy.cli.roofline import GPUS, MMA_FLOP, times
from kdacupy.emulate import counting

from .test_async_sanitizers import mod, run_wg  # noqa: F401  (the module fixture)


@pytest.fixture(autouse=True)
def unchecked(monkeypatch):
    monkeypatch.delenv("KDACUPY_EMULATE_CHECK", raising=False)
    monkeypatch.delenv("KDACUPY_EMULATE_CP_ASYNC", raising=False)


@pytest.mark.parametrize("reps, grid", [(1, 1), (3, 2)])
def test_wgmma_bulk_and_mbarrier_counts(mod, reps, grid):  # noqa: F811
    plain = run_wg(mod, 8, reps=reps, grid=grid)
    with counting() as recs:
        counted = run_wg(mod, 8, reps=reps, grid=grid)  # B by one 256-byte bulk copy per CTA
    np.testing.assert_array_equal(counted, plain)  # counting changes no result
    (r,) = recs
    assert r["wgmma"] == reps * grid  # one per warpgroup instruction, not per warp or thread
    assert r["wgmma_smem_bytes"] == reps * grid * 16 * 8 * 2  # B of m64n8k16: 16 x 8 bf16
    assert r["bulk_copy_bytes"] == 256 * grid
    assert r["mbarrier_waits"] == 128 * grid  # every thread waits once
    assert r["mma"] == 0 and r["cp_async_bytes"] == 0


def test_generic_path_counts_no_bulk_copy_nor_wait(mod):  # noqa: F811
    with counting() as recs:
        run_wg(mod, 0, reps=2)
    (r,) = recs
    assert (r["wgmma"], r["wgmma_smem_bytes"], r["bulk_copy_bytes"], r["mbarrier_waits"]) == (2, 512, 0, 0)
    assert r["smem_store_requests"] > 0  # B stored by the threads


def test_roofline_prices_wgmma_at_its_rate_and_mma_sync_at_its_own(mod):  # noqa: F811
    h200 = GPUS["h200"]
    with counting() as recs:
        run_wg(mod, 8, reps=3)
    (r,) = recs
    waves = 132  # one CTA on 132 SMs: the other SMs idle
    assert times(r, h200)["tensor"] == pytest.approx(3 * 2 * 64 * 8 * 16 * waves / (h200.bf16_tflops * 1e12))
    assert h200.bf16_tflops == 989.4 and h200.mma_sync_tflops < h200.bf16_tflops  # docs/design.md section 11.1
    mma_sync = dict(r, wgmma=0, wgmma_smem_bytes=0, mma=1000)
    assert times(mma_sync, h200)["tensor"] == pytest.approx(1000 * MMA_FLOP * waves / (h200.mma_sync_tflops * 1e12))
    # wgmma's B operand is shared-memory traffic: 256 bytes per instruction, 128 bytes a clock
    extra = times(r, h200)["smem"] - times(dict(r, wgmma_smem_bytes=0), h200)["smem"]
    assert extra == pytest.approx(3 * 256 / 128 * waves / (132 * h200.clock_ghz * 1e9))

"""The checked build (KDACUPY_EMULATE_CHECK) sees Hopper's asynchronous proxy (docs/design.md
section 4): racecheck names a read of a cp.async.bulk destination before its mbarrier phase
completed, a write to a wgmma's B operand before the wgmma.wait_group covering it, and a generic
write that a wgmma reads without fence.proxy.async; memcheck checks a bulk copy's extents. Each
probe's correct form passes with the unchecked build's results."""
import re

import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, EmulationError

from .test_ptx_twins import kernel_source

PROBES = r"""
// 64 threads: thread 0 bulk-copies 256 bytes of g behind an mbarrier; `early` 1 reads them before
// the wait (a planted missing wait); 2 drops the fence.proxy.async after mbarrier.init (planted).
extern "C" __global__ void bulk_read(const u32* g, u32* out, int early) {
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  const u32* buf = reinterpret_cast<const u32*>(s + 128);
  int t = threadIdx.x;
  if (t == 0) {
    mbarrier_init(bar, 1);
    if (early != 2) fence_proxy_async_smem();  // the init, visible to the async proxy (2: dropped, planted)
    mbarrier_arrive_expect_tx(bar, 256);
    cp_async_bulk_g2s(s + 128, g, 256, bar);
  }
  __syncthreads();
  u32 first = early == 1 ? buf[t] : 0u;
  mbarrier_wait_parity(bar, 0);
  out[t] = first + buf[(t + 1) % 64];
}

// 128 threads, one warpgroup: `reps` chained wgmma m64n8k16 on a 256-byte B tile (K-major, no
// swizzle). flags: 1 no fence.proxy.async after the generic stores of B (planted); 2 thread 0
// writes B before the covering wait (planted); 8 B arrives by cp.async.bulk (no fence needed);
// 16 ... and the wgmma does not wait for its mbarrier (planted); 32 ... and thread 0 refills B by
// bulk copy before the covering wait (planted).
extern "C" __global__ void wg_write(const u32* a, const u8* bimg, float* d, int reps, int flags) {
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  unsigned char* tile = s + 256;
  int t = threadIdx.x;
  if (flags & 8) {
    if (t == 0) {
      mbarrier_init(bar, 1);
      fence_proxy_async_smem();
      mbarrier_arrive_expect_tx(bar, 256);
      cp_async_bulk_g2s(tile, bimg, 256, bar);
    }
    __syncthreads();
    if (!(flags & 16)) mbarrier_wait_parity(bar, 0);
  } else {
    for (int i = t; i < 256; i += 128) tile[i] = bimg[i];
    if (!(flags & 1)) fence_proxy_async_smem();
    __syncthreads();
  }
  float acc[4];
  u32 af[4] = {a[t * 4], a[t * 4 + 1], a[t * 4 + 2], a[t * 4 + 3]};
  wgmma_fence();
  for (int r = 0; r < reps; r++) wgmma_bf16<8, false>(acc, af, wgmma_desc(tile, 128, 256, 0), r > 0);
  wgmma_commit();
  if ((flags & 2) && t == 0) tile[0] = 0;
  if ((flags & 32) && t == 0) {  // a refill of B by bulk copy before the covering wait (planted)
    mbarrier_arrive_expect_tx(bar, 256);
    cp_async_bulk_g2s(tile, bimg, 256, bar);
  }
  wgmma_wait<0>();
  if (t == 0) tile[1] = 0;  // after the wait: fine
  for (int j = 0; j < 4; j++) d[t * 4 + j] = acc[j];
}

// A two-stage ring (128 threads): thread 0 refills a stage once every thread released it (empty
// barrier, no __syncthreads), everyone waits for its full barrier; `nofull` 1 drops that wait (planted).
extern "C" __global__ void bulk_ring(const u8* g, u32* out, int nchunks, int nofull) {
  unsigned char* s = dynamic_smem();
  u64* full = reinterpret_cast<u64*>(s);
  u64* empty = full + 2;
  unsigned char* ring = s + 128;
  int t = threadIdx.x;
  if (t == 0) {
    for (int i = 0; i < 2; i++) mbarrier_init(&full[i], 1), mbarrier_init(&empty[i], blockDim.x);
    fence_proxy_async_smem();
  }
  __syncthreads();
  auto issue = [&](int i) {
    mbarrier_arrive_expect_tx(&full[i % 2], 512);
    cp_async_bulk_g2s(ring + (i % 2) * 512, g + i * 512, 512, &full[i % 2]);
  };
  if (t == 0) issue(0), issue(1);
  for (int i = 0; i < nchunks; i++) {
    u32 phase = (i / 2) & 1;
    if (!nofull) mbarrier_wait_parity(&full[i % 2], phase);
    const u32* src = reinterpret_cast<const u32*>(ring + (i % 2) * 512);
    out[i * 128 + t] = src[t];
    mbarrier_arrive(&empty[i % 2]);
    if (t == 0 && i + 2 < nchunks) {
      mbarrier_wait_parity(&empty[i % 2], phase);
      issue(i + 2);
    }
  }
}

// memcheck: thread 0 bulk-copies `bytes` of g to `dst` bytes into the dynamic shared memory.
extern "C" __global__ void bulk_extent(const u8* g, u32* out, int bytes, int dst) {
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    fence_proxy_async_smem();
    mbarrier_arrive_expect_tx(bar, bytes);
    cp_async_bulk_g2s(s + dst, g, bytes, bar);
    mbarrier_wait_parity(bar, 0);
    out[0] = *reinterpret_cast<const u32*>(s + dst);
  }
}
"""
NAMES = re.findall(r'extern "C" __global__ void (\w+)', PROBES)


@pytest.fixture(scope="module")
def mod():
    return EmulatedModule(kernel_source(PROBES), NAMES)


@pytest.fixture(autouse=True)
def default_modes(monkeypatch):
    monkeypatch.delenv("KDACUPY_EMULATE_CP_ASYNC", raising=False)
    monkeypatch.delenv("KDACUPY_EMULATE_ORDER", raising=False)
    monkeypatch.delenv("KDACUPY_EMULATE_CHECK", raising=False)


def caught(fn, *args, **kw) -> str:
    with pytest.raises(EmulationError) as e:
        fn(*args, **kw)
    return str(e.value)


def wg_inputs():
    rng = np.random.default_rng(27)
    a = (rng.integers(-4, 5, (128, 4, 2)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    a = (a[..., 0].astype(np.uint32) | a[..., 1].astype(np.uint32) << 16).ravel()
    b = (rng.integers(-4, 5, 128).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return a, b


def run_wg(mod, flags, reps=1, grid=1):
    a, b = wg_inputs()
    d = np.zeros(512, np.float32)
    mod.get_function("wg_write")(grid, 128, (a, b, d, np.int32(reps), np.int32(flags)), shared_mem=512)
    return d


def test_bulk_destination_read_before_its_phase_completed(mod, monkeypatch):
    g = np.arange(64, dtype=np.uint32) * 7 + 1
    out = np.zeros(64, np.uint32)
    fn = mod.get_function("bulk_read")
    fn(1, 64, (g, out, np.int32(0)), shared_mem=384)
    want = np.roll(g, -1)
    np.testing.assert_array_equal(out, want)
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    fn(1, 64, (g, out, np.int32(0)), shared_mem=384)  # the correct probe passes, same results
    np.testing.assert_array_equal(out, want)
    for mode in ("deferred", "eager"):  # eager copies land at issue: the read is still before the wait
        monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", mode)
        msg = caught(fn, 1, 64, (g, out, np.int32(1)), shared_mem=384)
        m = re.search(r"racecheck: cp.async.bulk hazard at byte offset (\d+) of the dynamic shared memory \(4-byte "
                      r"read\): thread \((\d+),0,0\) reads it at .*while the cp.async.bulk of thread \(0,0,0\) at .* "
                      r"into it is in flight", msg)
        assert m, msg
        assert int(m.group(1)) == 128 + 4 * int(m.group(2))
        assert "`u32 first = early == 1 ? buf[t] : 0u;`" in msg and "`cp_async_bulk_g2s(s + 128, g, 256, bar);`" in msg


def test_a_bulk_copy_on_an_mbarrier_whose_init_was_not_fenced(mod, monkeypatch):
    """mbarrier.init is a generic write; a bulk copy completes on the barrier through the async
    proxy: without the initialising thread's fence.proxy.async in between, racecheck names both."""
    g = np.arange(64, dtype=np.uint32)
    out = np.zeros(64, np.uint32)
    fn = mod.get_function("bulk_read")
    fn(1, 64, (g, out, np.int32(2)), shared_mem=384)  # one proxy in the emulation: unchecked, no difference
    np.testing.assert_array_equal(out, np.roll(g, -1))
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "racecheck")
    msg = caught(fn, 1, 64, (g, out, np.int32(2)), shared_mem=384)
    assert re.search(r"racecheck: proxy hazard on the mbarrier at 0x[0-9a-f]+: the cp.async.bulk at .* completes on "
                     r"it \(async proxy\) after thread \(0,0,0\) initialised it at .* \(generic proxy\) with no "
                     r"fence.proxy.async by that thread in between", msg), msg
    assert "`mbarrier_init(bar, 1);`" in msg and "`cp_async_bulk_g2s(s + 128, g, 256, bar);`" in msg
    fn(1, 64, (g, out, np.int32(0)), shared_mem=384)  # with the fence: clean


def test_correct_wgmma_probes_pass_checked_with_the_unchecked_results(mod, monkeypatch):
    plain = run_wg(mod, 0)
    assert np.any(plain != 0)
    np.testing.assert_array_equal(run_wg(mod, 8), plain)  # by bulk copy, without a proxy fence
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    np.testing.assert_array_equal(run_wg(mod, 0), plain)
    np.testing.assert_array_equal(run_wg(mod, 8), plain)


def test_unchecked_build_misses_the_planted_bugs(mod):
    plain = run_wg(mod, 0)
    np.testing.assert_array_equal(run_wg(mod, 1), plain)  # one proxy here: the missing fence changes nothing
    assert wg_inputs()[1][0] != 0  # B(0, 0)'s low byte, which the planted write zeroes
    assert not np.array_equal(run_wg(mod, 2), plain)  # B is read at the wait: wrong results, unnamed
    assert np.all(run_wg(mod, 8 | 16) != plain)  # the 0xFF fill, unnamed


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_write_to_a_pending_wgmma_operand(mod, monkeypatch, mode):
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "racecheck")
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", mode)  # eager wgmma read B at issue: still a bug on a GPU
    msg = caught(run_wg, mod, 2)
    assert "thread (0,0,0): racecheck: wgmma hazard at byte offset 256 of the dynamic shared memory (1-byte " \
        "write): thread (0,0,0) writes it at" in msg, msg
    assert "still reads it as its B operand (until the wgmma.wait_group covering it)" in msg
    assert "`if ((flags & 2) && t == 0) tile[0] = 0;`" in msg
    assert "wgmma_bf16<8, false>(acc, af, wgmma_desc(tile, 128, 256, 0), r > 0);`" in msg


def test_generic_write_read_by_wgmma_without_proxy_fence(mod, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "racecheck")
    msg = caught(run_wg, mod, 1)
    m = re.search(r"racecheck: proxy hazard at byte offset (\d+) of the dynamic shared memory: the wgmma.mma_async "
                  r"at .* reads it \(async proxy\) after thread \((\d+),0,0\) wrote it at .* \(generic proxy\) with "
                  r"no fence.proxy.async by that thread in between", msg)
    assert m, msg
    assert (int(m.group(1)) - 256) % 128 == int(m.group(2))  # the thread that stored that byte
    assert "`for (int i = t; i < 256; i += 128) tile[i] = bimg[i];`" in msg


def test_wgmma_reading_a_bulk_destination_before_its_phase(mod, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "racecheck")
    msg = caught(run_wg, mod, 8 | 16)
    assert "racecheck: cp.async.bulk hazard at byte offset 256 of the dynamic shared memory (2-byte read)" in msg, msg
    assert "`cp_async_bulk_g2s(tile, bimg, 256, bar);`" in msg


def test_bulk_copy_extents_go_through_memcheck(mod, monkeypatch):
    g = np.arange(256, dtype=np.uint8)
    out = np.zeros(1, np.uint32)
    fn = mod.get_function("bulk_extent")
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "memcheck")
    fn(1, 32, (g, out, np.int32(256), np.int32(128)), shared_mem=384)
    assert out[0] == int.from_bytes(bytes(range(4)), "little")
    msg = caught(fn, 1, 32, (g, out, np.int32(512), np.int32(128)), shared_mem=1024)
    assert "out of bounds: read of 512 bytes at byte offset 0 of argument 0 (g) (256 bytes)" in msg, msg
    assert "`cp_async_bulk_g2s(s + dst, g, bytes, bar);`" in msg
    msg = caught(fn, 1, 32, (g, out, np.int32(256), np.int32(256)), shared_mem=384)
    assert "out of bounds: write of 256 bytes at byte offset 256 of the dynamic shared memory (384 bytes)" in msg, msg
    assert "`cp_async_bulk_g2s(s + dst, g, bytes, bar);`" in msg


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_bulk_refill_of_a_pending_wgmma_operand(mod, monkeypatch, mode):
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "racecheck")
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", mode)
    msg = caught(run_wg, mod, 8 | 32)
    assert "racecheck: wgmma hazard at byte offset 256 of the dynamic shared memory (256-byte write): thread " \
        "(0,0,0) writes it at" in msg, msg
    assert "`cp_async_bulk_g2s(tile, bimg, 256, bar);`" in msg


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_mbarrier_ring_passes_checked_and_its_missing_wait_is_named(mod, monkeypatch, mode):
    g = np.random.default_rng(5).integers(0, 256, 5 * 512, dtype=np.uint8)
    out = np.zeros(5 * 128, np.uint32)
    fn = mod.get_function("bulk_ring")
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", mode)
    fn(1, 128, (g, out, np.int32(5), np.int32(0)), shared_mem=128 + 1024)  # the empty barrier orders the refill
    np.testing.assert_array_equal(out, g.view(np.uint32))
    msg = caught(fn, 1, 128, (g, out, np.int32(5), np.int32(1)), shared_mem=128 + 1024)
    assert "racecheck: cp.async.bulk hazard at byte offset 128 of the dynamic shared memory (4-byte read)" in msg, msg
    assert "`out[i * 128 + t] = src[t];`" in msg

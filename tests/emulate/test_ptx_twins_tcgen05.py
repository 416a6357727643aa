"""Blackwell's tcgen05 wrappers of kernels/ptx.cuh against their CPU twins (kdacupy/emulate/ptx_twins.h):
tensor memory's allocation, tcgen05.mma with its sm_100 shared-memory and instruction descriptors (A from
shared or tensor memory), tcgen05.commit to an mbarrier, tcgen05.ld / st and their waits, and the
profile's counts and dependent path of them (docs/design.md section 4).

Operand images, descriptors and the accumulator's lanes are built here from the PTX ISA's text (the
canonical shared-memory layouts, the descriptors' bit fields, the data-path layouts of M = 64 and 128
for cta_group::1, M = 64 in either half of the lanes), never from the C++; each planted bug (a wait, a
commit's mbarrier wait, a dealloc missing or early, an operand read before its copy or its tensor-memory
store landed) must fail the emulated run.
"""
import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, EmulationError

from .test_ptx_twins import kernel_source
from .test_ptx_twins_async import BF16, F32, image, step_model

pytestmark = pytest.mark.emulate

KERNELS = r"""
// flags: 1 no wait on the commit's mbarrier; 2 d written from the registers before tcgen05.wait::ld;
// 4 no dealloc; 8 dealloc right after the commit, before the wait; 16 B arrives by cp.async.bulk on a
// second mbarrier, 32 and the MMA does not wait for it; 64 block b > 0 issues one k16 step, not steps, and
// writes its D after block 0's (blocks whose paths differ, for the profile's per-block clocks).
template <int M, int N, bool BMN>
__device__ void umma_case(const u8* aimg, int abytes, int astep, const u8* bimg, int bbytes, int bstep, const int* geo,
                          float* d, int steps, int flags) {
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  u64* copied = reinterpret_cast<u64*>(s + 8);
  u32* slot = reinterpret_cast<u32*>(s + 16);
  unsigned char* at = s + 1024 - smem_u32(s) % 1024;  // the A image at a multiple of 1024, then B's
  unsigned char* bt = at + (abytes + 1023) / 1024 * 1024;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  constexpr u32 NCOLS = N <= 32 ? 32 : N <= 64 ? 64 : N <= 128 ? 128 : 256;
  for (int i = t; i < abytes; i += blockDim.x) at[i] = aimg[i];
  if (!(flags & 16))
    for (int i = t; i < bbytes; i += blockDim.x) bt[i] = bimg[i];
  if (t == 0) {
    mbarrier_init(bar, 1);
    mbarrier_init(copied, 1);
  }
  fence_proxy_async_smem();  // the generic writes (tiles, barriers), before the async proxy reads them
  __syncthreads();
  if ((flags & 16) && t == 0) {
    mbarrier_arrive_expect_tx(copied, bbytes);
    cp_async_bulk_g2s(bt, bimg, bbytes, copied);
  }
  if (warp == 0) tmem_alloc(slot, NCOLS);
  tcgen05_fence_before_sync();
  __syncthreads();
  tcgen05_fence_after_sync();
  const u32 taddr = *slot;
  if (t == 0) {
    if ((flags & 16) && !(flags & 32)) mbarrier_wait_parity(copied, 0);
    constexpr u32 idesc = umma_idesc_bf16<M, N, false, BMN>();
    for (int k = 0; k < ((flags & 64) && blockIdx.x > 0 ? 1 : steps); k++)
      umma_bf16(taddr, umma_desc(at + k * astep, geo[0], geo[1], UMMA_SWIZZLE_NONE),
                umma_desc(bt + k * bstep, geo[2], geo[3], UMMA_SWIZZLE_NONE), idesc, k > 0);
    umma_commit(bar);
  }
  if ((flags & 8) && warp == 0) tmem_dealloc(taddr, NCOLS);
  if (!(flags & 1)) mbarrier_wait_parity(bar, 0);
  tcgen05_fence_after_sync();
  const int row = M == 128 ? 32 * warp + lane : 16 * warp + lane;  // the row of D in this thread's lane
  if (flags & 64) d += static_cast<long long>(blockIdx.x) * M * N;
  for (int c = 0; c < N; c += 8) {
    float r[8];
    tmem_ld_32x32b<8>(taddr + ((32u * warp) << 16) + c, r);
    if (flags & 2)
      for (int j = 0; j < 8; j++) if (M == 128 || lane < 16) d[row * N + c + j] = r[j];
    tmem_wait_ld();
    if (!(flags & 2))
      for (int j = 0; j < 8; j++) if (M == 128 || lane < 16) d[row * N + c + j] = r[j];
  }
  tcgen05_fence_before_sync();
  __syncthreads();
  if (warp == 0 && !(flags & 12)) tmem_dealloc(taddr, NCOLS);
}

extern "C" __global__ void k_umma(const u8* aimg, int abytes, int astep, const u8* bimg, int bbytes, int bstep,
                                  const int* geo, float* d, int m, int n, int bmn, int steps, int flags) {
#define KDA_CASE(M, N)                                                                              \
  if (m == M && n == N && bmn) umma_case<M, N, true>(aimg, abytes, astep, bimg, bbytes, bstep, geo, d, steps, flags); \
  if (m == M && n == N && !bmn) umma_case<M, N, false>(aimg, abytes, astep, bimg, bbytes, bstep, geo, d, steps, flags);
  KDA_CASE(64, 8)
  KDA_CASE(64, 64)
  KDA_CASE(128, 16)
  KDA_CASE(128, 128)
#undef KDA_CASE
}

// D = A B with A from tensor memory (umma_bf16_ts): each thread stores its lane's row of A (A's k16 step s:
// 8 columns from ACOL + 8 s, two bf16 a column, even k low) by tcgen05.st, waits, and one thread issues the
// MMAs after the barrier; lane0 places A and D (M = 64: 0 or 16). flags: 1 no tcgen05.wait::st after the last
// step's store (planted);
// 2 A and D at different lanes (planted); 4 the MMA issued before the stores' barrier (planted: warps 1-3's
// rows may not be there yet).
template <int M, int N, bool BMN>
__device__ void umma_ts_case(const u16* a, const u8* bimg, int bbytes, int bstep, const int* geo, float* d, int steps,
                             int lane0, int flags) {
  constexpr u32 ACOL = 128;  // A's columns after D's (N <= 128)
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  u32* slot = reinterpret_cast<u32*>(s + 16);
  unsigned char* bt = s + 1024 - smem_u32(s) % 1024;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  for (int i = t; i < bbytes; i += blockDim.x) bt[i] = bimg[i];
  if (t == 0) mbarrier_init(bar, 1);
  fence_proxy_async_smem();
  if (warp == 0) tmem_alloc(slot, 256);
  tcgen05_fence_before_sync();
  __syncthreads();
  tcgen05_fence_after_sync();
  const u32 base = *slot;
  // the row of A and D in this thread's lane (-1: a lane M = 64 leaves out)
  const int row = M == 128 ? 32 * warp + lane : (lane >= lane0 && lane < lane0 + 16 ? 16 * warp + lane - lane0 : -1);
  for (int st = 0; st < steps; st++) {
    float w[8];
    for (int j = 0; j < 8; j++) {
      const u32 lo = row < 0 ? 0u : a[row * 16 * steps + 16 * st + 2 * j], hi = row < 0 ? 0u : a[row * 16 * steps + 16 * st + 2 * j + 1];
      w[j] = __uint_as_float(lo | hi << 16);
    }
    tmem_st_32x32b_x8(base + ((32u * warp) << 16) + ACOL + 8 * st, w);
    if (!(flags & 1) || st + 1 < steps) tmem_wait_st();
  }
  tcgen05_fence_before_sync();
  if (!(flags & 4)) __syncthreads();
  tcgen05_fence_after_sync();
  if (t == 0) {
    constexpr u32 idesc = umma_idesc_bf16<M, N, false, BMN>();
    const u32 dl = (u32)lane0 << 16, al = (u32)(flags & 2 ? 16 - lane0 : lane0) << 16;
    for (int k = 0; k < steps; k++)
      umma_bf16_ts(base + dl, base + al + ACOL + 8 * k, umma_desc(bt + k * bstep, geo[2], geo[3], UMMA_SWIZZLE_NONE),
                   idesc, k > 0);
    umma_commit(bar);
  }
  if (flags & 4) __syncthreads();
  mbarrier_wait_parity(bar, 0);
  tcgen05_fence_after_sync();
  for (int c = 0; c < N; c += 8) {
    float r[8];
    tmem_ld_32x32b<8>(base + ((32u * warp) << 16) + c, r);
    tmem_wait_ld();
    if (row >= 0)
      for (int j = 0; j < 8; j++) d[row * N + c + j] = r[j];
  }
  tcgen05_fence_before_sync();
  __syncthreads();
  if (warp == 0) tmem_dealloc(base, 256);
}

extern "C" __global__ void k_umma_ts(const u16* a, const u8* bimg, int bbytes, int bstep, const int* geo, float* d,
                                     int m, int n, int bmn, int steps, int lane0, int flags) {
#define KDA_CASE(M, N)                                                                                       \
  if (m == M && n == N && bmn) umma_ts_case<M, N, true>(a, bimg, bbytes, bstep, geo, d, steps, lane0, flags); \
  if (m == M && n == N && !bmn) umma_ts_case<M, N, false>(a, bimg, bbytes, bstep, geo, d, steps, lane0, flags);
  KDA_CASE(64, 16)
  KDA_CASE(128, 16)
  KDA_CASE(128, 128)
#undef KDA_CASE
}

// The descriptors as the wrappers build them: out[0..1] umma_desc's words, out[2] umma_idesc_bf16's.
extern "C" __global__ void k_umma_desc(u32* out, int lead, int stride, int swizzle) {
  unsigned char* s = dynamic_smem();
  u64 dsc = umma_desc(s + 256, lead, stride, swizzle);
  out[0] = (u32)dsc;
  out[1] = (u32)(dsc >> 32);
  out[2] = umma_idesc_bf16<128, 64, false, true>();
  out[3] = umma_idesc_bf16<64, 8, true, false>();
}

// 32 columns for the block, allocated by warp 0 and fenced for every thread: this warp's quarter's address;
// and freed once every thread is done with them.
__device__ u32 tm_block_alloc32(u32* slot) {
  if (threadIdx.x / 32 == 0) tmem_alloc(slot, 32);
  tcgen05_fence_before_sync();
  __syncthreads();
  tcgen05_fence_after_sync();
  return *slot + ((32u * (threadIdx.x / 32)) << 16);
}
__device__ void tm_block_free32(u32* slot) {
  tcgen05_fence_before_sync();
  __syncthreads();
  if (threadIdx.x / 32 == 0) tmem_dealloc(*slot, 32);
}

// tcgen05.st then tcgen05.ld of the same cells (each warp its quarter): out[t][j] = in[t][j] * 2 + 1 read
// back; flags: 1 no tcgen05.wait::st before the load (planted).
extern "C" __global__ void k_tmem_st(const float* in, float* out, int flags) {
  u32* slot = reinterpret_cast<u32*>(dynamic_smem());
  const int t = threadIdx.x;
  const u32 taddr = tm_block_alloc32(slot);
  float w[8], r[8];
  for (int j = 0; j < 8; j++) w[j] = in[t * 8 + j] * 2.f + 1.f;
  tmem_st_32x32b_x8(taddr + 8, w);
  if (!(flags & 1)) tmem_wait_st();
  tmem_ld_32x32b<8>(taddr + 8, r);
  tmem_wait_ld();
  for (int j = 0; j < 8; j++) out[t * 8 + j] = r[j];
  tm_block_free32(slot);
}

// Several tcgen05.st, one wait::st, several tcgen05.ld, one wait::ld: three blocks of 8 columns, block b
// holding in * (b + 2); out[t][b][j]. flags: 1 the third load issued before the stores' wait (it reads the
// cells as they were: NaN); 2 the loads' registers read before their wait (NaN).
extern "C" __global__ void k_tmem_queue(const float* in, float* out, int flags) {
  u32* slot = reinterpret_cast<u32*>(dynamic_smem());
  const int t = threadIdx.x;
  const u32 taddr = tm_block_alloc32(slot);
  float w[3][8], r[3][8];
  for (int b = 0; b < 3; b++) {
    for (int j = 0; j < 8; j++) w[b][j] = in[t * 8 + j] * (b + 2);
    tmem_st_32x32b_x8(taddr + 8 * b, w[b]);
  }
  if (flags & 1) tmem_ld_32x32b<8>(taddr + 16, r[2]);
  tmem_wait_st();
  for (int b = 0; b < 3; b++)
    if (!(flags & 1) || b < 2) tmem_ld_32x32b<8>(taddr + 8 * b, r[b]);
  if (!(flags & 2)) tmem_wait_ld();
  for (int b = 0; b < 3; b++)
    for (int j = 0; j < 8; j++) out[(t * 3 + b) * 8 + j] = r[b][j];
  tmem_wait_ld();
  tm_block_free32(slot);
}

// The 16-lane shapes against 32x32b's lane a thread, over 32 columns of each warp's quarter. mode 0: the cells
// x[lane][col] stored by 32x32b, then read by each thread through 16x256b.x4 (both halves: 32 columns) and
// 16x128b.x4 (16 columns): out[t][0..32) and [32..48), half 0 then 1 each; mode 1: y[t][h][r] stored by
// 16x256b.x4 from both halves, then each thread's lane read by 32x32b (out[t][0..32)); mode 2: the same
// through 16x128b.x4 (16 columns, out[t][0..16)).
extern "C" __global__ void k_tmem_shapes(const float* x, const float* y, float* out, int mode) {
  u32* slot = reinterpret_cast<u32*>(dynamic_smem());
  const int t = threadIdx.x;
  const u32 quarter = tm_block_alloc32(slot);  // (the warp's quarter of the lanes)
  if (mode == 0) {
    for (int c = 0; c < 32; c += 8) {
      float w[8];
      for (int j = 0; j < 8; j++) w[j] = x[t * 32 + c + j];
      tmem_st_32x32b_x8(quarter + c, w);
    }
    tmem_wait_st();
    for (int h = 0; h < 2; h++) {
      float a[16], b[8];
      tmem_ld_16x256b<4>(quarter + ((16u * h) << 16), a);
      tmem_ld_16x128b<4>(quarter + ((16u * h) << 16), b);
      tmem_wait_ld();
      for (int r = 0; r < 16; r++) out[t * 48 + 16 * h + r] = a[r];
      for (int r = 0; r < 8; r++) out[t * 48 + 32 + 8 * h + r] = b[r];
    }
  } else {
    for (int h = 0; h < 2; h++) {
      float w[16];
      for (int r = 0; r < 16; r++) w[r] = y[(t * 2 + h) * 16 + r];
      if (mode == 1) {
        tmem_st_16x256b<4>(quarter + ((16u * h) << 16), w);
      } else {
        tmem_st_16x128b<4>(quarter + ((16u * h) << 16), reinterpret_cast<const float(&)[8]>(w));
      }
    }
    tmem_wait_st();
    float r[16];
    for (int c = 0; c < (mode == 1 ? 32 : 16); c += 16) {
      tmem_ld_32x32b<16>(quarter + c, r);
      tmem_wait_ld();
      for (int j = 0; j < 16; j++) out[t * 48 + c + j] = r[j];
    }
  }
  tm_block_free32(slot);
}

// Tensor memory's allocation rules: mode 0 alloc 64 then 32 columns (addresses to out), free both;
// 1 alloc 48 columns; 2 alloc after relinquish; 3 tcgen05.ld of unallocated columns.
extern "C" __global__ void k_tmem(u32* out, int mode) {
  u32* slot = reinterpret_cast<u32*>(dynamic_smem());
  if (mode == 0) {
    tmem_alloc(slot, 64);
    u32 a = *slot;
    __syncwarp();
    tmem_alloc(slot, 32);
    u32 b = *slot;
    if (threadIdx.x == 0) out[0] = a, out[1] = b;
    tmem_dealloc(a, 64);
    tmem_dealloc(b, 32);
  } else if (mode == 1) {
    tmem_alloc(slot, 48);
  } else if (mode == 2) {
    tmem_relinquish();
    tmem_alloc(slot, 32);
  } else {
    float r[8];
    tmem_ld_32x32b<8>(128, r);
  }
}
"""


@pytest.fixture(scope="module")
def mod():
    return EmulatedModule(kernel_source(KERNELS), ["k_umma", "k_umma_desc", "k_tmem", "k_tmem_st", "k_umma_ts",
                                                   "k_tmem_queue", "k_tmem_shapes"])


def operands(m, n, steps, rng):
    """A (m x 16 steps), B (16 steps x n): multiples of 1/64, so only the rounding points can differ."""
    A = (rng.integers(-256, 257, (m, 16 * steps)) / 64.0).astype(BF16)
    B = (rng.integers(-256, 257, (16 * steps, n)) / 64.0).astype(BF16)
    return A, B


def run(mod, A, B, b_mn, flags=0):
    """D of the k_umma case: A K-major, B K- or N-major, both without swizzle (canonical layouts). ``mod``:
    the emulated module, or tests/gpu/test_gpu_ptx.py's device one (called as mod(name, grid, block, args,
    shared_mem), returning the arrays back)."""
    m, n, steps = A.shape[0], B.shape[1], A.shape[1] // 16
    aimg, albo, asbo, astep = image(A.T.copy().view(np.uint16), False, "none")  # A^T: k x m, K-major rows of m
    bimg, blbo, bsbo, bstep = image(B.view(np.uint16), bool(b_mn), "none")
    d = np.full((m, n), np.nan, F32)
    geo = np.array([albo, asbo, blbo, bsbo], np.int32)
    smem = 1024 + (aimg.size + 1023) // 1024 * 1024 + bimg.size + 1024
    args = (aimg, np.int32(aimg.size), np.int32(astep), bimg, np.int32(bimg.size), np.int32(bstep), geo, d,
            np.int32(m), np.int32(n), np.int32(b_mn), np.int32(steps), np.int32(flags))
    if not hasattr(mod, "get_function"):  # the GPU's
        return mod("k_umma", 1, 128, args, smem)[7]
    mod.get_function("k_umma")(1, 128, args, shared_mem=smem)
    return d


@pytest.mark.parametrize("m, n", [(64, 8), (64, 64), (128, 16), (128, 128)])
@pytest.mark.parametrize("b_mn", [0, 1], ids=["B K-major", "B N-major"])
def test_umma_layouts_lanes_and_rounding(mod, m, n, b_mn):
    """D = A B over three k16 instructions, each rounding once (as wgmma's twin), read back by every
    warp's tcgen05.ld from its quarter of the lanes (M = 64: the first 16 of each)."""
    A, B = operands(m, n, 3, np.random.default_rng(m + n + b_mn))
    np.testing.assert_array_equal(run(mod, A, B, b_mn), step_model(A, B, np.zeros((m, n), F32), accumulate=False))


def run_ts(mod, A, B, b_mn, lane0=0, flags=0):
    """D of the k_umma_ts case: A (m x 16 steps, row-major bf16) from tensor memory, B K- or N-major in
    shared memory; ``mod`` as run's."""
    m, n, steps = A.shape[0], B.shape[1], A.shape[1] // 16
    bimg, blbo, bsbo, bstep = image(B.view(np.uint16), bool(b_mn), "none")
    d = np.full((m, n), np.nan, F32)
    geo = np.array([0, 0, blbo, bsbo], np.int32)
    args = (A.view(np.uint16).copy(), bimg, np.int32(bimg.size), np.int32(bstep), geo, d, np.int32(m), np.int32(n),
            np.int32(b_mn), np.int32(steps), np.int32(lane0), np.int32(flags))
    smem = 1024 + bimg.size + 1024
    if not hasattr(mod, "get_function"):
        return mod("k_umma_ts", 1, 128, args, smem)[5]
    mod.get_function("k_umma_ts")(1, 128, args, shared_mem=smem)
    return d


#: (M, N, B N-major, lane field of A and D): both majors of B, M = 64 in either half of the data path
TS_CASES = [(128, 16, 0, 0), (128, 128, 1, 0), (64, 16, 0, 0), (64, 16, 1, 16)]


@pytest.mark.parametrize("m, n, b_mn, lane0", TS_CASES)
def test_umma_with_a_from_tensor_memory(mod, m, n, b_mn, lane0):
    """A written to tensor memory by tcgen05.st (two bf16 a column, even k low; M = 64 at lane 0 or 16 of
    each quarter) and read by tcgen05.mma from there: the same D as from shared memory, each k16 step
    rounded once."""
    A, B = operands(m, n, 3, np.random.default_rng(10 * m + n + lane0))
    np.testing.assert_array_equal(run_ts(mod, A, B, b_mn, lane0), step_model(A, B, np.zeros((m, n), F32), accumulate=False))


def test_a_from_tensor_memory_needs_the_stores_wait_and_the_barrier(mod, monkeypatch):
    """The planted bugs of an A in tensor memory: no tcgen05.wait::st (the MMA reads the cells as they were:
    NaN), the MMA issued before the other warps' stores (with the operands read at the issue, as eager mode
    does: their rows still NaN), A and D at different lanes."""
    A, B = operands(128, 16, 2, np.random.default_rng(11))
    assert np.isnan(run_ts(mod, A, B, 0, flags=1)).all()
    want = step_model(A, B, np.zeros((128, 16), F32), accumulate=False)
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", "eager")
    np.testing.assert_array_equal(run_ts(mod, A, B, 0), want)
    got = run_ts(mod, A, B, 0, flags=4)
    unwritten = np.isnan(got).all(axis=1)  # rows whose threads had not stored (and waited) when thread 0 issued it
    assert unwritten.sum() >= 32
    np.testing.assert_array_equal(got[~unwritten], want[~unwritten])
    with pytest.raises(EmulationError, match=r"A at lane 16, D at lane 0 \(the same alignment"):
        run_ts(mod, *operands(64, 16, 1, np.random.default_rng(12)), 0, lane0=0, flags=2)


def test_descriptor_bits(mod):
    """umma_desc and umma_idesc_bf16 against the PTX ISA's fields: start >> 4 in bits 0-13, lead >> 4 in
    16-29, stride >> 4 in 32-45, 0b001 in 46-48, swizzle in 61-63; the instruction descriptor's D format
    (bits 4-5, f32 = 1), A and B formats (7-9, 10-12, bf16 = 1), majors (15, 16), N >> 3 (17-22), M >> 4 (24-28)."""
    out = np.zeros(4, np.uint32)
    mod.get_function("k_umma_desc")(1, 32, (out, np.int32(4096), np.int32(256), np.int32(2)), shared_mem=1024)
    desc = int(out[0]) | int(out[1]) << 32
    start = 0x80 + 256  # the emulation's shared window starts at 0x80 (ptx_twins.h)
    assert desc == (start >> 4) | (4096 >> 4) << 16 | (256 >> 4) << 32 | 1 << 46 | 2 << 61
    assert out[2] == 1 << 4 | 1 << 7 | 1 << 10 | 1 << 16 | (64 >> 3) << 17 | (128 >> 4) << 24
    assert out[3] == 1 << 4 | 1 << 7 | 1 << 10 | 1 << 15 | (8 >> 3) << 17 | (64 >> 4) << 24


def test_tensor_memory_allocation(mod):
    out = np.zeros(2, np.uint32)
    mod.get_function("k_tmem")(1, 32, (out, np.int32(0)), shared_mem=64)
    assert list(out) == [0, 64]  # lane 0, first columns: 64 columns, then the next 32
    for mode, message in ((1, r"48 columns \(a power of 2 in \[32, 512\]\)"),
                          (2, r"tcgen05.alloc after tcgen05.relinquish_alloc_permit"),
                          (3, r"tcgen05.ld: column 128 is not allocated")):
        with pytest.raises(EmulationError, match=message):
            mod.get_function("k_tmem")(1, 32, (out, np.int32(mode)), shared_mem=64)


@pytest.mark.parametrize("flags, message", [
    (1, r"tcgen05.ld: column 0 is written by a tcgen05.mma not yet complete"),
    (4, r"tensor memory columns .* still allocated when the block exited"),
    (8, r"tcgen05.dealloc: column 0 is written by a tcgen05.mma not yet complete"),
])
def test_planted_bugs_fail(mod, flags, message):
    A, B = operands(64, 8, 1, np.random.default_rng(1))
    with pytest.raises(EmulationError, match=message):
        run(mod, A, B, 0, flags)


def test_registers_are_undefined_until_the_wait(mod):
    A, B = operands(128, 16, 1, np.random.default_rng(2))
    assert np.isnan(run(mod, A, B, 0, flags=2)).all()


def test_operands_by_bulk_copy_and_a_missing_copy_wait(mod, monkeypatch):
    """B by cp.async.bulk, waited for: the same D. Not waited for: the copy has not landed when the MMA
    is performed, which the checks name (racecheck: a read of bytes a bulk copy still writes)."""
    A, B = operands(64, 64, 2, np.random.default_rng(3))
    want = step_model(A, B, np.zeros((64, 64), F32), accumulate=False)
    np.testing.assert_array_equal(run(mod, A, B, 1, flags=16), want)
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    checked = EmulatedModule(kernel_source(KERNELS), ["k_umma"])
    np.testing.assert_array_equal(run(checked, A, B, 1, flags=16), want)
    with pytest.raises(EmulationError, match=r"racecheck: cp.async.bulk hazard .* reads it at .*umma_bf16"):
        run(checked, A, B, 1, flags=16 | 32)
    monkeypatch.delenv("KDACUPY_EMULATE_CHECK")
    assert np.isnan(run(mod, A, B, 1, flags=16 | 32)).all()  # unchecked: the tensor cores read unwritten bytes


@pytest.mark.nvrtc
def test_nvrtc_builds_them_for_sm_100a_only():
    """sm_100a: the wrappers assemble to the tensor cores' own SASS (UTCHMMA, the commit's UTCBAR, LDTM, STTM,
    the allocator's UTCATOMSWS); elsewhere they do not exist, so a kernel calling them fails to build
    instead of running something else."""
    from kdacupy.jit.nvrtc import nvrtc_compile
    from kdacupy.jit.sass import disassemble, nvdisasm

    src = kernel_source(KERNELS)
    res = nvrtc_compile(src, "sm_100a")
    assert res.ok, res.log
    if nvdisasm() is not None:
        sass = disassemble(res.cubin)
        for op in ("UTCHMMA", "UTCBAR", "LDTM", "STTM", "UTCATOMSWS"):
            assert op in sass, op
    other = nvrtc_compile(src, "sm_90a")
    assert not other.ok and "tmem_alloc" in other.log


def test_the_profile_counts_tcgen05():
    """Counted launches: each tcgen05.mma's FLOP and its A and B bytes read once from shared memory, each
    thread's tcgen05.ld bytes, the columns allocated (which bound the CTAs an SM holds); the roofline prices
    the FLOP at the datasheet's dense rate."""
    from kdacupy.cli import roofline
    from kdacupy.emulate import counting

    A, B = operands(128, 16, 3, np.random.default_rng(4))
    with counting() as recs:
        run(mod_counted(), A, B, 0)
    (rec,) = recs
    assert rec["tcgen05_flop"] == 3 * 2 * 128 * 16 * 16
    assert rec["tcgen05_smem_bytes"] == 3 * 2 * 16 * (128 + 16)
    assert rec["tmem_ld_bytes"] == 128 * 16 * 4
    assert rec["tmem_cols"] == 32 and roofline.tmem_cols_per_cta(rec) == 32  # the case's allocation, one CTA
    gpu = roofline.GPUS["b200"]
    occ = roofline.occupancy(gpu, 128, 64, 1024, tmem_cols=256)  # a CTA of 256 columns: two an SM
    assert occ["ctas_per_sm"] == 2 and occ["limited_by"] == "tensor memory"
    t = roofline.times(rec, gpu)
    assert t["tensor"] == pytest.approx(3 * 2 * 128 * 16 * 16 / (gpu.bf16_tflops * 1e12) * gpu.sms)


def test_the_dependent_path_prices_tcgen05():
    """The issuing thread's tcgen05.mma stream at the dense rate (M N / 256 cycles each) and are complete an
    mma latency later; the waiters on the commit's mbarrier take that on their path, then tcgen05.ld's."""
    from kdacupy.emulate import counting

    paths = {}
    for n in (16, 128):
        A, B = operands(128, n, 3, np.random.default_rng(4))
        with counting() as recs:
            run(mod_counted(), A, B, 0)
        paths[n] = recs[0]
    assert paths[16]["path_max_mma"] == paths[128]["path_max_mma"] == 1  # the last MMA's completion
    streaming = 3 * (128 * 128 - 128 * 16) // 256  # three k16 steps a launch
    assert paths[128]["path_max_issue"] - paths[16]["path_max_issue"] >= streaming


def test_each_block_starts_the_dependent_path_anew(monkeypatch):
    """A worker runs block after block; each block's clocks start at zero. The one-step block run after the
    three-step one on the same OS thread costs what it costs alone: its commit's mbarrier (the same shared
    address) does not keep the first block's later landing time. Which block follows which on a worker is
    the threads' race, so a time left over made the profile of one launch vary from run to run."""
    from kdacupy.emulate import counting

    monkeypatch.setenv("KDACUPY_EMULATE_THREADS", "1")
    A, B = operands(128, 128, 3, np.random.default_rng(7))
    m, n = A.shape[0], B.shape[1]
    aimg, albo, asbo, astep = image(A.T.copy().view(np.uint16), False, "none")
    bimg, blbo, bsbo, bstep = image(B.view(np.uint16), False, "none")
    geo = np.array([albo, asbo, blbo, bsbo], np.int32)
    smem = 1024 + (aimg.size + 1023) // 1024 * 1024 + bimg.size + 1024
    kernel = mod_counted().get_function("k_umma")
    recs = {}
    for grid, steps, flags in ((1, 3, 0), (1, 1, 0), (2, 3, 64)):
        d = np.zeros((grid, m, n), F32)
        with counting() as got:
            kernel(grid, 128, (aimg, np.int32(aimg.size), np.int32(astep), bimg, np.int32(bimg.size),
                               np.int32(bstep), geo, d, np.int32(m), np.int32(n), np.int32(0), np.int32(steps),
                               np.int32(flags)), shared_mem=smem)
        recs[grid, steps] = got[0]
    zero = np.zeros((m, n), F32)
    np.testing.assert_array_equal(d[0], step_model(A, B, zero, accumulate=False))  # (d: the two-block launch's)
    np.testing.assert_array_equal(d[1], step_model(A[:, :16], B[:16], zero, accumulate=False))
    assert recs[1, 3]["path_sum_issue"] > recs[1, 1]["path_sum_issue"]  # blocks of unequal paths
    for kind in ("issue", "dram", "smem", "mma", "barrier"):
        assert recs[2, 3][f"path_sum_{kind}"] == recs[1, 3][f"path_sum_{kind}"] + recs[1, 1][f"path_sum_{kind}"], kind


def mod_counted():
    return EmulatedModule(kernel_source(KERNELS), ["k_umma"])


def test_tensor_memory_stores_land_at_their_wait(mod):
    """tcgen05.st's values reach the cells at the thread's tcgen05.wait::st: read back after it, they are the
    values; without it the load reads what was there (NaN: tensor memory is NaN until written)."""
    x = np.random.default_rng(5).standard_normal((128, 8)).astype(F32)
    out = np.zeros_like(x)
    mod.get_function("k_tmem_st")(1, 128, (x, out, np.int32(0)), shared_mem=64)
    np.testing.assert_array_equal(out, x * 2 + 1)
    mod.get_function("k_tmem_st")(1, 128, (x, out, np.int32(1)), shared_mem=64)
    assert np.isnan(out).all()


def test_several_tensor_memory_moves_complete_at_one_wait(mod):
    """Several tcgen05.st before one tcgen05.wait::st land, in order, at it; several tcgen05.ld before one
    tcgen05.wait::ld give their registers at it (the kernels batch a chunk's state blocks so). A load issued
    before the stores' wait reads the cells as they were, and registers read before the loads' wait are NaN."""
    x = np.random.default_rng(6).standard_normal((128, 8)).astype(F32)
    want = np.stack([x * (b + 2) for b in range(3)], axis=1)
    out = np.zeros((128, 3, 8), F32)
    mod.get_function("k_tmem_queue")(1, 128, (x, out, np.int32(0)), shared_mem=64)
    np.testing.assert_array_equal(out, want)
    mod.get_function("k_tmem_queue")(1, 128, (x, out, np.int32(1)), shared_mem=64)
    np.testing.assert_array_equal(out[:, :2], want[:, :2])
    assert np.isnan(out[:, 2]).all()
    mod.get_function("k_tmem_queue")(1, 128, (x, out, np.int32(2)), shared_mem=64)
    assert np.isnan(out).all()


def shape_cells(shape, lane, r):
    """(lane offset in the 16 lanes, column) of register r of thread ``lane`` in a 16-lane shape: the PTX ISA's
    matrix fragments for tcgen05.ld / st .16x256b (the mma accumulator's pattern, 8 columns a repetition) and
    .16x128b (4 columns a repetition), written out from the ISA's figures, not from the twin."""
    if shape == "16x256b":
        return lane // 4 + 8 * (r // 2 % 2), r % 2 + 2 * (lane % 4) + 8 * (r // 4)
    return lane // 4 + 8 * (r % 2), lane % 4 + 4 * (r // 2)


def shapes_run(mod, mode, x, y):
    out = np.full((128, 48), np.nan, F32)
    if not hasattr(mod, "get_function"):  # tests/gpu/test_gpu_ptx.py's device module
        return mod("k_tmem_shapes", 1, 128, (x, y, out, np.int32(mode)), 64)[2]
    mod.get_function("k_tmem_shapes")(1, 128, (x, y, out, np.int32(mode)), shared_mem=64)
    return out


def check_shapes(mod):
    """Each thread's registers of 16x256b.x4 / 16x128b.x4 against the cells 32x32b wrote, and each cell 32x32b
    reads back against the thread and register that wrote it; the thread that writes a cell is in general not
    the one whose lane it is, so the warp's tcgen05.wait::st must land every lane's stores."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((128, 32)).astype(F32)
    y = rng.standard_normal((128, 2, 16)).astype(F32)
    got = shapes_run(mod, 0, x, y)
    want = np.empty((128, 48), F32)
    for t in range(128):
        w, lane = divmod(t, 32)
        for h in range(2):
            for r in range(16):
                dl, c = shape_cells("16x256b", lane, r)
                want[t, 16 * h + r] = x[32 * w + 16 * h + dl, c]
            for r in range(8):
                dl, c = shape_cells("16x128b", lane, r)
                want[t, 32 + 8 * h + r] = x[32 * w + 16 * h + dl, c]
    np.testing.assert_array_equal(got, want)
    for mode, shape, regs, cols in ((1, "16x256b", 16, 32), (2, "16x128b", 8, 16)):
        got = shapes_run(mod, mode, x, y)
        want = np.full((128, 48), np.nan, F32)
        for t in range(128):
            w, lane = divmod(t, 32)
            for h in range(2):
                for r in range(regs):
                    dl, c = shape_cells(shape, lane, r)
                    want[32 * w + 16 * h + dl, c] = y[t, h, r]
        np.testing.assert_array_equal(got[:, :cols], want[:, :cols])


def test_the_16_lane_shapes(mod):
    check_shapes(mod)

"""Hopper's asynchronous wrappers of kernels/ptx.cuh against their CPU twins
(kdacupy/emulate/ptx_twins.h): wgmma with its fence / commit / wait, the matrix descriptor,
mbarrier phases, cp.async.bulk, fence.proxy.async (docs/design.md section 4, item 4).

Fragments, shared-memory images and descriptors are built here, in Python, from the PTX ISA's
text (register fragments of wgmma .m64nNk16, the canonical shared-memory layouts, the matrix
descriptor format), never from the C++. tests/gpu/test_gpu_ptx.py runs the same kernels on an
sm_90a GPU against the same expectations.
"""
import ml_dtypes
import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, EmulationError
from kdacupy.emulate.numerics import VARIABLE, mma_dot

from .test_ptx_twins import kernel_source

F32 = np.float32
BF16 = ml_dtypes.bfloat16

ASYNC_KERNELS = r"""
// The tile of B sits at a shared address that is a multiple of 1024 (what a 128B-swizzled pattern
// needs), after 16 bytes for an mbarrier.
__device__ unsigned char* tile_after_barrier(unsigned char* s) {
  u32 at = smem_u32(s + 16);
  return s + 16 + (1024 - at % 1024) % 1024;
}

// flags: 1 B arrives by cp.async.bulk (else generic stores, then fence.proxy.async); 2 the first
// step accumulates onto c (else c is loaded but scale-d = 0); 4 d is read before the wait (a
// planted missing wait); 8 no wgmma.fence (planted); 16 thread 0 zeroes B after the issue.
template <int N, bool NMAJ>
__device__ void wgmma_case(const u32* a, const u8* bimg, int bbytes, int bstep, const int* geo, const float* c,
                           float* d, int steps, int flags) {
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  unsigned char* tile = tile_after_barrier(s);
  int t = threadIdx.x;
  if (flags & 1) {
    if (t == 0) {
      mbarrier_init(bar, 1);
      mbarrier_arrive_expect_tx(bar, bbytes);
      cp_async_bulk_g2s(tile, bimg, bbytes, bar);
    }
    __syncthreads();
    mbarrier_wait_parity(bar, 0);
  } else {
    for (int i = t; i < bbytes; i += blockDim.x) tile[i] = bimg[i];
    fence_proxy_async_smem();  // the generic writes, before the async proxy reads them
    __syncthreads();
  }
  float acc[N / 2];
  for (int j = 0; j < N / 2; j++) acc[j] = c[t * (N / 2) + j];
  wgmma_fence_operand(acc);
  if (!(flags & 8)) wgmma_fence();
  for (int k = 0; k < steps; k++) {
    u32 af[4] = {a[(k * 128 + t) * 4], a[(k * 128 + t) * 4 + 1], a[(k * 128 + t) * 4 + 2], a[(k * 128 + t) * 4 + 3]};
    wgmma_bf16<N, NMAJ>(acc, af, wgmma_desc(tile + k * bstep, geo[0], geo[1], geo[2]), k > 0 || (flags & 2));
  }
  if ((flags & 16) && t == 0)
    for (int i = 0; i < bbytes; i++) tile[i] = 0;
  wgmma_commit();
  if (flags & 4)
    for (int j = 0; j < N / 2; j++) d[t * (N / 2) + j] = acc[j];
  wgmma_wait<0>();
  wgmma_fence_operand(acc);
  if (!(flags & 4))
    for (int j = 0; j < N / 2; j++) d[t * (N / 2) + j] = acc[j];
}

extern "C" __global__ void k_wgmma(const u32* a, const u8* bimg, int bbytes, int bstep, const int* geo,
                                   const float* c, float* d, int n, int nmaj, int steps, int flags) {
#define KDA_CASE(N)                                                                   \
  if (n == N && nmaj) wgmma_case<N, true>(a, bimg, bbytes, bstep, geo, c, d, steps, flags); \
  if (n == N && !nmaj) wgmma_case<N, false>(a, bimg, bbytes, bstep, geo, c, d, steps, flags);
  KDA_CASE(8)
  KDA_CASE(16)
  KDA_CASE(64)
  KDA_CASE(128)
#undef KDA_CASE
}

// Two groups on two accumulators (N = 16, B K-major without swizzle, both from one image): after
// wait_group 1 the first is final, the second still pending; after wait_group 0 both.
extern "C" __global__ void k_wgmma_groups(const u32* a, const u8* bimg, int bbytes, const int* geo, float* mid,
                                          float* end) {
  unsigned char* tile = tile_after_barrier(dynamic_smem());
  int t = threadIdx.x;
  for (int i = t; i < bbytes; i += blockDim.x) tile[i] = bimg[i];
  fence_proxy_async_smem();
  __syncthreads();
  float x[8], y[8];
  u32 ax[4] = {a[t * 4], a[t * 4 + 1], a[t * 4 + 2], a[t * 4 + 3]};
  u32 ay[4] = {a[(128 + t) * 4], a[(128 + t) * 4 + 1], a[(128 + t) * 4 + 2], a[(128 + t) * 4 + 3]};
  u64 desc = wgmma_desc(tile, geo[0], geo[1], geo[2]);
  wgmma_fence();
  wgmma_bf16<16, false>(x, ax, desc, false);
  wgmma_commit();
  wgmma_bf16<16, false>(y, ay, desc, false);
  wgmma_commit();
  wgmma_wait<1>();
  for (int j = 0; j < 8; j++) mid[t * 16 + j] = x[j], mid[t * 16 + 8 + j] = y[j];
  wgmma_wait<0>();
  for (int j = 0; j < 8; j++) end[t * 16 + j] = x[j], end[t * 16 + 8 + j] = y[j];
}

// The descriptor of a tile 256 bytes into the dynamic shared memory, and its shared address; then
// (out[3..]) for each of `n` offsets, wgmma_desc_add of it against the descriptor built there.
extern "C" __global__ void k_desc(u32* out, int lbo, int sbo, int swizzle, const u32* offs, int n) {
  unsigned char* tile = dynamic_smem() + 256;
  u64 d = wgmma_desc(tile, lbo, sbo, swizzle);
  if (threadIdx.x == 0) {
    out[0] = smem_u32(tile), out[1] = (u32)d, out[2] = (u32)(d >> 32);
    for (int i = 0; i < n; i++) out[3 + i] = wgmma_desc_add(d, offs[i]) == wgmma_desc(tile + offs[i], lbo, sbo, swizzle);
  }
}

// elect_one_sync in every warp, three rounds: bit r of out[t] set where thread t was elected in round r.
// flags: 1 lane 5 exits first (a planted partial warp: elect.sync's full mask then waits on a lane gone).
extern "C" __global__ void k_elect(u32* out, int flags) {
  int t = threadIdx.x;
  if ((flags & 1) && t == 5) return;
  u32 bits = 0;
  for (int r = 0; r < 3; r++) bits |= (elect_one_sync() ? 1u : 0u) << r;
  out[t] = bits;
}

// Blocks handing data through global memory (64 threads a block): block b > 0 writes its 64 words
// (b << 16 | t), then releases flag[b]; block 0 acquires the flags from the last block down (so it
// waits on blocks that start after it), and copies each block's words in by a bulk copy (the async
// proxy reading what the generic stores wrote: fence.proxy.async.global first) into out[(b - 1) * 64 ..].
extern "C" __global__ void k_handoff(u32* data, u32* flag, u32* out) {
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  u32* buf = reinterpret_cast<u32*>(s + 128);
  const int b = blockIdx.x, t = threadIdx.x, nb = gridDim.x;
  if (b > 0) {
    data[b * 64 + t] = (u32)b << 16 | (u32)t;
    __syncthreads();  // every thread's store, before thread 0's release (cumulative)
    if (t == 0) st_release_gpu(&flag[b], 1u);
    return;
  }
  if (t == 0) {
    for (int i = nb - 1; i > 0; --i)
      while (ld_acquire_gpu(&flag[i]) == 0u) {
      }
    mbarrier_init(bar, 1);
    fence_proxy_async_smem();
    fence_proxy_async_global();
    mbarrier_arrive_expect_tx(bar, (nb - 1) * 256);
    for (int i = 1; i < nb; ++i) cp_async_bulk_g2s(buf + (i - 1) * 64, data + i * 64, 256, bar);
  }
  __syncthreads();
  mbarrier_wait_parity(bar, 0);
  for (int i = t; i < (nb - 1) * 64; i += 64) out[i] = buf[i];
}

// One mbarrier through its phases (64 threads): after each step (an arrival, an expect_tx, a bulk
// copy) thread 0 records test_wait.parity 0 | 1 << 1; where a copy may still be in flight it first
// waits (so the record is the same on a GPU). Then the copied bytes. flags: 1 no mbarrier_init.
extern "C" __global__ void k_mbar_phases(const u32* g, u32* out, int flags) {
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  u32* buf = reinterpret_cast<u32*>(s + 128);
  int t = threadIdx.x, k = 0;
  auto rec = [&](int wait_parity) {
    __syncthreads();
    if (t == 0) {
      if (wait_parity >= 0) mbarrier_wait_parity(bar, wait_parity);
      out[k] = (mbarrier_test_wait_parity(bar, 0) ? 1u : 0u) | (mbarrier_test_wait_parity(bar, 1) ? 2u : 0u);
    }
    k++;
    __syncthreads();
  };
  if (t == 0 && !(flags & 1)) mbarrier_init(bar, 2);
  rec(-1);                                               // 0: phase 0 pending
  if (t == 0) mbarrier_arrive(bar);
  rec(-1);                                               // 1: one of two arrivals
  if (t == 1) mbarrier_arrive(bar);
  rec(-1);                                               // 2: phase 0 complete, phase 1 pending
  if (t == 0) mbarrier_arrive_expect_tx(bar, 128);
  rec(-1);                                               // 3
  if (t == 1) cp_async_bulk_g2s(buf, g, 128, bar);
  rec(-1);                                               // 4: an arrival still pending
  if (t == 1) mbarrier_arrive(bar);
  rec(1);                                                // 5: phase 1 complete (arrivals, then bytes)
  if (t == 1) cp_async_bulk_g2s(buf + 32, g + 32, 64, bar);
  rec(-1);                                               // 6: the copy before its expect_tx
  if (t == 0) mbarrier_arrive_expect_tx(bar, 64);
  rec(-1);                                               // 7
  if (t == 1) mbarrier_arrive(bar);
  rec(0);                                                // 8: phase 2 complete
  if (t < 48) out[16 + t] = buf[t];
}

// A two-stage ring (128 threads): thread 0 refills a stage by cp.async.bulk once all threads have
// released it (empty barrier), everyone waits for its full barrier and copies the chunk out.
// bug: 1 no wait on full, 2 no wait on empty before a refill, 3 an arrival without expect_tx.
extern "C" __global__ void k_bulk_ring(const u8* g, u32* out, int nchunks, int chunk, int bug) {
  unsigned char* s = dynamic_smem();
  u64* full = reinterpret_cast<u64*>(s);
  u64* empty = full + 2;
  unsigned char* ring = s + 128;
  int t = threadIdx.x;
  if (t == 0) {
    mbarrier_init(&full[0], 1), mbarrier_init(&full[1], 1);
    mbarrier_init(&empty[0], blockDim.x), mbarrier_init(&empty[1], blockDim.x);
  }
  __syncthreads();
  auto issue = [&](int i) {
    u64* b = &full[i % 2];
    if (bug == 3) mbarrier_arrive(b); else mbarrier_arrive_expect_tx(b, chunk);
    cp_async_bulk_g2s(ring + (i % 2) * chunk, g + (size_t)i * chunk, chunk, b);
  };
  if (t == 0)
    for (int i = 0; i < 2 && i < nchunks; i++) issue(i);
  for (int i = 0; i < nchunks; i++) {
    u32 phase = (i / 2) & 1;
    if (bug != 1) mbarrier_wait_parity(&full[i % 2], phase);
    const u32* src = reinterpret_cast<const u32*>(ring + (i % 2) * chunk);
    for (int w = t; w < chunk / 4; w += blockDim.x) out[(size_t)i * (chunk / 4) + w] = src[w];
    mbarrier_arrive(&empty[i % 2]);
    if (t == 0 && i + 2 < nchunks) {
      if (bug != 2) mbarrier_wait_parity(&empty[i % 2], phase);
      issue(i + 2);
    }
  }
}
"""
NAMES = ["k_wgmma", "k_wgmma_groups", "k_desc", "k_elect", "k_handoff", "k_mbar_phases", "k_bulk_ring"]

SWIZZLE = {"none": (0, 0), "128B": (1, 128), "64B": (2, 64), "32B": (3, 32)}  # descriptor code, bytes


def build(numerics):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(VARIABLE, numerics)
        return EmulatedModule(kernel_source(ASYNC_KERNELS), NAMES)


@pytest.fixture(scope="module")
def mod():
    return build("exact")  # the exact twins (the default mode)


# ---- the PTX ISA's layouts (9.7.15.5.1: register fragments and shared memory matrix layout) ----
def scatter_a(A16):
    """A (64 x 16 of 16-bit patterns) -> (128, 4) u32. Thread i: warp w = i // 32, g = lane >> 2,
    t = lane % 4; a0,a1 (row 16w+g, cols 2t, 2t+1), a2,a3 (row 16w+g+8), a4..a7 the same at cols
    2t+8, 2t+9; element 2r in the low half of register r."""
    out = np.zeros((128, 4), np.uint32)
    for i in range(128):
        w, g, t = i // 32, (i % 32) >> 2, i % 4
        for r in range(4):
            row = 16 * w + g + 8 * (r & 1)
            col = 2 * t + 8 * (r >> 1)
            out[i, r] = int(A16[row, col]) | (int(A16[row, col + 1]) << 16)
    return out


def d_coords(i, j):
    """Accumulator d_j of thread i (m64nNk16, fp32): row 16w + g (+8 for j % 4 >= 2),
    column 8 (j // 4) + 2t + j % 2."""
    w, g, t = i // 32, (i % 32) >> 2, i % 4
    return 16 * w + g + 8 * ((j >> 1) & 1), 8 * (j >> 2) + 2 * t + (j & 1)


def scatter_d(D):
    n = D.shape[1]
    return np.array([[D[d_coords(i, j)] for j in range(n // 2)] for i in range(128)], F32)


def gather_d(frag, n):
    D = np.zeros((64, n), F32)
    for i in range(128):
        for j in range(n // 2):
            D[d_coords(i, j)] = frag[i, j]
    return D


def geometry(n, k, n_major, swizzle):
    """(LBO, SBO) in bytes of a canonical B layout of k x n bf16 (padded between blocks, so a
    wrong offset shows), and the byte offset of B(k, n) before the swizzle. K-major: n rows of
    contiguous k; N-major: k rows of contiguous n. Without swizzle a core matrix is 8 rows of
    16 bytes; swizzled, rows are the swizzle's width W (the atom 8 rows x W)."""
    W = SWIZZLE[swizzle][1]
    if not n_major:
        if W == 0:
            sbo = 128 + 32  # n: the next 8 rows
            lbo = sbo * (n // 8) + 64  # k: the next 8 elements
            return lbo, sbo, lambda kk, nn: (nn % 8) * 16 + (nn // 8) * sbo + (kk // 8) * lbo + (kk % 8) * 2
        sbo = 8 * W  # n: the next 8 rows of W bytes
        e, kcol = W // 2, sbo * -(-n // 8)  # k beyond a row's W / 2 elements: the next column of atoms
        return 16, sbo, lambda kk, nn: (nn % 8) * W + (nn // 8) * sbo + (kk // e) * kcol + (kk % e) * 2
    if W == 0:
        sbo = 128 + 16  # n: the next 8 elements
        lbo = sbo * max(n // 8, 1) + 48  # k: the next 8 rows
        return lbo, sbo, lambda kk, nn: (kk % 8) * 16 + (kk // 8) * lbo + (nn // 8) * sbo + (nn % 8) * 2
    e = W // 2  # elements of n per row of the atom
    sbo = 8 * W  # k: the next 8 rows
    lbo = sbo * (k // 8)  # n: the next W bytes of n
    return lbo, sbo, lambda kk, nn: (kk % 8) * W + (kk // 8) * sbo + (nn // e) * lbo + (nn % e) * 2


def image(B16, n_major, swizzle):
    """B (k x n of 16-bit patterns) laid out as wgmma reads it from a 1024-aligned tile: address
    bits [4, 4 + log2(W / 16)) XOR bits [7, ...) for a swizzle of W bytes."""
    k, n = B16.shape
    lbo, sbo, off = geometry(n, k, n_major, swizzle)
    W = SWIZZLE[swizzle][1]
    spots = {}
    for kk in range(k):
        for nn in range(n):
            a = off(kk, nn)
            if W:
                a ^= ((a >> 7) & (W // 16 - 1)) << 4
            spots[a] = B16[kk, nn]
    size = (max(spots) + 2 + 15) // 16 * 16
    img = np.zeros(size // 2, np.uint16)
    for a, v in spots.items():
        img[a // 2] = v
    step = off(16, 0) if k > 16 else 0  # where the next k16 step's tile starts
    return img.view(np.uint8), lbo, sbo, step


def wgmma_inputs(n, steps, rng, exact=True):
    """A (64 x 16 steps), B (16 steps x n), C: integer multiples of 1/64 (every product and
    partial sum exact in fp32) with C of full fp32 precision, so the rounding points show."""
    if exact:
        A = (rng.integers(-256, 257, (64, 16 * steps)) / 64.0).astype(BF16)
        B = (rng.integers(-256, 257, (16 * steps, n)) / 64.0).astype(BF16)
    else:
        A = (rng.standard_normal((64, 16 * steps)) * 2.0 ** rng.integers(-6, 7, (64, 1))).astype(BF16)
        B = rng.standard_normal((16 * steps, n)).astype(BF16)
    C = rng.standard_normal((64, n)).astype(F32)
    return A, B, C


def step_model(A, B, C, accumulate=True):
    """The twins' accumulation model: per k16 instruction, C + the exact sum of its 16 products,
    rounded once to fp32; chained instructions round in k order."""
    D = C.astype(np.float64) if accumulate else np.zeros(C.shape)
    for k0 in range(0, A.shape[1], 16):
        D = (D + A[:, k0:k0 + 16].astype(np.float64) @ B[k0:k0 + 16].astype(np.float64)).astype(F32).astype(np.float64)
    return D.astype(F32)


def wgmma_args(A, B, C, n_major, swizzle, flags=0):
    steps = A.shape[1] // 16
    img, lbo, sbo, step = image(B.view(np.uint16), n_major, swizzle)
    a = np.concatenate([scatter_a(A[:, 16 * s:16 * s + 16].view(np.uint16)) for s in range(steps)])
    n = B.shape[1]
    geo = np.array([lbo, sbo, SWIZZLE[swizzle][0]], np.int32)
    args = (a, img, np.int32(img.size), np.int32(step), geo, scatter_d(C), np.zeros((128, n // 2), F32),
            np.int32(n), np.int32(n_major), np.int32(steps), np.int32(flags))
    return args, 16 + 1024 + img.size


def run_wgmma(mod, A, B, C, n_major, swizzle, flags=0):
    args, smem = wgmma_args(A, B, C, n_major, swizzle, flags)
    mod.get_function("k_wgmma")(1, 128, args, shared_mem=smem)
    return gather_d(args[6], B.shape[1])


# ---- wgmma ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [8, 16, 64])
@pytest.mark.parametrize("n_major", [0, 1], ids=["B K-major", "B N-major"])
@pytest.mark.parametrize("swizzle", ["none", "128B"])
def test_wgmma_fragments_layouts_and_rounding(mod, n, n_major, swizzle):
    rng = np.random.default_rng(100 + n + 7 * n_major + len(swizzle))
    A, B, C = wgmma_inputs(n, 2, rng)
    D = run_wgmma(mod, A, B, C, n_major, swizzle, flags=2)
    np.testing.assert_array_equal(D, step_model(A, B, C))
    once = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(F32)  # one rounding for k32: differs
    assert not np.array_equal(D, once)


def test_hardware_numerics_sum_each_k16_instruction_as_the_tensor_cores():
    """KDACUPY_EMULATE_NUMERICS=hardware: wgmma's sums are mma's model (mma_dot: blocks of 16
    products aligned and truncated, per k16 instruction), which the GPU probe checks."""
    A, B, C = wgmma_inputs(64, 2, np.random.default_rng(15), exact=False)
    D = run_wgmma(build("hardware"), A, B, C, 1, "128B", flags=2)
    np.testing.assert_array_equal(D, mma_dot(A, B, C))
    assert not np.array_equal(D, step_model(A, B, C))  # the exact twin rounds each instruction to nearest


@pytest.mark.parametrize("swizzle", ["64B", "32B"])
def test_wgmma_other_swizzles(mod, swizzle):
    A, B, C = wgmma_inputs(64, 2, np.random.default_rng(7))
    for n_major in (0, 1):
        np.testing.assert_array_equal(run_wgmma(mod, A, B, C, n_major, swizzle, flags=2), step_model(A, B, C))


def test_wgmma_scale_d_zero_ignores_c_and_b_may_arrive_by_bulk_copy(mod):
    A, B, C = wgmma_inputs(64, 1, np.random.default_rng(8))
    np.testing.assert_array_equal(run_wgmma(mod, A, B, C, 0, "128B", flags=1), step_model(A, B, C, accumulate=False))


def test_wgmma_a_wrong_layout_would_show(mod):
    """The image check is sharp: B laid out K-major but read as N-major gives other numbers."""
    A, B, C = wgmma_inputs(16, 1, np.random.default_rng(9))
    args, smem = wgmma_args(A, B, C, 0, "none", flags=2)
    args = args[:8] + (np.int32(1),) + args[9:]
    mod.get_function("k_wgmma")(1, 128, args, shared_mem=smem)
    assert not np.array_equal(gather_d(args[6], 16), step_model(A, B, C))


def test_accumulators_are_not_final_before_the_covering_wait(mod):
    A, B, C = wgmma_inputs(16, 1, np.random.default_rng(10))
    D = run_wgmma(mod, A, B, C, 0, "none", flags=2 | 4)  # read between commit and wait
    assert np.all(D.view(np.uint32) == 0xFFFFFFFF)
    img, lbo, sbo, _ = image(B.view(np.uint16), 0, "none")
    A2 = np.concatenate([A, wgmma_inputs(16, 1, np.random.default_rng(11))[0]], axis=1)
    a = np.concatenate([scatter_a(A2[:, :16].view(np.uint16)), scatter_a(A2[:, 16:].view(np.uint16))])
    mid, end = np.zeros((128, 16), F32), np.zeros((128, 16), F32)
    mod.get_function("k_wgmma_groups")(1, 128, (a, img, np.int32(img.size), np.array([lbo, sbo, 0], np.int32),
                                                mid, end), shared_mem=1040 + img.size)
    x, y = (step_model(A2[:, s:s + 16], B, C, accumulate=False) for s in (0, 16))
    np.testing.assert_array_equal(gather_d(mid[:, :8], 16), x)  # wait_group 1: the older group is done
    assert np.all(mid[:, 8:].view(np.uint32) == 0xFFFFFFFF)  # the newer one is still pending
    np.testing.assert_array_equal(gather_d(end[:, :8], 16), x)
    np.testing.assert_array_equal(gather_d(end[:, 8:], 16), y)


def test_wgmma_reads_shared_memory_when_performed_or_at_issue_when_eager(mod, monkeypatch):
    A, B, C = wgmma_inputs(16, 1, np.random.default_rng(12))
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", "deferred")  # B read at the wait: the zeros
    np.testing.assert_array_equal(run_wgmma(mod, A, B, C, 0, "none", flags=2 | 16), C)
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", "eager")  # B read at the issue
    np.testing.assert_array_equal(run_wgmma(mod, A, B, C, 0, "none", flags=2 | 16), step_model(A, B, C))


def test_wgmma_needs_a_fence_and_whole_warpgroups(mod):
    A, B, C = wgmma_inputs(8, 1, np.random.default_rng(13))
    with pytest.raises(EmulationError, match="without a wgmma.fence"):
        run_wgmma(mod, A, B, C, 0, "none", flags=8)
    args, smem = wgmma_args(A, B, C, 0, "none")
    with pytest.raises(EmulationError, match="blocks of whole warpgroups"):
        mod.get_function("k_wgmma")(1, 96, args, shared_mem=smem)


def test_matrix_descriptor_bits(mod):
    """PTX ISA matrix descriptor: bits 0-13 (start address & 0x3FFFF) >> 4, 16-29 leading byte
    offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset, 62-63 swizzle mode."""
    offs = np.array([0, 16, 2048, 4096, 60000], np.uint32)
    out = np.zeros(3 + len(offs), np.uint32)
    mod.get_function("k_desc")(1, 32, (out, np.int32(4096), np.int32(1024), np.int32(1), offs, np.int32(len(offs))),
                               shared_mem=61000)
    desc = int(out[1]) | int(out[2]) << 32
    assert out[0] % 128 == 0 and out[0] % 1024 != 0  # the emulated window: 128-byte aligned, and no more
    assert desc == ((int(out[0]) & 0x3FFFF) >> 4) | (4096 >> 4) << 16 | (1024 >> 4) << 32 | 1 << 62
    assert list(out[3:]) == [1] * len(offs)  # wgmma_desc_add: the descriptor built at the tile + offset


# ---- elect.sync -----------------------------------------------------------------------------------
def elected_lanes(out: np.ndarray) -> list:
    """k_elect's record -> the lane each warp elected, after checking the ISA's promise: one lane a warp
    a round, the same lane every round."""
    lanes = []
    for w in range(len(out) // 32):
        bits = out[32 * w:32 * w + 32]
        assert np.count_nonzero(bits) == 1, bits  # one lane a round, the same in all three
        lane = int(np.flatnonzero(bits)[0])
        assert bits[lane] == 0b111
        lanes.append(lane)
    return lanes


def test_elect_one_sync_elects_one_lane_the_same_every_time(mod):
    out = np.zeros(96, np.uint32)
    mod.get_function("k_elect")(1, 96, (out, np.int32(0)))
    assert elected_lanes(out) == [31, 31, 31]  # the twin's choice: not lane 0, which the ISA does not promise


def test_elect_one_sync_needs_the_whole_warp(mod):
    with pytest.raises(EmulationError, match="elect_one_sync"):
        mod.get_function("k_elect")(1, 64, (np.zeros(64, np.uint32), np.int32(1)))


# ---- flags between blocks ---------------------------------------------------------------------------
def handoff_expected(nblocks: int) -> np.ndarray:
    """k_handoff's out: block b's words (b << 16 | t), blocks 1 .. nblocks - 1 in order."""
    return np.array([b << 16 | t for b in range(1, nblocks) for t in range(64)], np.uint32)


@pytest.mark.parametrize("check", ["", "all"], ids=["plain", "checked"])
def test_blocks_hand_data_over_through_acquire_and_release(mod, monkeypatch, check):
    # one OS thread would run block 0 first, spinning for ever on a block never started: a co-resident
    # launch gives every block its own
    monkeypatch.setenv("KDACUPY_EMULATE_THREADS", "1")
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", check)
    nb = 5
    data, flag, out = np.zeros(nb * 64, np.uint32), np.zeros(nb, np.uint32), np.zeros((nb - 1) * 64, np.uint32)
    mod.get_function("k_handoff")(nb, 64, (data, flag, out), shared_mem=128 + (nb - 1) * 256, co_resident=True)
    np.testing.assert_array_equal(out, handoff_expected(nb))
    assert list(flag[1:]) == [1] * (nb - 1)


def test_a_co_resident_launch_is_bounded(mod):
    from kdacupy.emulate.loader import MAX_CO_RESIDENT

    with pytest.raises(EmulationError, match="co-resident launch of"):
        mod.get_function("k_handoff")(MAX_CO_RESIDENT + 1, 64, (np.zeros(64, np.uint32), np.zeros(1, np.uint32),
                                                               np.zeros(64, np.uint32)), co_resident=True)


# ---- mbarrier and cp.async.bulk ---------------------------------------------------------------------
#: test_wait.parity(0) | test_wait.parity(1) << 1 after each step of k_mbar_phases
PHASES = [2, 2, 1, 1, 1, 2, 2, 2, 1]


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_mbarrier_phases_and_bulk_copy_bytes(mod, monkeypatch, mode):
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", mode)
    g = (np.arange(64, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)
    out = np.zeros(64, np.uint32)
    mod.get_function("k_mbar_phases")(1, 64, (g.astype(np.uint32), out, np.int32(0)), shared_mem=512)
    assert list(out[:9]) == PHASES
    np.testing.assert_array_equal(out[16:64], g[:48])  # 128 bytes, then 64 more


def test_mbarrier_before_init_is_an_error(mod):
    with pytest.raises(EmulationError, match="no mbarrier at"):
        mod.get_function("k_mbar_phases")(1, 64, (np.zeros(64, np.uint32), np.zeros(64, np.uint32), np.int32(1)),
                                          shared_mem=512)


def run_ring(mod, bug=0, nchunks=5, chunk=1024, smem=None):
    g = np.random.default_rng(14).integers(0, 1 << 32, nchunks * chunk // 4, dtype=np.uint64).astype(np.uint32)
    out = np.zeros_like(g)
    mod.get_function("k_bulk_ring")(1, 128, (g.view(np.uint8), out, np.int32(nchunks), np.int32(chunk),
                                             np.int32(bug)), shared_mem=smem or 128 + 2 * chunk)
    return g, out


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_bulk_copy_ring(mod, monkeypatch, mode):
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", mode)
    g, out = run_ring(mod)
    np.testing.assert_array_equal(out, g)


def test_ring_bugs_are_exposed(mod, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", "deferred")  # copies land at the covering wait
    g, out = run_ring(mod, bug=1, nchunks=2)  # no wait on full: the 0xFF fill
    assert np.all(out == 0xFFFFFFFF)
    g, out = run_ring(mod, bug=3)  # no expect_tx: each phase completes before its bytes
    assert np.all(out == 0xFFFFFFFF)
    with pytest.raises(EmulationError, match="deadlock.*wait for an mbarrier phase"):
        run_ring(mod, bug=2)  # refilled before every thread released the stage: the refiller laps the others
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", "eager")  # copies land at issue
    with pytest.raises(EmulationError, match="deadlock.*wait for an mbarrier phase"):
        run_ring(mod, bug=3)  # the early bytes leave the next phase waiting for ever


def test_bulk_copy_extents_are_checked(mod):
    with pytest.raises(EmulationError, match="size 24 is not a positive multiple of 16"):
        run_ring(mod, chunk=24, nchunks=1, smem=256)
    with pytest.raises(EmulationError, match=r"destination \[.*\) is not inside the block's dynamic shared memory"):
        run_ring(mod, smem=128 + 1024)

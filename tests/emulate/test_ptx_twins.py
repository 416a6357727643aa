"""Each wrapper of kernels/ptx.cuh against its CPU twin (kdacupy/emulate/ptx_twins.h).

Fragments are scattered to and gathered from lanes here, in Python, from the
PTX ISA's layout text (not from the C++), and compared with numpy.
"""

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, EmulationError

ROOT = Path(__file__).resolve().parents[2]
F32 = np.float32


def kernel_source(body: str) -> str:
    """types.cuh + ptx.cuh (their #include lines dropped) + test kernels: one self-contained text."""
    text = "".join((ROOT / "kernels" / f).read_text() for f in ("types.cuh", "ptx.cuh"))
    return re.sub(r'^\s*#include\s+"[^"]*"\s*$', "", text, flags=re.M) + body


TEST_KERNELS = r"""
// mode 0 x4, 1 x4.trans, 2 x2, 3 x2.trans. Lane l gives the address of shared
// row rowidx[l] (16 bytes each); lanes 16-31 give a misaligned address for x2
// (ignored by the ISA).
extern "C" __global__ void k_ldmatrix(const u16* rows, const int* rowidx, u32* out, int mode) {
  unsigned char* s = dynamic_smem();
  for (int i = threadIdx.x; i < 32 * 8; i += 32) reinterpret_cast<u16*>(s)[i] = rows[i];
  __syncthreads();
  int l = threadIdx.x;
  const unsigned char* p = s + 16 * rowidx[l];
  u32 r[4] = {0, 0, 0, 0};
  if (mode == 0) ldmatrix_x4(r, p);
  if (mode == 1) ldmatrix_x4_trans(r, p);
  u32 r2[2] = {0, 0};
  if (mode >= 2 && l >= 16) p = s + 3;
  if (mode == 2) ldmatrix_x2(r2, p);
  if (mode == 3) ldmatrix_x2_trans(r2, p);
  if (mode >= 2) { r[0] = r2[0]; r[1] = r2[1]; }
  for (int i = 0; i < 4; i++) out[4 * l + i] = r[i];
}

extern "C" __global__ void k_mma(const u32* a, const u32* b, const float* c, float* d, int f16) {
  int l = threadIdx.x;
  u32 af[4] = {a[4 * l], a[4 * l + 1], a[4 * l + 2], a[4 * l + 3]};
  u32 bf[2] = {b[2 * l], b[2 * l + 1]};
  float cf[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
  float df[4];
  if (f16) mma_f16_m16n8k16(df, af, bf, cf); else mma_bf16_m16n8k16(df, af, bf, cf);
  for (int i = 0; i < 4; i++) d[4 * l + i] = df[i];
}

// Elementwise over 32-bit words; the pack ops read pairs (in[2i], in[2i+1]).
extern "C" __global__ void k_unary(const u32* in, u32* out, int n, int op) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    float x = __uint_as_float(in[i]);
    u32 r = 0;
    switch (op) {
      case 0: r = f32_to_bf16(x); break;
      case 1: r = f32_to_f16(x); break;
      case 2: r = __float_as_uint(f16_to_f32((u16)in[i])); break;
      case 3: r = pack_bf16x2(__uint_as_float(in[2 * i]), __uint_as_float(in[2 * i + 1])); break;
      case 4: r = pack_f16x2(__uint_as_float(in[2 * i]), __uint_as_float(in[2 * i + 1])); break;
      case 5: r = __float_as_uint(ex2_approx_ftz(x)); break;
      case 6: r = __float_as_uint(lg2_approx_ftz(x)); break;
      case 7: r = __float_as_uint(rsqrt_approx_ftz(x)); break;
      case 8: r = __float_as_uint(rcp_approx_ftz(x)); break;
      case 9: r = __float_as_uint(tanh_approx(x)); break;
    }
    out[i] = r;
  }
}

// The f32x2 pairs: out[2i], out[2i + 1] from lanes (2i, 2i + 1) of a, b, c; op 0 fma2, 1 sub2, 2 mul2.
extern "C" __global__ void k_pair2(const float* a, const float* b, const float* c, float* out, int n, int op) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    const float2 x = make_float2(a[2 * i], a[2 * i + 1]), y = make_float2(b[2 * i], b[2 * i + 1]);
    const float2 z = make_float2(c[2 * i], c[2 * i + 1]);
    const float2 r = op == 0 ? fma2_ftz(x, y, z) : op == 1 ? sub2_ftz(x, y) : op == 2 ? mul2_ftz(x, y) : add2_ftz(x, y);
    out[2 * i] = r.x, out[2 * i + 1] = r.y;
  }
}

// Each thread copies its own 16-byte slot of regions R0..R2 and snapshots them
// (its own copies: no __syncthreads needed) after each step of the group protocol.
extern "C" __global__ void k_cp_async(const u32* g, u32* out) {
  unsigned char* s = dynamic_smem();
  int t = threadIdx.x, n = blockDim.x;
  auto snap = [&](int k) {
    for (int r = 0; r < 3; r++)
      for (int j = 0; j < 4; j++)
        out[((k * 3 + r) * n + t) * 4 + j] = reinterpret_cast<const u32*>(s + (r * n + t) * 16)[j];
  };
  cp_async_16(s + (0 * n + t) * 16, g + (0 * n + t) * 4);                   // group 0
  cp_async_commit();
  cp_async_16_zfill(s + (1 * n + t) * 16, g + (1 * n + t) * 4, t % 2 == 0);  // group 1, odd t zero-filled
  cp_async_commit();
  cp_async_16(s + (2 * n + t) * 16, g + (2 * n + t) * 4);                   // not committed yet
  snap(0);
  cp_async_wait<1>();  // all but the newest committed group: group 0
  snap(1);
  cp_async_wait<0>();  // every committed group; the uncommitted copy stays pending
  snap(2);
  cp_async_commit();
  cp_async_wait<0>();
  snap(3);
}

// C[M,N] = A[M,K] @ B[K,N], bf16 row-major, fp32 out: 64x64 tiles, 4 warps of 16 rows,
// K in steps of 32 through a 2-stage cp.async pipeline; B (K-major rows) goes through
// ldmatrix .trans to become the mma "col" operand. SLACK and END_SYNC make the two
// classic pipeline bugs: waiting one group too few, refilling a stage others still read.
template <int SLACK, bool END_SYNC>
__device__ void gemm_tile(const u16* A, const u16* B, float* C, int N, int K) {
  u16* sA = reinterpret_cast<u16*>(dynamic_smem());   // [2][64][32]
  u16* sB = sA + 2 * 64 * 32;                         // [2][32][64]
  int t = threadIdx.x, w = t / 32, l = t % 32, m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
  auto load = [&](int stage, int k0) {
    for (int c = t; c < 256; c += 128) {  // 16-byte chunks: A 64 rows x 4, B 32 rows x 8
      cp_async_16(sA + stage * 2048 + (c / 4) * 32 + (c % 4) * 8, A + (m0 + c / 4) * K + k0 + (c % 4) * 8);
      cp_async_16(sB + stage * 2048 + (c / 8) * 64 + (c % 8) * 8, B + (k0 + c / 8) * N + n0 + (c % 8) * 8);
    }
    cp_async_commit();
  };
  float acc[8][4] = {};
  int nk = K / 32;
  load(0, 0);
  for (int kb = 0; kb < nk; kb++) {
    if (kb + 1 < nk) { load((kb + 1) % 2, (kb + 1) * 32); cp_async_wait<1 + SLACK>(); } else { cp_async_wait<SLACK>(); }
    __syncthreads();
    const u16* a = sA + (kb % 2) * 2048;
    const u16* b = sB + (kb % 2) * 2048;
    for (int k16 = 0; k16 < 32; k16 += 16) {
      u32 af[4];  // matrix i = l/8: rows +8*(i&1), k +8*(i>>1)
      ldmatrix_x4(af, a + (16 * w + l % 8 + 8 * ((l / 8) & 1)) * 32 + k16 + 8 * (l / 16));
      for (int j = 0; j < 8; j++) {
        u32 bf[2];  // lanes 0-15: k rows k16 + l
        ldmatrix_x2_trans(bf, b + (k16 + l % 16) * 64 + 8 * j);
        mma_bf16_m16n8k16(acc[j], af, bf, acc[j]);
      }
    }
    if (END_SYNC) __syncthreads();
  }
  for (int j = 0; j < 8; j++)
    for (int i = 0; i < 4; i++)
      C[(m0 + 16 * w + l / 4 + 8 * (i / 2)) * N + n0 + 8 * j + 2 * (l % 4) + i % 2] = acc[j][i];
}
#define GEMM(name, slack, end_sync) \
  extern "C" __global__ void name(const u16* A, const u16* B, float* C, int N, int K) { \
    gemm_tile<slack, end_sync>(A, B, C, N, K); }
GEMM(k_gemm, 0, true)
GEMM(k_gemm_short_wait, 1, true)
GEMM(k_gemm_no_end_sync, 0, false)
"""
NAMES = ["k_ldmatrix", "k_mma", "k_unary", "k_pair2", "k_cp_async", "k_gemm", "k_gemm_short_wait", "k_gemm_no_end_sync"]


pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast",
                                        "ignore:invalid value encountered in cast")


@pytest.fixture(scope="module")
def mod():
    with pytest.MonkeyPatch.context() as mp:  # these tests pin the exact twins (the default mode)
        mp.setenv("KDACUPY_EMULATE_NUMERICS", "exact")
        return EmulatedModule(kernel_source(TEST_KERNELS), NAMES)


def u32_of(x):
    return np.asarray(x, dtype=F32).view(np.uint32)


def run_unary(mod, words, op, n_out=None):
    words = np.ascontiguousarray(words, dtype=np.uint32)
    n = len(words) if n_out is None else n_out
    out = np.zeros(n, np.uint32)
    mod.get_function("k_unary")(4, 64, (words, out, np.int32(n), np.int32(op)))
    return out


# ---- fragment layouts, from the PTX ISA ("Matrix Fragments for mma.m16n8k16
# with floating point type"; ldmatrix). g = groupID = lane >> 2, t = lane % 4.
def pack_halves(lo, hi):
    return (lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)).astype(np.uint32)


def scatter_a(A16):
    """A (16x16 of 16-bit patterns) -> (32, 4) u32: a_i, i=0..7, in registers i//2 (low half: even i).
    row = g for i in {0,1,4,5} else g+8; col = 2t + (i & 1) for i < 4 else 2t + 8 + (i & 1)."""
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        halves = []
        for i in range(8):
            row = g if i in (0, 1, 4, 5) else g + 8
            col = 2 * t + (i & 1) + (0 if i < 4 else 8)
            halves.append(A16[row, col])
        for r in range(4):
            out[lane, r] = int(halves[2 * r]) | (int(halves[2 * r + 1]) << 16)
    return out


def scatter_b(B16):
    """B (16x8, K x N) -> (32, 2) u32: b_i, i=0..3: row(k) = 2t + (i & 1) (+8 for i >= 2), col = g."""
    out = np.zeros((32, 2), np.uint32)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        halves = [B16[2 * t + (i & 1) + (8 if i >= 2 else 0), g] for i in range(4)]
        out[lane] = [int(halves[0]) | (int(halves[1]) << 16), int(halves[2]) | (int(halves[3]) << 16)]
    return out


def c_coords(lane, i):
    """C/D element c_i of a lane: row = g for i < 2 else g + 8; col = 2t + (i & 1)."""
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), 2 * t + (i & 1)


def scatter_c(C):
    return np.array([[C[c_coords(lane, i)] for i in range(4)] for lane in range(32)], F32)


def gather_d(frag):
    D = np.zeros((16, 8), F32)
    for lane in range(32):
        for i in range(4):
            D[c_coords(lane, i)] = frag[lane, i]
    return D


def ldmatrix_expected(mats, trans):
    """mats: (nm, 8, 8) u16. Per the ISA each lane l gets, of every matrix, the two
    elements (row l//4, cols 2(l%4), 2(l%4)+1); .trans delivers the transposed matrix."""
    nm = len(mats)
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        for m in range(nm):
            M = mats[m].T if trans else mats[m]
            row, col = lane // 4, 2 * (lane % 4)
            out[lane, m] = int(M[row, col]) | (int(M[row, col + 1]) << 16)
    return out


# ---- ldmatrix ------------------------------------------------------------------------
def check_ldmatrix(mod, mode, nm, trans):
    rng = np.random.default_rng(10 + mode)
    rows = rng.integers(0, 1 << 16, size=(32, 8), dtype=np.uint16)  # 32 shared rows of 16 bytes
    rowidx = rng.permutation(32).astype(np.int32)  # lane l addresses shared row rowidx[l]
    out = np.zeros((32, 4), np.uint32)
    mod.get_function("k_ldmatrix")(1, 32, (rows, rowidx, out, np.int32(mode)), shared_mem=512)
    # matrix m, row j = the shared row addressed by lane 8m + j
    mats = np.stack([rows[rowidx[8 * m: 8 * m + 8]] for m in range(nm)])
    np.testing.assert_array_equal(out[:, :nm], ldmatrix_expected(mats, trans)[:, :nm])


def test_ldmatrix_x4(mod):
    check_ldmatrix(mod, 0, 4, False)


def test_ldmatrix_x4_trans(mod):
    check_ldmatrix(mod, 1, 4, True)


def test_ldmatrix_x2(mod):
    check_ldmatrix(mod, 2, 2, False)


def test_ldmatrix_x2_trans(mod):
    check_ldmatrix(mod, 3, 2, True)


# ---- mma ------------------------------------------------------------------------------
def check_mma(mod, f16):
    rng = np.random.default_rng(20 + f16)
    # Inputs whose products and sums are exact in float64 (so the order of summation
    # cannot matter), with C of full float32 precision so that an fp32 accumulation
    # would differ from the twin's single rounding.
    lim = 2048 if f16 else 256
    dt = np.float16 if f16 else ml_dtypes.bfloat16
    A = (rng.integers(-lim, lim + 1, (16, 16)) / 64.0).astype(dt)
    B = (rng.integers(-lim, lim + 1, (16, 8)) / 64.0).astype(dt)
    C = rng.standard_normal((16, 8)).astype(F32)
    D_ref = (A.astype(np.float64) @ B.astype(np.float64) + C.astype(np.float64)).astype(F32)
    d = np.zeros((32, 4), F32)
    args = (scatter_a(A.view(np.uint16)), scatter_b(B.view(np.uint16)), scatter_c(C), d, np.int32(f16))
    mod.get_function("k_mma")(1, 32, args)
    np.testing.assert_array_equal(gather_d(d), D_ref)
    acc32 = C.copy()  # the same sum accumulated in float32 differs: the twin rounds once
    for k in range(16):
        acc32 = acc32 + A[:, k:k + 1].astype(F32) * B[k:k + 1, :].astype(F32)
    assert not np.array_equal(acc32, D_ref)


def test_mma_bf16_m16n8k16(mod):
    check_mma(mod, 0)


def test_mma_f16_m16n8k16(mod):
    check_mma(mod, 1)


def run_gemm(mod, name):
    rng = np.random.default_rng(30)
    M, N, K = 128, 192, 96
    A = (rng.integers(-256, 257, (M, K)) / 64.0).astype(ml_dtypes.bfloat16)  # every partial sum exact in fp32
    B = (rng.integers(-256, 257, (K, N)) / 64.0).astype(ml_dtypes.bfloat16)
    C = np.zeros((M, N), F32)
    mod.get_function(name)((N // 64, M // 64), 128, (A.view(np.uint16), B.view(np.uint16), C, np.int32(N),
                                                       np.int32(K)), shared_mem=2 * 2 * 64 * 32 * 2)
    return C, (A.astype(np.float64) @ B.astype(np.float64)).astype(F32)


def test_wrappers_compose_into_a_gemm_tile(mod):
    C, ref = run_gemm(mod, "k_gemm")
    np.testing.assert_array_equal(C, ref)


def test_cp_async_pipeline_bugs_are_exposed(mod, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", "deferred")
    C, _ = run_gemm(mod, "k_gemm_short_wait")  # deferred copies: a missing wait reads the 0xFF fill
    assert np.isnan(C).all()
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", "eager")  # copies land at issue
    C, ref = run_gemm(mod, "k_gemm_no_end_sync")  # a stage is refilled while another warp reads it
    assert (C != ref).any()
    C, ref = run_gemm(mod, "k_gemm")
    np.testing.assert_array_equal(C, ref)


# ---- cp.async ---------------------------------------------------------------------------
def test_cp_async(mod, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_CP_ASYNC", "deferred")  # the faithful default
    n = 32
    g = np.arange(3 * n * 4, dtype=np.uint32) + 1
    out = np.zeros((4, 3, n, 4), np.uint32)
    mod.get_function("k_cp_async")(1, n, (g, out), shared_mem=3 * n * 16)
    src = g.reshape(3, n, 4)
    ff = np.full((n, 4), 0xFFFFFFFF, np.uint32)  # shared memory starts as 0xFF bytes
    zfilled = src[1].copy()
    zfilled[1::2] = 0  # odd threads passed valid=false: 16 zero bytes
    expect = [
        [ff, ff, ff],  # nothing lands before a wait
        [src[0], ff, ff],  # wait_group 1: group 0 done, group 1 still pending
        [src[0], zfilled, ff],  # wait_group 0: committed groups only
        [src[0], zfilled, src[2]],  # after committing the last copy
    ]
    for k in range(4):
        for r in range(3):
            np.testing.assert_array_equal(out[k, r], expect[k][r], err_msg=f"snapshot {k}, region {r}")


def test_cp_async_destination_outside_dynamic_smem_is_an_error(mod):
    g = np.zeros(3 * 32 * 4, np.uint32)
    out = np.zeros((4, 3, 32, 4), np.uint32)
    with pytest.raises(EmulationError, match="not inside the block's dynamic shared memory"):
        mod.get_function("k_cp_async")(1, 32, (g, out), shared_mem=32 * 16)


# ---- conversions ---------------------------------------------------------------------------
SPECIAL_BITS = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x00008000,
            0x00018000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000,
            0x477FEFFF, 0x477FF000, 0x477FE000, 0x33000000, 0x33000001, 0x337FFFFF, 0x33800000, 0x38800000,
            0x387FE000, 0x387FF000, 0x38801000, 0xB3800001, 0x39FFF000, 0x3A000800]


def special_floats():
    rng = np.random.default_rng(5)
    rand = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
    near_half = (rng.standard_normal(2000) * 2.0 ** rng.integers(-26, 17, 2000)).astype(F32).view(np.uint32)
    return np.concatenate([np.array(SPECIAL_BITS, np.uint32), rand, near_half])


def assert_same_bits(got, ref, isnan):
    np.testing.assert_array_equal(got[~isnan], ref[~isnan])
    assert np.all(got[isnan] == 0x7FFF)  # NaN stays NaN (canonical)


def test_f32_to_bf16(mod):
    w = special_floats()
    x = w.view(F32)
    got = run_unary(mod, w, 0)
    ref = x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)  # RNE
    assert_same_bits(got, ref, np.isnan(x))
    assert list(got[:7]) == [0x3F80, 0x3F82, 0x3F81, 0x3F81, 0x7F80, 0xFF80, 0x7F80]  # ties to even, overflow
    assert list(got[7:11]) == [0x0000, 0x0002, 0x0000, 0x8080]  # subnormals round too (no ftz)


def test_f32_to_f16(mod):
    w = special_floats()
    x = w.view(F32)
    got = run_unary(mod, w, 1)
    ref = x.astype(np.float16).view(np.uint16).astype(np.uint32)  # RNE, subnormals, overflow to inf
    assert_same_bits(got, ref, np.isnan(x))
    by_bits = dict(zip(SPECIAL_BITS, got[: len(SPECIAL_BITS)].tolist()))
    assert by_bits[0x477FEFFF] == 0x7BFF and by_bits[0x477FF000] == 0x7C00  # 65519.99 -> max, 65520 -> inf
    assert by_bits[0x33000000] == 0x0000 and by_bits[0x33000001] == 0x0001  # 2^-25 ties to 0, above -> 2^-24
    assert by_bits[0x387FF000] == 0x0400  # rounds up out of the subnormals


def test_f16_to_f32(mod):
    h = np.arange(1 << 16, dtype=np.uint32)  # every half
    got = run_unary(mod, h, 2)
    x = h.astype(np.uint16).view(np.float16)
    ref = x.astype(F32).view(np.uint32)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], ref[~nan])
    assert np.all(np.isnan(got[nan].view(F32)))


def check_pack(mod, op, dt):
    w = special_floats()
    w = w[: len(w) // 2 * 2]
    got = run_unary(mod, w, op, n_out=len(w) // 2)
    x = w.view(F32)
    lo = x[0::2].astype(dt).view(np.uint16).astype(np.uint32)
    hi = x[1::2].astype(dt).view(np.uint16).astype(np.uint32)
    lo[np.isnan(x[0::2])] = 0x7FFF  # NaN stays NaN (canonical)
    hi[np.isnan(x[1::2])] = 0x7FFF
    np.testing.assert_array_equal(got, lo | (hi << 16))  # lo in bits 0..15


def test_pack_bf16x2(mod):
    check_pack(mod, 3, ml_dtypes.bfloat16)


def test_pack_f16x2(mod):
    check_pack(mod, 4, np.float16)


# ---- approximate SFU functions: exact value rounded once, ftz semantics ------------------------
TINY = 2.0 ** -126


def approx_inputs(lo, hi):
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(lo, hi, 3000), [0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 1.0, -1.0]])
    return x.astype(F32)


def flush(y):
    y = np.asarray(y, np.float64)
    return np.where(np.abs(y) < TINY, np.copysign(0.0, y), y)


def run_approx(mod, x, op):
    return run_unary(mod, u32_of(x), op).view(F32)


def assert_f32_equal(got, ref):
    ref = np.asarray(ref).astype(F32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))  # also the sign of 0


def test_ex2_approx_ftz(mod):
    x = np.concatenate([approx_inputs(-140, 130), np.array([-126.0, -126.5, -127.0, 127.9999], F32)])
    got = run_approx(mod, x, 5)
    with np.errstate(over="ignore"):
        ref = np.exp2(flush(x.astype(np.float64))).astype(F32)
    ref = np.where(ref < TINY, F32(0), ref)  # results below 2^-126 flush to +0
    assert_f32_equal(got, ref)
    assert got[-4] == TINY and got[-3] == 0 and got[-2] == 0 and np.isfinite(got[-1])
    assert list(got[3000:3004]) == [1, 1, 1, 1] and got[3004] == np.inf and got[3005] == 0  # ftz inputs


def test_lg2_approx_ftz(mod):
    x = np.concatenate([approx_inputs(-10, 1e6), np.array([1e-30, 3.0e38], F32)])
    got = run_approx(mod, x, 6)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = flush(np.log2(flush(x.astype(np.float64))))
    assert_f32_equal(got, ref)
    assert got[3000] == -np.inf and got[3002] == -np.inf and np.isnan(got[3008])  # lg2(0), lg2(subnormal), lg2(-1)


def test_rsqrt_approx_ftz(mod):
    x = approx_inputs(-1, 1e6)
    got = run_approx(mod, x, 7)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = flush(1.0 / np.sqrt(flush(x.astype(np.float64))))
    assert_f32_equal(got, ref)
    assert got[3000] == np.inf and got[3001] == -np.inf and got[3002] == np.inf and got[3004] == 0


def test_rcp_approx_ftz(mod):
    x = np.concatenate([approx_inputs(-1e3, 1e3), np.array([2.0 ** 127, -(2.0 ** 126)], F32)])
    got = run_approx(mod, x, 8)
    with np.errstate(divide="ignore"):
        ref = flush(1.0 / flush(x.astype(np.float64)))
    assert_f32_equal(got, ref)
    assert got[3000] == np.inf and got[3001] == -np.inf and got[3003] == -np.inf  # rcp(0), rcp(-0), rcp(-subn)
    assert got[-2] == 0 and got[-1] == -TINY  # 2^-127 flushes; -2^-126 is normal


def test_tanh_approx(mod):
    x = approx_inputs(-12, 12)
    got = run_approx(mod, x, 9)
    assert_f32_equal(got, np.tanh(x.astype(np.float64)))
    assert got[3004] == 1 and got[3005] == -1


# ---- the real PTX through NVRTC (no GPU needed) -----------------------------------------------------
ALL_WRAPPERS = r"""
extern "C" __global__ void all_wrappers(const float* g, float* out) {
  unsigned char* s = dynamic_smem();
  int t = threadIdx.x;
  cp_async_16(s + 16 * t, g + 4 * t);
  cp_async_16_zfill(s + 512 + 16 * t, g, t < 3);
  cp_async_commit();
  cp_async_wait<1>();
  cp_async_wait<0>();
  __syncthreads();
  u32 a[4], b[2], b2[2];
  ldmatrix_x4(a, s + 16 * t);
  ldmatrix_x4_trans(a, s + 16 * (t ^ 1));
  ldmatrix_x2(b, s + 16 * (t % 16));
  ldmatrix_x2_trans(b2, s + 16 * (t % 16));
  float c[4] = {g[0], g[1], g[2], g[3]}, d[4];
  mma_bf16_m16n8k16(d, a, b, c);
  mma_f16_m16n8k16(c, a, b2, d);
  u32 p = pack_bf16x2(c[0], c[1]) ^ pack_f16x2(c[2], c[3]);
  u16 h = f32_to_bf16(c[0]) ^ f32_to_f16(c[1]);
  out[t] = f16_to_f32(h) + ex2_approx_ftz(c[0]) + lg2_approx_ftz(c[1]) + rsqrt_approx_ftz(c[2]) +
           rcp_approx_ftz(c[3]) + tanh_approx(d[0]) + (float)p;
}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_ptx_cuh_compiles_with_nvrtc(arch):
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # no CuPy, or its NVRTC library cannot load
        pytest.skip(f"cupy's NVRTC is unavailable: {e}")
    prog = nvrtc.createProgram(kernel_source(ALL_WRAPPERS), "ptx_wrappers.cu", [], [])
    try:  # a real sm_* target runs ptxas, so every PTX spelling and operand is checked
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", "-std=c++17", "--fmad=false"])
    except nvrtc.NVRTCError as e:
        pytest.fail(f"{e}\n{nvrtc.getProgramLog(prog)}")
    ptx = nvrtc.getPTX(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    for instr in ("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                  "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "cp.async.cg.shared.global",
                  "cp.async.wait_group 1", "cvt.rn.bf16x2.f32", "ex2.approx.ftz.f32", "tanh.approx.f32"):
        assert instr in ptx
    nvrtc.destroyProgram(prog)


# ---- fp32 pairs (fma / sub / mul .rn.ftz.f32x2): each lane its scalar operation, rounded once -----------
def pair_operands(n=4000):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, n)) * np.exp2(rng.integers(-20, 20, (3, n)))
    special = np.array([0.0, -0.0, 1e-40, -1e-40, 2.0 ** -126, np.inf, -np.inf, np.nan, 1.0, -1.0, 3e38, -3e38])
    a, b = np.meshgrid(special, special)
    x[0, :a.size], x[1, :a.size], x[2, :a.size] = a.ravel(), b.ravel(), np.roll(a.ravel(), 5)
    return x.astype(F32)


PAIR_OPS = ["fma2", "sub2", "mul2", "add2"]  # k_pair2's op codes


@pytest.mark.parametrize("op", PAIR_OPS)
def test_f32x2_pairs(mod, op):
    """Each lane is the scalar operation rounded once (fma: fp32's correctly rounded fused multiply-add),
    as the kernels' scalar code computes it in the emulation's exact numerics (there, as for every plain
    fp32 operation, subnormals are kept; the hardware numerics' FTZ|DAZ launch mode flushes both alike, as
    the GPU's .ftz pair and its -ftz=true scalar twins do)."""
    from kdacupy.numerics.backward_arith import fma32
    a, b, c = pair_operands()
    out = np.zeros(a.size, F32)
    mod.get_function("k_pair2")(4, 64, (a, b, c, out, np.int32(a.size // 2), np.int32(PAIR_OPS.index(op))))
    fa, fb, fc = (x.astype(np.float64) for x in (a, b, c))
    with np.errstate(all="ignore"):
        ref = {"fma2": lambda: fma32(fa, fb, fc), "sub2": lambda: fa - fb, "mul2": lambda: fa * fb,
               "add2": lambda: fa + fb}[op]()
    assert_f32_equal(out, ref)

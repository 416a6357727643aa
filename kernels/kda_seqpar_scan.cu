// kda_seqpar_scan: the start state of every segment of the sequence-parallel
// forward (docs/design.md section 7.2, kdacupy/seqpar.py), in fp32 throughout:
//   S[0] = the sequence's initial state (any state dtype and layout, or zero)
//   S[s + 1] = M_s S[s] + B_s      (s >= m_from; before it B_s: the split's M_0 S[0] is zero)
//                                  (M_s: [K, K], B_s: [K, V], kv orientation; rows m_ld and b_ld
//                                   floats apart, each matrix K rows: the merged maps' [K, K + V] state
//                                   holds M_s and B_s side by side)
// One CTA per (sequence, value head, slice of SC value columns): the columns of
// the state evolve independently, so the slice stays in shared memory for the
// whole chain and only M and B stream in. Each thread owns a register tile of
// CPT columns and K/RG rows: per key, K/RG words of M and CPT of the slice feed
// (K/RG) CPT FMAs, read as 16-byte loads (K <= 128: a row's M four keys at a time,
// the slice's CPT columns at once), broadcasts with no bank conflicts; every
// product is a chain of fp32 FMAs in key order, B first: the
// key blocks of TI staged in ascending order into the same accumulators, no
// partial sums (the rounding points, bit for bit: kdacupy/numerics/scan_model.py).
// The starts are written in the call's state layout, ready for the forward; the
// initial state is read and the starts written through the slice in shared
// memory, the CTA's lanes walking the layout's contiguous dimension (in "vk" a
// column's K keys are adjacent in memory, so lanes owning columns would touch
// one sector each).
//
// Rendered configuration: KDA_K, KDA_V, SCAN_SC (columns per CTA), SCAN_CPT (columns per thread),
// SCAN_RG (row groups), SCAN_TI (columns of M staged per pass); SCAN_SC / SCAN_CPT * SCAN_RG threads;
// optional KDA_ANY_DIMS
// (1: KDA_K, KDA_V are the key and value tiles, the true head dims come as k_true, v_true: M, B, the
// initial state and the starts have their true extents, keys and columns past them are zeros in the
// slice and never written, ceil(v_true / SC) slices; a padded key adds fmaf(0, 0, acc) = acc to each
// chain, so the chains are the true ones: kdacupy/numerics/scan_model.py pads the same way).
#include "common.cuh"

#ifndef KDA_ANY_DIMS
#define KDA_ANY_DIMS 0
#endif

namespace {
using namespace kda;

constexpr int K = KDA_K;
constexpr int V = KDA_V;
constexpr bool ANY = KDA_ANY_DIMS;
constexpr int SC = SCAN_SC;
constexpr int TI = SCAN_TI;
constexpr int CPT = SCAN_CPT;         // columns per thread
constexpr int CG = SC / CPT;          // column groups
constexpr int RG = SCAN_RG;           // row groups: thread t owns columns (t % CG) CPT + q, rows t / CG + RG r
constexpr int NT = CG * RG;
constexpr int ROWS = K / RG;
// a staged row of M, padded to 16-byte rows (the copies) that put a warp's 8 consecutive rows in 8 banks
// (TI = 16: 20 words apart, TI = 8: 12)
constexpr int MS = TI + 4;
static_assert(TI % 4 == 0 && (TI == 16 || TI == 8), "16-byte copies; MS's banks");
constexpr int NBLK = K / TI;          // staged blocks of M per step
static_assert(V % SC == 0 && SC % CPT == 0 && K % RG == 0 && K % TI == 0 && NT <= 1024, "scan tiling");
static_assert((SC & (SC - 1)) == 0 && SC <= 32 && NT % 32 == 0 && 32 % CG == 0, "the slice's swizzle");
static_assert(SC == 16 && CPT == 4 && TI >= 8, "the FMA loop's 16-byte loads: a thread's columns one aligned group");

// (dk, dv: the true extents, the tiles without ANY)
__device__ __forceinline__ i64 state_at(int layout_vk, i64 nh, int k, int v, int dk, int dv) {
  return layout_vk ? (nh * dv + v) * dk + k : (nh * dk + k) * dv + v;
}

// Word of (key k, column v) in the [K][SC] slice: each pair of rows XOR-permutes
// its columns, so a row (the FMA loop's and the column owners' accesses), two
// adjacent rows (a warp of owners) and 32 consecutive keys of one column (the
// "vk" walk) all meet 32 distinct banks.
__device__ __forceinline__ int slice_at(int k, int v) { return k * SC + (v ^ ((k >> 1) & (SC - 1))); }

// Key and column of element e of the slice in the order the layout keeps it in memory.
__device__ __forceinline__ int elem_key(int layout_vk, int e) { return layout_vk ? e % K : e / SC; }
__device__ __forceinline__ int elem_col(int layout_vk, int e) { return layout_vk ? e / K : e % SC; }
}  // namespace

// up to 128 registers a thread (4 CTAs an SM): with a bare bound ptxas settled at 40 and spilled (sm_80, K = 64)
extern "C" __global__ void __launch_bounds__(NT, 4) kda_seqpar_scan(
    const float* M, const float* B, const void* s0, int s0_dtype, int layout_vk, float* starts, int HV,
    int nseg, int k_true, int v_true, int m_ld, int b_ld, int m_from) {
  const int kdim = ANY ? k_true : K, vdim = ANY ? v_true : V;  // the true head dims (constants without ANY)
  const int VB = ANY ? (vdim + SC - 1) / SC : V / SC;
  const int n = blockIdx.x / VB, c0 = (blockIdx.x % VB) * SC, hv = blockIdx.y;
  const int tid = threadIdx.x, j0 = (tid % CG) * CPT, rg = tid / CG;
  float* S = reinterpret_cast<float*>(dynamic_smem());  // [K][SC]
  float* Mt = S + K * SC;                               // [2][K][MS]: column blocks of M_s, two in turn

  // Block b of the chain (step m_from + b / NBLK, keys from (b % NBLK) TI) into buffer b % 2 by cp.async, one group
  // a block (empty past the last step): with the tiles' head dims, the next block is in flight while this
  // one is read. The padded variants (ANY) stage each block with plain loads, zeros past kdim, in turn.
  const auto stage = [&](int b) {
    if constexpr (!ANY) {
      const int s = m_from + b / NBLK, i0 = (b % NBLK) * TI;
      if (s < nseg - 1) {
        const float* Ms = M + ((static_cast<i64>(n) * nseg + s) * HV + hv) * K * m_ld + i0;
        float* dst = Mt + (b % 2) * K * MS;
        for (int e = tid; e < K * TI / 4; e += NT) {
          const int k = e / (TI / 4), i = 4 * (e % (TI / 4));
          cp_async_16(dst + k * MS + i, Ms + static_cast<i64>(k) * m_ld + i);
        }
      }
      cp_async_commit();
    }
  };
  stage(0);

  const i64 nh0 = static_cast<i64>(n) * HV + hv;  // the sequence's initial state
  if (s0_dtype != KDA_STATE_NONE) {
#pragma unroll 2
    for (int e = tid; e < K * SC; e += NT) {
      const int k = elem_key(layout_vk, e), v = elem_col(layout_vk, e);
      const i64 idx = state_at(layout_vk, nh0, k, c0 + v, kdim, vdim);
      S[slice_at(k, v)] = ANY && (k >= kdim || c0 + v >= vdim) ? 0.f
                          : s0_dtype == KDA_STATE_BF16 ? load_f32<KDA_BF16>(s0, idx) : load_f32<KDA_F32>(s0, idx);
    }
    __syncthreads();
  }
  float acc[ROWS][CPT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int q = 0; q < CPT; ++q) acc[r][q] = s0_dtype == KDA_STATE_NONE ? 0.f : S[slice_at(rg + RG * r, j0 + q)];
  }
#pragma unroll 1
  for (int s = 0;; ++s) {
    const i64 nh = (static_cast<i64>(n) * nseg + s) * HV + hv;  // segment s of sequence n
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int q = 0; q < CPT; ++q) S[slice_at(rg + RG * r, j0 + q)] = acc[r][q];  // each thread its own words
    }
    __syncthreads();
#pragma unroll 2
    for (int e = tid; e < K * SC; e += NT) {
      const int k = elem_key(layout_vk, e), v = elem_col(layout_vk, e);
      if (!ANY || (k < kdim && c0 + v < vdim)) starts[state_at(layout_vk, nh, k, c0 + v, kdim, vdim)] = S[slice_at(k, v)];
    }
    if (s == nseg - 1) break;
    const float* Bs = B + nh * kdim * b_ld;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int k = rg + RG * r;
#pragma unroll
      for (int q = 0; q < CPT; ++q) {
        const int j = j0 + q;
        acc[r][q] = !ANY || (k < kdim && c0 + j < vdim) ? Bs[static_cast<i64>(k) * b_ld + c0 + j] : 0.f;
      }
    }
#pragma unroll 1
    for (int i0 = 0; i0 < (s < m_from ? 0 : K); i0 += TI) {  // steps before m_from: S[s + 1] = B_s
      const int blk = (s - m_from) * NBLK + i0 / TI;
      const float* Mb = ANY ? Mt : Mt + (blk % 2) * K * MS;  // the padded variants: one buffer
      __syncthreads();  // S written / the block before this one read (its buffer is the next one's)
      if constexpr (ANY) {
        const float* Ms = M + nh * kdim * m_ld;
        for (int e = tid; e < K * TI; e += NT) {
          const int k = e / TI, i = i0 + e % TI;
          Mt[k * MS + e % TI] = k < kdim && i < kdim ? Ms[static_cast<i64>(k) * m_ld + i] : 0.f;
        }
      } else {
        stage(blk + 1);
        cp_async_wait<1>();  // this thread's copies of this block have landed
      }
      __syncthreads();  // everyone's
      if constexpr (ROWS <= 4) {
        // 16-byte loads: a row's four M words (keys ii .. ii + 3) and a key's four slice columns, which the
        // swizzle keeps in one aligned group (slice_at: column j0 + q of key k = i0 + ii at word
        // (j0 ^ (x & 12)) + (q ^ (x & 3)), x = (k >> 1) & 15 = (i0 >> 1) | (ii >> 1), two disjoint bit sets: i0
        // is a multiple of TI >= 8, ii < TI); the block unrolled whole, so each key's group is one of two row
        // pointers (i0's bits in both, ii's bit 4 choosing) and its permutation (ii's x & 3) the registers'
        // naming. K = 256 (eight rows a thread) keeps word loads: its registers spilled with these on sm_80.
        const int col = j0 ^ ((i0 >> 1) & 12);
        const float* rows[2] = {S + i0 * SC + col, S + i0 * SC + (col ^ 4)};
#pragma unroll
        for (int i4 = 0; i4 < TI; i4 += 4) {
          float4 m4[ROWS];
#pragma unroll
          for (int r = 0; r < ROWS; ++r) m4[r] = *reinterpret_cast<const float4*>(Mb + (rg + RG * r) * MS + i4);
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const int ii = i4 + w, x = ii >> 1;  // the key's swizzle bits from ii
            const float4 g4 = *reinterpret_cast<const float4*>(rows[(x >> 2) & 1] + ii * SC);
            const float gv[4] = {g4.x, g4.y, g4.z, g4.w};
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              const float m = w == 0 ? m4[r].x : w == 1 ? m4[r].y : w == 2 ? m4[r].z : m4[r].w;
#pragma unroll
              for (int q = 0; q < CPT; ++q) acc[r][q] = fmaf(m, gv[q ^ (x & 3)], acc[r][q]);
            }
          }
        }
      } else {
#pragma unroll 4
        for (int ii = 0; ii < TI; ++ii) {
          float sv[CPT];
#pragma unroll
          for (int q = 0; q < CPT; ++q) sv[q] = S[slice_at(i0 + ii, j0 + q)];
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const float m = Mb[(rg + RG * r) * MS + ii];
#pragma unroll
            for (int q = 0; q < CPT; ++q) acc[r][q] = fmaf(m, sv[q], acc[r][q]);
          }
        }
      }
    }
    __syncthreads();  // every thread has read S before it is overwritten
  }
}

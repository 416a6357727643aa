// kda_seqpar_scan: the start state of every segment of the sequence-parallel
// forward (docs/design.md section 7.2, kdacupy/seqpar.py), in fp32 throughout:
//   S[0] = the sequence's initial state (any state dtype and layout, or zero)
//   S[s + 1] = M_s S[s] + B_s      (M_s: [K, K], B_s: [K, V], kv orientation)
// One CTA per (sequence, value head, slice of SC value columns): the columns of
// the state evolve independently, so the slice stays in shared memory for the
// whole chain and only M and B stream in. Each thread owns one column and K/RG
// rows; every product is a chain of fp32 FMAs in key order, B first: the key
// blocks of TI staged in ascending order into the same accumulators, no partial
// sums (the rounding points, bit for bit: kdacupy/numerics/scan_model.py).
// The starts are written in the call's state layout, ready for the forward; the
// initial state is read and the starts written through the slice in shared
// memory, the CTA's lanes walking the layout's contiguous dimension (in "vk" a
// column's K keys are adjacent in memory, so lanes owning columns would touch
// one sector each).
//
// Rendered configuration: KDA_K, KDA_V, SCAN_SC (columns per CTA), SCAN_TI
// (columns of M staged per pass); SCAN_THREADS = SCAN_SC * SCAN_RG threads; optional KDA_ANY_DIMS
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
constexpr int RG = SCAN_RG;           // row groups: thread t owns column t % SC, rows t / SC + RG r
constexpr int NT = SC * RG;
constexpr int ROWS = K / RG;
static_assert(V % SC == 0 && K % RG == 0 && K % TI == 0 && NT <= 1024, "scan tiling");
static_assert((SC & (SC - 1)) == 0 && SC <= 32 && NT % 32 == 0, "the slice's swizzle");

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

extern "C" __global__ void __launch_bounds__(NT) kda_seqpar_scan(
    const float* M, const float* B, const void* s0, int s0_dtype, int layout_vk, float* starts, int HV,
    int nseg, int k_true, int v_true) {
  const int kdim = ANY ? k_true : K, vdim = ANY ? v_true : V;  // the true head dims (constants without ANY)
  const int VB = ANY ? (vdim + SC - 1) / SC : V / SC;
  const int n = blockIdx.x / VB, c0 = (blockIdx.x % VB) * SC, hv = blockIdx.y;
  const int tid = threadIdx.x, j = tid % SC, rg = tid / SC;
  float* S = reinterpret_cast<float*>(dynamic_smem());  // [K][SC]
  float* Mt = S + K * SC;                               // [K][TI]: a column block of M_s

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
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = s0_dtype == KDA_STATE_NONE ? 0.f : S[slice_at(rg + RG * r, j)];
#pragma unroll 1
  for (int s = 0;; ++s) {
    const i64 nh = (static_cast<i64>(n) * nseg + s) * HV + hv;  // segment s of sequence n
#pragma unroll
    for (int r = 0; r < ROWS; ++r) S[slice_at(rg + RG * r, j)] = acc[r];  // each thread its own words
    __syncthreads();
#pragma unroll 2
    for (int e = tid; e < K * SC; e += NT) {
      const int k = elem_key(layout_vk, e), v = elem_col(layout_vk, e);
      if (!ANY || (k < kdim && c0 + v < vdim)) starts[state_at(layout_vk, nh, k, c0 + v, kdim, vdim)] = S[slice_at(k, v)];
    }
    if (s == nseg - 1) break;
    const float* Ms = M + nh * kdim * kdim;
    const float* Bs = B + nh * kdim * vdim;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int k = rg + RG * r;
      acc[r] = !ANY || (k < kdim && c0 + j < vdim) ? Bs[static_cast<i64>(k) * vdim + c0 + j] : 0.f;
    }
#pragma unroll 1
    for (int i0 = 0; i0 < K; i0 += TI) {
      __syncthreads();  // S written / the previous block of M read
      for (int e = tid; e < K * TI; e += NT) {
        const int k = e / TI, i = i0 + e % TI;
        Mt[e] = !ANY || (k < kdim && i < kdim) ? Ms[static_cast<i64>(k) * kdim + i] : 0.f;
      }
      __syncthreads();
#pragma unroll 4
      for (int ii = 0; ii < TI; ++ii) {
        const float sv = S[slice_at(i0 + ii, j)];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r] = fmaf(Mt[(rg + RG * r) * TI + ii], sv, acc[r]);
      }
    }
    __syncthreads();  // every thread has read S before it is overwritten
  }
}

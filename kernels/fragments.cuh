// mma.m16n8k16 fragment helpers shared by the kernels: two n8 accumulator tiles (a 16 x 16 block,
// acc[nt] = columns 8 nt .. 8 nt + 7) against B fragments of four registers (ldmatrix_x4: n-tile 0
// in b[0..1], n-tile 1 in b[2..3]).
#pragma once
#include "types.cuh"
#include "ptx.cuh"

namespace kda {

// acc[nt] += a B[nt] for both n-tiles.
__device__ __forceinline__ void mma2(float (&acc)[2][4], const u32 (&a)[4], const u32 (&b)[4]) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const u32 bb[2] = {b[2 * nt], b[2 * nt + 1]};
    mma_bf16_m16n8k16(acc[nt], a, bb, acc[nt]);
  }
}
// The same into two separate n8 accumulators.
__device__ __forceinline__ void mma2(float (&acc)[4], float (&acc1)[4], const u32 (&a)[4], const u32 (&b)[4]) {
  const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_bf16_m16n8k16(acc, a, b0, acc);
  mma_bf16_m16n8k16(acc1, a, b1, acc1);
}

// Two n8 accumulator tiles (columns 0-7: lo, 8-15: hi) packed to bf16 as an A fragment (k = column).
__device__ __forceinline__ void to_a_frag(u32 (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}
__device__ __forceinline__ void to_a_frag(u32 (&a)[4], const float (&x)[2][4]) { to_a_frag(a, x[0], x[1]); }

// acc += a (16 rows x 16 tokens) times a 16x16 bf16 token block; ``row`` is this lane's ldmatrix
// row. TRANS = false: B[k = j][n = i] = tile[i][j] (ldmatrix); true: B[k = i][n = j] = tile[i][j]
// (ldmatrix .trans).
template <bool TRANS> __device__ __forceinline__ void mma_token_block(float (&acc)[2][4], const u32 (&a)[4], const u16* row) {
  u32 b[4];
  if constexpr (TRANS) {
    ldmatrix_x4_trans(b, row);
  } else {
    ldmatrix_x4(b, row);
  }
  mma2(acc, a, b);
}

}  // namespace kda

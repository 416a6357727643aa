// The row phases of the per-chunk kernels (kda_prepare, kda_bwd_chunk; docs/design.md section 11.3):
// 8 threads per token row; thread s of a row owns the row's 16-byte pieces of q and k round robin
// (pieces s, s + 8, ..., PPS of them, E channels each), so every warp request covers whole sectors;
// kda_prepare's core-layout build owns whole channel ranges instead (row_sum_sq_owned).
#pragma once
#include "common.cuh"

namespace kda {

// sum(x^2) of a row whose thread s itself holds the channels [s * SEG, (s + 1) * SEG) in order (PPS = 1,
// and kda_prepare's owned layout): one FMA chain, then the 8 threads of the row by xor shuffles 4, 2, 1.
template <int SEG> __device__ __forceinline__ float row_sum_sq_owned(const float (&x)[SEG]) {
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < SEG; ++i) sq = fmaf(x[i], x[i], sq);
#pragma unroll
  for (int m = 4; m >= 1; m >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, m);
  return sq;
}

// ... of two rows' q and k side by side: each lane of the pair (sm_100: FFMA2, FADD2) row_sum_sq_owned's bits.
template <int SEG>
__device__ __forceinline__ float2 row_sum_sq_owned_pair(const float (&q)[SEG], const float (&k)[SEG]) {
  float2 sq = make_float2(0.f, 0.f);
#pragma unroll
  for (int i = 0; i < SEG; ++i) sq = fma2_ftz(make_float2(q[i], k[i]), make_float2(q[i], k[i]), sq);
#pragma unroll
  for (int m = 4; m >= 1; m >>= 1)
    sq = add2_ftz(sq, make_float2(__shfl_xor_sync(0xffffffffu, sq.x, m), __shfl_xor_sync(0xffffffffu, sq.y, m)));
  return sq;
}

// sum(x^2) of a row, bit for bit as when thread s of the row held channels [s * SEG, (s + 1) * SEG)
// (SEG = PPS * E) and summed them with one fp32 FMA chain, then over the 8 threads with xor shuffles
// 4, 2, 1: the chain of old thread s runs through the pieces s * PPS .. s * PPS + PPS - 1, which now
// sit in lanes (s * PPS + u) % 8, slot (s * PPS) / 8, handed on lane to lane; the 8 chains are then
// added in the butterfly's order, ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)). The row's 8
// threads are 8 consecutive lanes starting at a multiple of 8.
template <int E, int PPS> __device__ __forceinline__ float row_sum_sq(const float (&x)[PPS * E], int s) {
  static_assert(PPS >= 1 && (PPS & (PPS - 1)) == 0 && PPS <= 8, "pieces per thread");
  if constexpr (PPS == 1) {
    return row_sum_sq_owned<E>(x);  // its own channels already
  } else {
    float chain[PPS];  // per slot: the chain that ends in this lane
#pragma unroll
    for (int v = 0; v < PPS; ++v) {
      float acc = 0.f;
#pragma unroll
      for (int h = 0; h < PPS; ++h) {  // hop h: lanes s with s % PPS == h extend the chain of lane s - 1
        const float from = __shfl_up_sync(0xffffffffu, acc, 1, 8);
        float mine = (s % PPS == 0) ? 0.f : from;
#pragma unroll
        for (int e = 0; e < E; ++e) mine = fmaf(x[v * E + e], x[v * E + e], mine);
        acc = (s % PPS == h) ? mine : acc;
      }
      chain[v] = acc;
    }
    float p[8];  // p[s]: old thread s's chain, which ends in lane (s * PPS + PPS - 1) % 8, slot s * PPS / 8
#pragma unroll
    for (int o = 0; o < 8; ++o) p[o] = __shfl_sync(0xffffffffu, chain[o * PPS / 8], (o * PPS + PPS - 1) % 8, 8);
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
  }
}

// [1] thread s's pieces of a q row and a k row (elements q_row, k_row of q and k, type DT) as fp32,
// pieces s + 8 v to x[v * E ..]; a padded row (not live) is zero.
template <int DT, int E, int PPS>
__device__ __forceinline__ void load_qk_rows(float (&qv)[PPS * E], float (&kv)[PPS * E], const void* q, i64 q_row,
                                             const void* k, i64 k_row, int s, bool live) {
#pragma unroll
  for (int v = 0; v < PPS; ++v) {
    float pq[E], pk[E];
    const i64 c = (s + 8 * v) * E;
    if (live) {
      load_row<DT>(static_cast<const unsigned char*>(q) + (q_row + c) * elem_bytes<DT>(), pq);
      load_row<DT>(static_cast<const unsigned char*>(k) + (k_row + c) * elem_bytes<DT>(), pk);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) pq[e] = pk[e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      qv[v * E + e] = pq[e];
      kv[v * E + e] = pk[e];
    }
  }
}

// load_qk_rows for rows of ``kdim`` channels of a padded key tile (the any-size variants, KDA_ANY_DIMS):
// a piece wholly inside the row and on 16 bytes as one vector, else element by element, channels at or
// past kdim zero.
template <int DT, int E, int PPS>
__device__ __forceinline__ void load_qk_rows_dims(float (&qv)[PPS * E], float (&kv)[PPS * E], const void* q,
                                                  i64 q_row, const void* k, i64 k_row, int s, bool live, int kdim) {
#pragma unroll
  for (int v = 0; v < PPS; ++v) {
    const int c = (s + 8 * v) * E;
    const unsigned char* pq = static_cast<const unsigned char*>(q) + (q_row + c) * elem_bytes<DT>();
    const unsigned char* pk = static_cast<const unsigned char*>(k) + (k_row + c) * elem_bytes<DT>();
    float xq[E], xk[E];
    if (live && c + E <= kdim && ((reinterpret_cast<u64>(pq) | reinterpret_cast<u64>(pk)) & 15) == 0) {
      load_row<DT>(pq, xq);
      load_row<DT>(pk, xk);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const bool in = live && c + e < kdim;
        xq[e] = in ? load_f32<DT>(pq, e) : 0.f;
        xk[e] = in ? load_f32<DT>(pk, e) : 0.f;
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      qv[v * E + e] = xq[e];
      kv[v * E + e] = xk[e];
    }
  }
}

// [1] l2norm of the q and k rows in place; iq, ik: the inverse norms. OWNED: thread s holds channels
// [s * SEG, (s + 1) * SEG) (row_sum_sq_owned), else pieces s + 8 v (row_sum_sq).
template <int E, int PPS, bool OWNED = false>
__device__ __forceinline__ void l2norm_qk_rows(float (&qv)[PPS * E], float (&kv)[PPS * E], int s, float& iq, float& ik) {
  if constexpr (OWNED) {
    const float2 sq = row_sum_sq_owned_pair<PPS * E>(qv, kv);
    iq = rsqrt_approx_ftz(sq.x + 1e-6f);
    ik = rsqrt_approx_ftz(sq.y + 1e-6f);
  } else {
    iq = rsqrt_approx_ftz(row_sum_sq<E, PPS>(qv, s) + 1e-6f);
    ik = rsqrt_approx_ftz(row_sum_sq<E, PPS>(kv, s) + 1e-6f);
  }
  // channel pairs of a row (not the q / k pairs of the sums): [5]'s pair instructions take these registers
  // as they are, where (q_i, k_i) pairs cost sm_100a a register move per element each use
#pragma unroll
  for (int i = 0; i < PPS * E; i += 2) {
    const float2 x = mul2_ftz(make_float2(qv[i], qv[i + 1]), make_float2(iq, iq));
    const float2 y = mul2_ftz(make_float2(kv[i], kv[i + 1]), make_float2(ik, ik));
    qv[i] = x.x, qv[i + 1] = x.y, kv[i] = y.x, kv[i + 1] = y.y;
  }
}

// E consecutive 16-bit results (E / 2 packed words) at dst: 16 bytes (E = 8) or 8 (E = 4).
template <int E> __device__ __forceinline__ void store_piece(void* dst, const u32 (&w)[E / 2]) {
  static_assert(E == 8 || E == 4, "16-bit pieces of 16 or 8 bytes");
  if constexpr (E == 8) {
    Vec16 x;
#pragma unroll
    for (int i = 0; i < 4; ++i) x.w[i] = w[i];
    *reinterpret_cast<Vec16*>(dst) = x;
  } else {
    Vec8 x;
    x.w[0] = w[0];
    x.w[1] = w[1];
    *reinterpret_cast<Vec8*>(dst) = x;
  }
}

}  // namespace kda

// A sequence's state [V, K] (or its gradient) in global memory, as the per-sequence kernels
// (kda_recurrence, kda_bwd_chain) read and write it: either layout (layout_vk: [.., V, K], else
// [.., K, V]), stored as a KDA_STATE_* precision chosen at run time. A warp holds 16 value rows
// from vw in the mma accumulator layout: n-tile j, element e is (row vw + g + 8 (e >> 1),
// column 8 j + 2 t + (e & 1)), g = lane / 4, t = lane % 4.
#pragma once
#include "common.cuh"

namespace kda {

// Element (value row v, key column kd) of state nh (sequence or pool slot, times HV, plus head).
template <int V, int K> __device__ __forceinline__ i64 state_index(int layout_vk, i64 nh, int v, int kd) {
  return layout_vk ? (nh * V + v) * K + kd : (nh * K + kd) * V + v;
}
// Element e of n-tile j of the warp's accumulator-layout slice from value row vw.
template <int V, int K>
__device__ __forceinline__ i64 state_frag_index(int layout_vk, i64 nh, int vw, int j, int e, int g, int t) {
  return state_index<V, K>(layout_vk, nh, vw + g + 8 * (e >> 1), 8 * j + 2 * t + (e & 1));
}
// As fp32; KDA_STATE_NONE (no state given) reads zeros.
__device__ __forceinline__ float load_state(const void* s, int dtype, i64 idx) {
  return dtype == KDA_STATE_NONE ? 0.f : dtype == KDA_STATE_BF16 ? load_f32<KDA_BF16>(s, idx) : load_f32<KDA_F32>(s, idx);
}
__device__ __forceinline__ void store_state(void* s, int dtype, i64 idx, float x) {
  if (dtype == KDA_STATE_BF16) store_f32<KDA_BF16>(s, idx, x); else store_f32<KDA_F32>(s, idx, x);
}
// An empty sequence: the warp's 16 value rows go from src to dst, converted only; lanes walk
// the layout's contiguous dimension (keys in "vk", the 16 value rows in "kv").
template <int V, int K>
__device__ __forceinline__ void copy_state_rows(void* dst, int dst_dtype, const void* src, int src_dtype, int layout_vk,
                                                i64 nh, int vw, int lane) {
  for (int e = lane; e < 16 * K; e += 32) {
    const int v = layout_vk ? e / K : e % 16, kd = layout_vk ? e % K : e / 16;
    const i64 idx = state_index<V, K>(layout_vk, nh, vw + v, kd);
    store_state(dst, dst_dtype, idx, load_state(src, src_dtype, idx));
  }
}

// Key columns 16 s .. 16 s + 15 of the warp's slice (n-tiles 2 s and 2 s + 1: x[jj][e] is
// element e of n-tile 2 s + jj) from and to global memory in whole 32-byte sectors, where one
// element per lane would use a quarter of each (docs/design.md section 5):
//   "vk" fp32: each lane's two adjacent keys as one 8-byte access, a quad a sector per row;
//   "vk" bf16: load_row16 / store_row16, a quad the row's 16 keys;
//   "kv" fp32: one element per lane already fills a sector per key (8 adjacent value rows);
//   "kv" bf16: lanes g and g ^ 1 trade halves, so each holds two adjacent value rows of a key
//     (g even: rows g, g + 1; g odd: rows g + 7, g + 8) and a key's 16 rows are one sector.
// Selects by arithmetic, as in store_row16. Every lane of the warp takes part.
namespace state_io_detail {
__device__ __forceinline__ u32 pick(u32 a, u32 b, u32 second) { return a + (b - a) * second; }
// "kv" bf16: (value row of this lane's pair, words (key c0: row, row + 1), (key c0 + 1: ..)) <->
// (rows g, g + 8 of keys c0, c0 + 1, packed per row), through lane g ^ 1.
__device__ __forceinline__ void kv_pairs_to_rows(u32 w0, u32 w1, u32& top, u32& bot, u32 odd) {
  const u32 first = (w0 & 0xffffu) | (w1 << 16), second = (w0 >> 16) | (w1 & 0xffff0000u);
  const u32 own = pick(first, second, odd);
  const u32 other = __shfl_xor_sync(0xffffffffu, pick(second, first, odd), 4);
  top = pick(own, other, odd);
  bot = pick(other, own, odd);
}
__device__ __forceinline__ void kv_rows_to_pairs(u32 top, u32 bot, u32& w0, u32& w1, u32 odd) {
  const u32 own = pick(top, bot, odd);
  const u32 other = __shfl_xor_sync(0xffffffffu, pick(bot, top, odd), 4);
  const u32 first = pick(own, other, odd), second = pick(other, own, odd);
  w0 = (first & 0xffffu) | (second << 16);
  w1 = (first >> 16) | (second & 0xffff0000u);
}
}  // namespace state_io_detail

// As fp32, exactly what load_state gives per element (KDA_STATE_NONE: zeros).
template <int V, int K>
__device__ __forceinline__ void load_state_cols16(float (&x)[2][4], const void* src, int dtype, int layout_vk, i64 nh,
                                                  int vw, int s, int g, int t) {
  using namespace state_io_detail;
  if (dtype == KDA_STATE_NONE) {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[jj][e] = 0.f;
    }
  } else if (layout_vk && dtype == KDA_STATE_BF16) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      u32 lo, hi;
      load_row16(static_cast<const u16*>(src) + state_index<V, K>(1, nh, vw + g + 8 * h, 16 * s), lo, hi, t);
      x[0][2 * h] = bf16_lo(lo), x[0][2 * h + 1] = bf16_hi(lo);
      x[1][2 * h] = bf16_lo(hi), x[1][2 * h + 1] = bf16_hi(hi);
    }
  } else if (layout_vk) {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const Vec8 w = *reinterpret_cast<const Vec8*>(static_cast<const float*>(src) +
                                                      state_index<V, K>(1, nh, vw + g + 8 * h, 16 * s + 8 * jj + 2 * t));
        x[jj][2 * h] = __uint_as_float(w.w[0]), x[jj][2 * h + 1] = __uint_as_float(w.w[1]);
      }
    }
  } else if (dtype == KDA_STATE_BF16) {
    const u32 odd = g & 1;
    const int v = vw + g + 7 * odd;
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int c0 = 16 * s + 8 * jj + 2 * t;
      const u16* p = static_cast<const u16*>(src);
      const u32 w0 = *reinterpret_cast<const u32*>(p + state_index<V, K>(0, nh, v, c0));
      const u32 w1 = *reinterpret_cast<const u32*>(p + state_index<V, K>(0, nh, v, c0 + 1));
      u32 top, bot;
      kv_pairs_to_rows(w0, w1, top, bot, odd);
      x[jj][0] = bf16_lo(top), x[jj][1] = bf16_hi(top), x[jj][2] = bf16_lo(bot), x[jj][3] = bf16_hi(bot);
    }
  } else {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[jj][e] = load_f32<KDA_F32>(src, state_frag_index<V, K>(0, nh, vw, 2 * s + jj, e, g, t));
    }
  }
}

// As store_state per element: bf16 rounds to nearest even, fp32 is stored as is.
template <int V, int K>
__device__ __forceinline__ void store_state_cols16(void* dst, int dtype, int layout_vk, i64 nh, int vw, int s, int g,
                                                   int t, const float (&x)[2][4]) {
  using namespace state_io_detail;
  if (layout_vk && dtype == KDA_STATE_BF16) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      store_row16(static_cast<u16*>(dst) + state_index<V, K>(1, nh, vw + g + 8 * h, 16 * s),
                  pack_bf16x2(x[0][2 * h], x[0][2 * h + 1]), pack_bf16x2(x[1][2 * h], x[1][2 * h + 1]), t);
    }
  } else if (layout_vk) {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        Vec8 w;
        w.w[0] = __float_as_uint(x[jj][2 * h]), w.w[1] = __float_as_uint(x[jj][2 * h + 1]);
        *reinterpret_cast<Vec8*>(static_cast<float*>(dst) + state_index<V, K>(1, nh, vw + g + 8 * h, 16 * s + 8 * jj + 2 * t)) = w;
      }
    }
  } else if (dtype == KDA_STATE_BF16) {
    const u32 odd = g & 1;
    const int v = vw + g + 7 * odd;
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int c0 = 16 * s + 8 * jj + 2 * t;
      u32 w0, w1;
      kv_rows_to_pairs(pack_bf16x2(x[jj][0], x[jj][1]), pack_bf16x2(x[jj][2], x[jj][3]), w0, w1, odd);
      u16* p = static_cast<u16*>(dst);
      *reinterpret_cast<u32*>(p + state_index<V, K>(0, nh, v, c0)) = w0;
      *reinterpret_cast<u32*>(p + state_index<V, K>(0, nh, v, c0 + 1)) = w1;
    }
  } else {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) store_f32<KDA_F32>(dst, state_frag_index<V, K>(0, nh, vw, 2 * s + jj, e, g, t), x[jj][e]);
    }
  }
}

// Any head size (kda_recurrence's KDA_ANY_DIMS): the state has its true extents dk <= K keys and
// dv value rows, the warp's slice is the padded tile's. Element by element; a padded key or value
// row reads zero and is never stored (zero keys leave the padded rows and columns zero, so nothing
// there is ever lost; docs/design.md section 2).
__device__ __forceinline__ i64 state_index_dims(int layout_vk, i64 nh, int v, int kd, int dk, int dv) {
  return layout_vk ? (nh * dv + v) * dk + kd : (nh * dk + kd) * dv + v;
}
__device__ __forceinline__ void load_state_cols16_dims(float (&x)[2][4], const void* src, int dtype, int layout_vk,
                                                       i64 nh, int vw, int s, int g, int t, int dk, int dv) {
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = vw + g + 8 * (e >> 1), kd = 16 * s + 8 * jj + 2 * t + (e & 1);
      x[jj][e] = v < dv && kd < dk ? load_state(src, dtype, state_index_dims(layout_vk, nh, v, kd, dk, dv)) : 0.f;
    }
  }
}
__device__ __forceinline__ void store_state_cols16_dims(void* dst, int dtype, int layout_vk, i64 nh, int vw, int s,
                                                        int g, int t, const float (&x)[2][4], int dk, int dv) {
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = vw + g + 8 * (e >> 1), kd = 16 * s + 8 * jj + 2 * t + (e & 1);
      if (v < dv && kd < dk) store_state(dst, dtype, state_index_dims(layout_vk, nh, v, kd, dk, dv), x[jj][e]);
    }
  }
}
// copy_state_rows at the true extents: the warp's value rows from vw that exist, every key.
__device__ __forceinline__ void copy_state_rows_dims(void* dst, int dst_dtype, const void* src, int src_dtype,
                                                     int layout_vk, i64 nh, int vw, int lane, int dk, int dv) {
  const int rows = dv - vw < 16 ? dv - vw : 16;
  for (int e = lane; e < rows * dk; e += 32) {
    const int v = layout_vk ? e / dk : e % rows, kd = layout_vk ? e % dk : e / rows;
    const i64 idx = state_index_dims(layout_vk, nh, vw + v, kd, dk, dv);
    store_state(dst, dst_dtype, idx, load_state(src, src_dtype, idx));
  }
}

}  // namespace kda

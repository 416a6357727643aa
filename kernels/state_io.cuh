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
// An empty sequence: the warp's 16 value rows go from src to dst, converted only.
template <int V, int K>
__device__ __forceinline__ void copy_state_rows(void* dst, int dst_dtype, const void* src, int src_dtype, int layout_vk,
                                                i64 nh, int vw, int lane) {
  for (int e = lane; e < 16 * K; e += 32) {
    const i64 idx = state_index<V, K>(layout_vk, nh, vw + e / K, e % K);
    store_state(dst, dst_dtype, idx, load_state(src, src_dtype, idx));
  }
}

}  // namespace kda

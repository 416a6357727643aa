// Gate and beta activations of one element, in fp32 with the SFU approximations
// (kdacupy/numerics/precision.py steps [2]-[3]: gate_f32, beta_f32). Shared by the prepare
// and decode kernels, and recomputed by kda_bwd_chunk.
#pragma once
#include "common.cuh"

namespace kda {

constexpr float LOG2E_F = 1.4426950408889634f;

// Base-2 log decay of one element; GATE is a KDA_GATE_* name.
// x_in is the gate input g; a = exp(A_log) (as ex2(A_log * log2e)), bias = dt_bias,
// lb2 = lower_bound * log2e.
template <int GATE>
__device__ __forceinline__ float gate_log2(float x_in, float a, float bias, float lb2) {
  if constexpr (GATE == KDA_GATE_LOG) {
    return x_in * LOG2E_F;
  } else {
    const float x = x_in + bias;
    if constexpr (GATE == KDA_GATE_SOFTPLUS) {
      const float z = x * LOG2E_F;
      const float sp = x > 15.0f ? z : lg2_approx_ftz(1.0f + ex2_approx_ftz(z));
      return -(a * sp);
    } else {
      const float y = a * x;
      return lb2 * rcp_approx_ftz(1.0f + ex2_approx_ftz(-y * LOG2E_F));
    }
  }
}

// gate_log2 of two elements of one row (their own biases), each lane gate_log2's bits: the fp32 steps as
// pair instructions (sm_100: FADD2, FMUL2), the SFU ones per element.
template <int GATE>
__device__ __forceinline__ float2 gate_log2_pair(float2 x_in, float a, float2 bias, float lb2) {
  if constexpr (GATE == KDA_GATE_LOG) {
    return mul2_ftz(x_in, make_float2(LOG2E_F, LOG2E_F));
  } else {
    const float2 x = add2_ftz(x_in, bias);
    if constexpr (GATE == KDA_GATE_SOFTPLUS) {
      const float2 z = mul2_ftz(x, make_float2(LOG2E_F, LOG2E_F));
      const float2 e1 = add2_ftz(make_float2(1.0f, 1.0f), make_float2(ex2_approx_ftz(z.x), ex2_approx_ftz(z.y)));
      const float2 sp = make_float2(x.x > 15.0f ? z.x : lg2_approx_ftz(e1.x), x.y > 15.0f ? z.y : lg2_approx_ftz(e1.y));
      return mul2_ftz(make_float2(-a, -a), sp);  // -(a sp): the negation exact
    } else {
      const float2 y = mul2_ftz(make_float2(a, a), x);
      const float2 z = mul2_ftz(y, make_float2(-LOG2E_F, -LOG2E_F));  // -y log2e: the negation exact
      const float2 d = add2_ftz(make_float2(1.0f, 1.0f), make_float2(ex2_approx_ftz(z.x), ex2_approx_ftz(z.y)));
      return mul2_ftz(make_float2(lb2, lb2), make_float2(rcp_approx_ftz(d.x), rcp_approx_ftz(d.y)));
    }
  }
}

// beta from its stored value; MODE is a KDA_BETA_* name (none: 1, sigmoid2: 2 * sigmoid).
template <int MODE>
__device__ __forceinline__ float beta_activate(float b) {
  if constexpr (MODE == KDA_BETA_NONE) {
    return 1.f;
  } else if constexpr (MODE == KDA_BETA_RAW) {
    return b;
  } else {
    const float s = rcp_approx_ftz(1.0f + ex2_approx_ftz(-b * LOG2E_F));
    return MODE == KDA_BETA_SIGMOID2 ? 2.f * s : s;
  }
}

// a = exp(A_log[hv]) of the softplus and sigmoid gates (1 for the log gate or without A_log).
template <int GATE> __device__ __forceinline__ float gate_a(const float* A_log, int hv) {
  return (GATE != KDA_GATE_LOG && A_log != nullptr) ? ex2_approx_ftz(A_log[hv] * LOG2E_F) : 1.f;
}
// Head hv's row of dt_bias [HV, kdim] (kdim: the true head dim where it is not the tile K), or
// nullptr (none, or the log gate, which has no bias).
template <int GATE, int K>
__device__ __forceinline__ const float* gate_bias_row(const float* dt_bias, int hv, int kdim = K) {
  return (GATE != KDA_GATE_LOG && dt_bias != nullptr) ? dt_bias + static_cast<i64>(hv) * kdim : nullptr;
}

// beta of the element beta[idx], stored as DT (not read when MODE is KDA_BETA_NONE).
template <int MODE, int DT> __device__ __forceinline__ float beta_at(const void* beta, i64 idx) {
  return beta_activate<MODE>(MODE == KDA_BETA_NONE ? 0.f : load_f32<DT>(beta, idx));
}

}  // namespace kda

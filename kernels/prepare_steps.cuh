// The per-chunk steps of the prepare (kda_prepare) that kda_bwd_chunk recomputes bit for bit:
// each kernel keeps its own shared-memory layout of the [16, K] and [16, 16] fp32 tiles, passed
// in as ``at(i, c)`` (the word of row i, column c). Step numbers of kdacupy/numerics/precision.py.
#pragma once
#include "common.cuh"

namespace kda {

// |gc - gr| above this: the pair form. Not 126: 2^(gc - gr) * scale * q must stay normal fp32 for
// every element that matters (26 binades of margin), or FTZ (-ftz=true) flushes terms whose product
// with 2^(gr - gc) is O(1); measured under KDACUPY_EMULATE_NUMERICS=hardware at T=8192, g=0, bias=+8.
constexpr float SAFE_EXPONENT = 100.0f;

// [4] running sum over the chunk's rows of g [16, K], per channel, sequential fp32, in place;
// [9] gexp[c] = ex2 of the sum; the factored form's reference gr[c], the centre of the channel's
// range of sums (so each factor 2^(gc - gr), 2^(gr - gc) spans half of it, and a chunk whose
// channels range up to 2 SAFE_EXPONENT stays on the tensor cores). Every thread of the block takes
// part: whether any channel's half range passed SAFE_EXPONENT (the pair form), after a barrier.
// MONO: every g of the chunk has one sign (the sigmoid gate's lb2 * s, s in [0, 1]), so the sums are
// monotone (fp32 rounding keeps their order) and their range is that of the first and last row's sums,
// found without the per-row max and min (kda_prepare's; kda_bwd_chunk's recompute keeps them: its K = 256
// builds spilled without). A NaN runs on to the last row, so the range is the first sum's where fmaxf /
// fminf over the rows (the model's) skip the NaN: the chunk's outputs are NaN either way (the recurrence's
// mma of Mqk and U multiplies the NaN rows of U by the zeros above Mqk's diagonal too).
template <int K, int NT, bool MONO = false, class At, class Put, class PutRef>
__device__ __forceinline__ bool gate_cumsum(float* g, At at, Put put_gexp, PutRef put_ref, int tid) {
  bool unsafe = false;
  for (int c = tid; c < K; c += NT) {
    float acc = 0.f, hi = 0.f, lo = 0.f;
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) {
      acc += g[at(i, c)];
      g[at(i, c)] = acc;
      if (i == 0) {
        hi = lo = acc;
      } else if constexpr (!MONO) {
        hi = fmaxf(hi, acc);
        lo = fminf(lo, acc);
      }
    }
    if constexpr (MONO) {  // the first and the last sum
      hi = fmaxf(hi, acc);
      lo = fminf(lo, acc);
    }
    const float gr = (hi + lo) * 0.5f;
    unsafe |= fmaxf(hi - gr, gr - lo) > SAFE_EXPONENT;
    put_gexp(c, ex2_approx_ftz(acc));
    put_ref(c, gr);
  }
  return __syncthreads_or(unsafe);
}

// [5] two fp32 values in two bf16 parts each, packed in pairs: hi their rounding, lo the rounding of
// what it left (an exact fp32 difference, flushed to zero when subnormal under -ftz=true): [6]'s
// split Mf, and kda_bwd_chunk's k_i low part ([B6]).
__device__ __forceinline__ void split_bf16x2(const float (&x)[2], u32& hi, u32& lo) {
  hi = pack_bf16x2(x[0], x[1]);
  lo = pack_bf16x2(x[0] - bf16_lo(hi), x[1] - bf16_hi(hi));
}
// ... of a pair: the difference one pair instruction (sm_100: FADD2; each lane the scalar's rounding).
__device__ __forceinline__ void split_bf16x2(float2 x, u32& hi, u32& lo) {
  hi = pack_bf16x2(x.x, x.y);
  const float2 rest = sub2_ftz(x, make_float2(bf16_lo(hi), bf16_hi(hi)));
  lo = pack_bf16x2(rest.x, rest.y);
}

// [8] column ``col`` of (I + Lb)^-1 by forward substitution in fp32 (Lb strictly lower, [16, 16]):
// X_i = e_i - sum_j<i Lb_ij X_j, FMAs in j order, each X_i to inv[i * ROW + col] as bf16. Unlike a power
// series of Lb it has no large intermediates, so repeated keys (Lb near an all-beta triangle) neither cancel
// nor overflow. Entries above the diagonal come out exactly 0. ``row(i, l)`` puts Lb_ij in l[j], j < i.
template <int ROW, class Row> __device__ __forceinline__ void inverse_column(Row row, u16* inv, int col) {
  float x[CHUNK];
#pragma unroll
  for (int i = 0; i < CHUNK; ++i) {
    float l[CHUNK];
    row(i, l);
    float acc = i == col ? 1.f : 0.f;
#pragma unroll
    for (int j = 0; j < i; ++j) acc = fmaf(-l[j], x[j], acc);
    x[i] = acc;
    inv[i * ROW + col] = f32_to_bf16(acc);
  }
}

}  // namespace kda

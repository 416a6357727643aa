// kda_prepare: the token-parallel half of the KDA forward (docs/design.md section 5).
// One CTA of 128 threads per (chunk slot, value head): l2norm, gate and beta
// activation, in-chunk cumulative decay, the decayed bf16 operands, the fp32
// forward-substitution inverse of (I + L) and the masked q.k block. Writes one
// workspace block (layout: kdacupy/ops/forward/layouts.py) that the recurrence streams.
// The rounding points are those of kdacupy/numerics/precision.py, step numbers in [].
//
// Rendered configuration: KDA_K, KDA_DT (q, k), KDA_G_DT, KDA_BETA_DT,
// KDA_GATE (KDA_GATE_LOG | _SOFTPLUS | _SIGMOID), KDA_BETA_MODE (KDA_BETA_NONE |
// _RAW | _SIGMOID | _SIGMOID2 = 2*sigmoid), KDA_L2NORM, WS_* and PSM_* layouts.
#include "common.cuh"
#include "gates.cuh"

namespace {
using namespace kda;

constexpr int K = KDA_K;
constexpr int NT = 128;
constexpr int SEG = K / 8;       // elements of one row per thread (8 threads per row)
constexpr int TS = K + 8;        // padded bf16 tile row (elements)
// |gc| above this: the pair form. Not 126: 2^gc * scale * q must stay normal fp32 for every
// element that matters (26 binades of margin), or FTZ (-ftz=true) flushes terms whose product
// with 2^-gc is O(1); measured under KDACUPY_EMULATE_NUMERICS=hardware at T=8192, g=0, bias=+8.
constexpr float SAFE_EXPONENT = 100.0f;

// 16x16 fp32 = A(16xK bf16 tile) B^T (B: 16xK bf16 tile), one warp, to dst [6].
__device__ __forceinline__ void bf16_abt(float* dst, const u16* a, const u16* b, int lane) {
  const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1), mcol = 8 * (lane >> 4);
  // B operand (k = channel, n = row j of b): row-major rows of b give k-pairs directly;
  // matrices (rows 0-7, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 0-7), (rows 8-15, k 8-15)
  const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1);
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int s = 0; s < K / 16; ++s) {
    u32 af[4], bf[4];
    ldmatrix_x4(af, a + mrow * TS + 16 * s + mcol);
    ldmatrix_x4(bf, b + brow * TS + 16 * s + bcol);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const u32 bb[2] = {bf[2 * nt], bf[2 * nt + 1]};
      mma_bf16_m16n8k16(acc[nt], af, bb, acc[nt]);
    }
  }
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int col = nt * 8 + 2 * t;
    dst[g * 16 + col] = acc[nt][0];
    dst[g * 16 + col + 1] = acc[nt][1];
    dst[(g + 8) * 16 + col] = acc[nt][2];
    dst[(g + 8) * 16 + col + 1] = acc[nt][3];
  }
}

}  // namespace

// Four CTAs per SM keep ~48 KB of loads in flight per SM (the kernel is
// bandwidth-bound) and let ptxas use 128 registers: no spills on any arch
// (a bare __launch_bounds__(128) made it settle for 64 and spill on sm_80/sm_100a).
extern "C" __global__ void __launch_bounds__(128, K <= 128 ? 4 : 2) kda_prepare(
    const void* q, const void* k, const void* g, const void* beta,
    i64 q_sb, i64 q_st, i64 q_sh, i64 k_sb, i64 k_st, i64 k_sh, i64 g_sb, i64 g_st, i64 g_sh,
    i64 b_sb, i64 b_st, i64 b_sh,
    const float* A_log, const float* dt_bias, const void* cu_seqlens, int cu_is_i64,
    int T, int H, int HV, int nseq, int nslots, int chunks_per_seq, float scale, float lb2,
    unsigned char* ws) {
  const int slot = blockIdx.x, hv = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // which sequence and chunk this slot is (varlen: the largest n with n + bos_n/16 <= slot)
  int n = 0;
  if (cu_seqlens == nullptr) {
    n = slot / chunks_per_seq;
  } else {
    int lo = 0, hi = nseq - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (mid + cu_at(cu_seqlens, cu_is_i64, mid, T) / CHUNK <= slot) lo = mid; else hi = mid - 1;
    }
    n = lo;
  }
  const Seq seq = sequence(cu_seqlens, cu_is_i64, n, T);
  const i64 c0 = (slot - first_slot(cu_seqlens, n, seq.bos, chunks_per_seq)) * CHUNK;
  if (c0 < 0 || c0 >= seq.len) return;  // an unused slot (varlen padding)
  const int rows = seq.len - c0 < CHUNK ? static_cast<int>(seq.len - c0) : CHUNK;
  const int b = cu_seqlens == nullptr ? n : 0;
  const i64 t0 = (cu_seqlens == nullptr ? 0 : seq.bos) + c0;  // token index within row b

  unsigned char* sm = dynamic_smem();
  float* sG = reinterpret_cast<float*>(sm + PSM_G);
  u16* sQd = reinterpret_cast<u16*>(sm + PSM_U);
  u16* sKd = sQd + CHUNK * TS;
  u16* sKi = sKd + CHUNK * TS;
  float* sQs = reinterpret_cast<float*>(sm + PSM_U);  // pair path: q * scale
  float* sKn = sQs + CHUNK * K;                       // pair path: k
  float* sL = reinterpret_cast<float*>(sm + PSM_L);
  float* sM = reinterpret_cast<float*>(sm + PSM_M);
  float* sBeta = reinterpret_cast<float*>(sm + PSM_BETA);

  unsigned char* blk = ws + (static_cast<i64>(hv) * nslots + slot) * WS_STRIDE;
  const int r = tid >> 3, col0 = (tid & 7) * SEG;  // this thread's row and first column
  const bool live = r < rows;
  const int h = hv / (HV / H);

  // [1] load and l2-normalise q and k; padded rows are zero
  float qv[SEG], kv[SEG], gv[SEG];
  if (live) {
    load_row<KDA_DT>(static_cast<const unsigned char*>(q) +
                         (b * q_sb + (t0 + r) * q_st + h * q_sh + col0) * elem_bytes<KDA_DT>(), qv);
    load_row<KDA_DT>(static_cast<const unsigned char*>(k) +
                         (b * k_sb + (t0 + r) * k_st + h * k_sh + col0) * elem_bytes<KDA_DT>(), kv);
    load_row<KDA_G_DT>(static_cast<const unsigned char*>(g) +
                           (b * g_sb + (t0 + r) * g_st + hv * g_sh + col0) * elem_bytes<KDA_G_DT>(), gv);
  } else {
#pragma unroll
    for (int i = 0; i < SEG; ++i) qv[i] = kv[i] = gv[i] = 0.f;
  }
  if constexpr (KDA_L2NORM) {
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int i = 0; i < SEG; ++i) {
      sq = fmaf(qv[i], qv[i], sq);
      sk = fmaf(kv[i], kv[i], sk);
    }
#pragma unroll
    for (int m = 4; m >= 1; m >>= 1) {  // the 8 threads of a row are adjacent lanes
      sq += __shfl_xor_sync(0xffffffffu, sq, m);
      sk += __shfl_xor_sync(0xffffffffu, sk, m);
    }
    const float iq = rsqrt_approx_ftz(sq + 1e-6f), ik = rsqrt_approx_ftz(sk + 1e-6f);
#pragma unroll
    for (int i = 0; i < SEG; ++i) {
      qv[i] *= iq;
      kv[i] *= ik;
    }
  }

  // [2] gate, zero on padded rows (activation first, so padding adds no decay)
  {
    float a = 1.f;
    if (KDA_GATE != KDA_GATE_LOG && A_log != nullptr) a = ex2_approx_ftz(A_log[hv] * LOG2E_F);
#pragma unroll
    for (int i = 0; i < SEG; ++i) {
      const float bias = (KDA_GATE != KDA_GATE_LOG && dt_bias != nullptr) ? dt_bias[static_cast<i64>(hv) * K + col0 + i] : 0.f;
      sG[r * K + col0 + i] = live ? gate_log2<KDA_GATE>(gv[i], a, bias, lb2) : 0.f;  // [2]
    }
  }
  // [3] beta
  if (tid < CHUNK) {
    float bt = 0.f;
    if (tid < rows) {
      bt = beta_activate<KDA_BETA_MODE>(
          KDA_BETA_MODE == KDA_BETA_NONE ? 0.f : load_f32<KDA_BETA_DT>(beta, b * b_sb + (t0 + tid) * b_st + hv * b_sh));
    }
    sBeta[tid] = bt;
    reinterpret_cast<float*>(blk + WS_BETA)[tid] = bt;
  }
  __syncthreads();

  // [4] running sum over the chunk rows, per channel, sequential fp32
  bool unsafe = false;
  for (int c = tid; c < K; c += NT) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) {
      acc += sG[i * K + c];
      sG[i * K + c] = acc;
      unsafe |= fabsf(acc) > SAFE_EXPONENT;
    }
  }
  unsafe = __syncthreads_or(unsafe);

  // [5] decayed operands, to the workspace (and shared memory for [6]); [9] gexp
  const i64 row_off = (static_cast<i64>(r) * K + col0) * 2;
#pragma unroll
  for (int v8 = 0; v8 < SEG / 8; ++v8) {  // 8 channels = one 16-byte bf16 vector at a time
    Vec16 vq, vk, vr, vi;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float qd[2], kd[2], kr[2], ki[2];
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int i = 8 * v8 + 2 * w + e2;
        const float gc = sG[r * K + col0 + i], gt = sG[(CHUNK - 1) * K + col0 + i];
        const float e = ex2_approx_ftz(gc);
        qd[e2] = qv[i] * (e * scale);
        kd[e2] = kv[i] * e;
        ki[e2] = kv[i] * ex2_approx_ftz(-gc);
        kr[e2] = kv[i] * ex2_approx_ftz(gt - gc);
        if (r == CHUNK - 1) reinterpret_cast<float*>(blk + WS_GEXP)[col0 + i] = ex2_approx_ftz(gt);
      }
      vq.w[w] = pack_bf16x2(qd[0], qd[1]);
      vk.w[w] = pack_bf16x2(kd[0], kd[1]);
      vr.w[w] = pack_bf16x2(kr[0], kr[1]);
      vi.w[w] = pack_bf16x2(ki[0], ki[1]);
    }
    reinterpret_cast<Vec16*>(blk + WS_QDEC + row_off)[v8] = vq;
    reinterpret_cast<Vec16*>(blk + WS_KDEC + row_off)[v8] = vk;
    reinterpret_cast<Vec16*>(blk + WS_KRES + row_off)[v8] = vr;
    if (!unsafe) {
      reinterpret_cast<Vec16*>(sQd + r * TS + col0)[v8] = vq;
      reinterpret_cast<Vec16*>(sKd + r * TS + col0)[v8] = vk;
      reinterpret_cast<Vec16*>(sKi + r * TS + col0)[v8] = vi;
    }
  }
  if (unsafe) {
#pragma unroll
    for (int i = 0; i < SEG; ++i) {
      sQs[r * K + col0 + i] = qv[i] * scale;
      sKn[r * K + col0 + i] = kv[i];
    }
  }
  __syncthreads();

  // [6] L = k_dec k_inv^T and Mf = q_dec k_inv^T
  if (!unsafe) {
    if (warp == 0) bf16_abt(sL, sKd, sKi, lane);
    if (warp == 1) bf16_abt(sM, sQd, sKi, lane);
  } else {
    // pair form: every product of two decays taken as one exponent difference
    for (int p = tid; p < 2 * CHUNK * CHUNK; p += NT) {
      const bool is_l = p < CHUNK * CHUNK;
      const int i = (p % (CHUNK * CHUNK)) / CHUNK, j = p % CHUNK;
      float acc = 0.f;
      if (is_l ? i > j : i >= j) {
        const float* a = (is_l ? sKn : sQs) + i * K;
        for (int c = 0; c < K; ++c) acc = fmaf(a[c] * sKn[j * K + c], ex2_approx_ftz(sG[i * K + c] - sG[j * K + c]), acc);
      }
      (is_l ? sL : sM)[i * CHUNK + j] = acc;
    }
  }
  __syncthreads();

  // [7] Lb = fp32(L * beta) strictly lower, in place; [9] Mqk = bf16(Mf) on and below the diagonal
  for (int p = tid; p < CHUNK * CHUNK; p += NT) {
    const int i = p / CHUNK, j = p % CHUNK;
    sL[p] = i > j ? sL[p] * sBeta[i] : 0.f;
    reinterpret_cast<u16*>(blk + WS_MQK)[p] = i >= j ? f32_to_bf16(sM[p]) : u16(0);
  }
  __syncthreads();

  // [8] (I + Lb)^-1 by forward substitution in fp32, one column per thread:
  // X_i = e_i - sum_j<i Lb_ij X_j, FMAs in j order. Unlike a power series of Lb it
  // has no large intermediates, so repeated keys (Lb near an all-beta triangle)
  // neither cancel nor overflow. Entries above the diagonal come out exactly 0.
  if (tid < CHUNK) {
    float x[CHUNK];
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) {
      float acc = i == tid ? 1.f : 0.f;
#pragma unroll
      for (int j = 0; j < i; ++j) acc = fmaf(-sL[i * CHUNK + j], x[j], acc);
      x[i] = acc;
      reinterpret_cast<u16*>(blk + WS_INV)[i * CHUNK + tid] = f32_to_bf16(acc);  // a row: 16 adjacent lanes
    }
  }
}

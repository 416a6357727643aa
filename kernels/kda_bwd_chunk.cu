// kda_bwd_chunk: the token-parallel half of the KDA backward (docs/design.md section 9.3).
// One CTA of K/16 warps per (chunk slot, query head), a warp per 16 channels in the [16, K] chains; it walks the query head's value heads in
// order, so the grouped heads' dq and dk are summed in a fixed order, in registers. Per value
// head: the prepare steps again (gates, cumulative decay, operands, L, INV, bit-identical to
// kda_prepare), then per block of BVC value columns the state S_c entering the chunk (from
// kda_recurrence) and the gradient dS_c at its end (from kda_bwd_chain) give W, U, dU, dY and
// dv, and the chains over the value columns give the decayed operands' gradients; then the
// in-chunk terms (tensor cores, or the pair form where the decay would overflow), the decay's
// gradient per channel and the gates' backward. No atomics: the sums over chunks of dA_log and
// dt_bias are written per chunk and reduced by kda_bwd_reduce.
// Rounding points: kdacupy/numerics/backward_model.py steps [P1], [B1]-[B9].
//
// Rendered configuration: KDA_K, KDA_BVC, KDA_DT (q, k, v, do and their gradients), KDA_G_DT,
// KDA_BETA_DT, KDA_GATE, KDA_BETA_MODE, KDA_L2NORM, CSM_* (kdacupy/ops/backward/layouts.py). The inputs may be strided (their strides are
// arguments); the gradients are the launcher's contiguous arrays. V and the states' precision
// (bf16, or fp32 with state_precision="fp32") are arguments: they change loop bounds and one load.
#include "common.cuh"
#include "gates.cuh"

namespace {
using namespace kda;

constexpr int K = KDA_K;
constexpr int BVC = KDA_BVC;
constexpr int NW = K / 16;       // warps: one per 16 channels of the [16, K] chains
constexpr int NT = NW * 32;
constexpr int ROW_THREADS = 128;  // the row phases: 8 threads per row, as kda_prepare
constexpr int SEG = K / 8;       // elements of one row per thread in the row phases
constexpr int TS = K + 8;        // padded bf16 row of a [rows, K] tile
constexpr int SR = 24;           // padded row of a 16x16 bf16 tile
constexpr int YS = BVC + 8;      // padded bf16 row of a [16, BVC] tile
constexpr int KS = K / 16;       // k-steps over the channels
constexpr int KW = 16;           // channels per warp in the [16, K] chains
constexpr int NKT = KW / 8;      // their n-tiles
constexpr int NCOL = (K + NT - 1) / NT;  // channels per thread in the per-channel phases
constexpr float SAFE_EXPONENT = 100.0f;
constexpr float LN2_F = 0.6931471805599453f;

static_assert(KW % 16 == 0 && BVC % 16 == 0, "whole mma tiles");  // V: a multiple of BVC (64, 128, 256)

// ldmatrix lane offsets: A = tile rows (m) x columns (k); A^T / B^T = the tile read transposed
__device__ __forceinline__ int a_row(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
__device__ __forceinline__ int a_col(int lane) { return 8 * (lane >> 4); }
__device__ __forceinline__ int t_row(int lane) { return (lane & 7) + 8 * (lane >> 4); }
__device__ __forceinline__ int t_col(int lane) { return 8 * ((lane >> 3) & 1); }

// A[m][k] = tile[m][k0 + k] (16 rows)
__device__ __forceinline__ void lda(u32 (&a)[4], const u16* tile, int stride, int k0, int lane) {
  ldmatrix_x4(a, tile + a_row(lane) * stride + k0 + a_col(lane));
}
// A[m][k] = tile[k][m] (a 16x16 tile read transposed)
__device__ __forceinline__ void lda_t(u32 (&a)[4], const u16* tile, int stride, int lane) {
  ldmatrix_x4_trans(a, tile + t_row(lane) * stride + t_col(lane));
}
// B[k][n] = tile[n0 + n][k0 + k] for two n-tiles (rows of the tile are n)
__device__ __forceinline__ void ldb_nk(u32 (&b)[4], const u16* tile, int stride, int n0, int k0, int lane) {
  ldmatrix_x4(b, tile + (n0 + t_row(lane)) * stride + k0 + t_col(lane));
}
// B[k][n] = tile[k0 + k][n0 + n] for two n-tiles (rows of the tile are k)
__device__ __forceinline__ void ldb_kn(u32 (&b)[4], const u16* tile, int stride, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + a_row(lane)) * stride + n0 + a_col(lane));
}
__device__ __forceinline__ void mma2(float (&acc)[2][4], const u32 (&a)[4], const u32 (&b)[4]) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const u32 bb[2] = {b[2 * nt], b[2 * nt + 1]};
    mma_bf16_m16n8k16(acc[nt], a, bb, acc[nt]);
  }
}
__device__ __forceinline__ void mma2(float (&acc)[4], float (&acc1)[4], const u32 (&a)[4], const u32 (&b)[4]) {
  const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_bf16_m16n8k16(acc, a, b0, acc);
  mma_bf16_m16n8k16(acc1, a, b1, acc1);
}
__device__ __forceinline__ void negate(u32 (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] ^= 0x80008000u;  // -x of each bf16: exact
}
__device__ __forceinline__ float bf16_at(const u16* tile, int idx) { return __uint_as_float(u32(tile[idx]) << 16); }

// 16x16 fp32 = A(16xK bf16 tile) B^T (B: 16xK bf16 tile), one warp (kda_prepare's [6]).
__device__ __forceinline__ void bf16_abt(float* dst, const u16* a, const u16* b, int lane) {
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    u32 af[4], bf[4];
    lda(af, a, TS, 16 * s, lane);
    ldb_nk(bf, b, TS, 0, 16 * s, lane);
    mma2(acc, af, bf);
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

// K = 64 (4 warps): a minimum-blocks figure of 1 lets ptxas take the registers it needs (left to itself it
// settles at 168 and spills a few bytes); at K >= 128 (8+ warps) the plain bound does not spill.
#if KDA_K <= 64
#define KDA_BWD_CHUNK_BOUNDS __launch_bounds__(NT, 1)
#else
#define KDA_BWD_CHUNK_BOUNDS __launch_bounds__(NT)
#endif
extern "C" __global__ void KDA_BWD_CHUNK_BOUNDS kda_bwd_chunk(
    const void* q, const void* k, const void* v, const void* g, const void* beta, const void* dout,
    i64 q_sb, i64 q_st, i64 q_sh, i64 k_sb, i64 k_st, i64 k_sh, i64 v_sb, i64 v_st, i64 v_sh,
    i64 g_sb, i64 g_st, i64 g_sh, i64 b_sb, i64 b_st, i64 b_sh, i64 d_sb, i64 d_st, i64 d_sh,
    const float* A_log, const float* dt_bias, const void* cu_seqlens, int cu_is_i64,
    int T, int H, int HV, int V, int nseq, int nslots, int chunks_per_seq, float scale, float lb2, float lb,
    const unsigned char* states, int states_fp32, const u16* dstates,
    void* dq, void* dk, void* dv, void* dg, void* dbeta, float* part_ddt, float* part_dA) {
  const int slot = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int G = HV / H;

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
  if (c0 < 0 || c0 >= seq.len) {  // an unused slot (varlen padding): its partial sums are zero
    for (int gi = 0; gi < G; ++gi) {
      const i64 hs = static_cast<i64>(h * G + gi) * nslots + slot;
      if (part_ddt != nullptr) for (int c = tid; c < K; c += NT) part_ddt[hs * K + c] = 0.f;
      if (part_dA != nullptr && tid == 0) part_dA[hs] = 0.f;
    }
    return;
  }
  const int rows = seq.len - c0 < CHUNK ? static_cast<int>(seq.len - c0) : CHUNK;
  const int b = cu_seqlens == nullptr ? n : 0;
  const i64 t0 = (cu_seqlens == nullptr ? 0 : seq.bos) + c0;
  const i64 tok0 = static_cast<i64>(b) * T + t0;  // the chunk's first token in the gradients (contiguous [B, T, ...])

  unsigned char* sm = dynamic_smem();
  float* sQN = reinterpret_cast<float*>(sm + CSM_QN);
  float* sKN = reinterpret_cast<float*>(sm + CSM_KN);
  float* sG = reinterpret_cast<float*>(sm + CSM_G);
  u16* sQD = reinterpret_cast<u16*>(sm + CSM_QD);
  u16* sKD = reinterpret_cast<u16*>(sm + CSM_KD);
  u16* sKI = reinterpret_cast<u16*>(sm + CSM_KI);
  u16* sKR = reinterpret_cast<u16*>(sm + CSM_KR);
  float* sL = reinterpret_cast<float*>(sm + CSM_L);
  float* sLB = reinterpret_cast<float*>(sm + CSM_LB);
  float* sDLB = reinterpret_cast<float*>(sm + CSM_DLB);
  float* sDM = reinterpret_cast<float*>(sm + CSM_DM);
  float* sDL = reinterpret_cast<float*>(sm + CSM_DL);
  u16* sMQ = reinterpret_cast<u16*>(sm + CSM_MQ);
  u16* sINV = reinterpret_cast<u16*>(sm + CSM_INV);
  u16* sDL16 = reinterpret_cast<u16*>(sm + CSM_DL16);
  u16* sDM16 = reinterpret_cast<u16*>(sm + CSM_DM16);
  float* sBeta = reinterpret_cast<float*>(sm + CSM_BETA);
  float* sGexp = reinterpret_cast<float*>(sm + CSM_GEXP);
  float* sRQ = reinterpret_cast<float*>(sm + CSM_RQ);
  float* sRK = reinterpret_cast<float*>(sm + CSM_RK);
  float* sColA = reinterpret_cast<float*>(sm + CSM_COLA);
  u16* sS = reinterpret_cast<u16*>(sm + CSM_S);
  u16* sD = reinterpret_cast<u16*>(sm + CSM_D);
  float* sVV = reinterpret_cast<float*>(sm + CSM_VV);
  u16* sDO = reinterpret_cast<u16*>(sm + CSM_DO);
  float* sX = reinterpret_cast<float*>(sm + CSM_X);
  u16* sY = reinterpret_cast<u16*>(sm + CSM_Y);
  u16* sU = reinterpret_cast<u16*>(sm + CSM_U);
  u16* sDU = reinterpret_cast<u16*>(sm + CSM_DU);
  u16* sDYB = reinterpret_cast<u16*>(sm + CSM_DYB);
  u16* sDXB = reinterpret_cast<u16*>(sm + CSM_DXB);
  float* sDYF = reinterpret_cast<float*>(sm + CSM_DYF);
  float* sDGAM = reinterpret_cast<float*>(sm + CSM_DGAM);
  float* sKT = reinterpret_cast<float*>(sm + CSM_KT);
  float* sDQN = reinterpret_cast<float*>(sm + CSM_DQN);
  float* sDKN = reinterpret_cast<float*>(sm + CSM_DKN);
  float* sDOT = reinterpret_cast<float*>(sm + CSM_DOT);

  const int r = tid >> 3, col0 = (tid & 7) * SEG;  // the row phases: this thread's row and first column
  const bool rowt = tid < ROW_THREADS;              // (whole warps: the l2norm's shuffles need them)
  const bool live = rowt && r < rows;

  // [P1] q and k rows, l2-normalised as kda_prepare's [1]; padded rows are zero
  if (rowt) {
    float qv[SEG], kv[SEG];
    if (live) {
      load_row<KDA_DT>(static_cast<const unsigned char*>(q) + (b * q_sb + (t0 + r) * q_st + h * q_sh + col0) * elem_bytes<KDA_DT>(), qv);
      load_row<KDA_DT>(static_cast<const unsigned char*>(k) + (b * k_sb + (t0 + r) * k_st + h * k_sh + col0) * elem_bytes<KDA_DT>(), kv);
    } else {
#pragma unroll
      for (int i = 0; i < SEG; ++i) qv[i] = kv[i] = 0.f;
    }
    if constexpr (KDA_L2NORM) {
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int i = 0; i < SEG; ++i) {
        sq = fmaf(qv[i], qv[i], sq);
        sk = fmaf(kv[i], kv[i], sk);
      }
#pragma unroll
      for (int m = 4; m >= 1; m >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, m);
        sk += __shfl_xor_sync(0xffffffffu, sk, m);
      }
      const float iq = rsqrt_approx_ftz(sq + 1e-6f), ik = rsqrt_approx_ftz(sk + 1e-6f);
#pragma unroll
      for (int i = 0; i < SEG; ++i) {
        qv[i] *= iq;
        kv[i] *= ik;
      }
      if ((tid & 7) == 0) {
        sRQ[r] = iq;
        sRK[r] = ik;
      }
    }
#pragma unroll
    for (int i = 0; i < SEG; ++i) {
      sQN[r * K + col0 + i] = qv[i];
      sKN[r * K + col0 + i] = kv[i];
    }
  }

  // [B7] sums over the group's value heads, in shared memory (each element owned by one lane)
  for (int p = tid; p < CHUNK * K; p += NT) sDQN[p] = sDKN[p] = 0.f;
  const int n0w = warp * KW;  // this warp's first channel in the [16, K] chains

#pragma unroll 1
  for (int gi = 0; gi < G; ++gi) {
    const int hv = h * G + gi;
    const i64 hs = static_cast<i64>(hv) * nslots + slot;
    const float a = (KDA_GATE != KDA_GATE_LOG && A_log != nullptr) ? ex2_approx_ftz(A_log[hv] * LOG2E_F) : 1.f;
    __syncthreads();  // the previous value head's last reads of the shared tiles are done
    // [2] gate, zero on padded rows; [3] beta
    if (rowt) {
      float gv[SEG];
      if (live) {
        load_row<KDA_G_DT>(static_cast<const unsigned char*>(g) + (b * g_sb + (t0 + r) * g_st + hv * g_sh + col0) * elem_bytes<KDA_G_DT>(), gv);
      }
#pragma unroll
      for (int i = 0; i < SEG; ++i) {
        const float bias = (KDA_GATE != KDA_GATE_LOG && dt_bias != nullptr) ? dt_bias[static_cast<i64>(hv) * K + col0 + i] : 0.f;
        sG[r * K + col0 + i] = live ? gate_log2<KDA_GATE>(gv[i], a, bias, lb2) : 0.f;
      }
    }
    if (tid < CHUNK) {
      float bt = 0.f;
      if (tid < rows) {
        bt = beta_activate<KDA_BETA_MODE>(
            KDA_BETA_MODE == KDA_BETA_NONE ? 0.f : load_f32<KDA_BETA_DT>(beta, b * b_sb + (t0 + tid) * b_st + hv * b_sh));
      }
      sBeta[tid] = bt;
    }
    __syncthreads();
    // [4] running sum over the rows per channel
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
    // [5] the decayed operands (bf16 tiles); gexp
    if (rowt) {
#pragma unroll
      for (int i = 0; i < SEG; ++i) {
        const int c = col0 + i;
        const float gc = sG[r * K + c], gt = sG[(CHUNK - 1) * K + c];
        const float e = ex2_approx_ftz(gc), qn = sQN[r * K + c], kn = sKN[r * K + c];
        sQD[r * TS + c] = f32_to_bf16(qn * (e * scale));
        sKD[r * TS + c] = f32_to_bf16(kn * e);
        sKI[r * TS + c] = f32_to_bf16(kn * ex2_approx_ftz(-gc));
        sKR[r * TS + c] = f32_to_bf16(kn * ex2_approx_ftz(gt - gc));
        if (r == CHUNK - 1) sGexp[c] = ex2_approx_ftz(gt);
      }
    }
    __syncthreads();
    // [6] L = k_dec k_inv^T, Mf = q_dec k_inv^T; the pair form where the decay would overflow
    if (!unsafe) {
      if (warp == 0) bf16_abt(sL, sKD, sKI, lane);
      if (warp == 1) bf16_abt(sDM, sQD, sKI, lane);  // sDM holds Mf until [7]
    } else {
      for (int p = tid; p < 2 * CHUNK * CHUNK; p += NT) {
        const bool is_l = p < CHUNK * CHUNK;
        const int i = (p % (CHUNK * CHUNK)) / CHUNK, j = p % CHUNK;
        float acc = 0.f;
        if (is_l ? i > j : i >= j) {
          for (int c = 0; c < K; ++c) {
            const float x = is_l ? sKN[i * K + c] : sQN[i * K + c] * scale;
            acc = fmaf(x * sKN[j * K + c], ex2_approx_ftz(sG[i * K + c] - sG[j * K + c]), acc);
          }
        }
        (is_l ? sL : sDM)[i * CHUNK + j] = acc;
      }
    }
    __syncthreads();
    // [7] Lb = fp32(L beta) strictly lower (L kept for dbeta); Mqk = bf16(Mf) on and below the diagonal
    for (int p = tid; p < CHUNK * CHUNK; p += NT) {
      const int i = p / CHUNK, j = p % CHUNK;
      if (i <= j) sL[p] = 0.f;
      sLB[p] = i > j ? sL[p] * sBeta[i] : 0.f;
      sMQ[i * SR + j] = i >= j ? f32_to_bf16(sDM[p]) : u16(0);
    }
    __syncthreads();
    // [8] (I + Lb)^-1 by forward substitution, one column per thread
    if (tid < CHUNK) {
      float x[CHUNK];
#pragma unroll
      for (int i = 0; i < CHUNK; ++i) {
        float acc = i == tid ? 1.f : 0.f;
#pragma unroll
        for (int j = 0; j < i; ++j) acc = fmaf(-sLB[i * CHUNK + j], x[j], acc);
        x[i] = acc;
        sINV[i * SR + tid] = f32_to_bf16(acc);
      }
    }

    // the chains over the value columns
    float aQd[NKT][4] = {}, aKd[NKT][4] = {}, aKr[NKT][4] = {};
    float aSm[2][4] = {};  // warp 0: dLb~ = dY U^T; warp 1: dM = do U^T
    float dbv = 0.f, dge[NCOL] = {};
#pragma unroll 1
    for (int v0 = 0; v0 < V; v0 += BVC) {
      __syncthreads();  // [8] done / the previous block's tiles are read
      // the block's S_c, dS_c rows (bf16, padded), v and do
      {
        const i64 sbase = (hs * V + v0) * K;
        for (int p = tid; p < BVC * K / 8; p += NT) {
          const int vr = p / (K / 8), c = (p % (K / 8)) * 8;
          if (states_fp32) {
            const float* src = reinterpret_cast<const float*>(states) + sbase + static_cast<i64>(vr) * K + c;
            Vec16 w;
#pragma unroll
            for (int e = 0; e < 4; ++e) w.w[e] = pack_bf16x2(src[2 * e], src[2 * e + 1]);
            *reinterpret_cast<Vec16*>(sS + vr * TS + c) = w;
          } else {
            cp_async_16(sS + vr * TS + c, reinterpret_cast<const u16*>(states) + sbase + static_cast<i64>(vr) * K + c);
          }
          cp_async_16(sD + vr * TS + c, dstates + sbase + static_cast<i64>(vr) * K + c);
        }
        cp_async_commit();
        for (int p = tid; p < CHUNK * BVC; p += NT) {
          const int i = p / BVC, c = p % BVC;
          float vx = 0.f, dx = 0.f;
          if (i < rows) {
            vx = load_f32<KDA_DT>(v, b * v_sb + (t0 + i) * v_st + hv * v_sh + v0 + c);
            dx = load_f32<KDA_DT>(dout, b * d_sb + (t0 + i) * d_st + hv * d_sh + v0 + c);
          }
          sVV[p] = vx;
          sDO[i * YS + c] = f32_to_bf16(dx);
        }
        cp_async_wait<0>();
      }
      __syncthreads();
      const int n0 = 16 * warp;  // this warp's 16 columns of the block in [B1]-[B3]
      const bool cols = n0 < BVC;
      // [B1] W = k_dec S^T;  X = v - W;  Y = bf16(beta X)
      if (cols) {
        float acc[2][4] = {};
#pragma unroll 2  // bounds the fragments ptxas prefetches (sm_100a spilled at full unroll)
        for (int s = 0; s < KS; ++s) {
          u32 af[4], bf[4];
          lda(af, sKD, TS, 16 * s, lane);
          ldb_nk(bf, sS, TS, n0, 16 * s, lane);
          mma2(acc, af, bf);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int i = gq + 8 * h2, c = n0 + 8 * nt + 2 * tq;
            const float x0 = sVV[i * BVC + c] - acc[nt][2 * h2], x1 = sVV[i * BVC + c + 1] - acc[nt][2 * h2 + 1];
            sX[i * BVC + c] = x0;
            sX[i * BVC + c + 1] = x1;
            *reinterpret_cast<u32*>(sY + i * YS + c) = pack_bf16x2(sBeta[i] * x0, sBeta[i] * x1);
          }
        }
      }
      __syncthreads();
      // [B2] U = bf16(INV Y);  dU = bf16(Mqk^T do + k_res dS^T)
      if (cols) {
        float acc[2][4] = {}, dacc[2][4] = {};
        u32 af[4], bf[4];
        lda(af, sINV, SR, 0, lane);
        ldb_kn(bf, sY, YS, 0, n0, lane);
        mma2(acc, af, bf);
        lda_t(af, sMQ, SR, lane);
        ldb_kn(bf, sDO, YS, 0, n0, lane);
        mma2(dacc, af, bf);
#pragma unroll 2  // bounds the fragments ptxas prefetches (sm_100a spilled at full unroll)
        for (int s = 0; s < KS; ++s) {
          lda(af, sKR, TS, 16 * s, lane);
          ldb_nk(bf, sD, TS, n0, 16 * s, lane);
          mma2(dacc, af, bf);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int i = gq + 8 * h2, c = n0 + 8 * nt + 2 * tq;
            *reinterpret_cast<u32*>(sU + i * YS + c) = pack_bf16x2(acc[nt][2 * h2], acc[nt][2 * h2 + 1]);
            *reinterpret_cast<u32*>(sDU + i * YS + c) = pack_bf16x2(dacc[nt][2 * h2], dacc[nt][2 * h2 + 1]);
          }
        }
      }
      __syncthreads();
      // [B3] dY = INV^T dU;  dX = beta dY: dv
      if (cols) {
        float acc[2][4] = {};
        u32 af[4], bf[4];
        lda_t(af, sINV, SR, lane);
        ldb_kn(bf, sDU, YS, 0, n0, lane);
        mma2(acc, af, bf);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int i = gq + 8 * h2, c = n0 + 8 * nt + 2 * tq;
            const float y0 = acc[nt][2 * h2], y1 = acc[nt][2 * h2 + 1];
            const float x0 = sBeta[i] * y0, x1 = sBeta[i] * y1;
            sDYF[i * BVC + c] = y0;
            sDYF[i * BVC + c + 1] = y1;
            *reinterpret_cast<u32*>(sDYB + i * YS + c) = pack_bf16x2(y0, y1);
            *reinterpret_cast<u32*>(sDXB + i * YS + c) = pack_bf16x2(x0, x1);
            if (i < rows) {
              const i64 o = ((tok0 + i) * HV + hv) * V + v0 + c;
              store_f32<KDA_DT>(dv, o, x0);
              store_f32<KDA_DT>(dv, o + 1, x1);
            }
          }
        }
      }
      __syncthreads();
      // [B4] the chains: dLb~ and dM (16x16), dQd, dKd, dKr ([16, K], this warp's channels); dbeta, dge
#pragma unroll 2  // bounds the fragments ptxas prefetches (sm_100a spilled at full unroll)
      for (int s2 = 0; s2 < BVC / 16; ++s2) {
        u32 aO[4], aX[4], aU[4];
        lda(aO, sDO, YS, 16 * s2, lane);
        lda(aX, sDXB, YS, 16 * s2, lane);
        negate(aX);
        lda(aU, sU, YS, 16 * s2, lane);
        if (warp < 2) {
          u32 ay[4], bu[4];
          if (warp == 0) {
            lda(ay, sDYB, YS, 16 * s2, lane);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) ay[e] = aO[e];
          }
          ldb_nk(bu, sU, YS, 0, 16 * s2, lane);
          mma2(aSm, ay, bu);
        }
#pragma unroll
        for (int jp = 0; jp < NKT / 2; ++jp) {
          u32 bS[4], bD[4];
          ldb_kn(bS, sS, TS, 16 * s2, n0w + 16 * jp, lane);
          ldb_kn(bD, sD, TS, 16 * s2, n0w + 16 * jp, lane);
          mma2(aQd[2 * jp], aQd[2 * jp + 1], aO, bS);
          mma2(aKd[2 * jp], aKd[2 * jp + 1], aX, bS);
          mma2(aKr[2 * jp], aKr[2 * jp + 1], aU, bD);
        }
      }
      if (tid >= 64 && tid < 64 + CHUNK) {
        const int i = tid - 64;
        for (int c = 0; c < BVC; ++c) dbv = fmaf(sDYF[i * BVC + c], sX[i * BVC + c], dbv);
      }
#pragma unroll
      for (int m = 0; m < NCOL; ++m) {
        const int c = tid + NT * m;
        if (c < K) {
          for (int vr = 0; vr < BVC; ++vr) {
            float sv;
            if (states_fp32) {
              sv = reinterpret_cast<const float*>(states)[(hs * V + v0 + vr) * K + c];
            } else {
              sv = bf16_at(sS, vr * TS + c);
            }
            dge[m] = fmaf(bf16_at(sD, vr * TS + c), sv, dge[m]);
          }
        }
      }
    }
    // [B5] dLb, dM to shared memory; dbeta; dL
    if (warp < 2) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = gq + 8 * (e >> 1), j = 8 * nt + 2 * tq + (e & 1);
          if (warp == 0) sDLB[i * CHUNK + j] = i > j ? -aSm[nt][e] : 0.f;
          else sDM[i * CHUNK + j] = i >= j ? aSm[nt][e] : 0.f;
        }
      }
    }
    __syncthreads();
    if (tid >= 64 && tid < 64 + CHUNK) {
      const int i = tid - 64;
      for (int j = 0; j < i; ++j) dbv = fmaf(sDLB[i * CHUNK + j], sL[i * CHUNK + j], dbv);
      if (KDA_BETA_MODE != KDA_BETA_NONE && i < rows) {
        float d = dbv;
        if constexpr (KDA_BETA_MODE == KDA_BETA_SIGMOID || KDA_BETA_MODE == KDA_BETA_SIGMOID2) {
          const float x = load_f32<KDA_BETA_DT>(beta, b * b_sb + (t0 + i) * b_st + hv * b_sh);
          const float s1 = rcp_approx_ftz(1.0f + ex2_approx_ftz(-x * LOG2E_F));
          const float s2 = rcp_approx_ftz(1.0f + ex2_approx_ftz(x * LOG2E_F));
          d = d * (s1 * s2);
          if constexpr (KDA_BETA_MODE == KDA_BETA_SIGMOID2) d = 2.f * d;
        }
        store_f32<KDA_BETA_DT>(dbeta, (tok0 + i) * HV + hv, d);
      }
    }
    for (int p = tid; p < CHUNK * CHUNK; p += NT) {
      const int i = p / CHUNK, j = p % CHUNK;
      const float dl = sBeta[i] * sDLB[p];
      sDL[p] = dl;
      sDL16[i * SR + j] = f32_to_bf16(dl);
      sDM16[i * SR + j] = f32_to_bf16(sDM[p]);
    }
    __syncthreads();
    // [B6] the in-chunk terms on the tensor cores (factored chunks)
    float aKi[NKT][4] = {};
    if (!unsafe) {
      u32 am[4], al[4], amt[4], alt[4];
      lda(am, sDM16, SR, 0, lane);
      lda(al, sDL16, SR, 0, lane);
      lda_t(alt, sDL16, SR, lane);
      lda_t(amt, sDM16, SR, lane);
#pragma unroll
      for (int jp = 0; jp < NKT / 2; ++jp) {
        u32 bki[4], bkd[4], bqd[4];
        ldb_kn(bki, sKI, TS, 0, n0w + 16 * jp, lane);
        ldb_kn(bkd, sKD, TS, 0, n0w + 16 * jp, lane);
        ldb_kn(bqd, sQD, TS, 0, n0w + 16 * jp, lane);
        mma2(aQd[2 * jp], aQd[2 * jp + 1], am, bki);
        mma2(aKd[2 * jp], aKd[2 * jp + 1], al, bki);
        mma2(aKi[2 * jp], aKi[2 * jp + 1], alt, bkd);
        mma2(aKi[2 * jp], aKi[2 * jp + 1], amt, bqd);
      }
    }
    // [B7] per element: the gradients of qn, kn (summed over the group) and the decay's terms
#pragma unroll
    for (int jt = 0; jt < NKT; ++jt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = gq + 8 * (e >> 1), d = n0w + 8 * jt + 2 * tq + (e & 1);
        const float gc = sG[i * K + d], gt = sG[(CHUNK - 1) * K + d];
        const float ex = ex2_approx_ftz(gc), es = ex * scale, ei = ex2_approx_ftz(-gc), er = ex2_approx_ftz(gt - gc);
        const float qn = sQN[i * K + d], kn = sKN[i * K + d];
        float t_q = aQd[jt][e] * es, P = aKd[jt][e] * ex, Mi, g1, g2;
        const float g_q = bf16_at(sQD, i * TS + d) * aQd[jt][e];
        if (!unsafe) {
          Mi = aKi[jt][e] * ei;
          g1 = bf16_at(sKD, i * TS + d) * aKd[jt][e];
          g2 = bf16_at(sKI, i * TS + d) * aKi[jt][e];
        } else {  // [B6] pair form: fma chains over the partner row, in order
          const float qs = qn * scale;
          float A = 0.f, B = 0.f, Cm = 0.f, Cl = 0.f;
          for (int p = 0; p < CHUNK; ++p) {
            const float erp = ex2_approx_ftz(gc - sG[p * K + d]), epr = ex2_approx_ftz(sG[p * K + d] - gc);
            if (p <= i) A = fmaf(sDM[i * CHUNK + p] * sKN[p * K + d], erp, A);
            if (p < i) B = fmaf(sDL[i * CHUNK + p] * sKN[p * K + d], erp, B);
            if (p >= i) Cm = fmaf(sDM[p * CHUNK + i] * (sQN[p * K + d] * scale), epr, Cm);
            if (p > i) Cl = fmaf(sDL[p * CHUNK + i] * sKN[p * K + d], epr, Cl);
          }
          t_q = t_q + A * scale;
          g1 = bf16_at(sKD, i * TS + d) * aKd[jt][e] + (qs * A + kn * B);
          P = P + B;
          Mi = Cm + Cl;
          g2 = kn * Mi;
        }
        const float t3 = aKr[jt][e] * er;
        sDQN[i * K + d] += t_q;
        sDKN[i * K + d] += (P + Mi) + t3;
        sDGAM[i * K + d] = (g_q + g1) - g2;
        sKT[i * K + d] = bf16_at(sKR, i * TS + d) * aKr[jt][e];
        (void)qn;
      }
    }
    __syncthreads();
    // [B8] per channel: the decay's gradient (natural units), the gates' backward, partial sums
#pragma unroll
    for (int m = 0; m < NCOL; ++m) {
      const int c = tid + NT * m;
      if (c < K) {
        const float G8 = sGexp[c] * dge[m];
        float suf = 0.f;
        for (int i = CHUNK - 1; i >= 0; --i) {
          suf += sDGAM[i * K + c];
          sDGAM[i * K + c] = suf;
        }
        float pre = 0.f, ddt = 0.f, dA = 0.f;
        const float bias = (KDA_GATE != KDA_GATE_LOG && dt_bias != nullptr) ? dt_bias[static_cast<i64>(hv) * K + c] : 0.f;
        for (int i = 0; i < CHUNK; ++i) {
          const float dgn = sDGAM[i * K + c] + (pre + G8);
          pre += sKT[i * K + c];
          if (i < rows) {
            const i64 o = b * g_sb + (t0 + i) * g_st + hv * g_sh + c;
            float dx = dgn;
            if constexpr (KDA_GATE == KDA_GATE_SOFTPLUS) {
              const float graw = load_f32<KDA_G_DT>(g, o), x = graw + bias;
              const float s = x > 15.0f ? 1.0f : rcp_approx_ftz(1.0f + ex2_approx_ftz(-x * LOG2E_F));
              dx = -((a * s) * dgn);
              dA += dgn * (gate_log2<KDA_GATE_SOFTPLUS>(graw, a, bias, lb2) * LN2_F);
            } else if constexpr (KDA_GATE == KDA_GATE_SIGMOID) {
              const float x = load_f32<KDA_G_DT>(g, o) + bias, y = a * x;
              const float s1 = rcp_approx_ftz(1.0f + ex2_approx_ftz(-y * LOG2E_F));
              const float s2 = rcp_approx_ftz(1.0f + ex2_approx_ftz(y * LOG2E_F));
              const float dy = (lb * (s1 * s2)) * dgn;
              dx = a * dy;
              dA += dy * y;
            }
            ddt += dx;
            store_f32<KDA_G_DT>(dg, ((tok0 + i) * HV + hv) * K + c, dx);
          }
        }
        if (part_ddt != nullptr) part_ddt[hs * K + c] = ddt;
        sColA[c] = dA;
      }
    }
    __syncthreads();
    if (part_dA != nullptr && tid == 0) {
      float acc = 0.f;
      for (int c = 0; c < K; ++c) acc += sColA[c];
      part_dA[hs] = acc;
    }
  }

  // [B9] dq, dk through the l2norm
  __syncthreads();
  if constexpr (KDA_L2NORM) {
    if (tid < 2 * CHUNK) {
      const int i = tid & (CHUNK - 1);
      const float* x = tid < CHUNK ? sQN : sKN;
      const float* dx = tid < CHUNK ? sDQN : sDKN;
      float acc = 0.f;
      for (int c = 0; c < K; ++c) acc = fmaf(x[i * K + c], dx[i * K + c], acc);
      sDOT[tid] = acc;
    }
    __syncthreads();
  }
  if (live) {
#pragma unroll
    for (int i = 0; i < SEG; ++i) {
      const int c = col0 + i;
      float xq = sDQN[r * K + c], xk = sDKN[r * K + c];
      if constexpr (KDA_L2NORM) {
        xq = sRQ[r] * fmaf(-sQN[r * K + c], sDOT[r], xq);
        xk = sRK[r] * fmaf(-sKN[r * K + c], sDOT[CHUNK + r], xk);
      }
      store_f32<KDA_DT>(dq, ((tok0 + r) * H + h) * K + c, xq);
      store_f32<KDA_DT>(dk, ((tok0 + r) * H + h) * K + c, xk);
    }
  }
}

// kda_bwd_chunk: the token-parallel half of the KDA backward (docs/design.md section 9.3).
// One CTA of K/16 warps per (chunk slot, query head), a warp per 16 channels in the [16, K] chains; it walks the query head's value heads in
// order, so the grouped heads' dq and dk are summed in a fixed order, in registers. Per value
// head: the prepare steps again up to L (gates, cumulative decay, operands, L, bit-identical to
// kda_prepare; INV and Mqk copied from the workspace block it wrote), then per block of BVC value columns the state S_c entering the chunk (from
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
// Optional KDA_ANY_DIMS (1: KDA_K is the key tile and V the value tile, of the internal states and
// partial sums; the true head dims come as k_true, v_true: q, k, g, dt_bias, v, do and the gradients
// dq, dk, dg, dv have them, channels and columns past them read as zero and are never written, a
// padded channel's gate is 0 and it adds nothing to dA_log: docs/design.md section 2).
#include "common.cuh"
#include "fragments.cuh"
#include "gates.cuh"
#include "prepare_steps.cuh"
#include "rows.cuh"

namespace {
using namespace kda;

#ifndef KDA_ANY_DIMS
#define KDA_ANY_DIMS 0
#endif

constexpr int K = KDA_K;
constexpr bool ANY = KDA_ANY_DIMS;
constexpr int BVC = KDA_BVC;
constexpr int NW = K / 16;       // warps: one per 16 channels of the [16, K] chains
constexpr int NT = NW * 32;
constexpr int ROW_THREADS = 128;  // the row phases: 8 threads per row, as kda_prepare (kernels/rows.cuh)
constexpr int E = 16 / elem_bytes<KDA_DT>();  // q, k (and dq, dk) channels per 16-byte piece
constexpr int PPS = K / E / 8;                // pieces per thread in the row phases
constexpr int SEG = PPS * E;                  // channels per thread in the row phases
constexpr int ES = elem_bytes<KDA_DT>();
constexpr int TS = K + 8;        // padded bf16 row of a [rows, K] tile
constexpr int SR = 24;           // padded row of a 16x16 bf16 tile
constexpr int YS = BVC + 8;      // padded bf16 row of a [16, BVC] tile
constexpr int KS = K / 16;       // k-steps over the channels
constexpr int KW = 16;           // channels per warp in the [16, K] chains
constexpr int NKT = KW / 8;      // their n-tiles
// [B7]'s pair form: n-tile pairs per pass over the partner rows (each row's values then read once for
// 4 JG elements; K = 256's 128 registers per thread take one at a time)
constexpr int JG = K <= 128 ? NKT : 1;
constexpr int NCOL = (K + NT - 1) / NT;  // channels per thread in the per-channel phases
constexpr int PV = 16 / ES;                            // v and do elements per 16-byte piece
constexpr int NVP = (CHUNK * BVC / PV + NT - 1) / NT;  // a value block's pieces of v (and of do) per thread
// [B4]'s dge = sum over v of dS S per channel: from the chains' S and dS fragments, a lane's chain over the rows
// v = 2t, 2t + 1, 2t + 8, 2t + 9 (mod 16) of its channels, the 4 lanes' chains summed as (t0 + t1) + (t2 + t3)
// (backward_model.py's dge_chains)
// [B8]: its row loop unrolled, the raw gates and dt_bias read from the shared tiles [2] filled (CSM_GRAW,
// CSM_BIAS: no global load on its path); K = 256 keeps the rolled loop with a global load a row (unrolled in
// 128 registers a thread, ptxas spilled about 160 bytes more; its shared memory is near sm_80's limit)
constexpr bool B8_UNROLLED = K <= 128;
// [B6]'s low parts of k_i, q_m, k_m formed by [5] beside their high parts, in tiles of their own (CSM_QL, CSM_KML,
// CSM_KIL; K <= 128: K = 256 forms them in [B6] into the high parts' tiles, its shared memory near sm_80's limit)
constexpr bool LOWS_EARLY = K <= 128;
// dbeta's sums, a row a thread: warp 2's first lanes (warp 0 forms L and dLb~, warp 1 dM, the last warp sums dA_log)
constexpr int DBETA_T0 = 64;
constexpr bool B9_HOLD = K <= 128;  // [B9]: q and k rows held over the dot products' shuffles
// [B9]'s pieces at K = 256, unrolled: sm_100a's ptxas spilled 48-80 bytes so (a piece at a time there), sm_80's and
// sm_90a's 16-48 bytes a piece at a time
#if !defined(KDA_EMULATE) && __CUDA_ARCH__ >= 1000
#define B9_PIECES_UNROLLED 1
#else
#define B9_PIECES_UNROLLED PPS
#endif
constexpr bool X_HELD = K <= 128;   // [B1]'s X held in registers for [B3] (K = 256: in CSM_X)
constexpr int DB_GROUPS = 16;  // [B3]'s dbeta sums per row: one a 16 value columns (V <= 256)
constexpr float LN2_F = 0.6931471805599453f;

static_assert(KW % 16 == 0 && BVC % 16 == 0, "whole mma tiles");  // V: a multiple of BVC (64, 128, 256)
static_assert(NT >= ROW_THREADS && NT >= K, "the row phases and the per-channel phases have their threads");

// Shared-memory layouts (docs/design.md section 11.3): every access pattern of the kernel meets 32
// banks. fp32 [16, C] tiles (C = K, or BVC >= 32): 32-channel blocks of each row rotated by
// R = 8 (i & 3) + 2 (i >> 2) + 4 (block & 1) words, no padding. The row phases (two rows per
// half-warp, rows i and i + 4, 8-byte accesses), the mma accumulator layout (8-byte pairs; 4
// rows i & 3 = 0..3 per half-warp), 32 channels of one row and 16 rows of one column (R distinct
// for the 16 rows: the pair form, the l2norm's dot products) then all hit distinct banks.
template <int C> __device__ __forceinline__ int fx(int i, int c) {
  if constexpr (C == 16) {
    return i * 16 + (c ^ ((i >> 1 & 1) << 3 | (i >> 2 & 1) << 2 | (i >> 3 & 1) << 1));
  } else {
    static_assert(C % 32 == 0, "rotated 32-channel blocks");
    return i * C + (c & ~31) + ((c + 8 * (i & 3) + 2 * (i >> 2) + 4 * (c >> 5 & 1)) & 31);
  }
}
// [16, 16] fp32 tiles (L, Lb, dLb, dM / Mf, dL): row i's words permuted by an XOR of i's bits 1-3
// into bits 3, 2, 1 (bit 0 kept: 8-byte pairs stay pairs), so the accumulator layout's pairs, a
// column of 16 rows and 32 consecutive elements are conflict-free.
__device__ __forceinline__ int sw(int i, int j) { return fx<16>(i, j); }

__device__ __forceinline__ float2 ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ void st2(float* p, float x, float y) {
  float2 v;
  v.x = x;
  v.y = y;
  *reinterpret_cast<float2*>(p) = v;
}
// two results in the 16-bit type DT, packed (lo first)
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  return KDA_DT == KDA_F16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
}

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
__device__ __forceinline__ void negate(u32 (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] ^= 0x80008000u;  // -x of each bf16: exact
}

// acc += A B over the K channels: A = the [16, K] tile a, B[k][n] = b[n0 + n][k] (rows of both TS apart).
__device__ __forceinline__ void mma_channels(float (&acc)[2][4], const u16* a, const u16* b, int n0, int lane) {
#pragma unroll 2  // bounds the fragments ptxas prefetches (sm_100a spilled at full unroll)
  for (int s = 0; s < KS; ++s) {
    u32 af[4], bf[4];
    lda(af, a, TS, 16 * s, lane);
    ldb_nk(bf, b, TS, n0, 16 * s, lane);
    mma2(acc, af, bf);
  }
}
// f(nt, h2, i, c) for each pair of an accumulator of 16 columns from n0: acc[nt][2 h2], acc[nt][2 h2 + 1]
// hold row i = g + 8 h2, columns c, c + 1 = n0 + 8 nt + 2 t (g = lane / 4, t = lane % 4).
template <class F> __device__ __forceinline__ void each_pair(int n0, int lane, F f) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) f(nt, h2, (lane >> 2) + 8 * h2, n0 + 8 * nt + 2 * (lane & 3));
  }
}

// 16x16 fp32 = A(16xK bf16 tile) B^T (B: 16xK bf16 tile), one warp (kda_prepare's [6], but fully
// unrolled and to this kernel's swizzle of [16, 16] tiles, by 8-byte stores).
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
    st2(dst + sw(g, col), acc[nt][0], acc[nt][1]);
    st2(dst + sw(g + 8, col), acc[nt][2], acc[nt][3]);
  }
}

}  // namespace

// K <= 128: a minimum-blocks figure of 1 lets ptxas take the registers it needs: left to itself it settled
// at 168 (K = 64) and at 128 (K = 128's lighter variants) and spilled a few bytes; one CTA fits an SM anyway
// (its shared memory). K = 256's 16 warps have 128 registers a thread either way (the plain bound spilled
// less on the sampled variants).
#if KDA_K <= 128
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
    const unsigned char* states, int states_fp32, const u16* dstates, const unsigned char* ws,
    void* dq, void* dk, void* dv, void* dg, void* dbeta, float* part_ddt, float* part_dA, int k_true, int v_true) {
  const int kdim = ANY ? k_true : K, vdim = ANY ? v_true : V;  // the true head dims
  const int slot = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int G = HV / H;

  const int n = slot_sequence(cu_seqlens, cu_is_i64, slot, nseq, T, chunks_per_seq);
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
  u16* sQM = reinterpret_cast<u16*>(sm + CSM_QM);  // the factored form's operands q_m, k_m, k_i
  u16* sKD = reinterpret_cast<u16*>(sm + CSM_KD);  // the recurrence's k_dec and k_res (q_dec: [B7]'s state terms round it again)
  u16* sKM = reinterpret_cast<u16*>(sm + CSM_KM);
  u16* sKI = reinterpret_cast<u16*>(sm + CSM_KI);
  u16* sKR = reinterpret_cast<u16*>(sm + CSM_KR);
  float* sL = reinterpret_cast<float*>(sm + CSM_L);
  float* sDLB = reinterpret_cast<float*>(sm + CSM_DLB);
  float* sDM = reinterpret_cast<float*>(sm + CSM_DM);
  float* sDL = reinterpret_cast<float*>(sm + CSM_DL);
  u16* sMQ = reinterpret_cast<u16*>(sm + CSM_MQ);
  u16* sINV = reinterpret_cast<u16*>(sm + CSM_INV);
  u16* sDL16 = reinterpret_cast<u16*>(sm + CSM_DL16);
  u16* sDM16 = reinterpret_cast<u16*>(sm + CSM_DM16);
  float* sBeta = reinterpret_cast<float*>(sm + CSM_BETA);
  float* sBetaD = reinterpret_cast<float*>(sm + CSM_BETAD);  // the beta sigmoid's derivative
  float* sGexp = reinterpret_cast<float*>(sm + CSM_GEXP);
  float* sRQ = reinterpret_cast<float*>(sm + CSM_RQ);
  float* sRK = reinterpret_cast<float*>(sm + CSM_RK);
  float* sColA = reinterpret_cast<float*>(sm + CSM_COLA);
  float* sRef = reinterpret_cast<float*>(sm + CSM_REF);  // row 0 of fx<K>'s rotation (CSM_COLA's bytes: ops/backward/layouts.py)
  u16* sS = reinterpret_cast<u16*>(sm + CSM_S);
  u16* sD = reinterpret_cast<u16*>(sm + CSM_D);
  float* sX = reinterpret_cast<float*>(sm + CSM_X);  // (K = 256)
  unsigned char* sVR = sm + CSM_VR;  // a value block's v rows as stored (DT), rows YS elements apart
  u16* sDO = reinterpret_cast<u16*>(sm + CSM_DO);
  u16* sY = reinterpret_cast<u16*>(sm + CSM_Y);
  u16* sU = reinterpret_cast<u16*>(sm + CSM_U);
  u16* sDU = reinterpret_cast<u16*>(sm + CSM_DU);
  u16* sDYB = reinterpret_cast<u16*>(sm + CSM_DYB);
  u16* sDXB = reinterpret_cast<u16*>(sm + CSM_DXB);
  // [B3]'s dbeta sums per row and column group [16, 16], in dL's bytes (summed before [B5] writes dL)
  float* sDBP = reinterpret_cast<float*>(sm + CSM_DL);
  static_assert(DB_GROUPS * CHUNK <= CHUNK * CHUNK, "dL's tile holds them");
  float* sDGAM = reinterpret_cast<float*>(sm + CSM_DGAM);
  float* sKT = reinterpret_cast<float*>(sm + CSM_KT);
  float* sDQN = reinterpret_cast<float*>(sm + CSM_DQN);
  float* sDKN = reinterpret_cast<float*>(sm + CSM_DKN);
  float* sGRAW = reinterpret_cast<float*>(sm + CSM_GRAW);  // [2]'s raw gate rows and dt_bias row, for [B8] (K <= 128)
  float* sBIAS = reinterpret_cast<float*>(sm + CSM_BIAS);
  u16* sQL = reinterpret_cast<u16*>(sm + CSM_QL);  // the low parts of q_m, k_m, k_i (LOWS_EARLY)
  u16* sKML = reinterpret_cast<u16*>(sm + CSM_KML);
  u16* sKIL = reinterpret_cast<u16*>(sm + CSM_KIL);

  // v and do by 16-byte pieces where their base and strides keep every row's pieces aligned (any head dims:
  // rows of v_true elements need not be)
  const auto al16 = [](const void* ptr, i64 sb, i64 st, i64 sh) {
    return (reinterpret_cast<u64>(ptr) & 15) == 0 && (sb * ES) % 16 == 0 && (st * ES) % 16 == 0 && (sh * ES) % 16 == 0;
  };
  const bool vec_vdo = al16(v, v_sb, v_st, v_sh) && al16(dout, d_sb, d_st, d_sh);
  // two v elements of row i, columns c, c + 1 of the block, as fp32 (exact)
  const auto v_pair = [&](int i, int c) {
    if constexpr (ES == 4) {
      return ld2(reinterpret_cast<const float*>(sVR) + i * YS + c);
    } else {
      const u32 w = *reinterpret_cast<const u32*>(sVR + (i * YS + c) * 2);
      return KDA_DT == KDA_BF16 ? make_float2(bf16_lo(w), bf16_hi(w))
                                : make_float2(f16_to_f32(static_cast<u16>(w & 0xffffu)), f16_to_f32(static_cast<u16>(w >> 16)));
    }
  };

  // the row phases: row r = (warp) + 4 (lane / 8) of threads 0-127, its 8 threads s = lane % 8 (kernels/rows.cuh)
  const int s8 = tid & 7, r = (tid >> 5) + 4 * ((tid >> 3) & 3);
  const bool rowt = tid < ROW_THREADS;  // (whole warps: the l2norm's shuffles need them)
  const bool live = rowt && r < rows;

  // [P1] q and k rows, l2-normalised as kda_prepare's [1]; padded rows are zero
  if (rowt) {
    float qv[SEG], kv[SEG];
    if constexpr (ANY) {
      load_qk_rows_dims<KDA_DT, E, PPS>(qv, kv, q, b * q_sb + (t0 + r) * q_st + h * q_sh, k,
                                        b * k_sb + (t0 + r) * k_st + h * k_sh, s8, live, kdim);
    } else {
      load_qk_rows<KDA_DT, E, PPS>(qv, kv, q, b * q_sb + (t0 + r) * q_st + h * q_sh, k, b * k_sb + (t0 + r) * k_st + h * k_sh,
                                   s8, live);
    }
    if constexpr (KDA_L2NORM) {
      float iq, ik;
      l2norm_qk_rows<E, PPS>(qv, kv, s8, iq, ik);
      if (s8 == 0) {
        sRQ[r] = iq;
        sRK[r] = ik;
      }
    }
#pragma unroll
    for (int v = 0; v < PPS; ++v) {
#pragma unroll
      for (int e = 0; e < E; e += 2) {
        const int c = (s8 + 8 * v) * E + e;
        st2(sQN + fx<K>(r, c), qv[v * E + e], qv[v * E + e + 1]);
        st2(sKN + fx<K>(r, c), kv[v * E + e], kv[v * E + e + 1]);
      }
    }
  }

  // [B7] sums over the group's value heads, in shared memory (each element owned by one lane), from 0: the first
  // head's state terms store 0 + theirs (not read), the rest add
  const int n0w = warp * KW;  // this warp's first channel in the [16, K] chains

#pragma unroll 1
  for (int gi = 0; gi < G; ++gi) {
    const int hv = h * G + gi;
    const i64 hs = static_cast<i64>(hv) * nslots + slot;
    const float a = gate_a<KDA_GATE>(A_log, hv);
    const float* bias_row = gate_bias_row<KDA_GATE, K>(dt_bias, hv, kdim);
    // a value block's inputs: S_c (bf16: cp.async; fp32: rounded to bf16 by the threads) and dS_c rows into their
    // padded tiles; v and do (strided) into registers, NVP 16-byte pieces a thread, then to shared memory
    const auto issue_states = [&](int v0) {
      const i64 sbase = (hs * V + v0) * K;
      static_assert(BVC * K / 8 % NT == 0, "whole rounds of 16-byte copies");
#pragma unroll  // (a fixed count a thread: the row steps fold into the copies' offsets)
      for (int j = 0; j < BVC * K / 8 / NT; ++j) {
        const int vr = tid / (K / 8) + j * (NT / (K / 8)), c = tid % (K / 8) * 8;
        if constexpr (ANY) {
          const bool row = v0 + vr < vdim;
          if (!states_fp32) {
            cp_async_16_zfill(sS + vr * TS + c, reinterpret_cast<const u16*>(states) + sbase + static_cast<i64>(vr) * K + c, row);
          }
          cp_async_16_zfill(sD + vr * TS + c, dstates + sbase + static_cast<i64>(vr) * K + c, row);
        } else {
          if (!states_fp32) {
            cp_async_16(sS + vr * TS + c, reinterpret_cast<const u16*>(states) + sbase + static_cast<i64>(vr) * K + c);
          }
          cp_async_16(sD + vr * TS + c, dstates + sbase + static_cast<i64>(vr) * K + c);
        }
      }
    };
    const auto stage_fp32_states = [&](int v0) {  // 4 fp32 per thread: whole sectors, 8-byte shared stores
      const i64 sbase = (hs * V + v0) * K;
      for (int p = tid; p < BVC * K / 4; p += NT) {
        const int vr = p / (K / 4), c = (p % (K / 4)) * 4;
        const Vec16 x = !ANY || v0 + vr < vdim
                            ? *reinterpret_cast<const Vec16*>(reinterpret_cast<const float*>(states) + sbase + static_cast<i64>(vr) * K + c)
                            : Vec16{};
        Vec8 w;
        w.w[0] = pack_bf16x2(__uint_as_float(x.w[0]), __uint_as_float(x.w[1]));
        w.w[1] = pack_bf16x2(__uint_as_float(x.w[2]), __uint_as_float(x.w[3]));
        *reinterpret_cast<Vec8*>(sS + vr * TS + c) = w;
      }
    };
    // v and do by 16-byte pieces where aligned (vec_vdo) and whole, else element by element
    const auto load_vdo = [&](int v0, Vec16 (&vx)[NVP], Vec16 (&dx)[NVP]) {
#pragma unroll
      for (int j = 0; j < NVP; ++j) {
        const int p = tid + NT * j, i = p / (BVC / PV), c = p % (BVC / PV) * PV;
        vx[j] = Vec16{}, dx[j] = Vec16{};
        if (p < CHUNK * BVC / PV && i < rows) {
          const int n = ANY && vdim - v0 - c < PV ? vdim - v0 - c : PV;  // the piece's true columns
          const i64 ov = b * v_sb + (t0 + i) * v_st + hv * v_sh + v0 + c, od = b * d_sb + (t0 + i) * d_st + hv * d_sh + v0 + c;
          if (vec_vdo && n == PV) {
            vx[j] = *reinterpret_cast<const Vec16*>(static_cast<const unsigned char*>(v) + ov * ES);
            dx[j] = *reinterpret_cast<const Vec16*>(static_cast<const unsigned char*>(dout) + od * ES);
          } else {
#pragma unroll
            for (int e = 0; e < PV; ++e) {
              if (e < n) {
                if constexpr (ES == 4) {
                  vx[j].w[e] = static_cast<const u32*>(v)[ov + e];
                  dx[j].w[e] = static_cast<const u32*>(dout)[od + e];
                } else {
                  vx[j].w[e / 2] |= u32(static_cast<const u16*>(v)[ov + e]) << (16 * (e & 1));
                  dx[j].w[e / 2] |= u32(static_cast<const u16*>(dout)[od + e]) << (16 * (e & 1));
                }
              }
            }
          }
        }
      }
    };
    // v as stored to sVR; do to bf16 (the operand: bf16 inputs as they are)
    const auto store_vdo = [&](const Vec16 (&vx)[NVP], const Vec16 (&dx)[NVP]) {
#pragma unroll
      for (int j = 0; j < NVP; ++j) {
        const int p = tid + NT * j, i = p / (BVC / PV), c = p % (BVC / PV) * PV;
        if (p < CHUNK * BVC / PV) {
          *reinterpret_cast<Vec16*>(sVR + (i * YS + c) * ES) = vx[j];
          if constexpr (KDA_DT == KDA_BF16) {
            *reinterpret_cast<Vec16*>(sDO + i * YS + c) = dx[j];
          } else if constexpr (KDA_DT == KDA_F16) {
            Vec16 w;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              w.w[e] = pack_bf16x2(f16_to_f32(static_cast<u16>(dx[j].w[e] & 0xffffu)), f16_to_f32(static_cast<u16>(dx[j].w[e] >> 16)));
            }
            *reinterpret_cast<Vec16*>(sDO + i * YS + c) = w;
          } else {
            Vec8 w;
            w.w[0] = pack_bf16x2(__uint_as_float(dx[j].w[0]), __uint_as_float(dx[j].w[1]));
            w.w[1] = pack_bf16x2(__uint_as_float(dx[j].w[2]), __uint_as_float(dx[j].w[3]));
            *reinterpret_cast<Vec8*>(sDO + i * YS + c) = w;
          }
        }
      }
    };
    __syncthreads();  // the previous value head's last reads of the shared tiles are done
    // INV and Mqk as kda_prepare left them in the workspace block (bit-identical to its [6]-[8], which
    // this kernel need not run again: L alone it forms, for dbeta), their 32-byte rows by 16-byte
    // copies into the padded tiles; the first value block's wait lands them, before [B2] reads them
    if (tid < 4 * CHUNK) {
      const int row = (tid >> 1) & (CHUNK - 1), half = tid & 1;
      const bool inv = tid < 2 * CHUNK;
      const u16* src = reinterpret_cast<const u16*>(ws + hs * WS_STRIDE + (inv ? WS_INV : WS_MQK));
      cp_async_16((inv ? sINV : sMQ) + row * SR + 8 * half, src + row * CHUNK + 8 * half);
    }
    // the first value block's inputs now, their latency under [2]-[6] (the region's tiles are free: the barrier)
    issue_states(0);
    cp_async_commit();
    Vec16 vpre[NVP], dpre[NVP];  // (K = 256: loaded at the block, its 128 registers a thread spilled more)
    if constexpr (K <= 128) load_vdo(0, vpre, dpre);
    // [2] gate, zero on padded rows; four channels 4 (s + 8 v) .. + 3 at a time, as kda_prepare's
    if (rowt) {
      const bool bias_vec = bias_row != nullptr && (reinterpret_cast<u64>(bias_row) & 15) == 0;
      const unsigned char* grow = static_cast<const unsigned char*>(g) + (b * g_sb + (t0 + r) * g_st + hv * g_sh) * elem_bytes<KDA_G_DT>();
#pragma unroll
      for (int v = 0; v < K / 32; ++v) {
        const int c = 4 * (s8 + 8 * v);
        float gq4[4] = {0.f, 0.f, 0.f, 0.f}, bq4[4] = {0.f, 0.f, 0.f, 0.f};  // as kda_prepare's (which says why a copy)
        const unsigned char* gp = grow + c * elem_bytes<KDA_G_DT>();
        if constexpr (ANY) {  // a quad inside the row and aligned as one load, else element by element
          if (live && c + 4 <= kdim && (reinterpret_cast<u64>(gp) & (4 * elem_bytes<KDA_G_DT>() - 1)) == 0) {
            load_quad<KDA_G_DT>(gp, gq4);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) gq4[e] = live && c + e < kdim ? load_f32<KDA_G_DT>(gp, e) : 0.f;
          }
        } else if (live) {
          load_quad<KDA_G_DT>(gp, gq4);
        }
        if (bias_vec && (!ANY || c + 4 <= kdim)) {
          load_quad<KDA_F32>(bias_row + c, bq4);
        } else if (bias_row != nullptr) {
#pragma unroll
          for (int e = 0; e < 4; ++e) bq4[e] = !ANY || c + e < kdim ? bias_row[c + e] : 0.f;
        }
        float x[4];  // a padded channel's gate is 0, as kda_prepare's
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = live && (!ANY || c + e < kdim) ? gate_log2<KDA_GATE>(gq4[e], a, bq4[e], lb2) : 0.f;
        st2(sG + fx<K>(r, c), x[0], x[1]);
        st2(sG + fx<K>(r, c + 2), x[2], x[3]);
        if constexpr (B8_UNROLLED && KDA_GATE != KDA_GATE_LOG) {  // [B8]'s inputs (zero on padded rows)
          st2(sGRAW + fx<K>(r, c), gq4[0], gq4[1]);
          st2(sGRAW + fx<K>(r, c + 2), gq4[2], gq4[3]);
          if (r == 0) *reinterpret_cast<float4*>(sBIAS + c) = make_float4(bq4[0], bq4[1], bq4[2], bq4[3]);
        }
      }
    }
    if (tid < CHUNK) {
      const float x = KDA_BETA_MODE == KDA_BETA_NONE || tid >= rows ? 0.f : load_f32<KDA_BETA_DT>(beta, b * b_sb + (t0 + tid) * b_st + hv * b_sh);
      sBeta[tid] = tid < rows ? beta_activate<KDA_BETA_MODE>(x) : 0.f;
      if constexpr (KDA_BETA_MODE == KDA_BETA_SIGMOID || KDA_BETA_MODE == KDA_BETA_SIGMOID2) {
        // the sigmoid's derivative for [B5], now: its load then is off the dependent path
        const float s1 = rcp_approx_ftz(1.0f + ex2_approx_ftz(-x * LOG2E_F));
        const float s2 = rcp_approx_ftz(1.0f + ex2_approx_ftz(x * LOG2E_F));
        sBetaD[tid] = s1 * s2;
      }
    }
    __syncthreads();
    // [4] running sum over the rows per channel, its reference gr; gexp
    const auto at = [](int i, int c) { return fx<K>(i, c); };
    const bool unsafe = gate_cumsum<K, NT>(sG, at, [&](int c, float x) { sGexp[c] = x; }, [&](int c, float x) { sRef[fx<K>(0, c)] = x; }, tid);
    // [5] the decayed operands (bf16 tiles), piece by piece; apart from kda_prepare's [5], which reads
    // q, k from registers and writes the workspace: here they come from the fp32 rows in shared memory
    if (rowt) {
#pragma unroll
      for (int v = 0; v < PPS; ++v) {
        const int c0 = (s8 + 8 * v) * E;
        u32 wqm[E / 2], wk[E / 2], wkm[E / 2], wi[E / 2], wr[E / 2], lqm[E / 2], lkm[E / 2], li[E / 2];
#pragma unroll
        for (int w = 0; w < E / 2; ++w) {
          const int c = c0 + 2 * w;
          const float2 gc = ld2(sG + fx<K>(r, c)), gt = ld2(sG + fx<K>(CHUNK - 1, c)), gr = ld2(sRef + fx<K>(0, c));
          const float2 qn = ld2(sQN + fx<K>(r, c)), kn = ld2(sKN + fx<K>(r, c));
          const float e0 = ex2_approx_ftz(gc.x), e1 = ex2_approx_ftz(gc.y);
          const float m0 = ex2_approx_ftz(gc.x - gr.x), m1 = ex2_approx_ftz(gc.y - gr.y);
          wk[w] = pack_bf16x2(kn.x * e0, kn.y * e1);
          wr[w] = pack_bf16x2(kn.x * ex2_approx_ftz(gt.x - gc.x), kn.y * ex2_approx_ftz(gt.y - gc.y));
          const float fq[2] = {qn.x * (m0 * scale), qn.y * (m1 * scale)}, fk[2] = {kn.x * m0, kn.y * m1};
          const float fi[2] = {kn.x * ex2_approx_ftz(gr.x - gc.x), kn.y * ex2_approx_ftz(gr.y - gc.y)};
          split_bf16x2(fq, wqm[w], lqm[w]);  // (the low parts unused unless LOWS_EARLY)
          split_bf16x2(fk, wkm[w], lkm[w]);
          split_bf16x2(fi, wi[w], li[w]);
        }
        store_piece<E>(sQM + r * TS + c0, wqm);
        store_piece<E>(sKD + r * TS + c0, wk);
        store_piece<E>(sKM + r * TS + c0, wkm);
        store_piece<E>(sKI + r * TS + c0, wi);
        store_piece<E>(sKR + r * TS + c0, wr);
        if constexpr (LOWS_EARLY) {
          store_piece<E>(sQL + r * TS + c0, lqm);
          store_piece<E>(sKML + r * TS + c0, lkm);
          store_piece<E>(sKIL + r * TS + c0, li);
        }
      }
    }
    __syncthreads();
    // [6] L = k_m k_i^T; the pair form where the decay would overflow: as kda_prepare's, one thread per
    // pair i > j (a copy: as one template for both kernels, ptxas unrolled the channel loop otherwise).
    // Mqk is R1's, read from the workspace: prepare forms Mf from the two-part q_m, k_i, tiles this
    // kernel has no room for at K = 256.
    if (!unsafe) {
      if (warp == 0) bf16_abt(sL, sKM, sKI, lane);
    } else if (tid < CHUNK * (CHUNK - 1) / 2) {
      int i = 1, j = tid;
      while (j >= i) j -= i++;
      float accl = 0.f;
      for (int c = 0; c < K; ++c) {
        const float e = ex2_approx_ftz(sG[fx<K>(i, c)] - sG[fx<K>(j, c)]), kj = sKN[fx<K>(j, c)];
        accl = fmaf(sKN[fx<K>(i, c)] * kj, e, accl);
      }
      sL[sw(i, j)] = accl;
    }
    // (L's strictly lower part is all dbeta reads, after the value blocks' barriers; the barrier bounds
    // what ptxas moves across: without it the K = 256 variants sampled spilled 4-24 bytes more)
    __syncthreads();

    // the chains over the value columns
    float aQd[NKT][4] = {}, aKd[NKT][4] = {}, aKr[NKT][4] = {};
    float aSm[2][4] = {};  // warp 0: dLb~ = dY U^T; warp 1: dM = do U^T
    float dge[NCOL] = {}, dgl[NKT] = {};  // dgl: [B4]'s dge chain of this lane's channels
    // the value blocks that hold a true column (ANY: the rows of S_c, dS_c past v_true are never written by
    // kda_recurrence and kda_bwd_chain, whose CTAs cover ceil(v_true / BV) slices: read below as zeros)
    const int vend = ANY ? (vdim + BVC - 1) / BVC * BVC : V;
#pragma unroll 1
    for (int v0 = 0; v0 < vend; v0 += BVC) {
      __syncthreads();  // [8] done / the previous block's tiles are read
      // the block's S_c, dS_c rows (bf16, padded), v and do (block 0's were issued at the head's start)
      {
        if (states_fp32) stage_fp32_states(v0);
        if (v0 > 0) {
          issue_states(v0);
          cp_async_commit();
        }
        if (v0 > 0 || K > 128) {
          Vec16 vx[NVP], dx[NVP];
          load_vdo(v0, vx, dx);
          store_vdo(vx, dx);
        } else {
          store_vdo(vpre, dpre);
        }
        cp_async_wait<0>();
      }
      __syncthreads();
      const int n0 = 16 * warp;  // this warp's 16 columns of the block in [B1]-[B3]
      const bool cols = n0 < BVC;
      // [B1] W = k_dec S^T;  X = v - W (held for [B3]'s dbeta terms: registers, or at K = 256 its tile);  Y = bf16(beta X)
      float xr[2][4] = {};  // (unused at K = 256)
      if (cols) {
        float acc[2][4] = {};
        mma_channels(acc, sKD, sS, n0, lane);
        each_pair(n0, lane, [&](int nt, int h2, int i, int c) {
          const float2 vv = v_pair(i, c);
          const float x0 = vv.x - acc[nt][2 * h2], x1 = vv.y - acc[nt][2 * h2 + 1];
          if constexpr (X_HELD) {
            xr[nt][2 * h2] = x0, xr[nt][2 * h2 + 1] = x1;
          } else {
            st2(sX + fx<BVC>(i, c), x0, x1);
          }
          *reinterpret_cast<u32*>(sY + i * YS + c) = pack_bf16x2(sBeta[i] * x0, sBeta[i] * x1);
        });
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
        mma_channels(dacc, sKR, sD, n0, lane);
        each_pair(n0, lane, [&](int nt, int h2, int i, int c) {
          *reinterpret_cast<u32*>(sU + i * YS + c) = pack_bf16x2(acc[nt][2 * h2], acc[nt][2 * h2 + 1]);
          *reinterpret_cast<u32*>(sDU + i * YS + c) = pack_bf16x2(dacc[nt][2 * h2], dacc[nt][2 * h2 + 1]);
        });
      }
      __syncthreads();
      // [B3] dY = INV^T dU;  dX = beta dY: dv (16-bit: staged in Y's tile, done with since [B2], and
      // written by rows below; fp32: 8 bytes per lane, whole sectors)
      if (cols) {
        float acc[2][4] = {};
        u32 af[4], bf[4];
        lda_t(af, sINV, SR, lane);
        ldb_kn(bf, sDU, YS, 0, n0, lane);
        mma2(acc, af, bf);
        float db[2] = {0.f, 0.f};  // dbeta's terms dY X of rows g, g + 8 over this lane's columns, in order
        each_pair(n0, lane, [&](int nt, int h2, int i, int c) {
          const float y0 = acc[nt][2 * h2], y1 = acc[nt][2 * h2 + 1];
          const float x0 = sBeta[i] * y0, x1 = sBeta[i] * y1;
          const float2 xx = X_HELD ? make_float2(xr[nt][2 * h2], xr[nt][2 * h2 + 1]) : ld2(sX + fx<BVC>(i, c));
          db[h2] = fmaf(y0, xx.x, db[h2]);
          db[h2] = fmaf(y1, xx.y, db[h2]);
          *reinterpret_cast<u32*>(sDYB + i * YS + c) = pack_bf16x2(y0, y1);
          *reinterpret_cast<u32*>(sDXB + i * YS + c) = pack_bf16x2(x0, x1);
          if constexpr (KDA_DT == KDA_F32 && ANY) {
            float* d = static_cast<float*>(dv) + ((tok0 + i) * HV + hv) * vdim + v0 + c;
            if (i < rows && v0 + c < vdim) d[0] = x0;
            if (i < rows && v0 + c + 1 < vdim) d[1] = x1;
          } else if constexpr (KDA_DT == KDA_F32) {
            if (i < rows) st2(static_cast<float*>(dv) + ((tok0 + i) * HV + hv) * V + v0 + c, x0, x1);
          } else {
            *reinterpret_cast<u32*>(sY + i * YS + c) = pack2(x0, x1);
          }
        });
        // the 16 columns' sum per row, (t0 + t1) + (t2 + t3), to its column group's slot
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          db[h2] += __shfl_xor_sync(0xffffffffu, db[h2], 1);
          db[h2] += __shfl_xor_sync(0xffffffffu, db[h2], 2);
          if (tq == 0) sDBP[(v0 + n0) / 16 * CHUNK + gq + 8 * h2] = db[h2];  // [group][row]: 8 rows, 8 banks
        }
      }
      __syncthreads();
      // [B4] the chains: dLb~ and dM (16x16), dQd, dKd, dKr ([16, K], this warp's channels); dge;
      // first dv's staged rows, 16 bytes per thread
      if constexpr (KDA_DT != KDA_F32) {
        constexpr int PR = BVC * 2 / 16;  // pieces per row
        for (int p = tid; p < CHUNK * PR; p += NT) {
          const int i = p / PR, pc = p % PR;
          if (i < rows) {
            if constexpr (ANY) {
              store_piece16<2>(reinterpret_cast<unsigned char*>(static_cast<u16*>(dv) + ((tok0 + i) * HV + hv) * vdim + v0 + 8 * pc),
                               reinterpret_cast<const unsigned char*>(sY + i * YS + 8 * pc), vdim - v0 - 8 * pc);
            } else {
              reinterpret_cast<Vec16*>(static_cast<u16*>(dv) + ((tok0 + i) * HV + hv) * V + v0)[pc] =
                  reinterpret_cast<const Vec16*>(sY + i * YS)[pc];
            }
          }
        }
      }
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
          // dge from the same fragments (bf16 states): B[k][n] = tile[16 s2 + k][n0w + 16 jp + n], this lane's
          // k = 2t, 2t + 1, 2t + 8, 2t + 9 (in order), n = g of each n-tile
          if (!states_fp32) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const u32 s01 = bS[2 * hf], s89 = bS[2 * hf + 1], d01 = bD[2 * hf], d89 = bD[2 * hf + 1];
              float& acc = dgl[2 * jp + hf];
              acc = fmaf(bf16_lo(d01), bf16_lo(s01), acc);
              acc = fmaf(bf16_hi(d01), bf16_hi(s01), acc);
              acc = fmaf(bf16_lo(d89), bf16_lo(s89), acc);
              acc = fmaf(bf16_hi(d89), bf16_hi(s89), acc);
            }
          }
        }
      }
      if (states_fp32) {  // dge in the same order from S_c as held: the fp32 states unrounded
        for (int s2 = 0; s2 < BVC / 16; ++s2) {
#pragma unroll
          for (int nt = 0; nt < NKT; ++nt) {
            const int c = n0w + 8 * nt + gq, vb = v0 + 16 * s2;
            const float* srow = reinterpret_cast<const float*>(states) + (hs * V + vb) * K + c;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int vr = 2 * tq + (e & 1) + 8 * (e >> 1);
              const float sv = !ANY || vb + vr < vdim ? srow[vr * K] : 0.f;
              dgl[nt] = fmaf(__uint_as_float(u32(sD[(16 * s2 + vr) * TS + c]) << 16), sv, dgl[nt]);
            }
          }
        }
      }
    }
    // dge's 4 chains (the lanes t) to one per channel: (t0 + t1) + (t2 + t3), through DGAM's bytes (before [B7]
    // writes them) to the channel's thread
#pragma unroll
    for (int nt = 0; nt < NKT; ++nt) {
      dgl[nt] += __shfl_xor_sync(0xffffffffu, dgl[nt], 1);
      dgl[nt] += __shfl_xor_sync(0xffffffffu, dgl[nt], 2);
    }
    __syncthreads();
    if (tq == 0) {
#pragma unroll
      for (int nt = 0; nt < NKT; ++nt) sDGAM[n0w + 8 * nt + gq] = dgl[nt];
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < NCOL; ++m) {
      const int c = tid + NT * m;
      if (c < K) dge[m] = sDGAM[c];
    }
    float dbv = 0.f;  // dbeta: [B3]'s column groups in order, then in [B5] the fma chain over dLb L
    if (tid >= DBETA_T0 && tid < DBETA_T0 + CHUNK) {
      for (int q = 0; q < vend / 16; ++q) dbv += sDBP[q * CHUNK + tid - DBETA_T0];
    }
    // [B7]'s state terms as soon as the chains end, so that their accumulators' registers are free for [B6]:
    // dqn += dQd es, dkn += dKd e + dKr er, and to the region (the V-blocks' tiles read: the barrier) the
    // decay's state part and kt; the lane's accumulator pairs, channels d, d + 1 together (8-byte accesses)
    __syncthreads();
#pragma unroll
    for (int jt = 0; jt < NKT; ++jt) {
      const int d0 = n0w + 8 * jt + 2 * tq;
      const float2 gt2 = ld2(sG + fx<K>(CHUNK - 1, d0));
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int i = gq + 8 * h2, e = 2 * h2;
        const u32 bk = *reinterpret_cast<const u32*>(sKD + i * TS + d0), br = *reinterpret_cast<const u32*>(sKR + i * TS + d0);
        const float2 gc2 = ld2(sG + fx<K>(i, d0)), qn2 = ld2(sQN + fx<K>(i, d0));
        const float ex0 = ex2_approx_ftz(gc2.x), ex1 = ex2_approx_ftz(gc2.y);
        const float er0 = ex2_approx_ftz(gt2.x - gc2.x), er1 = ex2_approx_ftz(gt2.y - gc2.y);
        const u32 bq = pack_bf16x2(qn2.x * (ex0 * scale), qn2.y * (ex1 * scale));  // q_dec as [5] of kda_prepare
        const float ex[2] = {ex0, ex1}, er[2] = {er0, er1}, qd[2] = {bf16_lo(bq), bf16_hi(bq)};
        const float kd[2] = {bf16_lo(bk), bf16_hi(bk)}, kr[2] = {bf16_lo(br), bf16_hi(br)};
        float tq2[2], tk2[2], gs2[2], kt2[2];
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
          const float dqd = aQd[jt][e + e1], dkd = aKd[jt][e + e1], dkr = aKr[jt][e + e1];
          tq2[e1] = dqd * (ex[e1] * scale);
          tk2[e1] = dkd * ex[e1] + dkr * er[e1];
          gs2[e1] = qd[e1] * dqd + kd[e1] * dkd;
          kt2[e1] = kr[e1] * dkr;
        }
        const float2 oq = gi > 0 ? ld2(sDQN + fx<K>(i, d0)) : make_float2(0.f, 0.f);
        const float2 ok = gi > 0 ? ld2(sDKN + fx<K>(i, d0)) : make_float2(0.f, 0.f);
        st2(sDQN + fx<K>(i, d0), oq.x + tq2[0], oq.y + tq2[1]);
        st2(sDKN + fx<K>(i, d0), ok.x + tk2[0], ok.y + tk2[1]);
        st2(sDGAM + fx<K>(i, d0), gs2[0], gs2[1]);
        st2(sKT + fx<K>(i, d0), kt2[0], kt2[1]);
      }
    }
    // [B5] dLb, dM to shared memory; dbeta; dL
    if (warp < 2) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int i = gq + 8 * h2, j = 8 * nt + 2 * tq;
          const float x0 = aSm[nt][2 * h2], x1 = aSm[nt][2 * h2 + 1];
          if (warp == 0) st2(sDLB + sw(i, j), i > j ? -x0 : 0.f, i > j + 1 ? -x1 : 0.f);
          else st2(sDM + sw(i, j), i >= j ? x0 : 0.f, i >= j + 1 ? x1 : 0.f);
        }
      }
    }
    __syncthreads();
    if (tid >= DBETA_T0 && tid < DBETA_T0 + CHUNK) {
      const int i = tid - DBETA_T0;
      for (int j = 0; j < i; ++j) dbv = fmaf(sDLB[sw(i, j)], sL[sw(i, j)], dbv);
      if (KDA_BETA_MODE != KDA_BETA_NONE && i < rows) {
        float d = dbv;
        if constexpr (KDA_BETA_MODE == KDA_BETA_SIGMOID || KDA_BETA_MODE == KDA_BETA_SIGMOID2) {
          d = d * sBetaD[i];
          if constexpr (KDA_BETA_MODE == KDA_BETA_SIGMOID2) d = 2.f * d;
        }
        store_f32<KDA_BETA_DT>(dbeta, (tok0 + i) * HV + hv, d);
      }
    }
    for (int p = tid; p < CHUNK * CHUNK; p += NT) {
      const int i = p / CHUNK, j = p % CHUNK, x = sw(i, j);
      const float dl = sBeta[i] * sDLB[x];
      sDL[x] = dl;
      sDL16[i * SR + j] = f32_to_bf16(dl);
      sDM16[i * SR + j] = f32_to_bf16(sDM[x]);
    }
    __syncthreads();
    // [B6] the in-chunk terms on the tensor cores (factored chunks), apart from the state's (their
    // factors are measured from gr, the state's from the chunk's start): the bf16 operands k_i, k_m, q_m,
    // then their low parts (K <= 128: [5]'s tiles; K = 256: formed here, in the same tiles)
    float aQm[NKT][4] = {}, aKm[NKT][4] = {}, aKi[NKT][4] = {};
    if (!unsafe) {
      u32 am[4], al[4], amt[4], alt[4];  // bf16 dM, dL and their transposes
      const auto load_dmdl = [&] {
        lda(am, sDM16, SR, 0, lane);
        lda(al, sDL16, SR, 0, lane);
        lda_t(alt, sDL16, SR, lane);
        lda_t(amt, sDM16, SR, lane);
      };
      // one pass of the products over operand tiles k_i, k_m, q_m (their high parts, or their low parts)
      const auto products = [&](const u16* ki, const u16* km, const u16* qm) {
#pragma unroll
        for (int jp = 0; jp < NKT / 2; ++jp) {
          u32 bki[4], bkm[4], bqm[4];
          ldb_kn(bki, ki, TS, 0, n0w + 16 * jp, lane);
          ldb_kn(bkm, km, TS, 0, n0w + 16 * jp, lane);
          ldb_kn(bqm, qm, TS, 0, n0w + 16 * jp, lane);
          mma2(aQm[2 * jp], aQm[2 * jp + 1], am, bki);
          mma2(aKm[2 * jp], aKm[2 * jp + 1], al, bki);
          mma2(aKi[2 * jp], aKi[2 * jp + 1], alt, bkm);
          mma2(aKi[2 * jp], aKi[2 * jp + 1], amt, bqm);
        }
      };
      load_dmdl();
      products(sKI, sKM, sQM);
      if constexpr (LOWS_EARLY) {
        products(sKIL, sKML, sQL);
      } else {
        __syncthreads();  // k_i, k_m, q_m read: their low parts take their tiles
        // the low parts bf16(x - bf16(x)) of the fp32 products [5] rounded to k_i, q_m and k_m: the in-chunk
        // terms take the three operands to 16 bits (kdacupy/numerics/backward_model.py [B6] says why)
#pragma unroll 1  // two channels at a time, every thread: [B6]'s accumulators are held over this phase
        for (int p = tid; p < CHUNK * K / 2; p += NT) {
          const int i = p / (K / 2), c = 2 * (p % (K / 2));
          const float2 gc = ld2(sG + fx<K>(i, c)), gr = ld2(sRef + fx<K>(0, c));
          const float2 qn = ld2(sQN + fx<K>(i, c)), kn = ld2(sKN + fx<K>(i, c));
          const float m0 = ex2_approx_ftz(gc.x - gr.x), m1 = ex2_approx_ftz(gc.y - gr.y);
          const float fi[2] = {kn.x * ex2_approx_ftz(gr.x - gc.x), kn.y * ex2_approx_ftz(gr.y - gc.y)};
          const float fq[2] = {qn.x * (m0 * scale), qn.y * (m1 * scale)}, fk[2] = {kn.x * m0, kn.y * m1};
          u32 hi, lo;
          split_bf16x2(fi, hi, lo);
          *reinterpret_cast<u32*>(sKI + i * TS + c) = lo;
          split_bf16x2(fq, hi, lo);
          *reinterpret_cast<u32*>(sQM + i * TS + c) = lo;
          split_bf16x2(fk, hi, lo);
          *reinterpret_cast<u32*>(sKM + i * TS + c) = lo;
        }
        __syncthreads();
        load_dmdl();  // loaded again: not held over the row phase
        products(sKI, sKM, sQM);
      }
    }
    // [B7] per element, the in-chunk terms: to qn, kn (summed over the group) and to the decay (added to its
    // state part); the two channels d, d + 1 of an accumulator pair together. in_chunk_terms(jt, h2, dq, dk, dg, g2)
    // adds the pair's terms at row gq + 8 h2, channels n0w + 8 jt + 2 tq and + 1.
    const auto in_chunk_terms = [&](int jt, int h2, const float (&dq)[2], const float (&dk)[2], const float (&dg)[2],
                                    const float (&g2)[2]) {
      const int x = fx<K>(gq + 8 * h2, n0w + 8 * jt + 2 * tq);
      const float2 oq = ld2(sDQN + x), ok = ld2(sDKN + x), og = ld2(sDGAM + x);
      st2(sDQN + x, oq.x + dq[0], oq.y + dq[1]);
      st2(sDKN + x, ok.x + dk[0], ok.y + dk[1]);
      st2(sDGAM + x, (og.x + dg[0]) - g2[0], (og.y + dg[1]) - g2[1]);
    };
    if (!unsafe) {  // factored: em, ei, and q_m, k_m, k_i to 16 bits (hi + lo, exact in fp32) as [B6] took them
#pragma unroll
      for (int jt = 0; jt < NKT; ++jt) {
        const int d0 = n0w + 8 * jt + 2 * tq;
        const float2 gr2 = ld2(sRef + fx<K>(0, d0));
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int i = gq + 8 * h2;
          const float2 gc2 = ld2(sG + fx<K>(i, d0)), qn2 = ld2(sQN + fx<K>(i, d0)), kn2 = ld2(sKN + fx<K>(i, d0));
          const float em[2] = {ex2_approx_ftz(gc2.x - gr2.x), ex2_approx_ftz(gc2.y - gr2.y)};
          const float ei[2] = {ex2_approx_ftz(gr2.x - gc2.x), ex2_approx_ftz(gr2.y - gc2.y)};
          // the high parts rounded again, the low parts from [B6]'s tiles
          const u32 hq = pack_bf16x2(qn2.x * (em[0] * scale), qn2.y * (em[1] * scale));
          const u32 hk = pack_bf16x2(kn2.x * em[0], kn2.y * em[1]), hi = pack_bf16x2(kn2.x * ei[0], kn2.y * ei[1]);
          const u32 lq = *reinterpret_cast<const u32*>((LOWS_EARLY ? sQL : sQM) + i * TS + d0);
          const u32 lk = *reinterpret_cast<const u32*>((LOWS_EARLY ? sKML : sKM) + i * TS + d0);
          const u32 li = *reinterpret_cast<const u32*>((LOWS_EARLY ? sKIL : sKI) + i * TS + d0);
          const float q16[2] = {bf16_lo(hq) + bf16_lo(lq), bf16_hi(hq) + bf16_hi(lq)};
          const float km16[2] = {bf16_lo(hk) + bf16_lo(lk), bf16_hi(hk) + bf16_hi(lk)};
          const float ki16[2] = {bf16_lo(hi) + bf16_lo(li), bf16_hi(hi) + bf16_hi(li)};
          float dq2[2], dk2[2], dg2[2], g2s[2];
#pragma unroll
          for (int e1 = 0; e1 < 2; ++e1) {
            const int e = 2 * h2 + e1;
            const float dqm = aQm[jt][e], dkm = aKm[jt][e], dki = aKi[jt][e];
            dq2[e1] = dqm * (em[e1] * scale);
            dk2[e1] = dkm * em[e1] + dki * ei[e1];
            dg2[e1] = q16[e1] * dqm + km16[e1] * dkm;
            g2s[e1] = ki16[e1] * dki;
          }
          in_chunk_terms(jt, h2, dq2, dk2, dg2, g2s);
        }
      }
    } else {  // pair form: fma chains over the partner row p, in order, each row read once for the lane's rows
      // gq, gq + 8 and JG channel pairs
#pragma unroll
      for (int j0 = 0; j0 < NKT; j0 += JG) {
        float gcs[JG][2][2], A[JG][2][2] = {}, B[JG][2][2] = {}, Cm[JG][2][2] = {}, Cl[JG][2][2] = {};
#pragma unroll
        for (int jj = 0; jj < JG; ++jj) {
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const float2 gc2 = ld2(sG + fx<K>(gq + 8 * h2, n0w + 8 * (j0 + jj) + 2 * tq));
            gcs[jj][h2][0] = gc2.x, gcs[jj][h2][1] = gc2.y;
          }
        }
        for (int p = 0; p < CHUNK; ++p) {
          float dmr[2], dlr[2], dmc[2], dlc[2];
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int i = gq + 8 * h2;
            dmr[h2] = sDM[sw(i, p)], dlr[h2] = sDL[sw(i, p)], dmc[h2] = sDM[sw(p, i)], dlc[h2] = sDL[sw(p, i)];
          }
#pragma unroll
          for (int jj = 0; jj < JG; ++jj) {
            const int d0 = n0w + 8 * (j0 + jj) + 2 * tq;
            const float2 gp2 = ld2(sG + fx<K>(p, d0)), kp2 = ld2(sKN + fx<K>(p, d0)), qp2 = ld2(sQN + fx<K>(p, d0));
            const float gp[2] = {gp2.x, gp2.y}, kp[2] = {kp2.x, kp2.y}, qp[2] = {qp2.x, qp2.y};
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
              const int i = gq + 8 * h2;
#pragma unroll
              for (int e1 = 0; e1 < 2; ++e1) {
                const float gc = gcs[jj][h2][e1];
                const float erp = ex2_approx_ftz(gc - gp[e1]), epr = ex2_approx_ftz(gp[e1] - gc);
                if (p <= i) A[jj][h2][e1] = fmaf(dmr[h2] * kp[e1], erp, A[jj][h2][e1]);
                if (p < i) B[jj][h2][e1] = fmaf(dlr[h2] * kp[e1], erp, B[jj][h2][e1]);
                if (p >= i) Cm[jj][h2][e1] = fmaf(dmc[h2] * (qp[e1] * scale), epr, Cm[jj][h2][e1]);
                if (p > i) Cl[jj][h2][e1] = fmaf(dlc[h2] * kp[e1], epr, Cl[jj][h2][e1]);
              }
            }
          }
        }
#pragma unroll
        for (int jj = 0; jj < JG; ++jj) {
          const int d0 = n0w + 8 * (j0 + jj) + 2 * tq;
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int i = gq + 8 * h2;
            const float2 qn2 = ld2(sQN + fx<K>(i, d0)), kn2 = ld2(sKN + fx<K>(i, d0));
            const float qn[2] = {qn2.x, qn2.y}, kn[2] = {kn2.x, kn2.y};
            float dq2[2], dk2[2], dg2[2], g2s[2];
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1) {
              const float a_ = A[jj][h2][e1], b_ = B[jj][h2][e1], Mi = Cm[jj][h2][e1] + Cl[jj][h2][e1];
              dq2[e1] = a_ * scale;
              dk2[e1] = b_ + Mi;
              dg2[e1] = (qn[e1] * scale) * a_ + kn[e1] * b_;
              g2s[e1] = kn[e1] * Mi;
            }
            in_chunk_terms(j0 + jj, h2, dq2, dk2, dg2, g2s);
          }
        }
      }
    }
    __syncthreads();
    // [B8] per channel: the decay's gradient (natural units), the gates' backward, partial sums
#pragma unroll
    for (int m = 0; m < NCOL; ++m) {
      const int c = tid + NT * m;
      if (ANY && c < K && c >= kdim) {  // a padded channel: no gradient, nothing to the sums
        if (part_ddt != nullptr) part_ddt[hs * K + c] = 0.f;
        sColA[c] = 0.f;
      } else if (c < K) {
        // the raw gate inputs: [2]'s shared copy (K <= 128), else a global load a row
        const auto g_at = [&](int i) {
          return B8_UNROLLED ? sGRAW[fx<K>(i, c)] : load_f32<KDA_G_DT>(g, b * g_sb + (t0 + i) * g_st + hv * g_sh + c);
        };
        const float G8 = sGexp[c] * dge[m];
        float suf = 0.f;
        for (int i = CHUNK - 1; i >= 0; --i) {
          suf += sDGAM[fx<K>(i, c)];
          sDGAM[fx<K>(i, c)] = suf;
        }
        float pre = 0.f, ddt = 0.f, dA = 0.f;
        const float bias = bias_row == nullptr ? 0.f : B8_UNROLLED ? sBIAS[c] : bias_row[c];
#pragma unroll(B8_UNROLLED ? CHUNK : 1)
        for (int i = 0; i < CHUNK; ++i) {
          const float dgn = sDGAM[fx<K>(i, c)] + (pre + G8);
          pre += sKT[fx<K>(i, c)];
          if (i < rows) {
            float dx = dgn;
            if constexpr (KDA_GATE != KDA_GATE_LOG) {
              const float graw_i = g_at(i), x = graw_i + bias;
              if constexpr (KDA_GATE == KDA_GATE_SOFTPLUS) {
                const float s = x > 15.0f ? 1.0f : rcp_approx_ftz(1.0f + ex2_approx_ftz(-x * LOG2E_F));
                dx = -((a * s) * dgn);
                dA += dgn * (gate_log2<KDA_GATE_SOFTPLUS>(graw_i, a, bias, lb2) * LN2_F);
              } else {
                const float y = a * x;
                const float s1 = rcp_approx_ftz(1.0f + ex2_approx_ftz(-y * LOG2E_F));
                const float s2 = rcp_approx_ftz(1.0f + ex2_approx_ftz(y * LOG2E_F));
                const float dy = (lb * (s1 * s2)) * dgn;
                dx = a * dy;
                dA += dy * y;
              }
            }
            ddt += dx;
            store_f32<KDA_G_DT>(dg, ((tok0 + i) * HV + hv) * kdim + c, dx);
          }
        }
        if (part_ddt != nullptr) part_ddt[hs * K + c] = ddt;
        sColA[c] = dA;
      }
    }
    __syncthreads();  // [B8]'s per-channel terms are in (and dq, dk's sums complete since [B7])
    // dA_log's partial, channels in order, by the last warp's first lane: beside [B9]'s dot products (warp 0),
    // or the next value head's first phases (their tiles' bytes are not sColA's until [4], past a barrier)
    if (part_dA != nullptr && tid == NT - 32) {
      float acc = 0.f;
#pragma unroll 4
      for (int c = 0; c < K; c += 4) {
        const float4 x = *reinterpret_cast<const float4*>(sColA + c);
        acc += x.x;
        acc += x.y;
        acc += x.z;
        acc += x.w;
      }
      part_dA[hs] = acc;
    }
  }

  // [B9] dq, dk through the l2norm, by the row phases' threads: each its channels' dot products (in order),
  // the row's 8 sums by xor shuffles 4, 2, 1, ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)); then the rows by 16-byte
  // pieces (whole sectors). The last value head's barrier after [B8] orders their reads after every [B7] sum.
  if (rowt) {  // (whole warps: the shuffles)
    // the row's values held in registers over the shuffles (K <= 128; K = 256's 128 registers read them again)
    constexpr int HS = B9_HOLD ? SEG : 1;
    float hq[HS], hk[HS], qs[HS], ks[HS], dotq = 0.f, dotk = 0.f;
    const auto row_pair = [&](const float* t, int x) { return ld2(t + fx<K>(r, (s8 + 8 * (x / E)) * E + x % E)); };
    if constexpr (KDA_L2NORM || B9_HOLD) {
#pragma unroll
      for (int x = 0; x < SEG; x += 2) {
        const float2 dq2 = row_pair(sDQN, x), dk2 = row_pair(sDKN, x);
        if constexpr (B9_HOLD) hq[x] = dq2.x, hq[x + 1] = dq2.y, hk[x] = dk2.x, hk[x + 1] = dk2.y;
        if constexpr (KDA_L2NORM) {
          const float2 qn2 = row_pair(sQN, x), kn2 = row_pair(sKN, x);
          if constexpr (B9_HOLD) qs[x] = qn2.x, qs[x + 1] = qn2.y, ks[x] = kn2.x, ks[x + 1] = kn2.y;
          dotq = fmaf(qn2.x, dq2.x, dotq);
          dotq = fmaf(qn2.y, dq2.y, dotq);
          dotk = fmaf(kn2.x, dk2.x, dotk);
          dotk = fmaf(kn2.y, dk2.y, dotk);
        }
      }
    }
    if constexpr (KDA_L2NORM) {
#pragma unroll
      for (int m = 4; m >= 1; m >>= 1) {  // (as rows.cuh's sums of squares)
        dotq += __shfl_xor_sync(0xffffffffu, dotq, m);
        dotk += __shfl_xor_sync(0xffffffffu, dotk, m);
      }
    }
#pragma unroll(B9_HOLD ? PPS : B9_PIECES_UNROLLED)
    for (int v = 0; v < PPS; ++v) {
      if (!live) break;  // (a padded row: nothing to store)
      const int c0 = (s8 + 8 * v) * E;
      float xq[E], xk[E];
#pragma unroll
      for (int e = 0; e < E; e += 2) {
        const int x = v * E + e;
        const float2 dq2 = B9_HOLD ? make_float2(hq[x % HS], hq[(x + 1) % HS]) : row_pair(sDQN, x);
        const float2 dk2 = B9_HOLD ? make_float2(hk[x % HS], hk[(x + 1) % HS]) : row_pair(sDKN, x);
        xq[e] = dq2.x, xq[e + 1] = dq2.y, xk[e] = dk2.x, xk[e + 1] = dk2.y;
        if constexpr (KDA_L2NORM) {
          const float2 qn2 = B9_HOLD ? make_float2(qs[x % HS], qs[(x + 1) % HS]) : row_pair(sQN, x);
          const float2 kn2 = B9_HOLD ? make_float2(ks[x % HS], ks[(x + 1) % HS]) : row_pair(sKN, x);
          xq[e] = sRQ[r] * fmaf(-qn2.x, dotq, xq[e]);
          xq[e + 1] = sRQ[r] * fmaf(-qn2.y, dotq, xq[e + 1]);
          xk[e] = sRK[r] * fmaf(-kn2.x, dotk, xk[e]);
          xk[e + 1] = sRK[r] * fmaf(-kn2.y, dotk, xk[e + 1]);
        }
      }
      const i64 o = ((tok0 + r) * H + h) * kdim + c0;
      Vec16 wq, wk;
      if constexpr (KDA_DT == KDA_F32) {
#pragma unroll
        for (int e = 0; e < 4; ++e) wq.w[e] = __float_as_uint(xq[e]), wk.w[e] = __float_as_uint(xk[e]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) wq.w[e] = pack2(xq[2 * e], xq[2 * e + 1]), wk.w[e] = pack2(xk[2 * e], xk[2 * e + 1]);
      }
      if constexpr (ANY) {
        store_vec16_dims<ES>(static_cast<unsigned char*>(dq) + o * ES, wq, kdim - c0);
        store_vec16_dims<ES>(static_cast<unsigned char*>(dk) + o * ES, wk, kdim - c0);
      } else {
        *reinterpret_cast<Vec16*>(static_cast<unsigned char*>(dq) + o * ES) = wq;
        *reinterpret_cast<Vec16*>(static_cast<unsigned char*>(dk) + o * ES) = wk;
      }
    }
  }
}

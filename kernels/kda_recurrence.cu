// kda_recurrence: the sequential half of the KDA forward (docs/design.md section 5).
// One CTA per (sequence, value head, slice of BV value rows); each warp owns 16
// value rows of the state S [V, K] and keeps them in registers for the whole
// sequence, in the mma accumulator layout, which is also the A-operand layout:
// every state matmul has the state as A (M = value rows), and nothing about the
// state goes through shared memory. Per 16-token chunk, streamed through a
// cp.async pipeline of KDA_STAGES stages from the prepare kernel's workspace:
//   W^T = S k_dec^T;  vsub^T = bf16(beta (v^T - W^T));  U^T = bf16(vsub^T INV^T)
//   o^T = S q_dec^T + U^T Mqk^T;  S = fma(S, gexp, U^T k_res)   (one fp32 FMA each)
// Rounding points: kdacupy/numerics/precision.py steps [10]-[16].
//
// Rendered configuration: KDA_K, KDA_V, KDA_DT (v and o), KDA_BV, KDA_STAGES,
// KDA_STATE_FP32, WS_* and RSM_* layouts; optional KDA_NO_OUTPUT (1: o is
// neither computed nor written, only the final state: the segment maps of the
// sequence-parallel forward, kdacupy/seqpar.py); optional KDA_STORE_STATES (1: the state at
// each chunk's start, as held, goes to ``states`` [HV, slots, V, K]: what the backward reads,
// kdacupy/ops/backward/); optional KDA_CHECKPOINTS (1: the state after every ``ckpt_every`` chunks of
// a sequence, as held, goes to ``ckpt`` [rows, HV, ., .] in the state layout and the ckpt_dtype
// precision: boundary j of sequence n, the state after its first j * ckpt_every * 16 tokens, to row
// ckpt_idx[n, j - 1] (without ckpt_idx: n * ckpt_per_seq + j - 1), for j <= ckpt_per_seq; a row
// outside [0, ckpt_rows) is skipped: prefix caching, docs/design.md section 7.1).
#include "common.cuh"
#include "chunk_stream.cuh"
#include "fragments.cuh"
#include "state_io.cuh"

#ifndef KDA_NO_OUTPUT
#define KDA_NO_OUTPUT 0
#endif
#ifndef KDA_STORE_STATES
#define KDA_STORE_STATES 0
#endif
#ifndef KDA_CHECKPOINTS
#define KDA_CHECKPOINTS 0
#endif

namespace {
using namespace kda;

constexpr int K = KDA_K;
constexpr int V = KDA_V;
constexpr int BV = KDA_BV;
constexpr int NW = BV / 16;
constexpr int NT = NW * 32;
constexpr int STAGES = KDA_STAGES;
constexpr bool FP32_STATE = KDA_STATE_FP32;
constexpr bool OUTPUT = !KDA_NO_OUTPUT;
constexpr int KS = K / 16;            // k-steps of the state matmuls
constexpr int TS = K + 8;             // padded bf16 row of a [16, K] tile (elements)
constexpr int SR = 24;                // padded row of a 16x16 tile (elements)
constexpr int ES = elem_bytes<KDA_DT>();
constexpr int VCH = BV * ES / 16;     // 16-byte pieces per value-tile row

static_assert(V % BV == 0 && BV % 16 == 0, "value slices are whole warps");
static_assert(RSM_BETA == RSM_GEXP + K * 4, "gexp and beta travel together");
static_assert(RSM_KDEC == RSM_QDEC + CHUNK * TS * 2 && RSM_KRES == RSM_KDEC + CHUNK * TS * 2, "smem tiles");

// Queue the copies of one chunk (workspace block + value tile) into a stage; without the output,
// q_dec and Mqk are never read: not copied.
__device__ __forceinline__ void load_chunk(unsigned char* stage, const unsigned char* blk,
                                           const unsigned char* vrow0, i64 v_row_bytes, int rows, int tid) {
  copy_ws_block<K, NT, RSM_QDEC, RSM_INV, RSM_MQK, RSM_GEXP, OUTPUT>(stage, blk, tid);
  copy_rows_zfill<NT, VCH, RSM_VROW>(stage + RSM_VT, vrow0, v_row_bytes, rows, tid);
}

// The state this CTA reads and writes: sequence n's, or with a pool its slot idx[n]'s; -1 for a
// slot outside [0, P) (padding: nothing read or written).
__device__ __forceinline__ i64 state_slot(int n, int hv, int HV, const void* pool_idx, int pool_idx_i64, i64 pool_slots) {
  if (pool_idx == nullptr) return static_cast<i64>(n) * HV + hv;
  const i64 slot = pool_idx_i64 ? static_cast<const i64*>(pool_idx)[n] : static_cast<const i32*>(pool_idx)[n];
  return slot < 0 || slot >= pool_slots ? -1 : slot * HV + hv;
}

}  // namespace

// A minimum-blocks figure that allows 256 registers per thread makes ptxas use what it needs; left
// to itself it settles short and spills a few bytes: at 128 with the fp32 state (twice the
// registers), at 80 for the state store on sm_100a and, since the whole-sector state I/O, for the
// bf16 state at K = 64, BV = 64, 3 stages on sm_80.
#if KDA_STATE_FP32 || KDA_STORE_STATES || KDA_CHECKPOINTS || KDA_K <= 64
#define KDA_RECURRENCE_BOUNDS __launch_bounds__(NT, 256 / NT)
#else
#define KDA_RECURRENCE_BOUNDS __launch_bounds__(NT)
#endif
extern "C" __global__ void KDA_RECURRENCE_BOUNDS kda_recurrence(
    const unsigned char* ws, const void* v, i64 v_sb, i64 v_st, i64 v_sh, void* o, i64 o_sb, i64 o_st, i64 o_sh,
    const void* s_in, int s_in_dtype, void* s_out, int s_out_dtype, int layout_vk,
    const void* cu_seqlens, int cu_is_i64, int T, int HV, int nslots, int chunks_per_seq,
    const void* pool_idx, int pool_idx_i64, i64 pool_slots, unsigned char* states,
    void* ckpt, int ckpt_dtype, const void* ckpt_idx, int ckpt_i64, i64 ckpt_rows, int ckpt_per_seq, int ckpt_every) {
  constexpr int VB = V / BV;
  const int n = blockIdx.x / VB, v0 = (blockIdx.x % VB) * BV, hv = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int vw = v0 + 16 * warp;  // first value row of this warp
  // state pool (s_in == s_out): slot idx[n]; outside [0, P) starts from zeros, stores nothing
  const i64 nh = state_slot(n, hv, HV, pool_idx, pool_idx_i64, pool_slots);
  if (nh < 0) s_in_dtype = KDA_STATE_NONE;
  const Seq seq = sequence(cu_seqlens, cu_is_i64, n, T);

  if (seq.len == 0) {  // [16] the final state is the initial state, converted only
    if (s_out != nullptr && nh >= 0) copy_state_rows<V, K>(s_out, s_out_dtype, s_in, s_in_dtype, layout_vk, nh, vw, lane);
    return;
  }

  unsigned char* sm = dynamic_smem();
  const int b = cu_seqlens == nullptr ? n : 0;
  const i64 tok0 = cu_seqlens == nullptr ? 0 : seq.bos;
  const unsigned char* vbase = static_cast<const unsigned char*>(v) +
                               (b * v_sb + tok0 * v_st + hv * v_sh + v0) * ES;
  const unsigned char* wsbase = ws + (static_cast<i64>(hv) * nslots + first_slot(cu_seqlens, n, seq.bos, chunks_per_seq)) * WS_STRIDE;
  const int nchunks = (seq.len + CHUNK - 1) / CHUNK;
  auto issue = [&](int c) {
    if (c < nchunks) {
      const int rows = seq.len - c * CHUNK < CHUNK ? seq.len - c * CHUNK : CHUNK;
      load_chunk(sm + (c % STAGES) * RSM_STAGE, wsbase + static_cast<i64>(c) * WS_STRIDE,
                 vbase + static_cast<i64>(c) * CHUNK * v_st * ES, v_st * ES, rows, tid);
    }
    cp_async_commit();  // always, so the group count stays uniform
  };
#pragma unroll 1
  for (int c = 0; c < STAGES - 1; ++c) issue(c);

  // [10] the warp's 16 x K slice of the state: n-tile j holds (row g / g+8, column 8j + 2t, +1),
  // read 16 keys at a time in whole sectors, after the first copies are issued (read before them,
  // it cost spills at the register limit: K = 256, fp32 state)
  float Sf[FP32_STATE ? K / 8 : 1][4];
  u32 Sa[FP32_STATE ? 1 : KS][4];
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    float x[2][4];
    load_state_cols16<V, K>(x, s_in, s_in_dtype, layout_vk, nh, vw, s, g, t);
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      if constexpr (FP32_STATE) {
#pragma unroll
        for (int e = 0; e < 4; ++e) Sf[2 * s + jj][e] = x[jj][e];
      } else {
        Sa[s][2 * jj] = pack_bf16x2(x[jj][0], x[jj][1]);
        Sa[s][2 * jj + 1] = pack_bf16x2(x[jj][2], x[jj][3]);
      }
    }
  }

  // [16] the state as held, 16 keys at a time in whole sectors, to state nh of dst (the final state;
  // with KDA_CHECKPOINTS also each boundary's)
  auto store_held = [&](void* dst, int dtype, i64 nh_dst) {
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      float x[2][4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (FP32_STATE) {
            x[jj][e] = Sf[2 * s + jj][e];
          } else {
            x[jj][e] = (e & 1) ? bf16_hi(Sa[s][2 * jj + (e >> 1)]) : bf16_lo(Sa[s][2 * jj + (e >> 1)]);
          }
        }
      }
      store_state_cols16<V, K>(dst, dtype, layout_vk, nh_dst, vw, s, g, t, x);
    }
  };

  // ldmatrix lane addresses in a 16x16 window of a row-major 16-bit tile:
  const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1);  // B = tile^T
  const int trow = (lane & 7) + 8 * ((lane >> 3) & 1), tcol = 8 * (lane >> 4);  // B = tile, transposed load
  unsigned char* ot = sm + RSM_OT + warp * CHUNK * RSM_OROW;

#pragma unroll 1
  for (int c = 0; c < nchunks; ++c) {
    issue(c + STAGES - 1);
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    const unsigned char* st = sm + (c % STAGES) * RSM_STAGE;
    const u16* qdec = reinterpret_cast<const u16*>(st + RSM_QDEC);
    const u16* kdec = reinterpret_cast<const u16*>(st + RSM_KDEC);
    const u16* kres = reinterpret_cast<const u16*>(st + RSM_KRES);
    const float* gexp = reinterpret_cast<const float*>(st + RSM_GEXP);
    const float* bet = reinterpret_cast<const float*>(st + RSM_BETA);

#if KDA_STORE_STATES
    {  // the state entering chunk c, [V, K] rows of this warp, in the precision it is held in
      const i64 blk = (static_cast<i64>(hv) * nslots + first_slot(cu_seqlens, n, seq.bos, chunks_per_seq) + c) * V;
#pragma unroll
      for (int s = 0; s < KS; ++s) {
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const i64 row = (blk + vw + g + 8 * h2) * K + 16 * s;  // whole 32-byte sectors per quad
          if constexpr (FP32_STATE) {
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              Vec8 x;
              x.w[0] = __float_as_uint(Sf[2 * s + jj][2 * h2]);
              x.w[1] = __float_as_uint(Sf[2 * s + jj][2 * h2 + 1]);
              *reinterpret_cast<Vec8*>(reinterpret_cast<float*>(states) + row + 8 * jj + 2 * t) = x;
            }
          } else {
            store_row16(reinterpret_cast<u16*>(states) + row, Sa[s][h2], Sa[s][2 + h2], t);
          }
        }
      }
    }
#endif

    // [11]-[12] W^T and the state part of o^T, both with the state as A
    float Wt[2][4] = {}, Ot[2][4] = {};
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      u32 a[4];
      if constexpr (FP32_STATE) {
        to_a_frag(a, Sf[2 * s], Sf[2 * s + 1]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = Sa[s][e];
      }
      u32 bk[4], bq[4] = {};
      ldmatrix_x4(bk, kdec + brow * TS + 16 * s + bcol);
      if constexpr (OUTPUT) ldmatrix_x4(bq, qdec + brow * TS + 16 * s + bcol);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const u32 b0[2] = {bk[2 * nt], bk[2 * nt + 1]}, b1[2] = {bq[2 * nt], bq[2 * nt + 1]};
        mma_bf16_m16n8k16(Wt[nt], a, b0, Wt[nt]);
        if constexpr (OUTPUT) mma_bf16_m16n8k16(Ot[nt], a, b1, Ot[nt]);
      }
    }

    // [12] vsub^T = bf16(beta * (v^T - W^T)), the values arriving as (row v, column token)
    float vt[2][4];
    load_tile_t<KDA_DT, RSM_VROW>(vt, st + RSM_VT, 16 * warp, lane);
    float vs[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) vs[nt][e] = bet[8 * nt + 2 * t + (e & 1)] * (vt[nt][e] - Wt[nt][e]);
    }
    u32 va[4];
    to_a_frag(va, vs);

    // [13] U^T = bf16(vsub^T INV^T): B[k = token j][n = token i] = INV[i][j], rows of INV
    float Ut[2][4] = {};
    mma_token_block<false>(Ut, va, reinterpret_cast<const u16*>(st + RSM_INV) + brow * SR + bcol);
    u32 ua[4];
    to_a_frag(ua, Ut);

    // [14] o^T += U^T Mqk^T, rounded once to the output dtype, staged per warp, stored by rows
    if constexpr (OUTPUT) {
      mma_token_block<false>(Ot, ua, reinterpret_cast<const u16*>(st + RSM_MQK) + brow * SR + bcol);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          store_f32<KDA_DT>(ot, (8 * nt + 2 * t + (e & 1)) * (RSM_OROW / ES) + g + 8 * (e >> 1), Ot[nt][e]);
        }
      }
      __syncwarp();
      constexpr int PIECES = 16 * ES / 16;  // 16-byte pieces per output row of this warp
      const int rows = seq.len - c * CHUNK < CHUNK ? seq.len - c * CHUNK : CHUNK;
      for (int p = lane; p < CHUNK * PIECES; p += 32) {
        const int r = p / PIECES, pc = p % PIECES;
        if (r < rows) {
          const i64 off = (b * o_sb + (tok0 + static_cast<i64>(c) * CHUNK + r) * o_st + hv * o_sh + vw) * ES;
          reinterpret_cast<Vec16*>(static_cast<unsigned char*>(o) + off)[pc] =
              reinterpret_cast<const Vec16*>(ot + r * RSM_OROW)[pc];
        }
      }
      __syncwarp();
    }

    // [15] S = fp32(dS + S * gexp), dS = U^T k_res: B[k = token][n = key] from rows of k_res, transposed
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      u32 br[4];
      ldmatrix_x4_trans(br, kres + trow * TS + 16 * s + tcol);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * s + jj;
        const u32 bb[2] = {br[2 * jj], br[2 * jj + 1]};
        const float zero[4] = {0.f, 0.f, 0.f, 0.f};
        float dS[4];
        mma_bf16_m16n8k16(dS, ua, bb, zero);
        const float ge0 = gexp[8 * j + 2 * t], ge1 = gexp[8 * j + 2 * t + 1];
        if constexpr (FP32_STATE) {
          Sf[j][0] = fmaf(Sf[j][0], ge0, dS[0]);
          Sf[j][1] = fmaf(Sf[j][1], ge1, dS[1]);
          Sf[j][2] = fmaf(Sf[j][2], ge0, dS[2]);
          Sf[j][3] = fmaf(Sf[j][3], ge1, dS[3]);
        } else {
          u32& top = Sa[s][2 * jj];
          u32& bot = Sa[s][2 * jj + 1];
          top = pack_bf16x2(fmaf(bf16_lo(top), ge0, dS[0]), fmaf(bf16_hi(top), ge1, dS[1]));
          bot = pack_bf16x2(fmaf(bf16_lo(bot), ge0, dS[2]), fmaf(bf16_hi(bot), ge1, dS[3]));
        }
      }
    }
#if KDA_CHECKPOINTS
    if ((c + 1) % ckpt_every == 0 && (c + 1) * CHUNK <= seq.len && (c + 1) / ckpt_every <= ckpt_per_seq) {
      const i64 e = static_cast<i64>(n) * ckpt_per_seq + (c + 1) / ckpt_every - 1;
      const i64 row = ckpt_idx == nullptr ? e
                      : ckpt_i64 ? static_cast<const i64*>(ckpt_idx)[e] : static_cast<const i32*>(ckpt_idx)[e];
      if (row >= 0 && row < ckpt_rows) store_held(ckpt, ckpt_dtype, row * HV + hv);
    }
#endif
    __syncthreads();  // the stage is refilled by the next iteration's issue()
  }
  cp_async_wait<0>();

  // [16] final state, 16 keys at a time in whole sectors; the slot is looked up again rather than
  // held across the chunk loop (at the register limit, K = 256 in fp32, holding it cost spills)
  const i64 nh_out = state_slot(n, hv, HV, pool_idx, pool_idx_i64, pool_slots);
  if (s_out != nullptr && nh_out >= 0) store_held(s_out, s_out_dtype, nh_out);
}

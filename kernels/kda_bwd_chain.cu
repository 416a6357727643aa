// kda_bwd_chain: the sequential half of the KDA backward (docs/design.md section 9.3).
// One CTA per (sequence, value head, slice of BV value rows), as kda_recurrence, walking the
// chunks in reverse: each warp keeps 16 value rows of D = dS^T [V, K], the gradient of the
// loss with respect to the state, in fp32 registers in the mma accumulator layout. Per chunk,
// streamed through a cp.async pipeline from the forward's prepare workspace and the do tile:
//   dS_c = bf16(D) (stored: the gradient at the chunk's end, for kda_bwd_chunk)
//   dU^T = bf16(do^T Mqk + D k_res^T) (D to 16 bits: two bf16 parts);  dY^T = dU^T INV;  dX^T = beta dY^T
//   D = fma(D, gexp, do^T q_dec - dX^T k_dec)          (the transposed transition)
// and at the sequence's start D is the initial state's gradient.
// Rounding points: kdacupy/numerics/backward_model.py steps [C1]-[C6].
//
// Rendered configuration: KDA_K, KDA_V, KDA_DT (do), KDA_BV, KDA_STAGES, WS_* (the forward's
// workspace, kdacupy/ops/forward/layouts.py) and BSM_* (kdacupy/ops/backward/layouts.py); optional
// KDA_ANY_DIMS (1: KDA_K, KDA_V are the tiles and the true head dims come as k_true, v_true, as in
// kda_recurrence: do and the states have their true extents, columns past v_true read as zero and are
// never written, ceil(v_true / BV) CTAs per sequence and head; dstates keeps the tiles).
// K = 256: shared addresses by the asm conversion (kernels/ptx.cuh's smem_addr says why)
#if KDA_K == 256
#define KDA_SMEM_ADDR_ASM 1
#endif
#include "common.cuh"
#include "chunk_stream.cuh"
#include "fragments.cuh"
#include "state_io.cuh"

#ifndef KDA_ANY_DIMS
#define KDA_ANY_DIMS 0
#endif

namespace {
using namespace kda;

constexpr int K = KDA_K;
constexpr bool ANY = KDA_ANY_DIMS;
constexpr int V = KDA_V;
constexpr int BV = KDA_BV;
constexpr int NW = BV / 16;
constexpr int NT = NW * 32;
constexpr int STAGES = KDA_STAGES;
constexpr int KS = K / 16;
constexpr int TS = K + 8;
constexpr int SR = 24;
constexpr int ES = elem_bytes<KDA_DT>();
constexpr int DCH = BV * ES / 16;

// [C2]'s Dop at K = 256: sm_100's ptxas spills less with it made one k-step at a time inside [C3]'s loop (a
// whole Dop holds K / 4 more registers next to D: BV = 16 spilled 16 bytes, 8 so), sm_80's and sm_90a's with
// it made whole first (per step they spilled up to 136 / 160 bytes); at K <= 128 whole first everywhere (per
// step took sm_100a's K = 128 from 233 to 250 registers). The same arithmetic in the same order either way;
// the emulation takes sm_100's choice.
#if defined(KDA_EMULATE) || __CUDA_ARCH__ >= 1000
constexpr bool DOP_PER_STEP = K >= 256;
#else
constexpr bool DOP_PER_STEP = false;
#endif

static_assert(V % BV == 0 && BV % 16 == 0, "value slices are whole warps");
static_assert(BSM_BETA == BSM_GEXP + K * 4, "gexp and beta travel together");
static_assert(BSM_KDEC == BSM_QDEC + CHUNK * TS * 2 && BSM_KRES == BSM_KDEC + CHUNK * TS * 2, "smem tiles");

// Queue the copies of one chunk (workspace block + do tile) into a stage; ``vcols``: the value columns
// from the slice's first that exist (ANY).
__device__ __forceinline__ void load_chunk(unsigned char* stage, const unsigned char* blk,
                                           const unsigned char* dorow0, i64 do_row_bytes, int rows, int vcols, int tid) {
  copy_ws_block<K, NT, BSM_QDEC, BSM_INV, BSM_MQK, BSM_GEXP, true>(stage, blk, tid);
  if constexpr (ANY) {
    fill_rows_dims<NT, DCH, BSM_DOROW, ES>(stage + BSM_DO, dorow0, do_row_bytes, rows, vcols, tid);
  } else {
    copy_rows_zfill<NT, DCH, BSM_DOROW>(stage + BSM_DO, dorow0, do_row_bytes, rows, tid);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NT, 256 / NT) kda_bwd_chain(
    const unsigned char* ws, const void* dout, i64 d_sb, i64 d_st, i64 d_sh,
    const void* dfinal, int dfinal_dtype, void* dinit, int dinit_dtype, int layout_vk, u16* dstates,
    const void* cu_seqlens, int cu_is_i64, int T, int HV, int nslots, int chunks_per_seq, int k_true, int v_true) {
  const int kdim = ANY ? k_true : K, vdim = ANY ? v_true : V;  // the true head dims (constants without ANY)
  const int VB = ANY ? (vdim + BV - 1) / BV : V / BV;
  const int n = blockIdx.x / VB, v0 = (blockIdx.x % VB) * BV, hv = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int vw = v0 + 16 * warp;
  const i64 nh = static_cast<i64>(n) * HV + hv;
  const Seq seq = sequence(cu_seqlens, cu_is_i64, n, T);

  if (seq.len == 0) {  // [C6] the initial state's gradient is the final state's
    if (dinit != nullptr) {
      if constexpr (ANY) {
        copy_state_rows_dims(dinit, dinit_dtype, dfinal, dfinal_dtype, layout_vk, nh, vw, lane, kdim, vdim);
      } else {
        copy_state_rows<V, K>(dinit, dinit_dtype, dfinal, dfinal_dtype, layout_vk, nh, vw, lane);
      }
    }
    return;
  }

  // [C1] the warp's 16 x K slice of D: n-tile j holds (row g / g+8, column 8j + 2t, +1)
  float D[K / 8][4];
#pragma unroll
  for (int j = 0; j < K / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (ANY) {
        const int v = vw + g + 8 * (e >> 1), kd = 8 * j + 2 * t + (e & 1);
        D[j][e] = v < vdim && kd < kdim ? load_state(dfinal, dfinal_dtype, state_index_dims(layout_vk, nh, v, kd, kdim, vdim))
                                        : 0.f;
      } else {
        D[j][e] = load_state(dfinal, dfinal_dtype, state_frag_index<V, K>(layout_vk, nh, vw, j, e, g, t));
      }
    }
  }

  unsigned char* sm = dynamic_smem();
  const int b = cu_seqlens == nullptr ? n : 0;
  const i64 tok0 = cu_seqlens == nullptr ? 0 : seq.bos;
  const unsigned char* dbase = static_cast<const unsigned char*>(dout) + (b * d_sb + tok0 * d_st + hv * d_sh + v0) * ES;
  const i64 slot0 = static_cast<i64>(hv) * nslots + first_slot(cu_seqlens, n, seq.bos, chunks_per_seq);
  const unsigned char* wsbase = ws + slot0 * WS_STRIDE;
  const int nchunks = (seq.len + CHUNK - 1) / CHUNK;
  auto issue = [&](int p) {  // the p-th chunk processed is chunk nchunks - 1 - p
    if (p < nchunks) {
      const int c = nchunks - 1 - p;
      const int rows = seq.len - c * CHUNK < CHUNK ? seq.len - c * CHUNK : CHUNK;
      load_chunk(sm + (p % STAGES) * BSM_STAGE, wsbase + static_cast<i64>(c) * WS_STRIDE,
                 dbase + static_cast<i64>(c) * CHUNK * d_st * ES, d_st * ES, rows, vdim - v0, tid);
    }
    cp_async_commit();
  };
#pragma unroll 1
  for (int p = 0; p < STAGES - 1; ++p) issue(p);

  const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1);  // B = tile^T
  const int trow = (lane & 7) + 8 * ((lane >> 3) & 1), tcol = 8 * (lane >> 4);  // B = tile, transposed load

#pragma unroll 1
  for (int p = 0; p < nchunks; ++p) {
    const int c = nchunks - 1 - p;
    issue(p + STAGES - 1);
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    const unsigned char* st = sm + (p % STAGES) * BSM_STAGE;
    const u16* qdec = reinterpret_cast<const u16*>(st + BSM_QDEC);
    const u16* kdec = reinterpret_cast<const u16*>(st + BSM_KDEC);
    const u16* kres = reinterpret_cast<const u16*>(st + BSM_KRES);
    const float* gexp = reinterpret_cast<const float*>(st + BSM_GEXP);
    const float* bet = reinterpret_cast<const float*>(st + BSM_BETA);

    // [C2] Dop = bf16(D), to dstates [HV, slots, V, K]: here, or per k-step in [C3] (DOP_PER_STEP)
    auto make_dop = [&](u32 (&dop)[4], int s) {
      to_a_frag(dop, D[2 * s], D[2 * s + 1]);
      u16* row = dstates + ((slot0 + c) * V + vw + g) * K + 16 * s;  // whole 32-byte sectors per quad
      store_row16(row, dop[0], dop[2], t);
      store_row16(row + 8 * K, dop[1], dop[3], t);
    };
    u32 Dall[DOP_PER_STEP ? 1 : KS][4];
    if constexpr (!DOP_PER_STEP) {
#pragma unroll
      for (int s = 0; s < KS; ++s) make_dop(Dall[s], s);
    }

    // do^T as an A operand (16 value rows x 16 tokens), from the tile's (token row, value column)
    float dt[2][4];
    load_tile_t<KDA_DT, BSM_DOROW>(dt, st + BSM_DO, 16 * warp, lane);
    u32 da[4];
    to_a_frag(da, dt);

    // [C3] dU^T = do^T Mqk, then + D k_res^T (k-steps over channels), D to 16 bits: Dop and its low part
    // bf16(D - Dop), the low part in an accumulator of its own (off the dependent path), added at the end
    float dUt[2][4] = {}, dUl[2][4] = {};
    mma_token_block<true>(dUt, da, reinterpret_cast<const u16*>(st + BSM_MQK) + trow * SR + tcol);
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      u32 Dop[4];
      if constexpr (DOP_PER_STEP) {
        make_dop(Dop, s);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) Dop[e] = Dall[s][e];
      }
      u32 bk[4], dl[4];
      ldmatrix_x4(bk, kres + brow * TS + 16 * s + bcol);
      mma2(dUt, Dop, bk);
      float r0[4], r1[4];  // D - Dop, exact in fp32 (Dop packs D[2s][0..3], then D[2s + 1][0..3], in pairs)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const u32 w0 = Dop[e >> 1], w1 = Dop[2 + (e >> 1)];
        r0[e] = D[2 * s][e] - ((e & 1) ? bf16_hi(w0) : bf16_lo(w0));
        r1[e] = D[2 * s + 1][e] - ((e & 1) ? bf16_hi(w1) : bf16_lo(w1));
      }
      to_a_frag(dl, r0, r1);
      mma2(dUl, dl, bk);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dUt[nt][e] += dUl[nt][e];
    }
    u32 ua[4];
    to_a_frag(ua, dUt);

    // [C4] dY^T = dU^T INV;  dX^T = dY^T beta, negated as an operand
    float dYt[2][4] = {};
    mma_token_block<true>(dYt, ua, reinterpret_cast<const u16*>(st + BSM_INV) + trow * SR + tcol);
    float nx[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) nx[nt][e] = -(dYt[nt][e] * bet[8 * nt + 2 * t + (e & 1)]);
    }
    u32 xa[4];
    to_a_frag(xa, nx);

    // [C5] D = fma(D, gexp, do^T q_dec + (-dX^T) k_dec)
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      u32 bq[4], bk[4];
      ldmatrix_x4_trans(bq, qdec + trow * TS + 16 * s + tcol);
      ldmatrix_x4_trans(bk, kdec + trow * TS + 16 * s + tcol);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * s + jj;
        const u32 b0[2] = {bq[2 * jj], bq[2 * jj + 1]}, b1[2] = {bk[2 * jj], bk[2 * jj + 1]};
        const float zero[4] = {0.f, 0.f, 0.f, 0.f};
        float acc[4];
        mma_bf16_m16n8k16(acc, da, b0, zero);
        mma_bf16_m16n8k16(acc, xa, b1, acc);
        const float ge0 = gexp[8 * j + 2 * t], ge1 = gexp[8 * j + 2 * t + 1];
        D[j][0] = fmaf(D[j][0], ge0, acc[0]);
        D[j][1] = fmaf(D[j][1], ge1, acc[1]);
        D[j][2] = fmaf(D[j][2], ge0, acc[2]);
        D[j][3] = fmaf(D[j][3], ge1, acc[3]);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's issue()
  }
  cp_async_wait<0>();

  // [C6] the initial state's gradient
  if (dinit != nullptr) {
#pragma unroll
    for (int j = 0; j < K / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (ANY) {
          const int v = vw + g + 8 * (e >> 1), kd = 8 * j + 2 * t + (e & 1);
          if (v < vdim && kd < kdim) store_state(dinit, dinit_dtype, state_index_dims(layout_vk, nh, v, kd, kdim, vdim), D[j][e]);
        } else {
          store_state(dinit, dinit_dtype, state_frag_index<V, K>(layout_vk, nh, vw, j, e, g, t), D[j][e]);
        }
      }
    }
  }
}

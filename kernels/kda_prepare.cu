// kda_prepare: the token-parallel half of the KDA forward (docs/design.md section 5).
// One CTA of 128 threads per (chunk slot, value head): l2norm, gate and beta
// activation, in-chunk cumulative decay, the decayed bf16 operands, the fp32
// forward-substitution inverse of (I + L) and the masked q.k block. Writes one
// workspace block (layout: kdacupy/ops/forward/layouts.py) that the recurrence streams.
// The rounding points are those of kdacupy/numerics/precision.py, step numbers in [].
//
// Rendered configuration: KDA_K, KDA_DT (q, k), KDA_G_DT, KDA_BETA_DT,
// KDA_GATE (KDA_GATE_LOG | _SOFTPLUS | _SIGMOID), KDA_BETA_MODE (KDA_BETA_NONE |
// _RAW | _SIGMOID | _SIGMOID2 = 2*sigmoid), KDA_L2NORM, WS_* and PSM_* layouts; optional
// KDA_WS_CORE (1: the workspace's 16-bit tiles in the core-matrix layout the wgmma recurrence's
// matrix descriptors read, layouts.core_offset; else row-major); optional KDA_ANY_DIMS (1: KDA_K is
// the key tile and the true head dim K <= KDA_K comes as the argument k_true: q, k, g and dt_bias
// rows have k_true channels, the ones past it read as zero and their gate is 0, so the workspace is
// exactly the key tile's over inputs padded with zeros; docs/design.md section 2).
#include "common.cuh"
#include "fragments.cuh"
#include "gates.cuh"
#include "prepare_steps.cuh"
#include "rows.cuh"

#ifndef KDA_WS_CORE
#define KDA_WS_CORE 0
#endif
#ifndef KDA_ANY_DIMS
#define KDA_ANY_DIMS 0
#endif
#ifndef KDA_G_PAIRS
#define KDA_G_PAIRS 0
#endif

namespace {
using namespace kda;

constexpr int K = KDA_K;  // the key tile (the head dim itself unless KDA_ANY_DIMS)
constexpr bool ANY = KDA_ANY_DIMS;
#if KDA_WS_CORE
// Byte offset of element (r, c) of a [16, C] workspace tile in the core-matrix layout
__device__ __forceinline__ int ws_core_off(int r, int c) { return (c >> 3) * (CHUNK * 16) + r * 16 + (c & 7) * 2; }
#endif
constexpr int NT = 128;
constexpr int TS = K + 8;        // padded bf16 tile row (elements)

// Who owns which channels (docs/design.md section 11: every global access a warp makes covers
// whole sectors). The 8 threads of row r = tid / 8 take the row's 16-byte pieces of q and k
// round robin: thread s = tid % 8 owns pieces s, s + 8, ... (PPS of them, E channels each;
// kernels/rows.cuh has the l2norm's sum in this ownership and the piece stores).
constexpr int E = 16 / elem_bytes<KDA_DT>();  // q / k channels per 16-byte piece
constexpr int PPS = K / E / 8;                // pieces per thread
constexpr int SEG = PPS * E;                  // channels per thread

// Owned channels (the core-layout workspace, the wgmma recurrence's): thread s computes on the row's
// channels [s SEG, (s + 1) SEG) (pieces s PPS + v), so its l2norm sum is one FMA chain with no hops
// between lanes (rows.cuh) and its workspace pieces fill whole sectors of the core matrices per warp
// request. The row-major workspace keeps pieces s + 8 v (a warp's stores of one v cover whole rows).
constexpr bool OWNED = KDA_WS_CORE;
__device__ __forceinline__ int piece_of(int s, int v) { return OWNED ? s * PPS + v : s + 8 * v; }
// 16-byte piece p's slot in a row of the input stage and of the [16, K] bf16 tiles: with OWNED, bit 3 up
// of p XORed into its low bits, so that 8 threads of a row meet 8 distinct 16-byte bank groups both when
// they copy pieces s + 8 v (coalesced global reads) and when they read or write pieces s PPS + v; the
// tiles' ldmatrix reads 8 rows of one slot, conflict-free as before (rows are TS elements apart).
template <int PER_THREAD> __device__ __forceinline__ int slot_of(int p) {
  static_assert(PER_THREAD >= 1 && (PER_THREAD & (PER_THREAD - 1)) == 0 && PER_THREAD <= 8, "slots per thread");
  return OWNED ? p ^ ((p >> 3) & (PER_THREAD - 1)) : p;
}
// element offset of channel c in a row of a [16, K] bf16 tile (8 channels a slot)
__device__ __forceinline__ int tile_col(int c) { return slot_of<(K / 64 > 0 ? K / 64 : 1)>(c >> 3) * 8 + (c & 7); }

// fp32 rows of [16, K] (the gate sums, and the pair form's q * scale and k): rows of PSM_GS floats with
// 4 words of pad after every 32 channels. Odd (= 1 mod 4): a warp reading a row segment per thread, one
// column of 16 rows, or 32 channels of one row meets 32 banks. KDA_G_PAIRS (the fused forward's build,
// whose registers have room: at kda_prepare's 128 the vector code spilled in some variants): = 2 mod 4,
// and the gates' stores [2] and [5]'s reads of a thread's own row go as 8-byte channel pairs, which
// meet all 32 banks across the 2 rows of a half-warp; a column of 16 rows then meets 16.
constexpr bool G_PAIRS = KDA_G_PAIRS;
__device__ __forceinline__ int gx(int r, int c) { return r * PSM_GS + c + 4 * (c >> 5); }
static_assert(PSM_GS % 4 == (G_PAIRS ? 2 : 1) && PSM_GS >= K + K / 8, "padded fp32 rows");
// channels c, c + 1 (c even) of row r of sG: one 8-byte load with KDA_G_PAIRS
__device__ __forceinline__ float2 g_pair(const float* g, int r, int c) {
  if constexpr (G_PAIRS) return *reinterpret_cast<const float2*>(g + gx(r, c));
  return make_float2(g[gx(r, c)], g[gx(r, c + 1)]);
}

// gates c .. c + 3 of row r into sG (as two channel pairs with KDA_G_PAIRS)
__device__ __forceinline__ void store_gate_quad(float* sG, int r, int c, const float (&gl)[4]) {
  if constexpr (G_PAIRS) {
    *reinterpret_cast<float2*>(sG + gx(r, c)) = make_float2(gl[0], gl[1]);
    *reinterpret_cast<float2*>(sG + gx(r, c + 2)) = make_float2(gl[2], gl[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) sG[gx(r, c + e)] = gl[e];
  }
}
// The gate loop the fused forward's producers' way (their registers have room; kda_prepare at its 128 spilled
// 4-12 bytes with it on sm_100a): unmasked, a padded row's gates zeroed after it (the stage holds zeros for the
// row, but a zero input's gate is not 0), and compiled twice, with the bias's quad loads and without, so no
// quad asks which.
#ifdef KDA_PREPARE_BODY_ONLY
constexpr bool LEAN_GATES = true;
#else
constexpr bool LEAN_GATES = false;
#endif
// a compile-time flag for a generic lambda's branches
template <bool B> struct Flag {
  static constexpr bool value = B;
};

// [16, 16] fp32 tiles (L, Mf): row i's 16 words permuted by an XOR of i's bits 1 and 2, so the
// mma accumulator stores of bf16_abt and a warp's 32 consecutive elements are conflict-free.
__device__ __forceinline__ int sw(int i, int j) { return i * CHUNK + (j ^ ((i >> 1 & 1) | (i >> 2 & 1) << 3)); }

// Row i of a [16, 16] fp32 tile in sw's layout, words j < i in logical order into l: ceil(i / 4) 16-byte loads
// (sw's XOR swaps words within a quad's pairs and quads two apart, both known once i is unrolled)
__device__ __forceinline__ void sw_row(const float* t, int i, float (&l)[CHUNK]) {
  const int m = sw(i, 0) - i * CHUNK;  // the row's XOR
#pragma unroll
  for (int q = 0; q < CHUNK / 4; ++q) {
    if (4 * q < i) {
      const float4 v = *reinterpret_cast<const float4*>(t + i * CHUNK + 4 * (q ^ (m >> 2)));
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int p = 0; p < 4; ++p) l[4 * q + p] = e[p ^ (m & 1)];
    }
  }
}

// 16x16 fp32 = A(16xK bf16 tile) B^T (B: 16xK bf16 tile), one warp, to dst [6] (kda_bwd_chunk has
// its own: its [16, 16] tiles use another swizzle and 8-byte stores). With al, bl (the operands' low
// bf16 parts) it takes three passes over the channels into one accumulator, a b^T, a bl^T, al b^T:
// the product of the fp32 operands to about 2^-16 (al bl^T left out).
template <int PASSES>
__device__ __forceinline__ void bf16_abt(float (&acc)[2][4], const u16* a, const u16* b, int lane, const u16* al = nullptr,
                                         const u16* bl = nullptr) {
  const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1), mcol = 8 * (lane >> 4);
  // B operand (k = channel, n = row j of b): row-major rows of b give k-pairs directly;
  // matrices (rows 0-7, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 0-7), (rows 8-15, k 8-15)
  const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll 1
  for (int pass = 0; pass < PASSES; ++pass) {
    const u16* x = pass == 2 ? al : a;
    const u16* y = pass == 1 ? bl : b;
#pragma unroll
    for (int s = 0; s < K / 16; ++s) {
      u32 af[4], bf[4];
      ldmatrix_x4(af, x + mrow * TS + tile_col(16 * s + mcol));
      ldmatrix_x4(bf, y + brow * TS + tile_col(16 * s + bcol));
      mma2(acc, af, bf);
    }
  }
}
// The accumulator of bf16_abt: lane (g, t) = (lane / 4, lane % 4) holds rows g, g + 8 (acc[nt][0, 1],
// acc[nt][2, 3]) at columns nt * 8 + 2 t and the next; f(row, col, x0, x1) takes each pair.
template <class F> __device__ __forceinline__ void abt_pairs(const float (&acc)[2][4], int lane, F f) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    f(g, nt * 8 + 2 * t, acc[nt][0], acc[nt][1]);
    f(g + 8, nt * 8 + 2 * t, acc[nt][2], acc[nt][3]);
  }
}

}  // namespace

// What one prepare reads: the inputs, their strides (elements) and the call's sizes.
struct PrepareIn {
  const void *q, *k, *g, *beta;
  i64 q_sb, q_st, q_sh, k_sb, k_st, k_sh, g_sb, g_st, g_sh, b_sb, b_st, b_sh;
  const float *A_log, *dt_bias;
  const void* cu_seqlens;
  int cu_is_i64, T, H, HV, nseq, chunks_per_seq;
  float scale, lb2;
  int k_true;
  int skip_last_of;  // > 0: the slots of every skip_last_of-th sequence's last are not written (the split forward's
                     // last segments, which its fused forward makes itself: kda_forward_fused.cu)
};

// Where slot ``slot`` of value head hv goes: the plain launch's workspace, every slot a block of its own;
// no hand-over to wait for or to publish (the fused forward's ring has both: kda_forward_fused.cu).
struct WorkspaceBlocks {
  unsigned char* ws;
  int nslots;
  __device__ __forceinline__ unsigned char* block(int hv, int slot) const {
    return ws + (static_cast<i64>(hv) * nslots + slot) * WS_STRIDE;
  }
  __device__ __forceinline__ void claim(int, int, int) const {}
  __device__ __forceinline__ void publish(int, int, int) const {}
};

// The one sequence a caller knows slots [first, last) lie in (the fused forward's split producers: an item is
// GROUP slots of one segment): where it starts, its length, its number and its first slot. n < 0: not known,
// each slot's found by the walk (and its bounds loaded) as it comes.
struct KnownSeq {
  i64 bos;
  int len, n, base;
};
constexpr KnownSeq UNKNOWN_SEQ{0, 0, -1, 0};

// Slots [first, last) of value head hv, in a software pipeline; ``blocks`` places each slot's block
// (claim: before its first store, by every thread; publish: after its last, by every thread).
template <class Blocks>
__device__ __forceinline__ void prepare_slots(const PrepareIn& in, int hv, int first, int last, const Blocks& blocks,
                                              const KnownSeq known = UNKNOWN_SEQ) {
  const void *const q = in.q, *const k = in.k, *const g = in.g, *const beta = in.beta;
  const i64 q_sb = in.q_sb, q_st = in.q_st, q_sh = in.q_sh, k_sb = in.k_sb, k_st = in.k_st, k_sh = in.k_sh;
  const i64 g_sb = in.g_sb, g_st = in.g_st, g_sh = in.g_sh, b_sb = in.b_sb, b_st = in.b_st, b_sh = in.b_sh;
  const float *const A_log = in.A_log, *const dt_bias = in.dt_bias;
  const void* const cu_seqlens = in.cu_seqlens;
  const int cu_is_i64 = in.cu_is_i64, T = in.T, H = in.H, HV = in.HV, nseq = in.nseq, chunks_per_seq = in.chunks_per_seq;
  const float scale = in.scale, lb2 = in.lb2;
  const int kdim = ANY ? in.k_true : K;  // the true head dim (a constant without KDA_ANY_DIMS)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r = tid >> 3, s = tid & 7;  // this thread's row and its place among the row's 8 threads
  const int h = hv / (HV / H);

  unsigned char* sm = dynamic_smem();
  float* sG = reinterpret_cast<float*>(sm + PSM_G);
  u16* sQm = reinterpret_cast<u16*>(sm + PSM_U);  // fast path: the factored form's q_m, k_m, k_i,
  u16* sKm = sQm + CHUNK * TS;                     // and the low parts of q_m and k_i (Mf's)
  u16* sKi = sKm + CHUNK * TS;
  u16* sQml = sKi + CHUNK * TS;
  u16* sKil = sQml + CHUNK * TS;
  float* sQs = reinterpret_cast<float*>(sm + PSM_U);  // pair path: q * scale
  float* sKn = sQs + CHUNK * PSM_GS;                  // pair path: k
  float* sL = reinterpret_cast<float*>(sm + PSM_L);
  float* sM = reinterpret_cast<float*>(sm + PSM_M);
  float* sBeta = reinterpret_cast<float*>(sm + PSM_BETA);
  float* sRef = reinterpret_cast<float*>(sm + PSM_REF);  // a row of sG's padding: the row phase's reads meet 32 banks
  unsigned char* sInQ = sm + PSM_INQ;  // the input stage: the chunk's q, k rows ([16, K]) and g rows (PSM_GROW bytes apart)
  unsigned char* sInK = sm + PSM_INK;
  unsigned char* sInG = sm + PSM_ING;

  // where a slot's chunk is: its row b, its first token t0 within the row, its live rows (0: an unused slot)
  // (found again where needed: fewer registers live through [4]-[8] than carrying it)
  struct At {
    i64 t0;
    int b, rows;
  };
  SlotWalk walk = known.n >= 0 ? SlotWalk{known.n} : slot_walk_start(cu_seqlens, cu_is_i64, first, nseq, T, chunks_per_seq);
  const auto locate = [&](int slot) {  // slots asked in non-decreasing order
    At at{0, 0, 0};
    if (slot >= last) return at;
    if (known.n >= 0) {  // (no skip_last_of with a known sequence: its callers make only slots to be written)
      const int c0 = (slot - known.base) * CHUNK;
      at.rows = known.len - c0 < CHUNK ? known.len - c0 : CHUNK;
      at.b = cu_seqlens == nullptr ? known.n : 0;
      at.t0 = (cu_seqlens == nullptr ? 0 : known.bos) + c0;
      return at;
    }
    const int n = slot_walk_to(walk, cu_seqlens, cu_is_i64, slot, nseq, T, chunks_per_seq);
    if (in.skip_last_of > 0 && n % in.skip_last_of == in.skip_last_of - 1) return at;
    const Seq seq = sequence(cu_seqlens, cu_is_i64, n, T);
    const i64 c0 = (slot - first_slot(cu_seqlens, n, seq.bos, chunks_per_seq)) * CHUNK;
    if (c0 < 0 || c0 >= seq.len) return at;  // an unused slot (varlen padding)
    at.rows = seq.len - c0 < CHUNK ? static_cast<int>(seq.len - c0) : CHUNK;
    at.b = cu_seqlens == nullptr ? n : 0;
    at.t0 = (cu_seqlens == nullptr ? 0 : seq.bos) + c0;
    return at;
  };
  // queue this thread's pieces of row r of q, k (pieces s + 8 v, to their slots) and g (16-byte pieces
  // s + 8 u) into the stage; a padded row reads zeros. One commit group per chunk, empty for an unused slot.
  constexpr int GES = elem_bytes<KDA_G_DT>(), GPIECES = K * GES / 16;
  static_assert(GPIECES % 8 == 0, "whole 16-byte pieces of g per thread");
  const auto issue = [&](const At& at) {
    if (at.rows > 0) {
      const bool live = r < at.rows;
      const i64 tok = at.t0 + (live ? r : 0);
      const unsigned char* qrow = static_cast<const unsigned char*>(q) + (at.b * q_sb + tok * q_st + h * q_sh) * elem_bytes<KDA_DT>();
      const unsigned char* krow = static_cast<const unsigned char*>(k) + (at.b * k_sb + tok * k_st + h * k_sh) * elem_bytes<KDA_DT>();
      const unsigned char* grow = static_cast<const unsigned char*>(g) + (at.b * g_sb + tok * g_st + hv * g_sh) * GES;
#pragma unroll
      for (int v = 0; v < PPS; ++v) {
        const int off = (s + 8 * v) * 16, at = r * K * elem_bytes<KDA_DT>() + slot_of<PPS>(s + 8 * v) * 16;
        if constexpr (ANY) {  // rows of kdim channels: the piece's channels from (s + 8 v) E on
          fill_piece16<elem_bytes<KDA_DT>()>(sInQ + at, qrow + off, kdim - (s + 8 * v) * E, live);
          fill_piece16<elem_bytes<KDA_DT>()>(sInK + at, krow + off, kdim - (s + 8 * v) * E, live);
        } else {
          cp_async_16_zfill(sInQ + at, qrow + off, live);
          cp_async_16_zfill(sInK + at, krow + off, live);
        }
      }
#pragma unroll
      for (int u = 0; u < GPIECES / 8; ++u) {
        const int off = (s + 8 * u) * 16;
        if constexpr (ANY) {
          fill_piece16<GES>(sInG + r * PSM_GROW + off, grow + off, kdim - (s + 8 * u) * (16 / GES), live);
        } else {
          cp_async_16_zfill(sInG + r * PSM_GROW + off, grow + off, live);
        }
      }
    }
    cp_async_commit();
  };

  issue(locate(first));
#pragma unroll 1
  for (int slot = first; slot < last; ++slot) {
    const At cur = locate(slot);
    cp_async_wait<0>();
    __syncthreads();  // this chunk's rows are in the stage; the previous chunk's [8] is done with the tiles
    if (cur.rows == 0) {  // an unused slot: nothing to write
      issue(locate(slot + 1));
      continue;
    }
    const int rows = cur.rows;
    const bool live = r < rows;
    unsigned char* blk = blocks.block(hv, slot);
    blocks.claim(hv, slot, tid);
    const i64 t0 = cur.t0;
    const int b = cur.b;

    // [1] q and k rows from the stage (this thread: pieces p = piece_of(s, v), channels p E + e),
    // l2-normalised; padded rows are zero (the stage holds zeros for them)
    float qv[SEG], kv[SEG];
#pragma unroll
    for (int v = 0; v < PPS; ++v) {
      float pq[E], pk[E];
      const int at = r * K * elem_bytes<KDA_DT>() + slot_of<PPS>(piece_of(s, v)) * 16;
      load_row<KDA_DT>(sInQ + at, pq);
      load_row<KDA_DT>(sInK + at, pk);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        qv[v * E + e] = pq[e];
        kv[v * E + e] = pk[e];
      }
    }
    if constexpr (KDA_L2NORM) {
      float iq, ik;
      l2norm_qk_rows<E, PPS, OWNED>(qv, kv, s, iq, ik);
    }

    // [2] gate, zero on padded rows; four channels 4 (s + 8 v) .. + 3 at a time; the bias read as aligned
    // quads where it can be (any-size builds per channel). LEAN_GATES: the loop unmasked and in two copies.
    {
      const float a = gate_a<KDA_GATE>(A_log, hv);
      const float* bias_row = gate_bias_row<KDA_GATE, K>(dt_bias, hv, kdim);
      const bool bias_vec = !ANY && bias_row != nullptr && (reinterpret_cast<u64>(bias_row) & 15) == 0;
      const unsigned char* grow = sInG + r * PSM_GROW;
      const auto gates = [&](auto vec) {
#pragma unroll
        for (int v = 0; v < K / 32; ++v) {
          const int c = 4 * (s + 8 * v);
          // (kda_bwd_chunk's [2] reads the same; a shared helper cost the fp32 variants up to 14 registers on sm_100a)
          float gq[4] = {0.f, 0.f, 0.f, 0.f}, bq[4] = {0.f, 0.f, 0.f, 0.f};
          if (LEAN_GATES || live) load_quad<KDA_G_DT>(grow + c * elem_bytes<KDA_G_DT>(), gq);
          if (decltype(vec)::value || (!LEAN_GATES && bias_vec)) {
            load_quad<KDA_F32>(bias_row + c, bq);
          } else if (bias_row != nullptr) {
#pragma unroll
            for (int e = 0; e < 4; ++e) bq[e] = !ANY || c + e < kdim ? bias_row[c + e] : 0.f;
          }
          // [2]; a padded channel's gate is 0 (no decay), as a padded row's
          float gl[4];
#pragma unroll
          for (int e = 0; e < 4; e += 2) {  // two channels a pair instruction
            const float2 x = gate_log2_pair<KDA_GATE>(make_float2(gq[e], gq[e + 1]), a, make_float2(bq[e], bq[e + 1]), lb2);
            gl[e] = (LEAN_GATES || live) && (!ANY || c + e < kdim) ? x.x : 0.f;
            gl[e + 1] = (LEAN_GATES || live) && (!ANY || c + e + 1 < kdim) ? x.y : 0.f;
          }
          store_gate_quad(sG, r, c, gl);
        }
      };
      if (LEAN_GATES && bias_vec) {
        gates(Flag<true>{});
      } else {
        gates(Flag<false>{});
      }
      if (LEAN_GATES && !live) {
        const float zero[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int v = 0; v < K / 32; ++v) store_gate_quad(sG, r, 4 * (s + 8 * v), zero);
      }
    }
    // [3] beta
    if (tid < CHUNK) {
      const float bt = tid < rows ? beta_at<KDA_BETA_MODE, KDA_BETA_DT>(beta, b * b_sb + (t0 + tid) * b_st + hv * b_sh) : 0.f;
      sBeta[tid] = bt;
      reinterpret_cast<float*>(blk + WS_BETA)[tid] = bt;
    }
    __syncthreads();
    issue(locate(slot + 1));  // the stage is free: its rows are in registers and sG

    // [4] running sum over the chunk rows, per channel, sequential fp32, and its reference gr; [9] gexp = ex2(gt)
    const auto at = [](int i, int c) { return gx(i, c); };
    const bool unsafe = gate_cumsum<K, NT, KDA_GATE == KDA_GATE_SIGMOID>(
        sG, at, [&](int c, float x) { reinterpret_cast<float*>(blk + WS_GEXP)[c] = x; }, [&](int c, float x) { sRef[gx(0, c)] = x; },
        tid);

    // [5] decayed operands, piece by piece: the recurrence's (from the chunk's start) to the workspace,
    // the factored form's (from the reference gr) to shared memory for [6]
#pragma unroll
    for (int v = 0; v < PPS; ++v) {
      const int c0 = piece_of(s, v) * E;
      // the piece's running sums, read once for both passes
      float2 gcs[E / 2];
#pragma unroll
      for (int w = 0; w < E / 2; ++w) gcs[w] = g_pair(sG, r, c0 + 2 * w);
      // two passes over the piece, to the workspace then to shared memory: half the packed words live at once
      {
        u32 wq[E / 2], wk[E / 2], wr[E / 2];
#pragma unroll
        for (int w = 0; w < E / 2; ++w) {  // two channels a pair instruction (sm_100: FMUL2, FADD2)
          const int i = v * E + 2 * w, c = c0 + 2 * w;
          // (the last row's sums as two scalar loads: as a pair they cost sm_90a's build 16 instructions)
          const float2 gc = gcs[w], gt = make_float2(sG[gx(CHUNK - 1, c)], sG[gx(CHUNK - 1, c + 1)]);
          const float2 d = sub2_ftz(gt, gc);
          const float2 q2 = make_float2(qv[i], qv[i + 1]), k2 = make_float2(kv[i], kv[i + 1]);
          const float2 e = make_float2(ex2_approx_ftz(gc.x), ex2_approx_ftz(gc.y));
          const float2 qd = mul2_ftz(q2, mul2_ftz(e, make_float2(scale, scale))), kd = mul2_ftz(k2, e);
          const float2 kr = mul2_ftz(k2, make_float2(ex2_approx_ftz(d.x), ex2_approx_ftz(d.y)));
          wq[w] = pack_bf16x2(qd.x, qd.y);
          wk[w] = pack_bf16x2(kd.x, kd.y);
          wr[w] = pack_bf16x2(kr.x, kr.y);
        }
#if KDA_WS_CORE
        const i64 off = ws_core_off(r, c0);  // E <= 8 channels from c0 (a multiple of E): 2E contiguous bytes
#else
        const i64 off = (static_cast<i64>(r) * K + c0) * 2;
#endif
        store_piece<E>(blk + WS_QDEC + off, wq);
        store_piece<E>(blk + WS_KDEC + off, wk);
        store_piece<E>(blk + WS_KRES + off, wr);
      }
      if (!unsafe) {
        u32 wqm[E / 2], wqml[E / 2], wkm[E / 2], wi[E / 2], wil[E / 2];
#pragma unroll
        for (int w = 0; w < E / 2; ++w) {  // in pairs, as above
          const int i = v * E + 2 * w, c = c0 + 2 * w;
          // (the reference sums as two scalar loads too: as a pair they cost 4 bytes of spills in two of sm_90a's
          // fused builds at 168 registers, fp32 inputs)
          const float2 gc = gcs[w], gr = make_float2(sRef[gx(0, c)], sRef[gx(0, c + 1)]);
          const float2 dm = sub2_ftz(gc, gr), di = sub2_ftz(gr, gc);
          const float2 q2 = make_float2(qv[i], qv[i + 1]), k2 = make_float2(kv[i], kv[i + 1]);
          const float2 em = make_float2(ex2_approx_ftz(dm.x), ex2_approx_ftz(dm.y));
          const float2 qm = mul2_ftz(q2, mul2_ftz(em, make_float2(scale, scale))), km = mul2_ftz(k2, em);
          const float2 ki = mul2_ftz(k2, make_float2(ex2_approx_ftz(di.x), ex2_approx_ftz(di.y)));
          split_bf16x2(qm, wqm[w], wqml[w]);
          wkm[w] = pack_bf16x2(km.x, km.y);
          split_bf16x2(ki, wi[w], wil[w]);
        }
        const int at = r * TS + tile_col(c0);
        store_piece<E>(sQm + at, wqm);
        store_piece<E>(sKm + at, wkm);
        store_piece<E>(sKi + at, wi);
        store_piece<E>(sQml + at, wqml);
        store_piece<E>(sKil + at, wil);
      }
    }
    if (unsafe) {
#pragma unroll
      for (int v = 0; v < PPS; ++v) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int c = piece_of(s, v) * E + e;
          sQs[gx(r, c)] = qv[v * E + e] * scale;
          sKn[gx(r, c)] = kv[v * E + e];
        }
      }
    }
    __syncthreads();

    // [6] L = k_m k_i^T; Mf = q_m k_i^T with q_m and k_i in two parts each (only the output reads
    // Mf: L stays the product of the bf16 keys, as the recurrence's k_dec, k_res are bf16). On this
    // (factored) path each warp finishes its product from its accumulators: [7] Lb = fp32(L * beta)
    // strictly lower, and L's warp goes on to [8] after its own lanes' stores; [9] Mqk = bf16(Mf) on and
    // below the diagonal, straight to the workspace (column pairs: 4-byte stores).
    // the two products' warps rotate chunk by chunk: warp w of every CTA shares scheduler w mod 4,
    // so fixed roles would load one scheduler of every SM with both extras of all its CTAs. Not with
    // fp32 gates: their quads leave no register for the role (spills at the 128-register bound)
    const int role = elem_bytes<KDA_G_DT>() == 2 ? (warp - slot) & (NT / 32 - 1) : warp;
    if (!unsafe) {
      float acc[2][4];
      if (role == 0) {
        bf16_abt<1>(acc, sKm, sKi, lane);
        abt_pairs(acc, lane, [&](int i, int j, float x0, float x1) {
          sL[sw(i, j)] = i > j ? x0 * sBeta[i] : 0.f;
          sL[sw(i, j + 1)] = i > j + 1 ? x1 * sBeta[i] : 0.f;
        });
        __syncwarp();  // its lanes' Lb before [8] (below)
      } else if (role == 1) {
        bf16_abt<3>(acc, sQm, sKi, lane, sQml, sKil);
        abt_pairs(acc, lane, [&](int i, int j, float x0, float x1) {
          const u32 w = static_cast<u32>(i >= j ? f32_to_bf16(x0) : u16(0)) |
                        static_cast<u32>(i >= j + 1 ? f32_to_bf16(x1) : u16(0)) << 16;
#if KDA_WS_CORE
          *reinterpret_cast<u32*>(blk + WS_MQK + ws_core_off(i, j)) = w;
#else
          reinterpret_cast<u32*>(blk + WS_MQK)[(i * CHUNK + j) / 2] = w;
#endif
        });
      }
    } else {
      // pair form: every product of two decays taken as one exponent difference. Threads 0-119
      // take one pair i > j each and get L_ij and Mf_ij from one ex2 per channel; the 16
      // diagonals Mf_ii run on warp 3, whose lanes 24-31 have no pair (no divergence inside a warp).
      // (kda_bwd_chunk has its own copy: see its [6])
      if (tid < CHUNK * (CHUNK - 1) / 2) {
        int i = 1, j = tid;
        while (j >= i) j -= i++;
        float accl = 0.f, accm = 0.f;
        for (int c = 0; c < K; ++c) {
          const float e = ex2_approx_ftz(sG[gx(i, c)] - sG[gx(j, c)]), kj = sKn[gx(j, c)];
          accl = fmaf(sKn[gx(i, c)] * kj, e, accl);
          accm = fmaf(sQs[gx(i, c)] * kj, e, accm);
        }
        sL[sw(i, j)] = accl;
        sM[sw(i, j)] = accm;
      }
      if (warp == NT / 32 - 1 && lane < CHUNK) {
        const int i = lane;
        float acc = 0.f;
        for (int c = 0; c < K; ++c) acc = fmaf(sQs[gx(i, c)] * sKn[gx(i, c)], ex2_approx_ftz(sG[gx(i, c)] - sG[gx(i, c)]), acc);
        sM[sw(i, i)] = acc;
      }
      __syncthreads();

      // [7] Lb = fp32(L * beta) strictly lower, in place; [9] Mqk = bf16(Mf) on and below the diagonal
      for (int p = tid; p < CHUNK * CHUNK; p += NT) {
        const int i = p / CHUNK, j = p % CHUNK;
        sL[sw(i, j)] = i > j ? sL[sw(i, j)] * sBeta[i] : 0.f;
#if KDA_WS_CORE
        *reinterpret_cast<u16*>(blk + WS_MQK + ws_core_off(i, j)) = i >= j ? f32_to_bf16(sM[sw(i, j)]) : u16(0);
#else
        reinterpret_cast<u16*>(blk + WS_MQK)[p] = i >= j ? f32_to_bf16(sM[sw(i, j)]) : u16(0);
#endif
      }
      __syncthreads();
    }
    // [8] (I + Lb)^-1, one column a lane of L's warp (a row of the workspace's INV: 16 adjacent lanes);
    // after both forms, so the code holds it once
    if (unsafe ? tid < CHUNK : role == 0 && lane < CHUNK) {
#if KDA_WS_CORE
      // core layout: column lane's rows 8 elements apart from its first, ws_core_off(0, lane) (the
      // helper writes inv[i * ROW + col])
      inverse_column<8>([&](int i, float (&l)[CHUNK]) { sw_row(sL, i, l); },
                        reinterpret_cast<u16*>(blk + WS_INV + ws_core_off(0, lane)) - lane, lane);
#else
      inverse_column<CHUNK>([&](int i, float (&l)[CHUNK]) { sw_row(sL, i, l); }, reinterpret_cast<u16*>(blk + WS_INV),
                            lane);
#endif
    }
    blocks.publish(hv, slot, tid);
  }
  cp_async_wait<0>();
}

#ifndef KDA_PREPARE_BODY_ONLY  // (the fused forward includes the body alone)
// Four CTAs per SM and let ptxas use 128 registers: no spills on any arch (a bare
// __launch_bounds__(128) made it settle for 64 and spill on sm_80/sm_100a); the any-size variants
// three (their masked row fills spilled a few bytes at 128 registers on sm_90a). Each CTA takes
// slots_per_cta consecutive chunk slots of one value head, in a software pipeline: the next
// chunk's q, k and g rows are copied (cp.async) into the input stage as soon as this chunk's are
// in registers and sG, so they stay in flight through its [4]-[8] (docs/design.md section 5).
#if KDA_ANY_DIMS
#define KDA_PREPARE_MIN_BLOCKS (KDA_K <= 128 ? 3 : 2)
#else
// fp32 q, k at K = 128: their 58 KB of shared memory fit three CTAs an SM at most, so three get the registers
#define KDA_PREPARE_MIN_BLOCKS (KDA_K <= 64 ? 4 : KDA_K <= 128 ? (KDA_DT == KDA_F32 ? 3 : 4) : 2)
#endif
extern "C" __global__ void __launch_bounds__(128, KDA_PREPARE_MIN_BLOCKS) kda_prepare(
    const void* q, const void* k, const void* g, const void* beta,
    i64 q_sb, i64 q_st, i64 q_sh, i64 k_sb, i64 k_st, i64 k_sh, i64 g_sb, i64 g_st, i64 g_sh,
    i64 b_sb, i64 b_st, i64 b_sh,
    const float* A_log, const float* dt_bias, const void* cu_seqlens, int cu_is_i64,
    int T, int H, int HV, int nseq, int nslots, int chunks_per_seq, int slots_per_cta, float scale, float lb2,
    unsigned char* ws, int k_true, int skip_last_of) {
  const PrepareIn in{q,    k,    g,    beta, q_sb,  q_st,  q_sh,    k_sb,      k_st, k_sh, g_sb,  g_st,
                     g_sh, b_sb, b_st, b_sh, A_log, dt_bias, cu_seqlens, cu_is_i64, T,    H,    HV,    nseq,
                     chunks_per_seq, scale, lb2, k_true, skip_last_of};
  const int first = blockIdx.x * slots_per_cta;
  prepare_slots(in, blockIdx.y, first, first + slots_per_cta < nslots ? first + slots_per_cta : nslots,
                WorkspaceBlocks{ws, nslots});
}
#endif

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
// KDA_MMA = KDA_MMA_WGMMA (sm_90a; docs/design.md section 5): each warpgroup (4 warps) owns 64
// value rows and runs the same products, in the same k order, as wgmma m64nNk16 with the state
// as the register A operand and the chunk tiles as B from shared memory (no-swizzle matrix
// descriptors over the core-matrix workspace, KDA_WS_CORE in kda_prepare); each chunk's
// workspace block and value rows arrive by cp.async.bulk in a ring of KDA_STAGES stages, each
// completed through its mbarrier (expect_tx, try_wait.parity). Every rounding point is the same.
// KDA_MMA = KDA_MMA_TCGEN05 (sm_100a): the same ring and products on Blackwell's tensor cores, a
// thread a value row, the state in tensor memory (kernels/recurrence_tcgen05.cuh).
//
// Rendered configuration: KDA_K, KDA_V, KDA_DT (v and o), KDA_BV, KDA_STAGES,
// KDA_STATE_FP32, WS_* and RSM_* layouts; optional KDA_MMA; optional KDA_NO_OUTPUT (1: o is
// neither computed nor written, only the final state: the segment maps of the
// sequence-parallel forward, kdacupy/seqpar.py); optional KDA_STORE_STATES (1: the state at
// each chunk's start, as held, goes to ``states`` [HV, slots, V, K]: what the backward reads,
// kdacupy/ops/backward/); optional KDA_CHECKPOINTS (1: the state after every ``ckpt_every`` chunks of
// a sequence, as held, goes to ``ckpt`` [rows, HV, ., .] in the state layout and the ckpt_dtype
// precision: boundary j of sequence n, the state after its first j * ckpt_every * 16 tokens, to row
// ckpt_idx[n, j - 1] (without ckpt_idx: n * ckpt_per_seq + j - 1), for j <= ckpt_per_seq; a row
// outside [0, ckpt_rows) is skipped: prefix caching, docs/design.md section 7.1); optional
// KDA_ANY_DIMS (1: KDA_K, KDA_V are the key and value tiles and the true head dims come as the
// arguments k_true <= KDA_K, v_true <= KDA_V: v, o and the states have their true extents, value
// columns past v_true read as zero and are never written, ceil(v_true / BV) CTAs per sequence and
// head; the workspace is the key tile's, zero past k_true. mma.sync only). Without the output, the
// any-size dims and the stored states (the segment maps), v may be null: v is zero and never read (the M map of the sequence-parallel forward; each stage's value rows
// are zeroed once), a runtime choice, so the M and B maps share one build.
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
#ifndef KDA_MMA
#define KDA_MMA KDA_MMA_SYNC
#endif
#ifndef KDA_ANY_DIMS
#define KDA_ANY_DIMS 0
#endif
#define KDA_WGMMA_PATH (KDA_MMA == KDA_MMA_WGMMA)
#define KDA_TCGEN05_PATH (KDA_MMA == KDA_MMA_TCGEN05)

namespace {
using namespace kda;

constexpr int K = KDA_K;
constexpr int V = KDA_V;
constexpr int BV = KDA_BV;
constexpr int NW = BV / 16;
constexpr int NT = KDA_TCGEN05_PATH ? 128 : NW * 32;  // tcgen05: a warpgroup, a thread a tensor-memory lane
constexpr int STAGES = KDA_STAGES;
constexpr bool FP32_STATE = KDA_STATE_FP32;
constexpr bool OUTPUT = !KDA_NO_OUTPUT;
constexpr bool ANY = KDA_ANY_DIMS;
constexpr int KS = K / 16;            // k-steps of the state matmuls
constexpr int TS = K + 8;             // padded bf16 row of a [16, K] tile (elements)
constexpr int SR = 24;                // padded row of a 16x16 tile (elements)
constexpr int ES = elem_bytes<KDA_DT>();
constexpr int VCH = BV * ES / 16;     // 16-byte pieces per value-tile row

static_assert(V % BV == 0 && BV % 16 == 0, "value slices are whole warps");
static_assert(RSM_BETA == RSM_GEXP + K * 4, "gexp and beta travel together");
#if KDA_WGMMA_PATH || KDA_TCGEN05_PATH
// A stage holds the workspace block as the prepare wrote it (core-matrix tiles: element (r, c) of a
// [16, C] 16-bit tile at byte (c / 8) * 256 + 16 r + 2 (c % 8); kda_prepare, KDA_WS_CORE), then the
// [16, BV] value rows; one mbarrier per stage at RSM_BAR (tcgen05: and the products' at RSM_MMABAR).
static_assert(KDA_TCGEN05_PATH || NW % 4 == 0, "wgmma: whole warpgroups of 64 value rows (BV = 64 or 128)");
static_assert(K <= 128, "wgmma: dS in one m64nKk16 (K = 256 keeps mma.sync: its registers)");
static_assert(!ANY, "wgmma: the head dims of the tiles (any other size keeps mma.sync)");
static_assert(!KDA_STORE_STATES, "wgmma: not the backward's forward (it reads the row-major workspace)");
static_assert(STAGES >= 2, "wgmma: a ragged tail's zeros are ordered by the barrier that ends a chunk");
static_assert(RSM_QDEC == WS_QDEC && RSM_KDEC == WS_KDEC && RSM_KRES == WS_KRES && RSM_INV == WS_INV &&
              RSM_MQK == WS_MQK && RSM_GEXP == WS_GEXP && RSM_VT >= WS_STRIDE && RSM_VT % 16 == 0 &&
              RSM_STAGE % 16 == 0 && RSM_VROW % 16 == 0 && RSM_BAR % 16 == 0, "the stage is the workspace block");
constexpr u32 CORE_COLS = CHUNK * 16;  // bytes per 8 columns of a core-matrix tile
static_assert(WS_MQK > WS_INV && WS_GEXP > WS_MQK && WS_KDEC > WS_QDEC && WS_KRES > WS_KDEC && WS_INV > WS_KRES,
              "without the output, the block's k_dec .. INV and gexp .. end are two runs");
constexpr u32 WS_BYTES_NO_OUTPUT = (WS_MQK - WS_KDEC) + (WS_STRIDE - WS_GEXP);
// B = tile^T through a K-major descriptor (k = column: 8 columns CORE_COLS apart; n = row: 8 rows
// 128 bytes apart), 16 columns from col0
__device__ __forceinline__ u64 desc_t(const unsigned char* tile, int col0) {
  return wgmma_desc(tile + (col0 / 8) * CORE_COLS, CORE_COLS, 128, WGMMA_SWIZZLE_NONE);
}
// B = tile through an N-major descriptor (k = row: 8 rows 128 bytes apart; n = column)
__device__ __forceinline__ u64 desc_n(const unsigned char* tile) {
  return wgmma_desc(tile, 128, CORE_COLS, WGMMA_SWIZZLE_NONE);
}
#else
static_assert(RSM_KDEC == RSM_QDEC + CHUNK * TS * 2 && RSM_KRES == RSM_KDEC + CHUNK * TS * 2, "smem tiles");
#endif

// Queue the copies of one chunk (workspace block + value tile) into a stage; without the output,
// q_dec and Mqk are never read: not copied.
// ``vcols``: the value columns from the slice's first that exist (ANY; at least BV otherwise).
__device__ __forceinline__ void load_chunk(unsigned char* stage, const unsigned char* blk,
                                           const unsigned char* vrow0, i64 v_row_bytes, int rows, int vcols, int tid,
                                           bool v_zero) {
  copy_ws_block<K, NT, RSM_QDEC, RSM_INV, RSM_MQK, RSM_GEXP, OUTPUT>(stage, blk, tid);
  if (v_zero) {
    // the value rows stay the zeros written once (zero_value_rows)
  } else if constexpr (ANY) {
    fill_rows_dims<NT, VCH, RSM_VROW, ES>(stage + RSM_VT, vrow0, v_row_bytes, rows, vcols, tid);
  } else {
    copy_rows_zfill<NT, VCH, RSM_VROW>(stage + RSM_VT, vrow0, v_row_bytes, rows, tid);
  }
}

// v = 0 (no output, v null): every stage's [16, BV] value rows zero, once, before the first copy: no
// chunk writes them.
__device__ __forceinline__ void zero_value_rows(unsigned char* sm, int tid) {
#pragma unroll 1
  for (int p = tid; p < STAGES * CHUNK * VCH; p += NT) {
    const int st = p / (CHUNK * VCH), r = p / VCH % CHUNK;
    reinterpret_cast<Vec16*>(sm + st * RSM_STAGE + RSM_VT + r * RSM_VROW)[p % VCH] = Vec16{};
  }
}

// The state this CTA reads and writes: sequence n's, or with a pool its slot idx[n]'s; -1 for a
// slot outside [0, P) (padding: nothing read or written).
__device__ __forceinline__ i64 state_slot(int n, int hv, int HV, const void* pool_idx, int pool_idx_i64, i64 pool_slots) {
  if (pool_idx == nullptr) return static_cast<i64>(n) * HV + hv;
  const i64 slot = pool_idx_i64 ? static_cast<const i64*>(pool_idx)[n] : static_cast<const i32*>(pool_idx)[n];
  return slot < 0 || slot >= pool_slots ? -1 : slot * HV + hv;
}

// KDA_CHECKPOINTS: the row of ckpt that the state after chunk c of sequence n goes to, or -1 (no
// boundary there, or a row outside [0, ckpt_rows): skipped).
__device__ __forceinline__ i64 checkpoint_row(int c, int seq_len, int n, const void* ckpt_idx, int ckpt_i64,
                                              i64 ckpt_rows, int ckpt_per_seq, int ckpt_every) {
  if ((c + 1) % ckpt_every != 0 || (c + 1) * CHUNK > seq_len || (c + 1) / ckpt_every > ckpt_per_seq) return -1;
  const i64 e = static_cast<i64>(n) * ckpt_per_seq + (c + 1) / ckpt_every - 1;
  const i64 row = ckpt_idx == nullptr ? e
                  : ckpt_i64 ? static_cast<const i64*>(ckpt_idx)[e] : static_cast<const i32*>(ckpt_idx)[e];
  return row >= 0 && row < ckpt_rows ? row : -1;
}

// Where chunk slot ``slot`` of value head hv is read from: the plain launch's workspace, written by the
// prepare launch before it; nothing to acquire or release (the fused forward's ring has both:
// kda_forward_fused.cu; acquire by the lane that issues the slot's copy, release by thread 0 once it landed).
struct WorkspaceBlocks {
  const unsigned char* ws;
  int nslots;
  __device__ __forceinline__ const unsigned char* block(int hv, i64 slot) const {
    return ws + (static_cast<i64>(hv) * nslots + slot) * WS_STRIDE;
  }
  __device__ __forceinline__ void acquire(int, i64) const {}
  __device__ __forceinline__ void release(int, i64) const {}
};

#if KDA_WGMMA_PATH || KDA_TCGEN05_PATH
// Chunk c's copies into stage c % STAGES of the bulk-copy ring (the wgmma and tcgen05 paths): an elected lane
// of warp ``lead`` (the callers rotate it chunk by chunk: warp w of every CTA shares scheduler w mod 4) arms the
// stage's barrier with their bytes and issues the workspace block (one copy; without the output q_dec and Mqk
// are never read: the block's two other runs, k_dec to INV and gexp with beta), then the value rows, a copy
// a row: their operands are warp-uniform, so ptxas issues each once from uniform registers (a copy from a lane
// of each warp's own rows cost a loop over the active lanes a copy, ~4x the instructions).
// A ragged tail's value rows are zeroed by the threads (0 * garbage could be NaN); v = 0: none copied.
// ``blocks`` places slot slot0 + c of value head hv (the plain launch: the workspace; the fused forward: its
// ring, acquired by the issuing lane first); ``c0``: the chunks this CTA ran before (the ring's stage of
// chunk c is (c0 + c) % STAGES).
template <class Blocks>
__device__ __forceinline__ void issue_bulk_chunk(unsigned char* sm, u64* bars, const Blocks& blocks, int hv, i64 slot0,
                                                 const unsigned char* vbase, i64 v_st, int c, int c0, int nchunks,
                                                 int seq_len, bool v_zero, int tid, int lead = 0) {
  if (c >= nchunks) return;
  unsigned char* stg = sm + ((c0 + c) % STAGES) * RSM_STAGE;
  u64* bar = &bars[2 * ((c0 + c) % STAGES)];
  const int rows = seq_len - c * CHUNK < CHUNK ? seq_len - c * CHUNK : CHUNK;
  if ((tid >> 5) == lead && elect_one_sync()) {  // one lane of warp lead (elected: no loop over the active lanes)
    blocks.acquire(hv, slot0 + c);
    const unsigned char* blk = blocks.block(hv, slot0 + c);
    const int VBYTES = v_zero ? 0 : BV * ES;  // v's rows a chunk
    if constexpr (OUTPUT) {
      mbarrier_arrive_expect_tx(bar, WS_STRIDE + rows * VBYTES);
      cp_async_bulk_g2s(stg, blk, WS_STRIDE, bar);
    } else {
      mbarrier_arrive_expect_tx(bar, WS_BYTES_NO_OUTPUT + rows * VBYTES);
      cp_async_bulk_g2s(stg + WS_KDEC, blk + WS_KDEC, WS_MQK - WS_KDEC, bar);
      cp_async_bulk_g2s(stg + WS_GEXP, blk + WS_GEXP, WS_STRIDE - WS_GEXP, bar);
    }
    if (!v_zero) {
      const unsigned char* vrow = vbase + static_cast<i64>(c) * CHUNK * v_st * ES;
      for (int row = 0; row < rows; ++row, vrow += v_st * ES)
        cp_async_bulk_g2s(stg + RSM_VT + row * RSM_VROW, vrow, BV * ES, bar);
    }
  }
  if (!v_zero) {
    for (int p = tid; p < (CHUNK - rows) * VCH; p += NT)
      reinterpret_cast<Vec16*>(stg + RSM_VT + (rows + p / VCH) * RSM_VROW)[p % VCH] = Vec16{};
  }
}
#endif

#if !KDA_TCGEN05_PATH
// A warp's o^T tile, staged in ot (CHUNK rows of its 16 value columns, RSM_OROW bytes apart), to o
// in 16-byte pieces: o_row0 is the tile's first element in o, rows the chunk's valid rows, ``cols``
// the warp's value columns that exist (ANY; 16 otherwise).
__device__ __forceinline__ void store_out_rows(void* o, i64 o_row0, i64 o_st, const unsigned char* ot, int rows,
                                               int cols, int lane) {
  constexpr int PIECES = 16 * ES / 16;  // 16-byte pieces per output row of this warp
  for (int p = lane; p < CHUNK * PIECES; p += 32) {
    const int r = p / PIECES, pc = p % PIECES;
    if (r < rows) {
      unsigned char* dst = static_cast<unsigned char*>(o) + (o_row0 + r * o_st) * ES + pc * 16;
      if constexpr (ANY) {
        store_piece16<ES>(dst, ot + r * RSM_OROW + pc * 16, cols - pc * (16 / ES));
      } else {
        *reinterpret_cast<Vec16*>(dst) = reinterpret_cast<const Vec16*>(ot + r * RSM_OROW)[pc];
      }
    }
  }
}
#endif

}  // namespace

// What one recurrence reads and writes: the kernel's arguments but the workspace.
struct RecurrenceIn {
  const void* v;
  i64 v_sb, v_st, v_sh;
  void* o;
  i64 o_sb, o_st, o_sh;
  const void* s_in;
  int s_in_dtype;
  void* s_out;
  int s_out_dtype, layout_vk;
  const void* cu_seqlens;
  int cu_is_i64, T, HV, nslots, chunks_per_seq;
  const void* pool_idx;
  int pool_idx_i64;
  i64 pool_slots;
  unsigned char* states;
  void* ckpt;
  int ckpt_dtype;
  const void* ckpt_idx;
  int ckpt_i64;
  i64 ckpt_rows;
  int ckpt_per_seq, ckpt_every, k_true, v_true;
};

#if KDA_TCGEN05_PATH
namespace {
#include "recurrence_tcgen05.cuh"
}  // namespace
#endif

#if KDA_WGMMA_PATH
// Stage s's mbarrier at bars[2 s]: its copies have landed (16 bytes a barrier, as the emulation's profile
// tells barriers apart). Once a CTA: a CTA that runs several sequences keeps counting the stages' phases.
__device__ __forceinline__ void init_stage_barriers(unsigned char* sm, int tid) {
  u64* bars = reinterpret_cast<u64*>(sm + RSM_BAR);
  if (tid == 0) {
#pragma unroll 1
    for (int s = 0; s < STAGES; ++s) mbarrier_init(&bars[2 * s], 1);
    fence_proxy_async_smem();  // the initialised barriers, before the bulk copies complete on them
  }
  __syncthreads();
}
#endif

#if !KDA_TCGEN05_PATH
// Sequence n's recurrence over value rows [v0, v0 + BV) of value head hv, its chunks read through ``blocks``;
// ``c0``: the chunks this CTA ran before (the wgmma ring's stages and phases go on from there).
template <class Blocks>
__device__ __forceinline__ void recurrence_sequence(const RecurrenceIn& in, int n, int v0, int hv, int c0,
                                                    const Blocks& blocks) {
  const void* const v = in.v;
  void* const o = in.o;
  const i64 v_sb = in.v_sb, v_st = in.v_st, v_sh = in.v_sh, o_sb = in.o_sb, o_st = in.o_st, o_sh = in.o_sh;
  const void* const s_in = in.s_in;
  void* const s_out = in.s_out;
  int s_in_dtype = in.s_in_dtype;
  const int s_out_dtype = in.s_out_dtype, layout_vk = in.layout_vk;
  const void* const cu_seqlens = in.cu_seqlens;
  const int cu_is_i64 = in.cu_is_i64, T = in.T, HV = in.HV, nslots = in.nslots, chunks_per_seq = in.chunks_per_seq;
  void* const ckpt = in.ckpt;
  const int ckpt_dtype = in.ckpt_dtype, ckpt_i64 = in.ckpt_i64, ckpt_per_seq = in.ckpt_per_seq, ckpt_every = in.ckpt_every;
  const void* const ckpt_idx = in.ckpt_idx;
  const i64 ckpt_rows = in.ckpt_rows;
  unsigned char* const states = in.states;
  (void)ckpt, (void)ckpt_dtype, (void)ckpt_i64, (void)ckpt_per_seq, (void)ckpt_every, (void)ckpt_idx, (void)ckpt_rows;
  (void)states, (void)nslots, (void)c0;
  const int kdim = ANY ? in.k_true : K, vdim = ANY ? in.v_true : V;  // the true head dims (constants without ANY)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int vw = v0 + 16 * warp;  // first value row of this warp
  // state pool (s_in == s_out): slot idx[n]; outside [0, P) starts from zeros, stores nothing
  const i64 nh = state_slot(n, hv, HV, in.pool_idx, in.pool_idx_i64, in.pool_slots);
  if (nh < 0) s_in_dtype = KDA_STATE_NONE;
  const Seq seq = sequence(cu_seqlens, cu_is_i64, n, T);

  if (seq.len == 0) {  // [16] the final state is the initial state, converted only
    if (s_out != nullptr && nh >= 0) {
      if constexpr (ANY) {
        copy_state_rows_dims(s_out, s_out_dtype, s_in, s_in_dtype, layout_vk, nh, vw, lane, kdim, vdim);
      } else {
        copy_state_rows<V, K>(s_out, s_out_dtype, s_in, s_in_dtype, layout_vk, nh, vw, lane);
      }
    }
    return;
  }

  unsigned char* sm = dynamic_smem();
  const int b = cu_seqlens == nullptr ? n : 0;
  const i64 tok0 = cu_seqlens == nullptr ? 0 : seq.bos;
  // v null: zero, never read (the maps without output, at the tiles' head dims: the any-size variants
  // and the backward's forward, at the register limit already, always read v, as the forward does)
  const bool v_zero = !OUTPUT && !ANY && !KDA_STORE_STATES && v == nullptr;
  const unsigned char* vbase = v_zero ? nullptr
                                      : static_cast<const unsigned char*>(v) + (b * v_sb + tok0 * v_st + hv * v_sh + v0) * ES;
  const i64 slot0 = first_slot(cu_seqlens, n, seq.bos, chunks_per_seq);
  const int nchunks = (seq.len + CHUNK - 1) / CHUNK;
#if KDA_WGMMA_PATH
  u64* bars = reinterpret_cast<u64*>(sm + RSM_BAR);  // (init_stage_barriers)
  auto issue = [&](int c) {
    issue_bulk_chunk(sm, bars, blocks, hv, slot0, vbase, v_st, c, c0, nchunks, seq.len, v_zero, tid, c % (NT / 32));
  };
  if (v_zero) zero_value_rows(sm, tid);
#pragma unroll 1
  for (int c = 0; c < STAGES - 1; ++c) issue(c);
  __syncthreads();  // chunk 0's zeroed tail, before its reads
#else
  const unsigned char* wsbase = blocks.block(hv, slot0);
  auto issue = [&](int c) {
    if (c < nchunks) {
      const int rows = seq.len - c * CHUNK < CHUNK ? seq.len - c * CHUNK : CHUNK;
      load_chunk(sm + (c % STAGES) * RSM_STAGE, wsbase + static_cast<i64>(c) * WS_STRIDE,
                 vbase + static_cast<i64>(c) * CHUNK * v_st * ES, v_st * ES, rows, vdim - v0, tid, v_zero);
    }
    cp_async_commit();  // always, so the group count stays uniform
  };
  if (v_zero) zero_value_rows(sm, tid);  // (ordered before any read by the barrier that opens each chunk)
#pragma unroll 1
  for (int c = 0; c < STAGES - 1; ++c) issue(c);
#endif

  // [10] the warp's 16 x K slice of the state: n-tile j holds (row g / g+8, column 8j + 2t, +1),
  // read 16 keys at a time in whole sectors, after the first copies are issued (read before them,
  // it cost spills at the register limit: K = 256, fp32 state)
  float Sf[FP32_STATE ? K / 8 : 1][4];
  u32 Sa[FP32_STATE ? 1 : KS][4];
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    float x[2][4];
    if constexpr (ANY) {
      load_state_cols16_dims(x, s_in, s_in_dtype, layout_vk, nh, vw, s, g, t, kdim, vdim);
    } else {
      load_state_cols16<V, K>(x, s_in, s_in_dtype, layout_vk, nh, vw, s, g, t);
    }
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
      if constexpr (ANY) {
        store_state_cols16_dims(dst, dtype, layout_vk, nh_dst, vw, s, g, t, x, kdim, vdim);
      } else {
        store_state_cols16<V, K>(dst, dtype, layout_vk, nh_dst, vw, s, g, t, x);
      }
    }
  };

#if KDA_WGMMA_PATH
  unsigned char* ot = sm + RSM_OT + warp * CHUNK * RSM_OROW;
#pragma unroll 1
  for (int c = 0; c < nchunks; ++c) {
    issue(c + STAGES - 1);
    mbarrier_wait_parity(&bars[2 * ((c0 + c) % STAGES)], ((c0 + c) / STAGES) & 1);
    if (tid == 0) blocks.release(hv, slot0 + c);  // the slot's bytes are in the stage
    const unsigned char* st = sm + ((c0 + c) % STAGES) * RSM_STAGE;
    const float* gexp = reinterpret_cast<const float*>(st + RSM_GEXP);
    const float* bet = reinterpret_cast<const float*>(st + RSM_BETA);

    // [11]-[12] W^T and the state part of o^T with the state as A: one k16 wgmma per 16 keys, in
    // key order, B = k_dec^T, q_dec^T (n = token). The fragments stay put until the wait.
    u32 A[KS][4];
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      if constexpr (FP32_STATE) {
        to_a_frag(A[s], Sf[2 * s], Sf[2 * s + 1]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) A[s][e] = Sa[s][e];
      }
    }
    float Wt[8], Ot[8];  // n-tile nt's accumulator e at [4 nt + e], as mma.sync's
    // this stage's K-major descriptor, built once; each tile's is it advanced by the tile's offset
    const u64 dstage = desc_t(st, 0);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < KS; ++s)
      wgmma_bf16<16, false>(Wt, A[s], wgmma_desc_add(dstage, RSM_KDEC + 2 * s * CORE_COLS), s > 0);
    wgmma_commit();
    if constexpr (OUTPUT) {
#pragma unroll
      for (int s = 0; s < KS; ++s)
        wgmma_bf16<16, false>(Ot, A[s], wgmma_desc_add(dstage, RSM_QDEC + 2 * s * CORE_COLS), s > 0);
      wgmma_commit();
      wgmma_wait<1>();  // W^T final; o^T's group still in flight
    } else {
      wgmma_wait<0>();  // W^T final (no o^T: the segment maps)
    }
    wgmma_fence_operand(Wt);

    // [12] vsub^T = bf16(beta * (v^T - W^T)), the values arriving as (row v, column token)
    float vt[2][4];
    load_tile_t<KDA_DT, RSM_VROW>(vt, st + RSM_VT, 16 * warp, lane);
    float vs[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      const float2 be = *reinterpret_cast<const float2*>(bet + 8 * nt + 2 * t);  // tokens 2t, 2t + 1: one load
#pragma unroll
      for (int e = 0; e < 4; ++e) vs[nt][e] = ((e & 1) ? be.y : be.x) * (vt[nt][e] - Wt[4 * nt + e]);
    }
    u32 va[4];
    to_a_frag(va, vs);

    // [13] U^T = bf16(vsub^T INV^T): B[k = token j][n = token i] = INV[i][j]
    float Ut[8];
    wgmma_fence();
    wgmma_bf16<16, false>(Ut, va, wgmma_desc_add(dstage, RSM_INV), false);
    wgmma_commit();
    wgmma_wait<0>();  // U^T and the state part of o^T final
    wgmma_fence_operand(Ut);
    if constexpr (OUTPUT) wgmma_fence_operand(Ot);
    u32 ua[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) ua[e] = pack_bf16x2(Ut[2 * e], Ut[2 * e + 1]);  // to_a_frag's packing

    // [14] o^T += U^T Mqk^T; [15] dS = U^T k_res: B[k = token][n = key], N-major, all K keys at once
    float dS[K / 2];
    wgmma_fence();
    if constexpr (OUTPUT) wgmma_bf16<16, false>(Ot, ua, wgmma_desc_add(dstage, RSM_MQK), true);
    wgmma_bf16<K, true>(dS, ua, desc_n(st + RSM_KRES), false);
    wgmma_commit();
    wgmma_wait<0>();  // o^T and dS final
    if constexpr (OUTPUT) wgmma_fence_operand(Ot);
    wgmma_fence_operand(dS);

    // [14] o^T rounded once to the output dtype, staged per warp, stored by rows
    if constexpr (OUTPUT) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          store_f32<KDA_DT>(ot, (8 * nt + 2 * t + (e & 1)) * (RSM_OROW / ES) + g + 8 * (e >> 1), Ot[4 * nt + e]);
        }
      }
      __syncwarp();
      store_out_rows(o, b * o_sb + (tok0 + static_cast<i64>(c) * CHUNK) * o_st + hv * o_sh + vw, o_st, ot,
                     seq.len - c * CHUNK < CHUNK ? seq.len - c * CHUNK : CHUNK, vdim - vw, lane);
      __syncwarp();
    }

    // [15] S = fp32(dS + S * gexp), one FMA per element (n-tile j of dS at [4 j + e])
#pragma unroll
    for (int j = 0; j < K / 8; ++j) {
      const float2 ge = *reinterpret_cast<const float2*>(gexp + 8 * j + 2 * t);  // keys 8j + 2t, +1: one load
      const float ge0 = ge.x, ge1 = ge.y;
      const float* d = dS + 4 * j;
      if constexpr (FP32_STATE) {
        Sf[j][0] = fmaf(Sf[j][0], ge0, d[0]);
        Sf[j][1] = fmaf(Sf[j][1], ge1, d[1]);
        Sf[j][2] = fmaf(Sf[j][2], ge0, d[2]);
        Sf[j][3] = fmaf(Sf[j][3], ge1, d[3]);
      } else {
        u32& top = Sa[j / 2][2 * (j % 2)];
        u32& bot = Sa[j / 2][2 * (j % 2) + 1];
        top = pack_bf16x2(fmaf(bf16_lo(top), ge0, d[0]), fmaf(bf16_hi(top), ge1, d[1]));
        bot = pack_bf16x2(fmaf(bf16_lo(bot), ge0, d[2]), fmaf(bf16_hi(bot), ge1, d[3]));
      }
    }
#if KDA_CHECKPOINTS
    {
      const i64 row = checkpoint_row(c, seq.len, n, ckpt_idx, ckpt_i64, ckpt_rows, ckpt_per_seq, ckpt_every);
      if (row >= 0) store_held(ckpt, ckpt_dtype, row * HV + hv);
    }
#endif
    __syncthreads();  // every read of the stage (wgmma waited for), before its refill
  }
#else
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
      const i64 blk = (static_cast<i64>(hv) * nslots + slot0 + c) * V;
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
      store_out_rows(o, b * o_sb + (tok0 + static_cast<i64>(c) * CHUNK) * o_st + hv * o_sh + vw, o_st, ot,
                     seq.len - c * CHUNK < CHUNK ? seq.len - c * CHUNK : CHUNK, vdim - vw, lane);
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
    {
      const i64 row = checkpoint_row(c, seq.len, n, ckpt_idx, ckpt_i64, ckpt_rows, ckpt_per_seq, ckpt_every);
      if (row >= 0) store_held(ckpt, ckpt_dtype, row * HV + hv);
    }
#endif
    __syncthreads();  // the stage is refilled by the next iteration's issue()
  }
  cp_async_wait<0>();
#endif

  // [16] final state, 16 keys at a time in whole sectors; the slot is looked up again rather than
  // held across the chunk loop (at the register limit, K = 256 in fp32, holding it cost spills)
  const i64 nh_out = state_slot(n, hv, HV, in.pool_idx, in.pool_idx_i64, in.pool_slots);
  if (s_out != nullptr && nh_out >= 0) store_held(s_out, s_out_dtype, nh_out);
}
#endif

constexpr bool MAP_WORK_LIST = !OUTPUT && !KDA_STORE_STATES && K <= 128;  // (kdacupy/ops/seqpar/split.py: work_list)
// The maps' work list (seg_n > 0: kdacupy/ops/seqpar/split.py): per sequence of seg_n segments, the M
// map's value tiles [0, mtiles) of segments [1, seg_n - 1), then the B map's tiles [mtiles, VB) of
// segments [0, seg_n - 1): the scan reads no map of the last segment, and no M of the first (an initial
// state is folded into its B map), so no CTA runs them. Item ``i`` -> segment batch sequence n, row v0.
__device__ __forceinline__ void map_work_item(int i, int seg_n, int mtiles, int VB, int& n, int& v0) {
  const int mruns = (seg_n - 2) * mtiles, btiles = VB - mtiles;
  const int per_seq = mruns + (seg_n - 1) * btiles, q = i / per_seq, r = i % per_seq;
  int seg, tile;
  if (r < mruns) {
    seg = 1 + r / mtiles, tile = r % mtiles;
  } else {
    seg = (r - mruns) / btiles, tile = mtiles + (r - mruns) % btiles;
  }
  n = q * seg_n + seg, v0 = tile * BV;
}

#ifndef KDA_RECURRENCE_BODY_ONLY  // (the fused forward includes the body alone)
// A minimum-blocks figure that allows 256 registers per thread makes ptxas use what it needs; left
// to itself it settles short and spills a few bytes: at 128 with the fp32 state (twice the
// registers), at 80 for the state store on sm_100a and, since the whole-sector state I/O, for the
// bf16 state at K = 64, BV = 64, 3 stages on sm_80; and at 128 for one warp's BV = 16, 3 stages on sm_100a
// (20 bytes, since the shared addresses are 32-bit arithmetic: kernels/ptx.cuh's smem_addr); and at 48 for
// tcgen05's fp32 inputs with the bf16 state (4 bytes).
#if KDA_STATE_FP32 || KDA_STORE_STATES || KDA_CHECKPOINTS || KDA_K <= 64 || KDA_BV == 16 || KDA_TCGEN05_PATH
#define KDA_RECURRENCE_BOUNDS __launch_bounds__(NT, 256 / NT)
#else
#define KDA_RECURRENCE_BOUNDS __launch_bounds__(NT)
#endif
extern "C" __global__ void KDA_RECURRENCE_BOUNDS kda_recurrence(
    const unsigned char* ws, const void* v, i64 v_sb, i64 v_st, i64 v_sh, void* o, i64 o_sb, i64 o_st, i64 o_sh,
    const void* s_in, int s_in_dtype, void* s_out, int s_out_dtype, int layout_vk,
    const void* cu_seqlens, int cu_is_i64, int T, int HV, int nslots, int chunks_per_seq,
    const void* pool_idx, int pool_idx_i64, i64 pool_slots, unsigned char* states,
    void* ckpt, int ckpt_dtype, const void* ckpt_idx, int ckpt_i64, i64 ckpt_rows, int ckpt_per_seq, int ckpt_every,
    int k_true, int v_true, int seg_n, int v_from) {
  const int VB = ANY ? (v_true + BV - 1) / BV : V / BV;
  const int hv = blockIdx.y;
  int n = blockIdx.x / VB, v0 = (blockIdx.x % VB) * BV;
  // the maps (seqpar, without the output) of key tiles up to 128: the work list, and the merged maps'
  // value rows below v_from the M map's, v = 0 and never read (null), the rest the B map's, row v0 of
  // this launch being v's row v0 - v_from. The other builds take the plain grid: with the branch ptxas
  // settled the forwards' registers short and spilled, and the K = 256 maps' (at 255) spilled 8-12 bytes.
  if constexpr (MAP_WORK_LIST) {
    if (seg_n > 0) map_work_item(blockIdx.x, seg_n, v_from / BV, VB, n, v0);
    if constexpr (!ANY) {
      if (v_from > 0) v = v0 < v_from ? nullptr : static_cast<const unsigned char*>(v) - static_cast<i64>(v_from) * ES;
    }
  }
  (void)seg_n, (void)v_from;
  const RecurrenceIn in{v,          v_sb,      v_st, v_sh,           o,       o_sb,         o_st,       o_sh,
                        s_in,       s_in_dtype, s_out, s_out_dtype,   layout_vk, cu_seqlens,  cu_is_i64,  T,
                        HV,         nslots,    chunks_per_seq, pool_idx, pool_idx_i64, pool_slots, states, ckpt,
                        ckpt_dtype, ckpt_idx,  ckpt_i64, ckpt_rows,    ckpt_per_seq, ckpt_every, k_true, v_true};
#if KDA_TCGEN05_PATH
  const u32 tm = tc_begin(dynamic_smem(), threadIdx.x);
  u32 phase = 0;
  tc_sequence(in, n, v0, hv, 0, WorkspaceBlocks{ws, nslots}, tm, phase);
  tc_end(tm);
#else
#if KDA_WGMMA_PATH
  init_stage_barriers(dynamic_smem(), threadIdx.x);
#endif
  recurrence_sequence(in, n, v0, hv, 0, WorkspaceBlocks{ws, nslots});
#endif
}
#endif

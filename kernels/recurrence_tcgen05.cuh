// kda_recurrence on Blackwell's tensor cores (KDA_MMA = KDA_MMA_TCGEN05, sm_100a; docs/design.md
// section 5): included by kda_recurrence.cu inside its namespace, after its constants.
//
// A CTA of 128 threads (a warpgroup, thread t tensor-memory lane t) owns BV value rows: BV = 128, M = 128,
// thread t row v0 + t; BV = 64, M = 64 (rows in the first 16 lanes of each warp's quarter), the second 16
// lanes taking the same rows' second half of the keys. The state lives in tensor memory (the bf16 state as
// the A operand itself; the fp32 state in columns of its own beside its bf16 copy), so every chunk product
// is a tcgen05.mma with A from tensor memory, the chunk tiles as B from the core-matrix workspace in shared
// memory (the wgmma path's stage, by the same bulk-copy ring), fp32 accumulators in tensor memory, issued
// by one elected lane of the chunk's lead warp and completed through one mbarrier. Per chunk, the same products and
// rounding points as the mma.sync and wgmma paths, in the same k order:
//   W^T, o^T = S k_dec^T, S q_dec^T (A: the state)      -> tcgen05.ld W^T
//   vsub^T = bf16(beta (v^T - W^T)) -> tensor memory      U^T = vsub^T INV^T -> tcgen05.ld
//   bf16(U^T) -> tensor memory; o^T += U^T Mqk^T; dS = U^T k_res -> tcgen05.ld, 16 keys at a time:
//   S = fma(S, gexp, dS) (one fp32 FMA each), and its bf16 copy, the next A, back to tensor memory.

static_assert((BV == 128 || BV == 64) && NT == 128, "tcgen05: 128 threads, M = BV = 128 or 64");
static_assert(K <= 128, "tcgen05: dS in one or two products of N <= 128 (K = 256 keeps mma.sync)");
static_assert(!ANY && !KDA_STORE_STATES, "tcgen05: the head dims of the tiles and the forward's variants");
static_assert(STAGES >= 2, "tcgen05: the bulk-copy ring of the wgmma path");
// BV = 128: M = 128, thread t the value row in lane t, all K keys of it. BV = 64 (TC_HALVES): M = 64, whose
// rows sit in the first 16 lanes of each warp's quarter (the ISA's layout F); the last 16 lanes take the
// same rows' second half of the keys: lane 16 + r of warp w holds keys K / 2 .. K of row 16 w + r, dS's
// second half by a second M = 64 product at lane field 16 (A: a copy of U^T there), so a thread does half a
// row's state work and a head's rows spread over twice the CTAs.
constexpr bool TC_HALVES = BV == 64;
constexpr int KH = TC_HALVES ? K / 2 : K;  // keys a thread updates
// Tensor-memory columns: the accumulators, then the A operands (two bf16 a column), then the fp32 state.
// The state lives here, not in registers: the bf16 state's A copy is the state itself (each thread's keys
// at column key / 2 of its lane; with TC_HALVES the first lanes also hold the second half, the MMAs' A);
// the fp32 state keeps KH columns of its own beside it.
constexpr u32 TC_DS = 0, TC_W = KH, TC_O = KH + 16, TC_U = KH + 32, TC_AS = KH + 48, TC_AV = TC_AS + K / 2,
              TC_AU = TC_AV + 8, TC_SF = TC_AU + 8, TC_USED = TC_SF + (FP32_STATE ? KH : 0);
constexpr u32 TC_COLS = TC_USED <= 256 ? 256 : 512;  // one allocation, a power of 2
static_assert(TC_USED <= 512, "tensor memory: 512 columns");
constexpr u32 TC_HI = 16u << 16;  // lane field 16: the second M = 64 product's D and A
// Keys a round trip of the state update, 16 TC_GROUP (tc_state_update: both 16-lane halves' loads of them
// issued together, one wait::ld, their stores, one wait::st)
constexpr int TC_GROUP = KH / 16 < 4 ? KH / 16 : 4;
// The first key of the 16-lane half h of a warp's quarter (lanes 16 h ..): TC_HALVES, the rows' second half
// of the keys in lanes 16-31; else both halves hold all K keys of their rows.
__device__ __forceinline__ constexpr int tc_key_of_half(int h) { return TC_HALVES ? h * (K / 2) : 0; }

// Keys key0 + 16 s .. + 15 of this thread's state row, as held, to fp32 in x (fp32: its columns; bf16: the A
// copy's 8 words into x[8..15], unpacked in place) (the initial and final states, checkpoints).
__device__ __forceinline__ void tc_state_load16(u32 lane_addr, int key0, int s, float (&x)[16]) {
  if constexpr (FP32_STATE) {
    tmem_ld_32x32b<16>(lane_addr + TC_SF + 16 * s, x);
    tmem_wait_ld();
  } else {
    tmem_ld_32x32b<8>(lane_addr + TC_AS + (key0 + 16 * s) / 2, reinterpret_cast<float(&)[8]>(x[8]));
    tmem_wait_ld();
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // in place, ascending: word j (x[8 + j]) is read before x[2 j + 1] is written
      const u32 w = __float_as_uint(x[8 + j]);
      x[2 * j] = bf16_lo(w), x[2 * j + 1] = bf16_hi(w);
    }
  }
}
// ... and back: the fp32 state as is, and every state's bf16 copy (rounded once: for the bf16 state that
// rounding is the state's own) as the A of the next products. With TC_HALVES the second half's copy also
// goes to its row's first lane (lane - 16), where the MMAs read A: every lane stores what lane | 16 has
// at the second half's columns (the second lanes their own values again).
__device__ __forceinline__ void tc_state_store16(u32 lane_addr, int key0, int s, const float (&x)[16]) {
  if constexpr (FP32_STATE) {
#pragma unroll
    for (int h = 0; h < 2; ++h) tmem_st_32x32b_x8(lane_addr + TC_SF + 16 * s + 8 * h, reinterpret_cast<const float(&)[8]>(x[8 * h]));
  }
  float w[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = __uint_as_float(pack_bf16x2(x[2 * j], x[2 * j + 1]));
  tmem_st_32x32b_x8(lane_addr + TC_AS + (key0 + 16 * s) / 2, w);
  if constexpr (TC_HALVES) {
    const int from = (threadIdx.x & 31) | 16;
    float w2[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) w2[j] = __shfl_sync(0xffffffffu, w[j], from);
    tmem_st_32x32b_x8(lane_addr + TC_AS + (K / 2 + 16 * s) / 2, w2);
  }
  tmem_wait_st();
}
// Keys 16 s .. of value row v of state nh of a global state array (load_state / store_state's
// precisions and layouts), as fp32.
__device__ __forceinline__ void tc_global_load16(const void* src, int dtype, int layout_vk, i64 nh, int v, int k0,
                                                 float (&x)[16]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) x[j] = load_state(src, dtype, state_index<V, K>(layout_vk, nh, v, k0 + j));
}
__device__ __forceinline__ void tc_global_store16(void* dst, int dtype, int layout_vk, i64 nh, int v, int k0,
                                                  const float (&x)[16]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) store_state(dst, dtype, state_index<V, K>(layout_vk, nh, v, k0 + j), x[j]);
}
// [16] this thread's keys of the state as held, from tensor memory to state nh of dst (the final state,
// a checkpoint).
__device__ __forceinline__ void tc_store_held(u32 lane_addr, int key0, void* dst, int dtype, int layout_vk, i64 nh,
                                              int v) {
#pragma unroll 1
  for (int s = 0; s < KH / 16; ++s) {
    float x[16];
    tc_state_load16(lane_addr, key0, s, x);
    tc_global_store16(dst, dtype, layout_vk, nh, v, key0 + 16 * s, x);
  }
}
// 16 fp32 values rounded to bf16 pairs (even index low), to 8 columns of this thread's lane.
__device__ __forceinline__ void tc_store_bf16_16(const float (&x)[16], u32 taddr) {
  float w[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = __uint_as_float(pack_bf16x2(x[2 * j], x[2 * j + 1]));
  tmem_st_32x32b_x8(taddr, w);
  tmem_wait_st();
}
// Every thread's tensor-memory stores, before the issuing lane's next tcgen05.mma reads them (and every read
// of the stage before its refill).
__device__ __forceinline__ void tc_sync() {
  tcgen05_fence_before_sync();
  __syncthreads();
  tcgen05_fence_after_sync();
}
// The issuing lane's products of this step complete: each thread waits for the commit's phase.
__device__ __forceinline__ void tc_wait(u64* done, u32& phase) {
  mbarrier_wait_parity(done, phase);
  phase ^= 1u;
  tcgen05_fence_after_sync();
}
// B = a [16, C] core-matrix tile^T (K-major), 16 of its columns from col0; B = the tile (N-major).
__device__ __forceinline__ u64 tc_desc_t(const unsigned char* tile, int col0) {
  return umma_desc(tile + (col0 / 8) * CORE_COLS, CORE_COLS, 128, UMMA_SWIZZLE_NONE);
}
__device__ __forceinline__ u64 tc_desc_n(const unsigned char* tile) {
  return umma_desc(tile, 128, CORE_COLS, UMMA_SWIZZLE_NONE);
}

// [15] S = fp32(dS + S * gexp), one FMA per element; the bf16 copy as the next A. Through the 16-lane
// shapes (16x256b for dS and the fp32 state, 16x128b for the bf16 pairs): a thread takes two adjacent keys
// of two rows in each 8 keys, so it reads a quarter of a row's gexp (two keys an 8-byte load) where a row a
// thread read all of them. GK keys a tensor-memory round trip: the loads of both 16-lane halves of the
// warp's quarter issued together, one wait, their stores, one wait.
__device__ __forceinline__ void tc_state_update(const float* gexp, u32 tm, int tid) {
  constexpr int GK = 16 * TC_GROUP, GN = GK / 8;  // keys a round trip; the shapes' .xN (8 N fp32, 4 N pair columns)
  const u32 quarter = tm + ((32u * (tid >> 5)) << 16);
  const int pair = 2 * (tid & 3);  // the first of the thread's two keys in each 8
#pragma unroll 1
  for (int k0 = 0; k0 < KH; k0 += GK) {
    float D[2][4 * GN], F[2][4 * GN], W[2][2 * GN];  // dS, the fp32 state (FP32_STATE), the bf16 pairs
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // lanes 16 h .. 16 h + 15 of the quarter (TC_HALVES: keys h K / 2 on)
      const u32 half = quarter + ((16u * h) << 16);
      tmem_ld_16x256b<GN>(half + TC_DS + k0, D[h]);
      if constexpr (FP32_STATE) {
        tmem_ld_16x256b<GN>(half + TC_SF + k0, F[h]);
      } else {
        tmem_ld_16x128b<GN>(half + TC_AS + (tc_key_of_half(h) + k0) / 2, W[h]);
      }
    }
    tmem_wait_ld();
#pragma unroll
    for (int j = 0; j < GN; ++j) {
      // without TC_HALVES both halves take the same two decays: one load (as ptxas emits it either way)
      const float2 ge0 = *reinterpret_cast<const float2*>(gexp + k0 + 8 * j + pair);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 ge =
            TC_HALVES && h ? *reinterpret_cast<const float2*>(gexp + tc_key_of_half(h) + k0 + 8 * j + pair) : ge0;
#pragma unroll
        for (int r2 = 0; r2 < 2; ++r2) {  // rows l / 4 and l / 4 + 8 of the half: FFMA2 (sm_100) on the key pair
          const int e = 4 * j + 2 * r2;
          float2 x;
          if constexpr (FP32_STATE) {
            x = make_float2(F[h][e], F[h][e + 1]);
          } else {
            const u32 w = __float_as_uint(W[h][2 * j + r2]);
            x = make_float2(bf16_lo(w), bf16_hi(w));
          }
          const float2 y = fma2_ftz(x, ge, make_float2(D[h][e], D[h][e + 1]));
          if constexpr (FP32_STATE) F[h][e] = y.x, F[h][e + 1] = y.y;
          W[h][2 * j + r2] = __uint_as_float(pack_bf16x2(y.x, y.y));
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 half = quarter + ((16u * h) << 16);
      if constexpr (FP32_STATE) tmem_st_16x256b<GN>(half + TC_SF + k0, F[h]);
      tmem_st_16x128b<GN>(half + TC_AS + (tc_key_of_half(h) + k0) / 2, W[h]);
      // TC_HALVES: the second half's pairs also to the first lanes, where the MMAs read A
      if (TC_HALVES && h == 1) tmem_st_16x128b<GN>(quarter + TC_AS + (K / 2 + k0) / 2, W[h]);
    }
    tmem_wait_st();
  }
}

// One chunk of the chain on the stage st: products by an elected lane of warp ``lead``, the rest by every
// thread on its row (row: the CTA's value row of this thread; key0: the first of its keys); o at o_row0 +
// token * o_st.
__device__ __forceinline__ void tc_chunk(const unsigned char* st, u32 tm, u32 lane_addr, u64* done, u32& phase,
                                         int tid, int lead, int row, int key0, bool v_zero, void* o, i64 o_row0,
                                         i64 o_st, int rows) {
  constexpr u32 IDESC_16 = umma_idesc_bf16<BV, 16, false, false>();  // B = a tile^T (K-major), N = 16 tokens
  constexpr u32 IDESC_KEYS = umma_idesc_bf16<BV, KH, false, true>();  // B = k_res (N-major), N = KH keys
  const float* gexp = reinterpret_cast<const float*>(st + RSM_GEXP);
  const float* bet = reinterpret_cast<const float*>(st + RSM_BETA);
  // the stage's K-major and N-major descriptors, built once; each tile's is one advanced by its offset
  const u64 dstage = tc_desc_t(st, 0), dkres = tc_desc_n(st + RSM_KRES);
  // [11]-[12] W^T and the state part of o^T: A = the state, one k16 step per 16 keys, in key order
  if ((tid >> 5) == lead && elect_one_sync()) {
#pragma unroll
    for (int s = 0; s < KS; ++s)
      umma_bf16_ts(tm + TC_W, tm + TC_AS + 8 * s, wgmma_desc_add(dstage, RSM_KDEC + 2 * s * CORE_COLS), IDESC_16, s > 0);
    if constexpr (OUTPUT) {
#pragma unroll
      for (int s = 0; s < KS; ++s)
        umma_bf16_ts(tm + TC_O, tm + TC_AS + 8 * s, wgmma_desc_add(dstage, RSM_QDEC + 2 * s * CORE_COLS), IDESC_16, s > 0);
    }
    umma_commit(done);
  }
  tc_wait(done, phase);
  // [12] vsub^T = bf16(beta (v^T - W^T)): this thread's value row against the 16 tokens (TC_HALVES: the
  // second lanes compute their row's too, into lanes no product reads)
  float x[16];
  tmem_ld_32x32b<16>(lane_addr + TC_W, x);
  tmem_wait_ld();
#pragma unroll
  for (int j = 0; j < 16; j += 2) {  // two tokens a pair instruction (sm_100: FADD2, FMUL2)
    const float2 vj = v_zero ? make_float2(0.f, 0.f)
                             : make_float2(load_f32<KDA_DT>(st + RSM_VT + j * RSM_VROW, row),
                                           load_f32<KDA_DT>(st + RSM_VT + (j + 1) * RSM_VROW, row));
    const float2 r = mul2_ftz(*reinterpret_cast<const float2*>(bet + j), sub2_ftz(vj, make_float2(x[j], x[j + 1])));
    x[j] = r.x, x[j + 1] = r.y;
  }
  tc_store_bf16_16(x, lane_addr + TC_AV);
  tc_sync();
  // [13] U^T = bf16(vsub^T INV^T): B[k = token j][n = token i] = INV[i][j]
  if ((tid >> 5) == lead && elect_one_sync()) {
    umma_bf16_ts(tm + TC_U, tm + TC_AV, wgmma_desc_add(dstage, RSM_INV), IDESC_16, false);
    umma_commit(done);
  }
  tc_wait(done, phase);
  tmem_ld_32x32b<16>(lane_addr + TC_U, x);
  tmem_wait_ld();
  if constexpr (TC_HALVES) {  // the second lanes take their row's U^T from its first lane: A at lane field 16
#pragma unroll
    for (int j = 0; j < 16; ++j) x[j] = __shfl_sync(0xffffffffu, x[j], tid & 15);
  }
  tc_store_bf16_16(x, lane_addr + TC_AU);
  tc_sync();
  // [14] o^T += U^T Mqk^T; [15] dS = U^T k_res (B[k = token][n = key], N-major): all K keys at once, or
  // (TC_HALVES) each half of them to its lanes, one product a lane field
  if ((tid >> 5) == lead && elect_one_sync()) {
    if constexpr (OUTPUT) umma_bf16_ts(tm + TC_O, tm + TC_AU, wgmma_desc_add(dstage, RSM_MQK), IDESC_16, true);
    umma_bf16_ts(tm + TC_DS, tm + TC_AU, dkres, IDESC_KEYS, false);
    if constexpr (TC_HALVES)
      umma_bf16_ts(tm + TC_HI + TC_DS, tm + TC_HI + TC_AU, wgmma_desc_add(dkres, (K / 2 / 8) * CORE_COLS), IDESC_KEYS,
                   false);
    umma_commit(done);
  }
  tc_wait(done, phase);
  if constexpr (OUTPUT) {  // [14] o^T rounded once to the output dtype: this thread's value column
    tmem_ld_32x32b<16>(lane_addr + TC_O, x);
    tmem_wait_ld();
    if (key0 == 0)  // TC_HALVES: the row's first lane alone
      for (int j = 0; j < rows; ++j) store_f32<KDA_DT>(o, o_row0 + j * o_st, x[j]);
  }
  tc_state_update(gexp, tm, tid);  // [15]
}

// Once a CTA, before its first sequence: the stages' barriers and the products' one, and TC_COLS columns
// of tensor memory (their address returned). A CTA that runs several sequences (the fused forward's
// consumers) keeps counting the stages' and the products' phases across them.
__device__ __forceinline__ u32 tc_begin(unsigned char* sm, int tid) {
  u64* bars = reinterpret_cast<u64*>(sm + RSM_BAR);  // stage s's copies at bars[2 s]
  u64* done = reinterpret_cast<u64*>(sm + RSM_MMABAR);  // the issuing lane's products complete
  u32* slot = reinterpret_cast<u32*>(sm + RSM_TMEM);
  if (tid == 0) {
#pragma unroll 1
    for (int s = 0; s < STAGES; ++s) mbarrier_init(&bars[2 * s], 1);
    mbarrier_init(done, 1);
    fence_proxy_async_smem();  // the initialised barriers, before the bulk copies and commits complete on them
  }
  if (tid < 32) {
    tmem_alloc(slot, TC_COLS);
    tmem_relinquish();
  }
  tc_sync();
  return *slot;
}
// Once a CTA, after its last sequence: the columns freed.
__device__ __forceinline__ void tc_end(u32 tm) {
  tc_sync();  // every thread's last tensor-memory load, before the columns are freed
  if (threadIdx.x < 32) tmem_dealloc(tm, TC_COLS);
}

// Sequence n's recurrence over value rows [v0, v0 + BV) of value head hv on tcgen05, its chunks read through
// ``blocks`` (the workspace; the fused forward's ring); ``c0``: the chunks this CTA ran before, ``phase`` the
// products' barrier's (tc_begin's tensor memory at tm).
template <class Blocks>
__device__ __forceinline__ void tc_sequence(const RecurrenceIn& in, int n, int v0, int hv, int c0, const Blocks& blocks,
                                            u32 tm, u32& phase) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // state pool (s_in == s_out): slot idx[n]; outside [0, P) starts from zeros, stores nothing
  const i64 nh = state_slot(n, hv, in.HV, in.pool_idx, in.pool_idx_i64, in.pool_slots);
  const int s_in_dtype = nh < 0 ? KDA_STATE_NONE : in.s_in_dtype;
  const void* const s_in = in.s_in;
  void* const s_out = in.s_out;
  const int s_out_dtype = in.s_out_dtype, layout_vk = in.layout_vk;
  // this thread's value row in the CTA and its first key: M = 128 a row a thread; TC_HALVES a row's two
  // halves in lanes r and 16 + r of warp w (row 16 w + r)
  const int row = TC_HALVES ? 16 * warp + (lane & 15) : tid, key0 = TC_HALVES ? (lane >> 4) * KH : 0;
  const int vr = v0 + row;
  const Seq seq = sequence(in.cu_seqlens, in.cu_is_i64, n, in.T);
  if (seq.len == 0) {  // [16] the final state is the initial state, converted only
    if (s_out != nullptr && nh >= 0) {
#pragma unroll 1
      for (int s = 0; s < KH / 16; ++s) {
        float x[16];
        tc_global_load16(s_in, s_in_dtype, layout_vk, nh, vr, key0 + 16 * s, x);
        tc_global_store16(s_out, s_out_dtype, layout_vk, nh, vr, key0 + 16 * s, x);
      }
    }
    return;
  }
  unsigned char* sm = dynamic_smem();
  const int b = in.cu_seqlens == nullptr ? n : 0;
  const i64 tok0 = in.cu_seqlens == nullptr ? 0 : seq.bos;
  const bool v_zero = !OUTPUT && in.v == nullptr;  // the M map: v = 0, never read
  const unsigned char* vbase =
      v_zero ? nullptr
             : static_cast<const unsigned char*>(in.v) + (b * in.v_sb + tok0 * in.v_st + hv * in.v_sh + v0) * ES;
  const i64 slot0 = first_slot(in.cu_seqlens, n, seq.bos, in.chunks_per_seq);
  const int nchunks = (seq.len + CHUNK - 1) / CHUNK;
  u64* bars = reinterpret_cast<u64*>(sm + RSM_BAR);
  u64* done = reinterpret_cast<u64*>(sm + RSM_MMABAR);
  const u32 lane_addr = tm + ((32u * warp) << 16);
  // the warp that issues a chunk's copies and products, and releases its slot: one a stage in turn, so
  // no scheduler of the SM carries all of them (warp w of every block shares scheduler w mod 4)
  const auto lead_of = [&](int c) { return (c0 + c) % (NT / 32); };
  auto issue = [&](int c) {
    issue_bulk_chunk(sm, bars, blocks, hv, slot0, vbase, in.v_st, c, c0, nchunks, seq.len, v_zero, tid, lead_of(c));
  };
#pragma unroll 1
  for (int c = 0; c < STAGES - 1; ++c) issue(c);
  // [10] this thread's row of the state, as held (a bf16 state rounded once, as the other paths'
  // loads do), into tensor memory with its bf16 copy as the first A
#pragma unroll 1
  for (int s = 0; s < KH / 16; ++s) {
    float x[16];
    tc_global_load16(s_in, s_in_dtype, layout_vk, nh < 0 ? 0 : nh, vr, key0 + 16 * s, x);
    tc_state_store16(lane_addr, key0, s, x);
  }
  tc_sync();  // every row's A, and chunk 0's zeroed tail, before the first products
#pragma unroll 1
  for (int c = 0; c < nchunks; ++c) {
    issue(c + STAGES - 1);
    mbarrier_wait_parity(&bars[2 * ((c0 + c) % STAGES)], ((c0 + c) / STAGES) & 1);
    if (tid == 32 * lead_of(c)) blocks.release(hv, slot0 + c);  // the slot's bytes are in the stage
    const int rows = seq.len - c * CHUNK < CHUNK ? seq.len - c * CHUNK : CHUNK;
    tc_chunk(sm + ((c0 + c) % STAGES) * RSM_STAGE, tm, lane_addr, done, phase, tid, lead_of(c), row, key0, v_zero, in.o,
             b * in.o_sb + (tok0 + static_cast<i64>(c) * CHUNK) * in.o_st + hv * in.o_sh + vr, in.o_st, rows);
#if KDA_CHECKPOINTS
    {
      const i64 ck_row = checkpoint_row(c, seq.len, n, in.ckpt_idx, in.ckpt_i64, in.ckpt_rows, in.ckpt_per_seq,
                                        in.ckpt_every);
      if (ck_row >= 0) tc_store_held(lane_addr, key0, in.ckpt, in.ckpt_dtype, layout_vk, ck_row * in.HV + hv, vr);
    }
#endif
    tc_sync();  // every read of the stage and every A store, before the refill and the next products
  }
  // [16] the final state, as held
  if (s_out != nullptr && nh >= 0) tc_store_held(lane_addr, key0, s_out, s_out_dtype, layout_vk, nh, vr);
}

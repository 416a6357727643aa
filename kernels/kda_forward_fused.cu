// kda_forward_fused: the forward in one launch (docs/design.md section 5, the fused forward): kda_prepare's
// per-chunk work and kda_recurrence's wgmma chain (sm_90a) as two roles of one persistent grid, the
// workspace a ring of KDA_RING chunk blocks a value head in global memory (kernels/chunk_ring.cuh) that
// stays in L2 instead of a round trip through HBM.
//
// Blocks [0, HV * V / BV) consume: block b runs value rows [v0, v0 + BV) of value head hv = b / (V / BV),
// v0 = (b % (V / BV)) BV, through every sequence in turn, each chunk acquired from the ring (its bulk copy
// issued once the producer published it) and released once its copy landed. The other blocks produce:
// they take items of KDA_GROUP consecutive chunk slots of one value head from a counter, in slot-group
// order (item i: group i / HV of head i % HV), and run kda_prepare's pipeline over them, each slot's block
// written once its ring slot is free and published after its last store. Every block of the launch must
// be resident (a cooperative launch; the emulation's co-resident one): a consumer waits on producers, and a
// producer on the consumers of its head. Deadlock-free: a producer waits only for slot s - R's releases;
// a consumer releases s - R after it acquired s - R + STAGES - 1 < s (R >= STAGES), which an earlier item
// holds or this producer published already.
//
// The slots between sequences (varlen: first_slot's spare ones, and a zero-length sequence's) are never
// written: each consumer releases them when it passes them, so the ring's counts stay in step.
//
// KDA_FUSED_SPLIT = 1 (wgmma): the split forward's final launch (docs/design.md section 7.2; seg_n segments a
// sequence of the call, the launch's sequences those segments). Blocks [0, nseq HV V / BV) consume one
// (segment, value head, value rows) each, from the segment's start state; a segment but the last reads the
// workspace ``ws`` the prepare launch wrote for the maps, the last one a stream of the ring (stream q HV + hv
// of the call's sequence q, its chunk c at the segment's slot first + c), filled by the producers in
// stream-group order (item i: group i / S of stream i % S, at most ``groups`` a stream). The same protocol,
// each stream's counts from its first slot; the prepare launch skips the last segments (skip_last_of).
//
// KDA_FUSED_MAPS = 1 (wgmma, KDA_NO_OUTPUT = 1): the split's maps with the prepare of what they read, so no
// prepare launch at all. Blocks [0, HV items) run the maps' work list (kda_recurrence.cu's map_work_item, the
// merged [K, K + V] fp32 state, value rows below K the M part's with v = 0), each chunk's block bulk-copied
// from the workspace ``ws`` once its ready flag is set; the producers write every segment's but the last into
// that workspace (the final launch reads them too), each slot once, and set its flag: flags ready[HV nslots],
// the item counter, an error word. A producer never waits, so its items' order is free: group-major over the
// (sequence, segment, head) streams, as the chains walk every segment at once.
//
// Rendered configuration: kda_prepare's (KDA_WS_CORE = 1) and kda_recurrence's (KDA_MMA = KDA_MMA_WGMMA with
// KDA_BV = 64: a warpgroup, the prepare's 128 threads; or KDA_MMA_TCGEN05 on sm_100a, KDA_BV = 64 or 128, its
// 128 threads a tensor-memory lane each), KDA_RING (slots a stream), KDA_GROUP (slots an item), KDA_FUSED_SPLIT,
// KDA_FUSED_MAPS.
// Flags (u32, zeroed before the launch): ready[S R], consumed[S R] (S streams: HV, or the split's last segments'
// heads), the item counter, an error word (nonzero: a consumer found its slot refilled before it released it, a
// broken protocol; the output is then wrong).
#include "common.cuh"
#include "fragments.cuh"
#include "gates.cuh"
#include "prepare_steps.cuh"
#include "rows.cuh"
#include "chunk_stream.cuh"
#include "state_io.cuh"
#include "chunk_ring.cuh"

#define KDA_PREPARE_BODY_ONLY 1
#define KDA_RECURRENCE_BODY_ONLY 1
namespace fused_prepare {
#include "kda_prepare.cu"
}
namespace fused_recurrence {
#include "kda_recurrence.cu"
}

#ifndef KDA_FUSED_SPLIT
#define KDA_FUSED_SPLIT 0
#endif
#ifndef KDA_FUSED_MAPS
#define KDA_FUSED_MAPS 0
#endif

namespace {
using namespace kda;

constexpr int R = KDA_RING;
static_assert(!KDA_FUSED_SPLIT || KDA_MMA == KDA_MMA_WGMMA, "the split's final launch: the wgmma chain");
static_assert(!KDA_FUSED_MAPS || (KDA_MMA == KDA_MMA_WGMMA && !KDA_FUSED_SPLIT), "the split's maps: the wgmma chain");
constexpr int GROUP = KDA_GROUP;
constexpr int VB = KDA_V / KDA_BV;  // consumers a value head
static_assert(KDA_WS_CORE && ((KDA_MMA == KDA_MMA_WGMMA && KDA_BV == 64) || KDA_MMA == KDA_MMA_TCGEN05),
              "the wgmma chain of one warpgroup, or the tcgen05 chain of 128 threads");
static_assert(!KDA_ANY_DIMS && KDA_NO_OUTPUT == KDA_FUSED_MAPS && !KDA_STORE_STATES && !KDA_CHECKPOINTS,
              "the plain forward, or the split's maps without the output");
#if KDA_TCGEN05_PATH
static_assert(2 * fused_recurrence::TC_COLS <= 512, "two consumers' tensor memory on an SM (fused.py: tcgen05_columns)");
#endif
static_assert(R >= KDA_STAGES, "a consumer releases a slot after acquiring STAGES - 1 more (deadlock-free)");

// The ring: R blocks a stream; per slot its ready and consumed counts (chunk_ring.cuh). The serial launch
// has a stream a value head, its chunk c at slot c; the split's (seg_n > 0) a stream a (last segment, value
// head), its chunk c at slot base + c, the streams of last segment q from q HV on (stream0).
struct RingBlocks {
  unsigned char* ring;
  u32* flags;  // ready[S R], consumed[S R], counter, error
  int S;
#if KDA_FUSED_SPLIT
  int stream0;
  i64 base;
  // the stream's chunk in ``slot`` and its place in the ring
  __device__ __forceinline__ int chunk(i64 slot) const { return static_cast<int>(slot - base); }
  __device__ __forceinline__ int at(int hv, i64 slot) const { return (stream0 + hv) * R + chunk(slot) % R; }
#else  // (the serial build's arithmetic as it was: ptxas spilled the fp32 state's builds with the split's)
  __device__ __forceinline__ int chunk(i64 slot) const { return static_cast<int>(slot); }
  __device__ __forceinline__ int at(int hv, i64 slot) const { return hv * R + static_cast<int>(slot % R); }
#endif
  __device__ __forceinline__ unsigned char* block(int hv, i64 slot) const {
    return ring + static_cast<i64>(at(hv, slot)) * WS_STRIDE;
  }
  // producer (every thread): wait until the slot's last chunk is released by every consumer of the head
  __device__ __forceinline__ void claim(int hv, int slot, int tid) const {
    if (tid == 0) ring_wait_free(flags + S * R + at(hv, slot), chunk(slot), R, VB);
    __syncthreads();
  }
  // producer (every thread): every store of the slot's block, then its flag
  __device__ __forceinline__ void publish(int hv, int slot, int tid) const {
    __syncthreads();
    if (tid == 0) ring_publish(flags + at(hv, slot), chunk(slot));
  }
  // consumer, the lane that issues the slot's copy: the block published, then visible to the bulk copy
  __device__ __forceinline__ void acquire(int hv, i64 slot) const {
    if (!ring_wait_ready(flags + at(hv, slot), chunk(slot))) red_release_gpu_add(flags + 2 * S * R + 1, 1u);
    fence_proxy_async_global();
  }
  // consumer, thread 0, once the slot's copy landed
  __device__ __forceinline__ void release(int hv, i64 slot) const { ring_release(flags + S * R + at(hv, slot)); }
};

// A consumer: value rows [v0, v0 + BV) of head hv through every sequence; the slots no sequence uses
// released as they are passed.
__device__ __forceinline__ void consume(const fused_recurrence::RecurrenceIn& in, const RingBlocks& blocks, int nseq,
                                        int hv, int v0) {
#if KDA_TCGEN05_PATH
  const u32 tm = fused_recurrence::tc_begin(dynamic_smem(), threadIdx.x);
  u32 phase = 0;  // the products' barrier's, across sequences as the stages'
#else
  fused_recurrence::init_stage_barriers(dynamic_smem(), threadIdx.x);
#endif
  int c0 = 0;
#pragma unroll 1
  for (int n = 0; n < nseq; ++n) {
#if KDA_TCGEN05_PATH
    fused_recurrence::tc_sequence(in, n, v0, hv, c0, blocks, tm, phase);
#else
    fused_recurrence::recurrence_sequence(in, n, v0, hv, c0, blocks);
#endif
    const Seq seq = sequence(in.cu_seqlens, in.cu_is_i64, n, in.T);
    const int nchunks = (seq.len + CHUNK - 1) / CHUNK;
    c0 += nchunks;
    if (in.cu_seqlens != nullptr && n + 1 < nseq && threadIdx.x == 0) {
      const i64 used = first_slot(in.cu_seqlens, n, seq.bos, in.chunks_per_seq) + nchunks;
      const i64 next = first_slot(in.cu_seqlens, n + 1, cu_at(in.cu_seqlens, in.cu_is_i64, n + 1, in.T), in.chunks_per_seq);
#pragma unroll 1
      for (i64 s = used; s < next; ++s) blocks.release(hv, s);  // (its copies landed: the sequence's last wait)
    }
  }
#if KDA_TCGEN05_PATH
  fused_recurrence::tc_end(tm);
#endif
}

// A producer's loop: item after item from the launch's counter (thread 0 takes one, the block's barrier hands it
// to every thread) until ``items`` are taken; ``run(it)`` makes item it.
template <class Run>
__device__ __forceinline__ void take_items(u32* counter, u32 items, const Run& run) {
  __shared__ u32 item;
#pragma unroll 1
  for (;;) {
    if (threadIdx.x == 0) item = atomicAdd(counter, 1u);
    __syncthreads();
    const u32 it = item;
    __syncthreads();  // every thread has it before thread 0 takes the next
    if (it >= items) break;
    run(it);
  }
}

// A producer: items of GROUP slots of one head, in slot-group order, until none is left.
__device__ __forceinline__ void produce(const fused_prepare::PrepareIn& in, const RingBlocks& blocks, int nslots) {
  const u32 groups = static_cast<u32>((nslots + GROUP - 1) / GROUP);
  take_items(blocks.flags + 2 * blocks.S * R, groups * static_cast<u32>(in.HV), [&](u32 it) {
    const int first = static_cast<int>(it / in.HV) * GROUP, hv = static_cast<int>(it % in.HV);
    fused_prepare::prepare_slots(in, hv, first, first + GROUP < nslots ? first + GROUP : nslots, blocks);
  });
}

#if KDA_FUSED_SPLIT
// The split forward (seg_n > 0; kdacupy/ops/seqpar/split.py): the segment batch's sequences, seg_n segments
// of each of the call's, the segments' start states in s_in. A consumer runs one (segment, value head, value
// rows); a segment but the last reads the workspace the prepare launch wrote (it also fed the maps), the last
// reads the ring, its chunks made by the producers beside: the prepare launch skips them. Stream of last
// segment q and head hv: q HV + hv; its chunk c at the segment's slot first + c.
__device__ __forceinline__ RingBlocks last_segment_ring(const RingBlocks& r, const void* cu, int cu_is_i64, int n,
                                                        int seg_n, int HV, int T, int chunks_per_seq) {
  const Seq seq = sequence(cu, cu_is_i64, n, T);
  return RingBlocks{r.ring, r.flags, r.S, (n / seg_n) * HV, first_slot(cu, n, seq.bos, chunks_per_seq)};
}

// A split consumer's blocks: the ring's (its last segment) or the workspace's, one body for both (two
// instantiations of the chain cost the fp32 state's builds spills).
struct SegmentBlocks {
  RingBlocks ring;
  fused_recurrence::WorkspaceBlocks ws;
  bool last;
  __device__ __forceinline__ const unsigned char* block(int hv, i64 slot) const {
    return last ? ring.block(hv, slot) : ws.block(hv, slot);
  }
  __device__ __forceinline__ void acquire(int hv, i64 slot) const {
    if (last) ring.acquire(hv, slot);
  }
  __device__ __forceinline__ void release(int hv, i64 slot) const {
    if (last) ring.release(hv, slot);
  }
};

__device__ __forceinline__ void consume_segment(const fused_recurrence::RecurrenceIn& in, const RingBlocks& ring,
                                                const unsigned char* ws, int seg_n, int n, int hv, int v0) {
  fused_recurrence::init_stage_barriers(dynamic_smem(), threadIdx.x);
  const bool last = n % seg_n == seg_n - 1;
  const RingBlocks r = last ? last_segment_ring(ring, in.cu_seqlens, in.cu_is_i64, n, seg_n, in.HV, in.T,
                                                in.chunks_per_seq)
                            : ring;
  fused_recurrence::recurrence_sequence(in, n, v0, hv, 0, SegmentBlocks{r, {ws, in.nslots}, last});
}

// A producer of the split: items of GROUP chunks of one stream, group-major (item i: group i / S of stream
// i % S), ``groups`` a stream at most (a shorter segment's items past its end are skipped).
__device__ __forceinline__ void produce_segments(const fused_prepare::PrepareIn& in, const RingBlocks& ring, int seg_n,
                                                 int groups) {
  take_items(ring.flags + 2 * ring.S * R, static_cast<u32>(groups) * static_cast<u32>(ring.S), [&](u32 it) {
    const int stream = static_cast<int>(it % ring.S), hv = stream % in.HV, n = stream / in.HV * seg_n + seg_n - 1;
    const RingBlocks r = last_segment_ring(ring, in.cu_seqlens, in.cu_is_i64, n, seg_n, in.HV, in.T, in.chunks_per_seq);
    const Seq seq = sequence(in.cu_seqlens, in.cu_is_i64, n, in.T);
    const int first = static_cast<int>(it / ring.S) * GROUP, nchunks = (seq.len + CHUNK - 1) / CHUNK;
    if (first >= nchunks) return;
    const int last = first + GROUP < nchunks ? first + GROUP : nchunks, base = static_cast<int>(r.base);
    fused_prepare::prepare_slots(in, hv, base + first, base + last, r, fused_prepare::KnownSeq{seq.bos, seq.len, n, base});
  });
}
#endif

#if KDA_FUSED_MAPS
// The split's maps with the prepare of the segments they read (seg_n > 0; kdacupy/ops/seqpar/split.py): the
// consumers run the maps' work list (kda_recurrence.cu's map_work_item, value rows below K the M part's,
// v = 0) of every value head, each chunk's block read from the workspace once its producer published it there;
// the producers make every segment's but the last (the final launch makes those), each slot once, into the
// workspace the final launch reads too. Flags: ready[HV nslots] (1: the slot's block is written), the item
// counter. A producer never waits, so any order of its items is deadlock-free; slot-group order keeps them
// just ahead of the chains, which walk all segments at once.
struct FlaggedWorkspace {
  unsigned char* ws;
  u32* flags;
  int nslots;
  __device__ __forceinline__ unsigned char* block(int hv, i64 slot) const {
    return ws + (static_cast<i64>(hv) * nslots + slot) * WS_STRIDE;
  }
  __device__ __forceinline__ void claim(int, int, int) const {}  // (written once)
  __device__ __forceinline__ void publish(int hv, int slot, int tid) const {
    __syncthreads();
    if (tid == 0) st_release_gpu(flags + static_cast<i64>(hv) * nslots + slot, 1u);
  }
  __device__ __forceinline__ void acquire(int hv, i64 slot) const {
    wait_acquire_gpu_geq(flags + static_cast<i64>(hv) * nslots + slot, 1u);
    fence_proxy_async_global();
  }
  __device__ __forceinline__ void release(int, i64) const {}
};

// Consumer b: work item b % items of value head b / items (the plain maps' grid is (items, HV)).
__device__ __forceinline__ void consume_map(fused_recurrence::RecurrenceIn in, const FlaggedWorkspace& blocks,
                                            int seg_n, int v_from, int items, int b) {
  int n, v0;
  const int hv = b / items;
  fused_recurrence::map_work_item(b % items, seg_n, v_from / KDA_BV, VB, n, v0);
  if (v_from > 0)
    in.v = v0 < v_from ? nullptr : static_cast<const unsigned char*>(in.v) - static_cast<i64>(v_from) * fused_recurrence::ES;
  fused_recurrence::init_stage_barriers(dynamic_smem(), threadIdx.x);
  fused_recurrence::recurrence_sequence(in, n, v0, hv, 0, blocks);
}

// A producer: items of GROUP chunks of one (sequence, segment but the last, value head) stream, group-major.
__device__ __forceinline__ void produce_maps(const fused_prepare::PrepareIn& in, const FlaggedWorkspace& blocks,
                                             u32* counter, int seg_n, int groups) {
  const int S = in.nseq / seg_n * (seg_n - 1) * in.HV;
  take_items(counter, static_cast<u32>(groups) * static_cast<u32>(S), [&](u32 it) {
    const int stream = static_cast<int>(it % S), hv = stream % in.HV, qs = stream / in.HV;
    const int n = qs / (seg_n - 1) * seg_n + qs % (seg_n - 1);
    const Seq seq = sequence(in.cu_seqlens, in.cu_is_i64, n, in.T);
    const int base = static_cast<int>(first_slot(in.cu_seqlens, n, seq.bos, in.chunks_per_seq));
    const int first = static_cast<int>(it / S) * GROUP, nchunks = (seq.len + CHUNK - 1) / CHUNK;
    if (first >= nchunks) return;
    fused_prepare::prepare_slots(in, hv, base + first, base + (first + GROUP < nchunks ? first + GROUP : nchunks),
                                 blocks, fused_prepare::KnownSeq{seq.bos, seq.len, n, base});
  });
}
#endif

}  // namespace

// Three blocks an SM: the wgmma chain and the prepare fit 168 registers (K = 128: 164); fp32 inputs at K = 128
// spilled 4 bytes there (either state), so two (their shared memory allows three at most anyway). tcgen05: two,
// as the launch's shared memory allows (kdacupy/ops/forward/fused.py: two consumers' tensor memory must fit an
// SM's 512 columns, or a third's tcgen05.alloc would wait for a consumer that waits for producers that wait for
// it). The split's builds with the fp32 state at K = 128 (the maps' always): two (they spilled 8-72 bytes at 168).
#define KDA_FUSED_MIN_BLOCKS                                                                                  \
  (KDA_TCGEN05_PATH || (KDA_K > 64 && (KDA_DT == KDA_F32 || (KDA_STATE_FP32 && (KDA_FUSED_SPLIT || KDA_FUSED_MAPS)))) \
       ? 2                                                                                                    \
       : 3)
extern "C" __global__ void __launch_bounds__(128, KDA_FUSED_MIN_BLOCKS) kda_forward_fused(
    const void* q, const void* k, const void* g, const void* beta, const void* v, void* o,
    i64 q_sb, i64 q_st, i64 q_sh, i64 k_sb, i64 k_st, i64 k_sh, i64 g_sb, i64 g_st, i64 g_sh,
    i64 b_sb, i64 b_st, i64 b_sh, i64 v_sb, i64 v_st, i64 v_sh, i64 o_sb, i64 o_st, i64 o_sh,
    const float* A_log, const float* dt_bias, const void* cu_seqlens, int cu_is_i64,
    int T, int H, int HV, int nseq, int nslots, int chunks_per_seq, float scale, float lb2,
    const void* s_in, int s_in_dtype, void* s_out, int s_out_dtype, int layout_vk,
    const void* pool_idx, int pool_idx_i64, i64 pool_slots, unsigned char* ring, u32* flags
#if KDA_FUSED_SPLIT || KDA_FUSED_MAPS
    , const unsigned char* ws, int seg_n, int groups  // the split's builds: the workspace, segments, items a stream
#endif
    ) {
  // what a consumer's chain and a producer's prepare read (each role builds its own, in its branch)
  const auto recurrence_in = [&] {
    return fused_recurrence::RecurrenceIn{v,       v_sb,         v_st,       v_sh,       o,        o_sb,
                                          o_st,    o_sh,         s_in,       s_in_dtype, s_out,    s_out_dtype,
                                          layout_vk, cu_seqlens, cu_is_i64,  T,          HV,       nslots,
                                          chunks_per_seq, pool_idx, pool_idx_i64, pool_slots, nullptr, nullptr,
                                          0,       nullptr,      0,          0,          0,        1,
                                          KDA_K,   KDA_V};
  };
  const auto prepare_in = [&] {
    return fused_prepare::PrepareIn{q,    k,    g,    beta, q_sb,  q_st,    q_sh, k_sb,
                                    k_st, k_sh, g_sb, g_st, g_sh,  b_sb,    b_st,      b_sh,
                                    A_log, dt_bias, cu_seqlens, cu_is_i64, T, H, HV, nseq, chunks_per_seq, scale, lb2,
                                    KDA_K, 0};
  };
#if KDA_FUSED_MAPS
  // the split's maps: every value head's work list (the merged state's value rows below K the M part's, v = 0);
  // the producers every segment's but the last
  constexpr int v_from = KDA_K;
  const int items = nseq / seg_n * ((seg_n - 2) * (v_from / KDA_BV) + (seg_n - 1) * (VB - v_from / KDA_BV));
  const FlaggedWorkspace flagged{const_cast<unsigned char*>(ws), flags, nslots};
  if (blockIdx.x < static_cast<unsigned>(HV * items)) {
    const fused_recurrence::RecurrenceIn in = recurrence_in();
    consume_map(in, flagged, seg_n, v_from, items, blockIdx.x);
  } else {
    const fused_prepare::PrepareIn in = prepare_in();
    produce_maps(in, flagged, flags + static_cast<i64>(HV) * nslots, seg_n, groups);
  }
  (void)ring;
#else
  // the consumers: every (value head, value rows) through every sequence; the split's, every (segment, head, rows)
  const int consumers = KDA_FUSED_SPLIT ? HV * VB * nseq : HV * VB;
#if KDA_FUSED_SPLIT
  const RingBlocks blocks{ring, flags, nseq / seg_n * HV, 0, 0};
#else
  const RingBlocks blocks{ring, flags, HV};
#endif
  if (blockIdx.x < static_cast<unsigned>(consumers)) {
    const fused_recurrence::RecurrenceIn in = recurrence_in();
    const int b = blockIdx.x, v0 = (b % VB) * KDA_BV;
#if KDA_FUSED_SPLIT
    consume_segment(in, blocks, ws, seg_n, b / (VB * HV), b / VB % HV, v0);
#else
    consume(in, blocks, nseq, b / VB, v0);
#endif
  } else {
    const fused_prepare::PrepareIn in = prepare_in();
#if KDA_FUSED_SPLIT
    produce_segments(in, blocks, seg_n, groups);
#else
    produce(in, blocks, nslots);
#endif
  }
#endif
}

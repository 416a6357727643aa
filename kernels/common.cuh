// Element types and small helpers shared by the KDA kernels. bf16 and fp16
// travel as raw 16-bit patterns, so no CUDA header is needed (NVRTC runs with
// no include path, and the CPU emulation compiles the same text with g++).
#pragma once
#include "types.cuh"
#include "ptx.cuh"

// Element types KDA_BF16, KDA_F16, KDA_F32 and every other enum are #defined in
// front of each rendered variant, from kdacupy/jit/enums.py.
#ifndef KDA_BF16
#error "render kernels through kdacupy.jit.render: the enum names are missing"
#endif

namespace kda {

constexpr int CHUNK = 16;

template <int DT> struct Storage { typedef u16 type; };
template <> struct Storage<KDA_F32> { typedef float type; };

template <int DT> __host__ __device__ constexpr int elem_bytes() { return DT == KDA_F32 ? 4 : 2; }

__device__ __forceinline__ float bf16_bits_to_f32(u32 b) { return __uint_as_float(b << 16); }

// One element of storage type DT at base[idx], as fp32 (exact).
template <int DT> __device__ __forceinline__ float load_f32(const void* base, i64 idx) {
  if constexpr (DT == KDA_F32) {
    return static_cast<const float*>(base)[idx];
  } else if constexpr (DT == KDA_BF16) {
    return bf16_bits_to_f32(static_cast<const u16*>(base)[idx]);
  } else {
    return f16_to_f32(static_cast<const u16*>(base)[idx]);
  }
}

// fp32 -> storage type DT at base[idx], round to nearest even.
template <int DT> __device__ __forceinline__ void store_f32(void* base, i64 idx, float x) {
  if constexpr (DT == KDA_F32) {
    static_cast<float*>(base)[idx] = x;
  } else if constexpr (DT == KDA_BF16) {
    static_cast<u16*>(base)[idx] = f32_to_bf16(x);
  } else {
    static_cast<u16*>(base)[idx] = f32_to_f16(x);
  }
}

struct __align__(16) Vec16 {
  u32 w[4];
};
struct __align__(8) Vec8 {
  u32 w[2];
};

// N consecutive elements of type DT starting at a 16-byte aligned address, as fp32.
template <int DT, int N> __device__ __forceinline__ void load_row(const void* p, float (&out)[N]) {
  constexpr int per_vec = 16 / elem_bytes<DT>();
  static_assert(N % per_vec == 0, "rows are read in 16-byte vectors");
#pragma unroll
  for (int i = 0; i < N / per_vec; ++i) {
    Vec16 v = static_cast<const Vec16*>(p)[i];
#pragma unroll
    for (int j = 0; j < per_vec; ++j) {
      if constexpr (DT == KDA_F32) {
        out[i * per_vec + j] = __uint_as_float(v.w[j]);
      } else {
        u32 bits = (v.w[j / 2] >> (16 * (j % 2))) & 0xffffu;
        out[i * per_vec + j] = DT == KDA_BF16 ? bf16_bits_to_f32(bits) : f16_to_f32(static_cast<u16>(bits));
      }
    }
  }
}

// 4 consecutive elements of type DT (8 or 16 bytes, aligned to that) as fp32.
template <int DT> __device__ __forceinline__ void load_quad(const void* p, float (&out)[4]) {
  if constexpr (DT == KDA_F32) {
    const Vec16 v = *static_cast<const Vec16*>(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __uint_as_float(v.w[j]);
  } else {
    const Vec8 v = *static_cast<const Vec8*>(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const u32 bits = (v.w[j / 2] >> (16 * (j % 2))) & 0xffffu;
      out[j] = DT == KDA_BF16 ? bf16_bits_to_f32(bits) : f16_to_f32(static_cast<u16>(bits));
    }
  }
}

// 16 bf16 of one row held in the mma accumulator layout (lane t of the row's quad: ``lo`` =
// columns 2t, 2t + 1, ``hi`` = columns 8 + 2t, 8 + 2t + 1) to row[0..15], one 8-byte store per
// lane after one shuffle: even lanes store columns 2t..2t+3 (their lo, the odd partner's lo), odd
// lanes 8+2t-2..8+2t+1 (the even partner's hi, their hi), so the quad writes one whole 32-byte
// sector (two 4-byte stores per lane would use half of each). The parity picks by arithmetic, not
// by selects: a host compiler turned those into branches and split the store per parity, which
// the emulation's counters then saw as two half-warp requests. Every lane of the warp takes part.
__device__ __forceinline__ void store_row16(u16* row, u32 lo, u32 hi, int t) {
  const u32 odd = t & 1;
  const u32 other = __shfl_xor_sync(0xffffffffu, hi + (lo - hi) * odd, 1);  // odd lanes hand over lo
  const u64 w0 = lo + (other - lo) * odd, w1 = other + (hi - other) * odd;
  *reinterpret_cast<u64*>(row + 2 * t + 6 * odd) = w0 | w1 << 32;
}
// store_row16's inverse: row[0..15] to the accumulator layout (``lo``, ``hi`` as there), one
// 8-byte load per lane (the same columns store_row16 writes) and one shuffle, so the quad reads
// one whole 32-byte sector. Every lane of the warp takes part.
__device__ __forceinline__ void load_row16(const u16* row, u32& lo, u32& hi, int t) {
  const u32 odd = t & 1;
  const u64 w = *reinterpret_cast<const u64*>(row + 2 * t + 6 * odd);
  const u32 w0 = static_cast<u32>(w), w1 = static_cast<u32>(w >> 32);
  const u32 other = __shfl_xor_sync(0xffffffffu, w1 + (w0 - w1) * odd, 1);  // even lanes hand over w1
  lo = w0 + (other - w0) * odd;
  hi = other + (w1 - other) * odd;
}

// n elements of EB bytes from src to dst, one at a time (a rolled loop: fill_piece16 and
// store_piece16 run it next to a chunk's live registers, where an unrolled one cost spills).
template <int EB> __device__ __forceinline__ void copy_elems(unsigned char* dst, const unsigned char* src, int n) {
#pragma unroll 1
  for (int e = 0; e < n; ++e) {
    if constexpr (EB == 4) {
      reinterpret_cast<u32*>(dst)[e] = reinterpret_cast<const u32*>(src)[e];
    } else {
      reinterpret_cast<u16*>(dst)[e] = reinterpret_cast<const u16*>(src)[e];
    }
  }
}
// Any head size (KDA_ANY_DIMS in the chunked kernels): a tile is padded to its key / value tile and
// the arrays have their true extents, so a 16-byte piece of a row may hang over the row's end or
// sit off 16 bytes (a 60-channel bf16 row is 120 bytes). fill_piece16 puts the piece whose first
// ``valid`` elements (of EB bytes) exist at src into shared memory at dst: a whole, aligned piece
// by cp.async (in the caller's open group), else zeros then the existing elements one by one
// (copy_elems); a dead row (``live`` false) or an empty piece is zero and reads nothing.
template <int EB>
__device__ __forceinline__ void fill_piece16(unsigned char* dst, const unsigned char* src, int valid, bool live) {
  constexpr int PE = 16 / EB;
  if (live && valid >= PE && (reinterpret_cast<u64>(src) & 15) == 0) {
    cp_async_16(dst, src);
    return;
  }
  *reinterpret_cast<Vec16*>(dst) = Vec16{};
  if (live) copy_elems<EB>(dst, src, valid < PE ? valid : PE);
}
// fill_piece16's inverse for a store: the first ``valid`` elements of the piece at src (shared
// memory, 16-byte aligned) to dst, one 16-byte store where the whole piece exists and dst is aligned.
template <int EB> __device__ __forceinline__ void store_piece16(unsigned char* dst, const unsigned char* src, int valid) {
  constexpr int PE = 16 / EB;
  if (valid >= PE && (reinterpret_cast<u64>(dst) & 15) == 0) {
    *reinterpret_cast<Vec16*>(dst) = *reinterpret_cast<const Vec16*>(src);
    return;
  }
  copy_elems<EB>(dst, src, valid < PE ? valid : PE);
}

// store_piece16 of a piece held in registers (x: PE = 16 / EB elements, packed as in memory).
template <int EB> __device__ __forceinline__ void store_vec16_dims(unsigned char* dst, const Vec16& x, int valid) {
  constexpr int PE = 16 / EB;
  if (valid >= PE && (reinterpret_cast<u64>(dst) & 15) == 0) {
    *reinterpret_cast<Vec16*>(dst) = x;
    return;
  }
#pragma unroll
  for (int e = 0; e < PE; ++e) {
    if (e < valid) {
      if constexpr (EB == 4) {
        reinterpret_cast<u32*>(dst)[e] = x.w[e];
      } else {
        reinterpret_cast<u16*>(dst)[e] = static_cast<u16>(x.w[e / 2] >> (16 * (e % 2)));
      }
    }
  }
}

// Low and high halves of a packed bf16x2 as fp32.
__device__ __forceinline__ float bf16_lo(u32 x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(u32 x) { return __uint_as_float(x & 0xffff0000u); }

// Sequence of a flattened token range: [bos, bos + len) in token index b*T + t.
struct Seq {
  i64 bos;
  int len;
};

// cu_seqlens[i], clamped into [0, T]: bad device values cannot reach outside the arrays.
__device__ __forceinline__ i64 cu_at(const void* cu, int is_i64, int i, int T) {
  i64 x = is_i64 ? static_cast<const i64*>(cu)[i] : static_cast<i64>(static_cast<const i32*>(cu)[i]);
  return x < 0 ? 0 : (x > T ? T : x);
}

__device__ __forceinline__ Seq sequence(const void* cu, int is_i64, int n, int T) {
  if (cu == nullptr) return Seq{static_cast<i64>(n) * T, T};
  i64 bos = cu_at(cu, is_i64, n, T), eos = cu_at(cu, is_i64, n + 1, T);
  return Seq{bos, eos > bos ? static_cast<int>(eos - bos) : 0};
}

// First workspace slot of sequence n. Varlen: n + bos/16, which never collides
// between sequences (a ragged tail costs at most one extra slot per sequence).
__device__ __forceinline__ i64 first_slot(const void* cu, int n, i64 bos, int chunks_per_seq) {
  return cu == nullptr ? static_cast<i64>(n) * chunks_per_seq : n + bos / CHUNK;
}

// The sequence that workspace slot ``slot`` belongs to (first_slot's inverse; varlen: the largest
// n with n + bos_n / 16 <= slot, by bisection).
__device__ __forceinline__ int slot_sequence(const void* cu, int is_i64, int slot, int nseq, int T, int chunks_per_seq) {
  if (cu == nullptr) return slot / chunks_per_seq;
  int lo = 0, hi = nseq - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (mid + cu_at(cu, is_i64, mid, T) / CHUNK <= slot) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// A walk over non-decreasing workspace slots (a prepare CTA's consecutive ones): slot_sequence's answer
// for each, by stepping forward from the last: one bisection at the CTA's first slot, then one load of
// cu_seqlens a slot (the bisection per slot was the prepare's second issuer at the varlen Kimi shapes, and
// a chain of dependent loads). One register of state: a second (the next sequence's first slot) made
// some K = 64 prepares spill at their 128-register bound.
struct SlotWalk {
  int n;  // the sequence of the last slot asked
};
__device__ __forceinline__ SlotWalk slot_walk_start(const void* cu, int is_i64, int slot, int nseq, int T,
                                                    int chunks_per_seq) {
  return SlotWalk{cu == nullptr ? 0 : slot_sequence(cu, is_i64, slot, nseq, T, chunks_per_seq)};
}
__device__ __forceinline__ int slot_walk_to(SlotWalk& w, const void* cu, int is_i64, int slot, int nseq, int T,
                                            int chunks_per_seq) {
  if (cu == nullptr) return slot / chunks_per_seq;
  while (w.n + 1 < nseq && w.n + 1 + cu_at(cu, is_i64, w.n + 1, T) / CHUNK <= slot) ++w.n;
  return w.n;
}

}  // namespace kda

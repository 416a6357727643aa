// CPU twins of every wrapper in kernels/ptx.cuh: same names and signatures.
// Included by cuda_emu.h (which defines the fibers, warps and fail()).
// Conversions round to nearest even exactly; approximate instructions are
// computed in double and rounded once (the GPU is within a few ulp); mma sums
// the 16 exact products and c in double and rounds once per output element.
#pragma once

namespace kda_emu {
inline bool is_subnormal(float x) { return x != 0.0f && fabsf(x) < 1.17549435e-38f; }
inline float ftz(float x) { return is_subnormal(x) ? copysignf(0.0f, x) : x; }

inline u16 f2bf(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN -> canonical NaN
  u += 0x7fffu + ((u >> 16) & 1u);                      // RNE; carries into the exponent (-> inf)
  return (u16)(u >> 16);
}
inline u16 f2h(float x) {
  unsigned u = __float_as_uint(x), sign = (u >> 16) & 0x8000u, ax = u & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fff;                // NaN -> canonical NaN
  if (ax >= 0x477ff000u) return (u16)(sign | 0x7c00u);  // >= 65520 rounds to inf (ties to even)
  if (ax >= 0x38800000u) {                            // normal half: RNE on the 13 dropped bits
    unsigned m = ax + 0xfffu + ((ax >> 13) & 1u) - ((127u - 15u) << 23);
    return (u16)(sign | (m >> 13));
  }
  // subnormal half (or zero): units of 2^-24; scaling by 2^24 is exact, rintf rounds to even
  return (u16)(sign | (unsigned)rintf(__uint_as_float(ax) * 16777216.0f));
}
inline float h2f(u16 h) {
  unsigned s = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return s ? -(float)m * 5.9604644775390625e-8f : (float)m * 5.9604644775390625e-8f;
  if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13));
  return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}
inline double bf2d(unsigned bits16) { return (double)__uint_as_float(bits16 << 16); }
inline double h2d(unsigned bits16) { return (double)h2f((u16)bits16); }

// mma.m16n8k16: lanes deposit their A/B fragments; each lane then computes its
// own 4 outputs from the warp's fragments, reading them by the ISA layout.
template <bool BF16>
KDA_EMU_RT inline void mma_m16n8k16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2], const float (&c)[4],
                         const char* what) {
  Fiber* f = g_cur;
  Warp& wp = g_worker->warps[f->warp];
  int buf = wp.buf, lane = f->lane;
  u32* mine = reinterpret_cast<u32*>(wp.slot[buf][lane]);
  for (int i = 0; i < 4; i++) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  warp_barrier(f, what, [] {});
  auto half = [](u32 w, int k) KDA_EMU_RT -> double {
    unsigned h = (k & 1) ? w >> 16 : w & 0xffffu;
    return BF16 ? bf2d(h) : h2d(h);
  };
  auto A = [&](int row, int k) KDA_EMU_RT {  // a[r]: r bit0 = row >= 8, bit1 = k >= 8
    const u32* s = reinterpret_cast<const u32*>(wp.slot[buf][(row & 7) * 4 + ((k & 7) >> 1)]);
    return half(s[(row >> 3) | ((k >> 3) << 1)], k);
  };
  auto B = [&](int k, int n) KDA_EMU_RT {  // b[r]: r = k >= 8
    const u32* s = reinterpret_cast<const u32*>(wp.slot[buf][n * 4 + ((k & 7) >> 1)]);
    return half(s[4 + (k >> 3)], k);
  };
  int g = lane >> 2, t = lane & 3;
  float out[4];
  for (int i = 0; i < 4; i++) {
    int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    double acc = (double)c[i];
    for (int k = 0; k < 16; k++) acc += A(row, k) * B(k, col);
    out[i] = (float)acc;
  }
  for (int i = 0; i < 4; i++) d[i] = out[i];  // d may alias c
}

// ldmatrix: lanes 0..8*NM-1 give row addresses; the last lane to arrive reads
// all rows at once (as the instruction does), then each lane takes its part.
// pc: the caller's code address (checked builds: racecheck messages).
template <int NM, bool TRANS>
KDA_EMU_RT inline void ldmatrix(u32* r, const void* smem_row, const char* what, uintptr_t pc) {
  Fiber* f = g_cur;
  Warp& wp = g_worker->warps[f->warp];
  int buf = wp.buf, lane = f->lane;
  if (lane < 8 * NM) {
    check_smem16(smem_row, what);
    memcpy(wp.slot[buf][lane], &smem_row, sizeof(void*));
    memcpy(wp.slot[buf][lane] + 8, &pc, sizeof pc);
  }
  warp_barrier(f, what, [&wp, buf]() KDA_EMU_RT {
    for (int i = 0; i < 8 * NM; i++) {
      const void* p;
      memcpy(&p, wp.slot[buf][i], sizeof(void*));
#ifdef KDA_EMU_CHECK
      uintptr_t lane_pc;
      memcpy(&lane_pc, wp.slot[buf][i] + 8, sizeof lane_pc);
      ldmatrix_row(p, i, lane_pc);
#endif
      memcpy(wp.snap[buf][i], p, 16);
    }
  });
  for (int m = 0; m < NM; m++) {
    const u16* rows = reinterpret_cast<const u16*>(wp.snap[buf][8 * m]);  // rows[row * 8 + col]
    u32 lo, hi;
    if (TRANS) {
      lo = rows[(2 * (lane & 3)) * 8 + (lane >> 2)];
      hi = rows[(2 * (lane & 3) + 1) * 8 + (lane >> 2)];
    } else {
      lo = rows[(lane >> 2) * 8 + 2 * (lane & 3)];
      hi = rows[(lane >> 2) * 8 + 2 * (lane & 3) + 1];
    }
    r[m] = lo | (hi << 16);
  }
}

// cp.async: copies queue in the thread's open group and land only when a
// cp_async_wait covers their (committed) group: a missing wait shows as 0xFF.
// In eager mode they land at once instead: a copy into a buffer that another
// warp still reads (missing __syncthreads before refilling a stage) shows.
// Checked builds (racecheck) queue eager copies too, done, for the wait to land them.
KDA_EMU_RT inline void cp_async_push(void* dst, const void* src, unsigned bytes, uintptr_t pc) {
  Fiber* f = g_cur;
  check_smem16(dst, "cp.async");
  if (bytes && ((uintptr_t)src % 16 || !src)) fail("cp.async: global address %p is not 16-byte aligned", src);
  bool queue = !g_worker->L->cp_eager;
#ifdef KDA_EMU_CHECK
  if (g_worker->L->check) cp_issue(dst, src, bytes, pc);
  queue |= (g_worker->L->check & CK_RACE) != 0;
#endif
  (void)pc;
  if (g_worker->L->cp_eager) {
    if (bytes) memcpy(dst, src, 16);
    else memset(dst, 0, 16);
  }
  if (!queue) return;
  if (f->ncp == f->capcp) {
    f->capcp = f->capcp ? 2 * f->capcp : 64;
    f->cp = (Copy*)realloc(f->cp, sizeof(Copy) * f->capcp);
    if (!f->cp) fail("cp.async: out of memory");
  }
  f->cp[f->ncp++] = Copy{dst, src, bytes, f->open_group, (unsigned)g_worker->L->cp_eager};
}
KDA_EMU_RT inline void cp_async_wait_n(unsigned n, uintptr_t pc) {
  Fiber* f = g_cur;
  int k = 0;  // groups are in issue order: perform the prefix of groups < open_group - n
  (void)pc;
  while (k < f->ncp && f->cp[k].group + n < f->open_group) {
    Copy& c = f->cp[k++];
    if (c.done) {
    } else if (c.bytes) {
      memcpy(c.dst, c.src, 16);
    } else {
      memset(c.dst, 0, 16);
    }
#ifdef KDA_EMU_CHECK
    cp_land(c.dst, pc);
#endif
  }
  memmove(f->cp, f->cp + k, sizeof(Copy) * (f->ncp - k));
  f->ncp -= k;
}
}  // namespace kda_emu

inline u32 pack_bf16x2(float lo, float hi) {
  return (u32)::kda_emu::f2bf(lo) | ((u32)::kda_emu::f2bf(hi) << 16);
}
inline u32 pack_f16x2(float lo, float hi) { return (u32)::kda_emu::f2h(lo) | ((u32)::kda_emu::f2h(hi) << 16); }
inline u16 f32_to_bf16(float x) { return ::kda_emu::f2bf(x); }
inline u16 f32_to_f16(float x) { return ::kda_emu::f2h(x); }
inline float f16_to_f32(u16 h) { return ::kda_emu::h2f(h); }
inline float ex2_approx_ftz(float x) {
  float r = (float)exp2((double)::kda_emu::ftz(x));
  return r < 1.17549435e-38f ? 0.0f : r;  // results below 2^-126 flush to +0
}
inline float lg2_approx_ftz(float x) { return ::kda_emu::ftz((float)log2((double)::kda_emu::ftz(x))); }
inline float rsqrt_approx_ftz(float x) { return ::kda_emu::ftz((float)(1.0 / sqrt((double)::kda_emu::ftz(x)))); }
inline float rcp_approx_ftz(float x) { return ::kda_emu::ftz((float)(1.0 / (double)::kda_emu::ftz(x))); }
inline float tanh_approx(float x) { return (float)tanh((double)x); }

// KDA_EMU_RT + KDA_EMU_PC: in checked builds these stay calls, so the return address is the kernel's.
KDA_EMU_RT inline void ldmatrix_x4(u32 (&r)[4], const void* p) {
  ::kda_emu::ldmatrix<4, false>(r, p, "ldmatrix.x4", KDA_EMU_PC);
}
KDA_EMU_RT inline void ldmatrix_x4_trans(u32 (&r)[4], const void* p) {
  ::kda_emu::ldmatrix<4, true>(r, p, "ldmatrix.x4.trans", KDA_EMU_PC);
}
KDA_EMU_RT inline void ldmatrix_x2(u32 (&r)[2], const void* p) {
  ::kda_emu::ldmatrix<2, false>(r, p, "ldmatrix.x2", KDA_EMU_PC);
}
KDA_EMU_RT inline void ldmatrix_x2_trans(u32 (&r)[2], const void* p) {
  ::kda_emu::ldmatrix<2, true>(r, p, "ldmatrix.x2.trans", KDA_EMU_PC);
}

inline void mma_bf16_m16n8k16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2], const float (&c)[4]) {
  ::kda_emu::mma_m16n8k16<true>(d, a, b, c, "mma.m16n8k16.bf16");
}
inline void mma_f16_m16n8k16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2], const float (&c)[4]) {
  ::kda_emu::mma_m16n8k16<false>(d, a, b, c, "mma.m16n8k16.f16");
}

KDA_EMU_RT inline void cp_async_16(void* dst, const void* src) { ::kda_emu::cp_async_push(dst, src, 16, KDA_EMU_PC); }
KDA_EMU_RT inline void cp_async_16_zfill(void* dst, const void* src, bool valid) {
  ::kda_emu::cp_async_push(dst, src, valid ? 16 : 0, KDA_EMU_PC);
}
KDA_EMU_RT inline void cp_async_commit() { ::kda_emu::g_cur->open_group++; }
template <int N>
KDA_EMU_RT inline void cp_async_wait() {
  static_assert(N >= 0, "cp.async.wait_group N needs N >= 0");
  ::kda_emu::cp_async_wait_n((unsigned)N, KDA_EMU_PC);
}
KDA_EMU_RT inline unsigned char* dynamic_smem() { return ::kda_emu::g_worker->smem; }

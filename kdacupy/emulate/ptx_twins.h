// CPU twins of every wrapper in kernels/ptx.cuh: same names and signatures.
// Included by cuda_emu.h (which defines the fibers, warps and fail()).
// Conversions round to nearest even exactly; approximate instructions are
// computed in double and rounded once (the GPU is within a few ulp); mma sums
// the 16 exact products and c in double and rounds once per output element.
//
// KDA_EMU_NUMERICS=1 (KDACUPY_EMULATE_NUMERICS=hardware) models the hardware instead:
// .approx results perturbed deterministically (a hash of the input bits) within the
// PTX ISA's error bounds, each mma's fp32 sum done as tensor cores do it (block
// alignment to the largest exponent, truncation), and FTZ for the launch (cuda_emu.h).
#pragma once

#ifndef KDA_EMU_NUMERICS
#define KDA_EMU_NUMERICS 0
#endif
#ifndef KDA_EMU_MMA_BLOCK  // products summed in one fused step (with the running sum)
#define KDA_EMU_MMA_BLOCK 16
#endif
#ifndef KDA_EMU_MMA_GUARD  // alignment bits kept below a 24-bit significand at the largest exponent
#define KDA_EMU_MMA_GUARD 3
#endif

// Instrumented builds count every .approx instruction (profile.h: per warp instruction, its lanes).
#ifdef KDA_EMU_CHECK
#define KDA_EMU_SFU() ::kda_emu::prof_sfu()
#else
#define KDA_EMU_SFU() (void)0
#endif

namespace kda_emu {
// bit tests, not float compares: the hardware mode's DAZ would make a subnormal compare as 0
inline bool is_subnormal(float x) {
  unsigned u = __float_as_uint(x);
  return (u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0;
}
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
inline double bf2d(unsigned bits16) {  // exact, subnormals included (no float op: DAZ-proof)
  unsigned e = (bits16 >> 7) & 0xffu, m = bits16 & 0x7fu;
  double mag = e == 0 ? ldexp((double)m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp((double)(m | 0x80u), (int)e - 134);
  return (bits16 & 0x8000u) ? -mag : mag;
}

namespace hw {
// Deterministic hash of an input's bits (and the instruction): the same input always gives the
// same perturbed result, as on the hardware.
inline u32 mix(u32 x, u32 salt) {
  unsigned long long z = ((unsigned long long)salt << 32 | x) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (u32)((z ^ (z >> 31)) >> 32);
}
inline double unit(float x, u32 salt) { return mix(__float_as_uint(x), salt) * (2.0 / 4294967296.0) - 1.0; }
inline bool pow2(double y) {
  int e;
  return y != 0 && isfinite(y) && frexp(fabs(y), &e) == 0.5;
}
// r moved by k units in the last place, away from zero for k > 0 (never across zero or to inf)
inline float step_ulps(float r, int k) {
  if (k == 0 || r == 0.0f || !isfinite(r)) return r;
  unsigned u = __float_as_uint(r);
  long long m = (long long)(u & 0x7fffffffu) + k;
  if (m <= 0) return copysignf(0.0f, r);
  if (m >= 0x7f800000ll) m = 0x7f7fffffll;
  return __uint_as_float((u & 0x80000000u) | (unsigned)m);
}
// exact + e, |e| <= tol, rounded to fp32; a rounding that lands outside tol is stepped back in
inline float within(double exact, double e, double tol) {
  float r = (float)(exact + e);
  if (fabs((double)r - exact) > tol) r = nextafterf(r, (double)r > exact ? -INFINITY : INFINITY);
  return r;
}
// exact * (1 + d), |d| <= bound
inline float rel(double exact, float x, u32 salt, double bound) {
  return within(exact, exact * unit(x, salt) * bound, fabs(exact) * bound);
}
// the value nearest s toward zero (the tensor cores' final truncation)
inline float rz_f32(double s) {
  float f = (float)s;
  if (isfinite(f) && fabs((double)f) > fabs(s)) f = nextafterf(f, 0.0f);
  return f;
}
// c + sum of n exact products, KDA_EMU_MMA_BLOCK at a time: each block's terms (and the running
// sum) are aligned to the largest exponent among them, truncated to 24 + KDA_EMU_MMA_GUARD bits
// there, added exactly, and the sum truncated to fp32.
inline float dot(float c, const double* p, int n) {
  float acc = c;
  for (int k0 = 0; k0 < n; k0 += KDA_EMU_MMA_BLOCK) {
    int kn = k0 + KDA_EMU_MMA_BLOCK < n ? k0 + KDA_EMU_MMA_BLOCK : n;
    double t[KDA_EMU_MMA_BLOCK + 1];
    int m = 0, emax = -100000;
    bool finite = isfinite(acc);
    t[m++] = acc;
    for (int k = k0; k < kn; k++) finite &= (bool)isfinite(t[m++] = p[k]);
    if (!finite) {  // inf / nan: IEEE semantics
      double s = acc;
      for (int k = k0; k < kn; k++) s += p[k];
      acc = (float)s;
      continue;
    }
    for (int i = 0; i < m; i++) {
      int e;
      if (t[i] != 0) { frexp(t[i], &e); if (e > emax) emax = e; }
    }
    if (emax == -100000) { acc = (float)(t[0] + 0.0); continue; }  // all zero
    double q = ldexp(1.0, emax - 24 - KDA_EMU_MMA_GUARD), s = 0;
    for (int i = 0; i < m; i++) s += trunc(t[i] / q) * q;  // exact: at most ~31 + GUARD bits
    acc = rz_f32(s);
  }
  return acc;
}
}  // namespace hw
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
  warp_barrier(f, what, [] KDA_EMU_RT { KDA_EMU_PROF_COUNT(PR_mma); });
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
#if KDA_EMU_NUMERICS == 1
    double prod[16];
    for (int k = 0; k < 16; k++) prod[k] = A(row, k) * B(k, col);  // exact in double
    out[i] = hw::dot(c[i], prod, 16);
#else
    double acc = (double)c[i];
    for (int k = 0; k < 16; k++) acc += A(row, k) * B(k, col);
    out[i] = (float)acc;
#endif
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
#ifdef KDA_EMU_CHECK
    if (g_worker->pf) {
      const void* rows[32];
      uintptr_t pc0;
      for (int i = 0; i < 8 * NM; i++) memcpy(&rows[i], wp.slot[buf][i], sizeof(void*));
      memcpy(&pc0, wp.slot[buf][0] + 8, sizeof pc0);
      prof_ldmatrix(rows, NM, pc0);
    }
#endif
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
  if (g_worker->L->prof) prof_cp_async(dst, src, bytes, pc);
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
#if KDA_EMU_NUMERICS == 1
// PTX ISA error bounds (Floating Point Instructions: ex2, lg2, rsqrt, rcp, tanh): ex2 2 ulp of the
// correctly rounded result; lg2 2^-22 absolute in (0.5, 2), else 2^-22 relative; rsqrt 2^-22.9
// relative; rcp.approx 1 ulp; tanh 2^-11 relative (subnormal inputs passed through). Inputs whose
// exact result is a power of two (ex2 of an integer, lg2 of a power of two, ...) stay exact.
inline float ex2_approx_ftz(float x) {
  KDA_EMU_SFU();
  float xf = ::kda_emu::ftz(x);
  float r = (float)exp2((double)xf);
  if (isfinite(xf) && rint(xf) != xf)
    r = ::kda_emu::hw::step_ulps(r, (int)floor((::kda_emu::hw::unit(xf, 1) + 1.0) * 2.5) - 2);
  return __float_as_uint(r) < 0x00800000u ? 0.0f : r;  // results below 2^-126 flush to +0
}
inline float lg2_approx_ftz(float x) {
  KDA_EMU_SFU();
  float xf = ::kda_emu::ftz(x);
  double y = log2((double)xf);
  if (!(xf > 0) || !isfinite(xf) || ::kda_emu::hw::pow2(xf)) return ::kda_emu::ftz((float)y);
  double u = ::kda_emu::hw::unit(xf, 2);
  float r = (xf > 0.5f && xf < 2.0f) ? ::kda_emu::hw::within(y, u * 0x1p-22, 0x1p-22) : ::kda_emu::hw::rel(y, xf, 2, 0x1p-22);
  return ::kda_emu::ftz(r);
}
inline float rsqrt_approx_ftz(float x) {
  KDA_EMU_SFU();
  float xf = ::kda_emu::ftz(x);
  double y = 1.0 / sqrt((double)xf);
  if (!(xf > 0) || !isfinite(xf) || ::kda_emu::hw::pow2(y)) return ::kda_emu::ftz((float)y);
  return ::kda_emu::ftz(::kda_emu::hw::rel(y, xf, 3, exp2(-22.9)));
}
inline float rcp_approx_ftz(float x) {
  KDA_EMU_SFU();
  float xf = ::kda_emu::ftz(x);
  double y = 1.0 / (double)xf;
  float r = (float)y;
  if (xf != 0 && isfinite(xf) && isfinite(r) && !::kda_emu::hw::pow2(y) && (::kda_emu::hw::mix(__float_as_uint(xf), 4) & 1))
    r = (double)r > y ? nextafterf(r, -INFINITY) : (double)r < y ? nextafterf(r, INFINITY) : r;  // the other neighbour
  return ::kda_emu::ftz(r);
}
inline float tanh_approx(float x) {
  KDA_EMU_SFU();
  if (::kda_emu::is_subnormal(x)) return x;  // passed through (no ftz on tanh), not flushed by FTZ here
  double y = tanh((double)x);
  if (x == 0 || !isfinite(x)) return (float)y;
  float r = ::kda_emu::hw::rel(y, x, 5, 0x1p-11);
  return fabsf(r) > 1.0f ? copysignf(1.0f, r) : r;
}
#else
inline float ex2_approx_ftz(float x) {
  KDA_EMU_SFU();
  float r = (float)exp2((double)::kda_emu::ftz(x));
  return r < 1.17549435e-38f ? 0.0f : r;  // results below 2^-126 flush to +0
}
inline float lg2_approx_ftz(float x) {
  KDA_EMU_SFU();
  return ::kda_emu::ftz((float)log2((double)::kda_emu::ftz(x))); }
inline float rsqrt_approx_ftz(float x) {
  KDA_EMU_SFU();
  return ::kda_emu::ftz((float)(1.0 / sqrt((double)::kda_emu::ftz(x)))); }
inline float rcp_approx_ftz(float x) {
  KDA_EMU_SFU();
  return ::kda_emu::ftz((float)(1.0 / (double)::kda_emu::ftz(x))); }
inline float tanh_approx(float x) {
  KDA_EMU_SFU();
  return (float)tanh((double)x); }
#endif

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

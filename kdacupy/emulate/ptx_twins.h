// CPU twins of every wrapper in kernels/ptx.cuh: same names and signatures.
// Included by cuda_emu.h (which defines the fibers, warps and fail()).
// Conversions round to nearest even exactly; approximate instructions are
// computed in double and rounded once (the GPU is within a few ulp); mma sums
// the 16 exact products and c in double and rounds once per output element, and
// so does wgmma per k16 instruction (a chain rounds once per instruction, in k order).
// wgmma's accumulators read as NaN from its issue to the wait_group covering it; its
// shared operand is read then (eager mode: at the issue). mbarrier state lives in its
// 8 bytes; cp.async.bulk lands at the first wait on its mbarrier that finds every
// arrival in (eager: at the issue). docs/design.md section 4 has the whole model.
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
#define KDA_EMU_SFU(cls) ::kda_emu::prof_sfu(::kda_emu::AN_##cls)
#else
#define KDA_EMU_SFU(cls) (void)0
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
                         const char* what, uintptr_t pc) {
  Fiber* f = g_cur;
  KDA_EMU_ANCHOR(mma, pc);
  (void)pc;
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
  KDA_EMU_ANCHOR(ldmatrix, pc);
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

// ---- Hopper: warpgroup MMA, mbarrier, bulk copies ----------------------------------------------
// The shared-window address of the dynamic shared memory's first byte: 128-byte aligned, as
// dynamic_smem() promises, and no more, so a swizzled tile placed by its generic address
// rather than by smem_u32() reads other bytes here (as it may on a GPU).
constexpr u32 SMEM_WINDOW = 0x80;
constexpr unsigned WG_POISON = 0xFFFFFFFFu;  // accumulators of a pending wgmma read as this NaN

KDA_EMU_RT inline u32 smem_window(const void* p, const char* what) {
  Worker* w = g_worker;
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)w->smem;
  if (a < lo || a > lo + w->smem_size)
    fail("%s: %p is not inside the block's dynamic shared memory [%p, +%zu): the emulation gives only it a "
         "shared-window address", what, p, (void*)w->smem, w->smem_size);
  return SMEM_WINDOW + (u32)(a - lo);
}

// -- warpgroup collectives: the 128 threads of warps 4g..4g+3 meet; on_last runs once, by the last --
template <class F>
KDA_EMU_RT inline void wg_barrier(Fiber* f, const char* what, F&& on_last) {
  Worker* w = g_worker;
  int g = f->warp >> 2;
  if (128 * (g + 1) > w->n)
    fail("%s in warpgroup %d, which has only %d threads: the warpgroup instructions need blocks of whole "
         "warpgroups (128 threads)", what, g, w->n - 128 * g);
  WarpGroup& wg = w->wgs[g];
  for (int k = 4 * g; k < 4 * g + 4; k++)
    if (w->warps[k].exited) fail("%s in warpgroup %d after %d thread(s) of warp %d exited", what, g, w->warps[k].exited, k);
  if (wg.arrived == 0) {
    wg.what = what;
  } else if (wg.what != what && strcmp(wg.what, what) != 0) {
    fail("threads of warpgroup %d meet in different warpgroup instructions: %s and %s", g, wg.what, what);
  }
  if (++wg.arrived == 128) {
    for (int k = 4 * g; k < 4 * g + 4; k++) KDA_EMU_PROF_WARP(w, k);
    on_last();
    wg.arrived = 0;
    Fiber* lanes = &w->fibers[g * 128];
    for (int k = 0; k < 128; k++) {  // to the front last-first: thread 0 of the group (127 if reverse) runs first
      Fiber* l = &lanes[w->L->reverse ? k : 127 - k];
      if (l->st == WAIT_WG) push_front(w, l);
    }
  } else {
    f->st = WAIT_WG;
    f->what = what;
    yield_blocked(f);
  }
}

// One issued wgmma: the A fragments and accumulator addresses of the 128 threads, C (ready unless
// chained to a pending wgmma on the same accumulators, whose result becomes it), B (read at issue
// in eager mode, else when performed) and the result.
struct WgOp {
  int n, trans, acc, chained, has_next, b_read;
  unsigned group;
  u64 desc;
  u32 a[128][4];
  float* d[128];
  u16 b[16][256];  // B(k, n) bits
  float* cin;      // [128][n / 2]
  float* out;      // [128][n / 2]
};

// B(k, n) of a descriptor, by the layouts of kernels/ptx.cuh's header (the PTX ISA's canonical ones).
KDA_EMU_RT inline const u16* wg_b_elem(u64 desc, int trans, int k, int n) {
  u32 start = (u32)(desc & 0x3FFF) << 4, lbo = (u32)((desc >> 16) & 0x3FFF) << 4, sbo = (u32)((desc >> 32) & 0x3FFF) << 4;
  int swz = (int)(desc >> 62), base = (int)((desc >> 49) & 7);
  if (base) fail("wgmma: matrix descriptor base offset %d: the emulation supports patterns aligned to their size only", base);
  u32 W = swz == 0 ? 0 : swz == 1 ? 128 : swz == 2 ? 64 : 32, off;
  if (!trans)
    off = W ? (n % 8) * W + (n / 8) * sbo + k * 2 : (n % 8) * 16 + (n / 8) * sbo + (k / 8) * lbo + (k % 8) * 2;
  else
    off = W ? (k % 8) * W + (k / 8) * sbo + (n / (W / 2)) * lbo + (n % (W / 2)) * 2
            : (k % 8) * 16 + (k / 8) * lbo + (n / 8) * sbo + (n % 8) * 2;
  u32 addr = start + off;
  if (W) addr ^= ((addr >> 7) & (W / 16 - 1)) << 4;
  Worker* w = g_worker;
  if (addr < SMEM_WINDOW || addr + 2 > SMEM_WINDOW + w->smem_size)
    fail("wgmma: B(k=%d, n=%d) at shared address 0x%x is outside the dynamic shared memory [0x%x, +%zu)", k, n, addr,
         SMEM_WINDOW, w->smem_size);
  return reinterpret_cast<const u16*>(w->smem + (addr - SMEM_WINDOW));
}

KDA_EMU_RT inline void wg_read_b(WgOp* op) {
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < op->n; n++) op->b[k][n] = *wg_b_elem(op->desc, op->trans, k, n);
  op->b_read = 1;
}

// D = C + A * B for every thread: each output the exact sum of its 16 products and C rounded once
// to fp32 (KDA_EMU_NUMERICS=1: the tensor cores' sum, hw::dot), as mma_m16n8k16 per k16 step.
KDA_EMU_RT inline void wg_perform(WarpGroup& wg, WgOp* op, int idx) {
  if (!op->b_read) wg_read_b(op);
#ifdef KDA_EMU_CHECK
  for (int k = 0; k < 16; k++)  // racecheck: B is no longer read
    for (int n = 0; n < op->n; n++) wgmma_b_operand(wg_b_elem(op->desc, op->trans, k, n), true, 0);
#endif
  int R = op->n / 2;
  for (int i = 0; i < 128; i++) {
    int warp = i >> 5, lane = i & 31, g = lane >> 2, t = lane & 3;
    auto A = [&](int row, int k) KDA_EMU_RT {  // the thread holding (row, k): rows 16w + g (+8), k 2t (+1, +8)
      int r = row & 15, owner = (row >> 4) * 32 + (r & 7) * 4 + ((k & 7) >> 1);
      u32 word = op->a[owner][(r >> 3) | ((k >> 3) << 1)];
      return bf2d((k & 1) ? word >> 16 : word & 0xffffu);
    };
    for (int j = 0; j < R; j++) {
      int row = 16 * warp + g + 8 * ((j >> 1) & 1), col = 8 * (j >> 2) + 2 * t + (j & 1);
      float c = op->cin[i * R + j];
#if KDA_EMU_NUMERICS == 1
      double prod[16];
      for (int k = 0; k < 16; k++) prod[k] = A(row, k) * bf2d(op->b[k][col]);
      op->out[i * R + j] = hw::dot(c, prod, 16);
#else
      double s = (double)c;
      for (int k = 0; k < 16; k++) s += A(row, k) * bf2d(op->b[k][col]);
      op->out[i * R + j] = (float)s;
#endif
    }
  }
  for (int k = idx + 1; k < wg.nops && op->has_next; k++) {  // the pending wgmma chained to it takes the result
    WgOp* nx = wg.ops[k];
    if (nx->chained && nx->d[0] == op->d[0]) {
      memcpy(nx->cin, op->out, sizeof(float) * 128 * R);
      nx->chained = 0;
      return;
    }
  }
  if (op->has_next) return;  // a later wgmma overwrote the accumulators without reading them
  for (int i = 0; i < 128; i++)
    for (int j = 0; j < R; j++) {
      if (__float_as_uint(op->d[i][j]) != WG_POISON)
        fail("wgmma: thread %d of warpgroup wrote its accumulator d[%d] before the wgmma.wait_group covering its "
             "wgmma (undefined on the GPU)", i, j);
      op->d[i][j] = op->out[i * R + j];
    }
}

// wgmma.mma_async: every thread deposits its fragments; the last one records the operation.
KDA_EMU_RT inline void wgmma_issue(float* d, int n, int trans, const u32* a, u64 desc, bool acc, uintptr_t pc) {
  Fiber* f = g_cur;
  KDA_EMU_ANCHOR(wgmma, pc);
  Worker* w = g_worker;
  WarpGroup& wg = w->wgs[f->warp >> 2];
  int me = f->lin & 127;
  if (128 * ((f->warp >> 2) + 1) <= w->n) {
    WgLane& l = wg.lane[me];
    memcpy(l.a, a, 16);
    l.d = d, l.desc = desc, l.acc = acc;
  }
  const char* what = trans ? "wgmma.mma_async (B N-major)" : "wgmma.mma_async (B K-major)";
  wg_barrier(f, what, [&wg, w, n, trans, pc]() KDA_EMU_RT {
    if (!wg.fenced)
      fail("wgmma.mma_async without a wgmma.fence since the warpgroup's last wgmma.wait_group (or its start): the "
           "ISA wants one before a wgmma reads registers other instructions wrote");
    int R = n / 2;
    for (int i = 1; i < 128; i++)
      if (wg.lane[i].desc != wg.lane[0].desc || wg.lane[i].acc != wg.lane[0].acc)
        fail("wgmma.mma_async: thread %d's B descriptor or scale-d differs from thread 0's (the emulation needs "
             "them uniform over the warpgroup)", i);
    WgOp* prev = nullptr;
    for (int k = wg.nops - 1; k >= 0 && !prev; k--)
      for (int i = 0; i < 128 && !prev; i++)
        if (wg.ops[k]->d[i] == wg.lane[i].d) prev = wg.ops[k];
    if (prev) {
      if (prev->n != n) fail("wgmma.mma_async: accumulators of a pending wgmma of another shape (N=%d, now %d)", prev->n, n);
      for (int i = 0; i < 128; i++)
        if (prev->d[i] != wg.lane[i].d)
          fail("wgmma.mma_async: thread %d's accumulators are not the ones it gave the pending wgmma", i);
    }
    WgOp* op = (WgOp*)malloc(sizeof(WgOp) + 2 * sizeof(float) * 128 * R);
    if (!op) fail("wgmma: out of memory");
    op->n = n, op->trans = trans, op->acc = wg.lane[0].acc != 0, op->group = wg.open_group, op->desc = wg.lane[0].desc;
    op->cin = reinterpret_cast<float*>(op + 1);
    op->out = op->cin + 128 * R;
    op->chained = op->acc && prev, op->has_next = 0, op->b_read = 0;
    if (prev) prev->has_next = 1;
    for (int i = 0; i < 128; i++) {
      memcpy(op->a[i], wg.lane[i].a, 16);
      op->d[i] = wg.lane[i].d;
      for (int j = 0; j < R; j++) {
        op->cin[i * R + j] = op->acc && !prev ? op->d[i][j] : 0.0f;
        op->d[i][j] = __uint_as_float(WG_POISON);  // not final until the covering wait
      }
    }
#ifdef KDA_EMU_CHECK
    for (int k = 0; k < 16; k++)  // racecheck: B is read from now until the covering wait
      for (int c = 0; c < n; c++) wgmma_b_operand(wg_b_elem(op->desc, trans, k, c), false, pc);
    if (w->pf) w->pf->c[PR_wgmma]++, w->pf->c[PR_wgmma_smem_bytes] += 32 * n;  // B: once per warpgroup
    path_wgmma(4 * (g_cur->warp >> 2), op->a, n);
#endif
    (void)pc;
    if (w->L->cp_eager) wg_read_b(op);
    if (wg.nops == wg.capops) {
      wg.capops = wg.capops ? 2 * wg.capops : 16;
      wg.ops = (WgOp**)realloc(wg.ops, sizeof(WgOp*) * wg.capops);
      if (!wg.ops) fail("wgmma: out of memory");
    }
    wg.ops[wg.nops++] = op;
  });
}

KDA_EMU_RT inline void wgmma_fence_all() {
  Fiber* f = g_cur;
  WarpGroup& wg = g_worker->wgs[f->warp >> 2];
#ifdef KDA_EMU_CHECK
  wg_barrier(f, "wgmma.fence", [&wg, f]() KDA_EMU_RT {
    wg.fenced = 1;
    path_wgmma_fence(4 * (f->warp >> 2));
  });
#else
  wg_barrier(f, "wgmma.fence", [&wg]() KDA_EMU_RT { wg.fenced = 1; });
#endif
}
KDA_EMU_RT inline void wgmma_commit_all() {
  Fiber* f = g_cur;
  WarpGroup& wg = g_worker->wgs[f->warp >> 2];
  wg_barrier(f, "wgmma.commit_group", [&wg]() KDA_EMU_RT { wg.open_group++; });
}
// wgmma.wait_group n: performs, in issue order, every wgmma of the groups older than the n newest
// committed ones (uncommitted wgmma are not waited for).
KDA_EMU_RT inline void wgmma_wait_n(unsigned n) {
  Fiber* f = g_cur;
  WarpGroup& wg = g_worker->wgs[f->warp >> 2];
  wg_barrier(f, "wgmma.wait_group", [&wg, n]() KDA_EMU_RT {
    int k = 0;
    while (k < wg.nops && wg.ops[k]->group + n < wg.open_group) {
      wg_perform(wg, wg.ops[k], k);
      k++;
    }
    for (int i = 0; i < k; i++) free(wg.ops[i]);
    memmove(wg.ops, wg.ops + k, sizeof(WgOp*) * (wg.nops - k));
    wg.nops -= k;
    wg.fenced = 0;
  });
}

// -- mbarrier: its state lives in its own 8 bytes, as on the GPU: bits 0-19 pending arrivals,
// 20-39 expected arrivals, 40-60 transaction bytes (signed), 61 phase parity, 62-63 0b01 (a marker:
// the 0xFF fill of shared memory, or zeros, are no mbarrier).
constexpr u64 MB_MARK = 1ull << 62, MB_COUNT = (1u << 20) - 1;
struct MbState { unsigned pending, expected; long long tx; unsigned phase; };

KDA_EMU_RT inline MbState mb_load(const u64* bar, const char* what) {
  if ((uintptr_t)bar % 8) fail("%s: mbarrier address %p is not 8-byte aligned", what, (const void*)bar);
  u64 v = *bar;
  if ((v >> 62) != 1) fail("%s: no mbarrier at %p (mbarrier_init first)", what, (const void*)bar);
  long long tx = (long long)((v >> 40) & 0x1FFFFF);
  if (tx & 0x100000) tx -= 0x200000;
  return MbState{(unsigned)(v & MB_COUNT), (unsigned)((v >> 20) & MB_COUNT), tx, (unsigned)((v >> 61) & 1)};
}
KDA_EMU_RT inline void mb_store(u64* bar, MbState s, const char* what) {
  if (s.tx > (long long)MB_COUNT || s.tx < -(long long)MB_COUNT)
    fail("%s: mbarrier %p's transaction count %lld is outside [-(2^20 - 1), 2^20 - 1]", what, (void*)bar, s.tx);
  *bar = MB_MARK | (u64)s.phase << 61 | ((u64)s.tx & 0x1FFFFF) << 40 | (u64)s.expected << 20 | s.pending;
}
KDA_EMU_RT inline void mb_wake(const u64* bar) {
  Worker* w = g_worker;
  for (int i = 0; i < w->n; i++)
    if (w->fibers[i].st == WAIT_MBAR && w->fibers[i].mbar == bar) push_ready(w, &w->fibers[i]);
}
// The phase completes once no arrival and no transaction byte is pending.
KDA_EMU_RT inline void mb_update(u64* bar, MbState s, const char* what) {
  if (s.pending == 0 && s.tx == 0) s.phase ^= 1, s.pending = s.expected;
  mb_store(bar, s, what);
  mb_wake(bar);
}
KDA_EMU_RT inline void mb_arrive(u64* bar, unsigned tx, const char* what) {
  MbState s = mb_load(bar, what);
  if (s.pending == 0)
    fail("%s: mbarrier %p's phase has no pending arrival (it waits for transaction bytes only): an arrival "
         "for the next phase before this one completed", what, (void*)bar);
  s.tx += tx;
  s.pending--;
  mb_update(bar, s, what);
}
// Deferred bulk copies land at a wait that finds every arrival of their mbarrier's phase in.
KDA_EMU_RT inline void mb_land(u64* bar) {
  Worker* w = g_worker;
  int k = 0;
  for (int i = 0; i < w->nbulk; i++) {
    Bulk& b = w->bulk[i];
    if (b.bar != bar) {
      w->bulk[k++] = b;
      continue;
    }
    memcpy(b.dst, b.src, b.bytes);
    MbState s = mb_load(bar, "cp.async.bulk");
    s.tx -= b.bytes;
    mb_update(bar, s, "cp.async.bulk");
  }
  w->nbulk = k;
}
KDA_EMU_RT inline void tc_land(u64* bar);  // below: tcgen05.mma performed, their commits' arrivals made
KDA_EMU_RT inline bool mb_test(u64* bar, unsigned parity, const char* what) {
  tc_land(bar);
  MbState s = mb_load(bar, what);
#ifdef KDA_EMU_CHECK
  bulk_settle(bar, s.phase);  // racecheck: the copies of completed phases have landed
#endif
  if (s.phase != (parity & 1)) return true;  // the phase of that parity completed
  if (s.pending) return false;
  mb_land(bar);
  s = mb_load(bar, what);
#ifdef KDA_EMU_CHECK
  bulk_settle(bar, s.phase);
#endif
  return s.phase != (parity & 1);
}
KDA_EMU_RT inline bool mb_wait(u64* bar, unsigned parity) {
  Fiber* f = g_cur;
#ifdef KDA_EMU_CHECK
  if (g_worker->pf) {
    g_worker->pf->c[PR_mbarrier_waits]++;  // per thread that waits
    prof_cp_land(bar, KDA_EMU_PC);  // the dependent path: it waits for what the barrier completes (copies, MMAs)
  }
#endif
  while (!mb_test(bar, parity, "mbarrier.try_wait.parity")) {  // suspended until an arrival or a copy
    f->st = WAIT_MBAR;
    f->mbar = bar;
    yield_blocked(f);
  }
  return true;
}
KDA_EMU_RT inline void bulk_copy(void* dst, const void* src, unsigned bytes, u64* bar, uintptr_t pc) {
  Worker* w = g_worker;
  const char* what = "cp.async.bulk";
  uintptr_t a = (uintptr_t)dst, lo = (uintptr_t)w->smem;
  if (bytes == 0 || bytes % 16) fail("%s: size %u is not a positive multiple of 16", what, bytes);
#ifdef KDA_EMU_CHECK
  if (w->L->check) bulk_issue(dst, src, bytes, bar, mb_load(bar, what).phase, pc);
  if (w->L->check & CK_RACE) bulk_after_acquire(src);
  if (w->pf) w->pf->c[PR_bulk_copy_bytes] += bytes;
  path_bulk(bar, src, bytes);
#endif
  (void)pc;
  if (a < lo || a + bytes > lo + w->smem_size)
    fail("%s: destination [%p, +%u) is not inside the block's dynamic shared memory [%p, +%zu)", what, dst, bytes,
         (void*)w->smem, w->smem_size);
  if (a % 16 || (uintptr_t)src % 16 || !src) fail("%s: address %p or %p is not 16-byte aligned", what, dst, src);
  mb_load(bar, what);
  if (w->L->cp_eager) {
    memcpy(dst, src, bytes);
    MbState s = mb_load(bar, what);
    s.tx -= bytes;
    mb_update(bar, s, what);
    return;
  }
  if (w->nbulk == w->capbulk) {
    w->capbulk = w->capbulk ? 2 * w->capbulk : 16;
    w->bulk = (Bulk*)realloc(w->bulk, sizeof(Bulk) * w->capbulk);
    if (!w->bulk) fail("%s: out of memory", what);
  }
  w->bulk[w->nbulk++] = Bulk{dst, src, bytes, bar};
  mb_wake(bar);
}

// ---- Blackwell: tcgen05 and tensor memory ------------------------------------------------------
// TMEM: 128 lanes x 512 columns of 32 bits a block, allocated by 32-column units. An issued
// tcgen05.mma reads its operands when performed (eager mode: at the issue) and is performed, in issue
// order, when a wait finds the mbarrier its tcgen05.commit arrives on (eager: at the commit); until
// then its D columns are pending, and a tcgen05.ld or dealloc of them fails (a missing wait). A
// tcgen05.ld's registers read as NaN until the lane's tcgen05.wait::ld. Each D element is the exact
// sum of its 16 products and C, rounded once (KDA_EMU_NUMERICS=1: the tensor cores' sum), as wgmma's.
struct TcOp {
  u32 d, idesc;
  u64 a, b;                        // a: A's shared-memory descriptor, or (a_tm) its tensor-memory address
  int acc, lin, m, n, a_mn, b_mn;  // lin: the issuing thread
  int a_tm;                        // A from tensor memory (umma_bf16_ts)
  u64* bar;                        // its commit's mbarrier (null: not committed yet)
  uintptr_t pc;
  int read;
  u16 A[128][16], B[16][256];
};
// A thread's tcgen05.ld / st not yet waited for: up to TM_QUEUE of each (tcgen05.wait::ld / st completes
// every one before it, in issue order).
constexpr int TM_QUEUE = 16;
constexpr int TM_REGS = 32;  // registers one tcgen05.ld / st moves at most (the kernels' widest: 16x256b.x8)
struct TmLoad { float* dst; int n; u32 v[TM_REGS]; };
struct TmStore { int n; u32 v[TM_REGS]; u16 lane[TM_REGS], col[TM_REGS]; };
struct TmLoads { int pending; TmLoad q[TM_QUEUE]; };
struct TmStores { int pending; TmStore q[TM_QUEUE]; };
struct Tmem {
  u32 cell[128][512];
  int pend[512];          // pending tcgen05.mma writing each column
  unsigned units;         // allocated 32-column units (bit u: columns 32u..32u+31)
  int relinquished;
  TcOp* ops[64];          // issued, not performed, in issue order
  int nops;
  int commits[64];        // per pending commit: its mbarrier's index in bars, issuer in issuers
  u64* bars[64];
  int issuers[64], ncommits;
  TmLoads ld[1024];       // per thread of the block: its tcgen05.ld not yet waited for
  TmStores st[1024];      // per thread: its tcgen05.st not yet waited for (written to the cells at the wait)
};

// A block's fresh tensor memory: NaN cells (unwritten tensor memory reads as NaN), nothing allocated or
// pending (an earlier block's tcgen05.mma never waited for are dropped, as on the GPU).
KDA_EMU_RT inline void tm_reset(Tmem* t) {
  for (int i = 0; i < t->nops; i++) free(t->ops[i]);
  memset(t, 0, sizeof(Tmem));
  for (int l = 0; l < 128; l++)
    for (int c = 0; c < 512; c++) t->cell[l][c] = WG_POISON;
}
KDA_EMU_RT inline Tmem* tm_of(const char* what) {
  Worker* w = g_worker;
  if (!w->tm) {
    w->tm = (Tmem*)calloc(1, sizeof(Tmem));
    if (!w->tm) fail("%s: out of memory for the tensor memory", what);
    tm_reset(w->tm);
  }
  if (w->n > 1024) fail("%s: blocks of more than 1024 threads", what);
  return w->tm;
}
KDA_EMU_RT inline void tmem_block_begin(Worker* w) {
  if (w->tm) tm_reset(w->tm);
}
// A CTA must free its tensor memory before it exits (the ISA: else undefined); the emulation says so.
KDA_EMU_RT inline void tmem_block_end(Worker* w) {
  if (!w->tm || !w->tm->units) return;
  char msg[256];
  snprintf(msg, sizeof msg, "block (%u,%u,%u): tcgen05: tensor memory columns (units 0x%x of 32) still allocated when "
           "the block exited (a tcgen05.dealloc missing)", w->bid.x, w->bid.y, w->bid.z, w->tm->units);
  record_error(w->L, msg);
}
KDA_EMU_RT inline void tm_columns(Tmem* t, u32 col, int n, const char* what) {
  if (col + n > 512) fail("%s: columns [%u, %u) past the 512 of tensor memory", what, col, col + n);
  for (u32 c = col; c < col + n; c += 32 - c % 32)
    if (!(t->units >> (c / 32) & 1)) fail("%s: column %u is not allocated (tcgen05.alloc first)", what, c);
}
// Columns [col, col + n) no tcgen05.mma still writes (else the wait on its commit's mbarrier is missing).
KDA_EMU_RT inline void tm_settled(Tmem* t, u32 col, int n, const char* what) {
  for (u32 c = col; c < col + n; c++)
    if (t->pend[c])
      fail("%s: column %u is written by a tcgen05.mma not yet complete (a wait on its commit's mbarrier missing)",
           what, c);
}
// The shapes of tcgen05.ld / st (the PTX ISA's matrix fragments): 32x32b, thread l lane l of the warp's
// quarter, register r column r; 16x128b, 16 lanes, register r of thread l at lane l / 4 + 8 (r % 2) and column
// l % 4 + 4 (r / 2); 16x256b, lane l / 4 + 8 (r / 2 % 2), column r % 2 + 2 (l % 4) + 8 (r / 4). A 16-lane
// shape's address takes the first or the last 16 lanes of the quarter (lane field 32 w or 32 w + 16).
enum TmShape { TM_32x32b, TM_16x128b, TM_16x256b };
KDA_EMU_RT inline void tm_cell(int shape, int l, int r, int& lane, int& col) {
  if (shape == TM_32x32b) lane = l, col = r;
  else if (shape == TM_16x128b) lane = l / 4 + 8 * (r % 2), col = l % 4 + 4 * (r / 2);
  else lane = l / 4 + 8 * (r / 2 % 2), col = r % 2 + 2 * (l % 4) + 8 * (r / 4);
}
// The cells one thread's tcgen05.ld / st of ``shape`` moves into lanes[] and cols[] (n registers): in its
// warp's quarter of the lanes (the address's lane field), allocated, settled columns.
KDA_EMU_RT inline void tm_thread_cells(Tmem* t, u32 taddr, int shape, int n, u16* lanes, u16* cols, const char* what) {
  Fiber* f = g_cur;
  const u32 base = taddr >> 16, col = taddr & 0xFFFF, quarter = 32u * (f->warp % 4);
  if (shape == TM_32x32b ? base != quarter : base != quarter && base != quarter + 16)
    fail("%s: lane field %u of warp %d's address (a warp moves its own quarter: lanes %d..%d%s)", what, base, f->warp,
         (int)quarter, (int)quarter + 31, shape == TM_32x32b ? "" : "; 16 lanes from its first or its 17th");
  const int span = shape == TM_32x32b ? n : 2 * n;  // the columns the warp's instruction covers
  tm_columns(t, col, span, what);
  tm_settled(t, col, span, what);
  for (int r = 0; r < n; r++) {
    int dl, dc;
    tm_cell(shape, f->lane, r, dl, dc);
    lanes[r] = (u16)(base + dl), cols[r] = (u16)(col + dc);
  }
}
// Operand element (r, k) of an sm_100 shared-memory descriptor (r: the M or N index): the wgmma
// layouts of kernels/ptx.cuh's header, the swizzle field re-coded (bits 61-63: 0, 2, 4, 6).
KDA_EMU_RT inline const u16* tc_elem(u64 desc, int mn_major, int r, int k, const char* what) {
  if (((desc >> 46) & 7) != 1) fail("%s: descriptor bits 46-48 are %d, not 0b001 (sm_100's version)", what, (int)((desc >> 46) & 7));
  int swz = (int)(desc >> 61);
  if (swz & 1 || swz > 6) fail("%s: descriptor swizzle mode %d (the emulation knows 0, 2, 4, 6)", what, swz);
  u64 wg = (desc & ~(7ull << 61) & ~(7ull << 46)) | (u64)(swz == 0 ? 0 : swz == 2 ? 1 : swz == 4 ? 2 : 3) << 62;
  return wg_b_elem(wg, mn_major, k, r);
}
KDA_EMU_RT inline int tc_lane(int m, int i);
// Element (i, k) of an A in tensor memory at taddr: row i in the lane D's row i takes, k in column k / 2,
// even k in the low half (kernels/ptx.cuh, umma_bf16_ts).
KDA_EMU_RT inline u16 tc_tmem_a(Tmem* t, u32 taddr, int m, int i, int k) {
  return (u16)(t->cell[(taddr >> 16) + tc_lane(m, i)][(taddr & 0xFFFF) + k / 2] >> (16 * (k & 1)));
}
KDA_EMU_RT inline void tc_read(TcOp* op) {
  const char* what = "tcgen05.mma";
  for (int k = 0; k < 16; k++) {
    for (int i = 0; i < op->m; i++)
      op->A[i][k] = op->a_tm ? tc_tmem_a(g_worker->tm, (u32)op->a, op->m, i, k) : *tc_elem(op->a, op->a_mn, i, k, what);
    for (int j = 0; j < op->n; j++) op->B[k][j] = *tc_elem(op->b, op->b_mn, j, k, what);
  }
  op->read = 1;
}
KDA_EMU_RT inline int tc_lane(int m, int i) { return m == 128 ? i : 32 * (i / 16) + i % 16; }
KDA_EMU_RT inline void tc_perform(Tmem* t, TcOp* op) {
  if (!op->read) tc_read(op);
#ifdef KDA_EMU_CHECK
  for (int k = 0; k < 16; k++) {  // racecheck: the operands are no longer read
    for (int i = 0; i < op->m && !op->a_tm; i++) wgmma_b_operand(tc_elem(op->a, op->a_mn, i, k, "tcgen05.mma"), true, 0);
    for (int j = 0; j < op->n; j++) wgmma_b_operand(tc_elem(op->b, op->b_mn, j, k, "tcgen05.mma"), true, 0);
  }
#endif
  u32 lane0 = op->d >> 16, col = op->d & 0xFFFF;
  for (int i = 0; i < op->m; i++) {
    u32* row = t->cell[lane0 + tc_lane(op->m, i)];
    for (int j = 0; j < op->n; j++) {
      float c = op->acc ? __uint_as_float(row[col + j]) : 0.0f;
#if KDA_EMU_NUMERICS == 1
      double prod[16];
      for (int k = 0; k < 16; k++) prod[k] = bf2d(op->A[i][k]) * bf2d(op->B[k][j]);
      row[col + j] = __float_as_uint(hw::dot(c, prod, 16));
#else
      double sum = (double)c;
      for (int k = 0; k < 16; k++) sum += bf2d(op->A[i][k]) * bf2d(op->B[k][j]);
      row[col + j] = __float_as_uint((float)sum);
#endif
    }
  }
  for (int j = 0; j < op->n; j++) t->pend[col + j]--;
}
// Performs the committed tcgen05.mma of every commit on `bar` (in issue order) and makes the commits'
// arrivals; the others stay pending.
KDA_EMU_RT inline void tc_land(u64* bar) {
  Tmem* t = g_worker->tm;
  if (!t) return;
  int arrivals = 0, k = 0;
  for (int i = 0; i < t->ncommits; i++) {
    if (t->bars[i] == bar) arrivals++;
    else t->bars[k] = t->bars[i], t->issuers[k++] = t->issuers[i];
  }
  if (!arrivals) return;
  t->ncommits = k;
  k = 0;
  for (int i = 0; i < t->nops; i++) {
    TcOp* op = t->ops[i];
    if (op->bar == bar) {
      tc_perform(t, op);
      free(op);
    } else {
      t->ops[k++] = op;
    }
  }
  t->nops = k;
  for (int i = 0; i < arrivals; i++) mb_arrive(bar, 0, "tcgen05.commit");
}
// a_tm: A from tensor memory at the address a (umma_bf16_ts), else a is A's shared-memory descriptor.
KDA_EMU_RT inline void tc_mma(u32 d, u64 a, u64 b, u32 idesc, bool acc, uintptr_t pc, bool a_tm = false) {
  const char* what = "tcgen05.mma";
  Tmem* t = tm_of(what);
  if ((idesc & 0x0F) || ((idesc >> 4) & 3) != 1 || ((idesc >> 7) & 7) != 1 || ((idesc >> 10) & 7) != 1 ||
      (idesc >> 13 & 3) || (idesc >> 23 & 1) || (idesc >> 29))
    fail("%s: instruction descriptor 0x%08x is not kind::f16's dense bf16 x bf16 -> f32 without negation (the "
         "emulation knows that one)", what, idesc);
  int m = (int)((idesc >> 24) & 31) << 4, n = (int)((idesc >> 17) & 63) << 3;
  if (!((m == 64 && n >= 8 && n <= 256) || (m == 128 && n >= 16 && n <= 256 && n % 16 == 0)))
    fail("%s: M = %d, N = %d is no cta_group::1 shape", what, m, n);
  u32 lane0 = d >> 16, col = d & 0xFFFF;
  if (lane0 && !(m == 64 && lane0 == 16))
    fail("%s: D at lane %u (cta_group::1: lane 0, or 16 for M = 64's half of the data path)", what, lane0);
  tm_columns(t, col, n, what);
  if (a_tm) {  // A's 16 k of each row: 8 columns of D's lanes, settled (no tcgen05.mma still writing them)
    if ((u32)(a >> 16) != lane0) fail("%s: A at lane %u, D at lane %u (the same alignment, the ISA says)", what, (u32)(a >> 16), lane0);
    if (idesc >> 15 & 1) fail("%s: A from tensor memory is K-major (instruction descriptor bit 15 set)", what);
    tm_columns(t, (u32)(a & 0xFFFF), 8, what);
    tm_settled(t, (u32)(a & 0xFFFF), 8, what);
  }
  if (t->nops == 64) fail("%s: more than 64 pending (commit and wait for them)", what);
  TcOp* op = (TcOp*)malloc(sizeof(TcOp));
  if (!op) fail("%s: out of memory", what);
  *op = TcOp{d, idesc, a, b, acc ? 1 : 0, g_cur->lin, m, n, (int)(idesc >> 15 & 1), (int)(idesc >> 16 & 1), a_tm ? 1 : 0,
              nullptr, pc, 0};
#ifdef KDA_EMU_CHECK
  for (int k = 0; k < 16; k++) {  // racecheck: the operands are read from now until performed
    for (int i = 0; i < m && !a_tm; i++) wgmma_b_operand(tc_elem(a, op->a_mn, i, k, what), false, pc);
    for (int j = 0; j < n; j++) wgmma_b_operand(tc_elem(b, op->b_mn, j, k, what), false, pc);
  }
  if (g_worker->pf)  // the tensor cores' work and their operands' shared-memory bytes, each read once
    g_worker->pf->c[PR_tcgen05_flop] += 2ull * m * n * 16,
        g_worker->pf->c[PR_tcgen05_smem_bytes] += 32ull * ((a_tm ? 0 : m) + n);
  path_tcgen05_mma(m, n);
#endif
  (void)pc;
  if (g_worker->L->cp_eager) tc_read(op);
  for (int j = 0; j < n; j++) t->pend[col + j]++;
  t->ops[t->nops++] = op;
}
KDA_EMU_RT inline void tc_commit(u64* bar) {
  const char* what = "tcgen05.commit";
  Tmem* t = tm_of(what);
  mb_load(bar, what);
  int me = g_cur->lin;
  for (int i = 0; i < t->nops; i++)
    if (t->ops[i]->lin == me && !t->ops[i]->bar) t->ops[i]->bar = bar;
  if (t->ncommits == 64) fail("%s: more than 64 pending", what);
  t->bars[t->ncommits] = bar, t->issuers[t->ncommits++] = me;
#ifdef KDA_EMU_CHECK
  path_tcgen05_commit(bar);
#endif
  if (g_worker->L->cp_eager) tc_land(bar);
  else mb_wake(bar);
}
KDA_EMU_RT inline void tm_alloc(u32* slot, u32 ncols) {
  Fiber* f = g_cur;
  const char* what = "tcgen05.alloc";
  Tmem* t = tm_of(what);
  smem_window(slot, what);
  warp_barrier(f, what, [t, slot, ncols, what]() KDA_EMU_RT {
    if (ncols < 32 || ncols > 512 || (ncols & (ncols - 1))) fail("%s: %u columns (a power of 2 in [32, 512])", what, ncols);
    if (t->relinquished) fail("%s after tcgen05.relinquish_alloc_permit", what);
    unsigned units = ncols / 32, mask = units == 16 ? 0xFFFFu : ((1u << units) - 1);
#ifdef KDA_EMU_CHECK
    if (g_worker->pf) g_worker->pf->c[PR_tmem_cols] += ncols;  // what limits the CTAs an SM holds
#endif
    for (unsigned u = 0; u + units <= 16; u += units)
      if (!(t->units & (mask << u))) {
        t->units |= mask << u;
        *slot = 32 * u;  // lane 0, the first column
        return;
      }
    fail("%s: %u columns asked, not free in the 512 (this emulation does not wait for another CTA's)", what, ncols);
  });
}
KDA_EMU_RT inline void tm_dealloc(u32 taddr, u32 ncols) {
  Fiber* f = g_cur;
  const char* what = "tcgen05.dealloc";
  Tmem* t = tm_of(what);
  warp_barrier(f, what, [t, taddr, ncols, what]() KDA_EMU_RT {
    u32 col = taddr & 0xFFFF;
    if ((taddr >> 16) || col % 32 || ncols < 32 || (ncols & (ncols - 1)))
      fail("%s: address 0x%x, %u columns: not an allocation", what, taddr, ncols);
    unsigned units = ncols / 32, mask = (units == 16 ? 0xFFFFu : ((1u << units) - 1)) << (col / 32);
    if ((t->units & mask) != mask) fail("%s: columns [%u, %u) not all allocated", what, col, col + ncols);
    tm_settled(t, col, ncols, what);
    t->units &= ~mask;
  });
}
KDA_EMU_RT inline void tm_relinquish() {
  Tmem* t = tm_of("tcgen05.relinquish_alloc_permit");
  warp_barrier(g_cur, "tcgen05.relinquish_alloc_permit", [t]() KDA_EMU_RT { t->relinquished = 1; });
}
// tcgen05.ld of ``shape`` by one thread of its warp: its n registers' cells (tm_cell).
KDA_EMU_RT inline void tm_ld(u32 taddr, float* r, int n, int shape = TM_32x32b) {
  const char* what = "tcgen05.ld";
  Tmem* t = tm_of(what);
  TmLoads& q = t->ld[g_cur->lin];
  if (q.pending == TM_QUEUE) fail("%s: more than %d tcgen05.ld before a tcgen05.wait::ld (the emulation keeps %d)", what, TM_QUEUE, TM_QUEUE);
  TmLoad& l = q.q[q.pending++];
  u16 lanes[TM_REGS], cols[TM_REGS];
  tm_thread_cells(t, taddr, shape, n, lanes, cols, what);
  for (int j = 0; j < n; j++) {
    l.v[j] = t->cell[lanes[j]][cols[j]];
    r[j] = __uint_as_float(WG_POISON);  // undefined until tcgen05.wait::ld
  }
  l.dst = r, l.n = n;
#ifdef KDA_EMU_CHECK
  if (g_worker->pf) g_worker->pf->c[PR_tmem_ld_bytes] += 4ull * n;  // per thread: its lane's columns
  path_tmem(false);
#endif
}
// tcgen05.st of ``shape`` by one thread: its values reach the cells at its tcgen05.wait::st (an MMA or a
// tcgen05.ld of them before that reads what was there: the missing wait shows).
KDA_EMU_RT inline void tm_st(u32 taddr, const float* r, int n, int shape = TM_32x32b) {
  const char* what = "tcgen05.st";
  Tmem* t = tm_of(what);
  TmStores& q = t->st[g_cur->lin];
  if (q.pending == TM_QUEUE) fail("%s: more than %d tcgen05.st before a tcgen05.wait::st (the emulation keeps %d)", what, TM_QUEUE, TM_QUEUE);
  TmStore& s = q.q[q.pending++];
  tm_thread_cells(t, taddr, shape, n, s.lane, s.col, what);
  for (int j = 0; j < n; j++) s.v[j] = __float_as_uint(r[j]);
  s.n = n;
#ifdef KDA_EMU_CHECK
  path_tmem(true);
#endif
}
// tcgen05.wait::st, a warp collective (.sync.aligned) as the stores it waits for: every lane's stores land
// when the warp's last lane arrives (a 16-lane shape writes other threads' lanes: what a thread reads of
// its own lane after the wait is the warp's).
KDA_EMU_RT inline void tm_wait_st() {
  const char* what = "tcgen05.wait::st";
  Tmem* t = tm_of(what);
  const int first = g_cur->warp * 32;
  warp_barrier(g_cur, what, [t, first]() KDA_EMU_RT {
    for (int lin = first; lin < first + 32; lin++) {
      TmStores& q = t->st[lin];
      for (int i = 0; i < q.pending; i++) {
        const TmStore& s = q.q[i];
        for (int j = 0; j < s.n; j++) t->cell[s.lane[j]][s.col[j]] = s.v[j];
      }
      q.pending = 0;
    }
  });
}
KDA_EMU_RT inline void tm_wait_ld() {
  Tmem* t = tm_of("tcgen05.wait::ld");
  TmLoads& q = t->ld[g_cur->lin];
  for (int i = 0; i < q.pending; i++) {
    const TmLoad& l = q.q[i];
    for (int j = 0; j < l.n; j++) l.dst[j] = __uint_as_float(l.v[j]);
  }
  q.pending = 0;
}
}  // namespace kda_emu

inline u32 pack_bf16x2(float lo, float hi) {
  return (u32)::kda_emu::f2bf(lo) | ((u32)::kda_emu::f2bf(hi) << 16);
}
inline u32 pack_f16x2(float lo, float hi) { return (u32)::kda_emu::f2h(lo) | ((u32)::kda_emu::f2h(hi) << 16); }
inline u16 f32_to_bf16(float x) { return ::kda_emu::f2bf(x); }
// fma / sub / mul / add .rn.ftz.f32x2: each lane the scalar operation (the launch's FTZ|DAZ mode flushes as -ftz=true)
inline float2 fma2_ftz(float2 a, float2 b, float2 c) { return make_float2(fmaf(a.x, b.x, c.x), fmaf(a.y, b.y, c.y)); }
inline float2 sub2_ftz(float2 a, float2 b) { return make_float2(a.x - b.x, a.y - b.y); }
inline float2 mul2_ftz(float2 a, float2 b) { return make_float2(a.x * b.x, a.y * b.y); }
inline float2 add2_ftz(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
inline u16 f32_to_f16(float x) { return ::kda_emu::f2h(x); }
inline float f16_to_f32(u16 h) { return ::kda_emu::h2f(h); }
#if KDA_EMU_NUMERICS == 1
// PTX ISA error bounds (Floating Point Instructions: ex2, lg2, rsqrt, rcp, tanh): ex2 2 ulp of the
// correctly rounded result; lg2 2^-22 absolute in (0.5, 2), else 2^-22 relative; rsqrt 2^-22.9
// relative; rcp.approx 1 ulp; tanh 2^-11 relative (subnormal inputs passed through). Inputs whose
// exact result is a power of two (ex2 of an integer, lg2 of a power of two, ...) stay exact.
inline float ex2_approx_ftz(float x) {
  KDA_EMU_SFU(ex2);
  float xf = ::kda_emu::ftz(x);
  float r = (float)exp2((double)xf);
  if (isfinite(xf) && rint(xf) != xf)
    r = ::kda_emu::hw::step_ulps(r, (int)floor((::kda_emu::hw::unit(xf, 1) + 1.0) * 2.5) - 2);
  return __float_as_uint(r) < 0x00800000u ? 0.0f : r;  // results below 2^-126 flush to +0
}
inline float lg2_approx_ftz(float x) {
  KDA_EMU_SFU(lg2);
  float xf = ::kda_emu::ftz(x);
  double y = log2((double)xf);
  if (!(xf > 0) || !isfinite(xf) || ::kda_emu::hw::pow2(xf)) return ::kda_emu::ftz((float)y);
  double u = ::kda_emu::hw::unit(xf, 2);
  float r = (xf > 0.5f && xf < 2.0f) ? ::kda_emu::hw::within(y, u * 0x1p-22, 0x1p-22) : ::kda_emu::hw::rel(y, xf, 2, 0x1p-22);
  return ::kda_emu::ftz(r);
}
inline float rsqrt_approx_ftz(float x) {
  KDA_EMU_SFU(rsqrt);
  float xf = ::kda_emu::ftz(x);
  double y = 1.0 / sqrt((double)xf);
  if (!(xf > 0) || !isfinite(xf) || ::kda_emu::hw::pow2(y)) return ::kda_emu::ftz((float)y);
  return ::kda_emu::ftz(::kda_emu::hw::rel(y, xf, 3, exp2(-22.9)));
}
inline float rcp_approx_ftz(float x) {
  KDA_EMU_SFU(rcp);
  float xf = ::kda_emu::ftz(x);
  double y = 1.0 / (double)xf;
  float r = (float)y;
  if (xf != 0 && isfinite(xf) && isfinite(r) && !::kda_emu::hw::pow2(y) && (::kda_emu::hw::mix(__float_as_uint(xf), 4) & 1))
    r = (double)r > y ? nextafterf(r, -INFINITY) : (double)r < y ? nextafterf(r, INFINITY) : r;  // the other neighbour
  return ::kda_emu::ftz(r);
}
inline float tanh_approx(float x) {
  KDA_EMU_SFU(tanh);
  if (::kda_emu::is_subnormal(x)) return x;  // passed through (no ftz on tanh), not flushed by FTZ here
  double y = tanh((double)x);
  if (x == 0 || !isfinite(x)) return (float)y;
  float r = ::kda_emu::hw::rel(y, x, 5, 0x1p-11);
  return fabsf(r) > 1.0f ? copysignf(1.0f, r) : r;
}
#else
inline float ex2_approx_ftz(float x) {
  KDA_EMU_SFU(ex2);
  float r = (float)exp2((double)::kda_emu::ftz(x));
  return r < 1.17549435e-38f ? 0.0f : r;  // results below 2^-126 flush to +0
}
inline float lg2_approx_ftz(float x) {
  KDA_EMU_SFU(lg2);
  return ::kda_emu::ftz((float)log2((double)::kda_emu::ftz(x))); }
inline float rsqrt_approx_ftz(float x) {
  KDA_EMU_SFU(rsqrt);
  return ::kda_emu::ftz((float)(1.0 / sqrt((double)::kda_emu::ftz(x)))); }
inline float rcp_approx_ftz(float x) {
  KDA_EMU_SFU(rcp);
  return ::kda_emu::ftz((float)(1.0 / (double)::kda_emu::ftz(x))); }
inline float tanh_approx(float x) {
  KDA_EMU_SFU(tanh);
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

KDA_EMU_RT inline void mma_bf16_m16n8k16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2], const float (&c)[4]) {
  ::kda_emu::mma_m16n8k16<true>(d, a, b, c, "mma.m16n8k16.bf16", KDA_EMU_PC);
}
KDA_EMU_RT inline void mma_f16_m16n8k16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2], const float (&c)[4]) {
  ::kda_emu::mma_m16n8k16<false>(d, a, b, c, "mma.m16n8k16.f16", KDA_EMU_PC);
}

KDA_EMU_RT inline void cp_async_16(void* dst, const void* src) { ::kda_emu::cp_async_push(dst, src, 16, KDA_EMU_PC); }
KDA_EMU_RT inline void cp_async_16_zfill(void* dst, const void* src, bool valid) {
  ::kda_emu::cp_async_push(dst, src, valid ? 16 : 0, KDA_EMU_PC);
}
KDA_EMU_RT inline void cp_async_commit() {
  KDA_EMU_ANCHOR(cp_commit, KDA_EMU_PC);
  ::kda_emu::g_cur->open_group++;
}
template <int N>
KDA_EMU_RT inline void cp_async_wait() {
  static_assert(N >= 0, "cp.async.wait_group N needs N >= 0");
  KDA_EMU_ANCHOR(cp_wait, KDA_EMU_PC);
  ::kda_emu::cp_async_wait_n((unsigned)N, KDA_EMU_PC);
}
KDA_EMU_RT inline unsigned char* dynamic_smem() { return ::kda_emu::g_worker->smem; }

// ---- Hopper (kernels/ptx.cuh: sm_90a / sm_90+ there, always here) -------------------------------
KDA_EMU_RT inline u32 smem_u32(const void* p) { return ::kda_emu::smem_window(p, "smem_u32"); }
KDA_EMU_RT inline void wgmma_fence() {
  KDA_EMU_ANCHOR(wg_fence, KDA_EMU_PC);
  ::kda_emu::wgmma_fence_all();
}
KDA_EMU_RT inline void wgmma_commit() {
  KDA_EMU_ANCHOR(wg_commit, KDA_EMU_PC);
  ::kda_emu::wgmma_commit_all();
}
template <int N>
KDA_EMU_RT inline void wgmma_wait() {
  static_assert(N >= 0, "wgmma.wait_group N needs N >= 0");
  KDA_EMU_ANCHOR(wg_wait, KDA_EMU_PC);
  ::kda_emu::wgmma_wait_n((unsigned)N);
}
template <int R>
KDA_EMU_RT inline void wgmma_fence_operand(float (&)[R]) {}
template <int N, bool B_N_MAJOR>
KDA_EMU_RT inline void wgmma_bf16(float (&d)[N / 2], const u32 (&a)[4], u64 b_desc, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "wgmma_bf16: N of 8..256 (powers of 2)");
  ::kda_emu::wgmma_issue(d, N, B_N_MAJOR ? 1 : 0, a, b_desc, accumulate, KDA_EMU_PC);
}
KDA_EMU_RT inline void mbarrier_init(u64* bar, u32 count) {
  KDA_EMU_ANCHOR(mb_init, KDA_EMU_PC);
  if (count < 1 || count > ::kda_emu::MB_COUNT) ::kda_emu::fail("mbarrier_init: count %u outside [1, 2^20 - 1]", count);
  if ((uintptr_t)bar % 8) ::kda_emu::fail("mbarrier_init: address %p is not 8-byte aligned", (void*)bar);
  *bar = ::kda_emu::MB_MARK;
  ::kda_emu::mb_store(bar, ::kda_emu::MbState{count, count, 0, 0}, "mbarrier_init");
#ifdef KDA_EMU_CHECK
  if (::kda_emu::g_worker->L->check) ::kda_emu::mbarrier_init_mark(bar, KDA_EMU_PC);
#endif
}
KDA_EMU_RT inline void mbarrier_arrive(u64* bar) {
  KDA_EMU_ANCHOR(mb_arrive, KDA_EMU_PC);
  ::kda_emu::mb_arrive(bar, 0, "mbarrier.arrive");
}
KDA_EMU_RT inline void mbarrier_arrive_expect_tx(u64* bar, u32 bytes) {
  KDA_EMU_ANCHOR(mb_arrive, KDA_EMU_PC);
  ::kda_emu::mb_arrive(bar, bytes, "mbarrier.arrive.expect_tx");
}
// elect.sync, full mask: every lane of the warp must arrive (a warp barrier: none may have exited); the twin
// elects lane 31, since the ISA promises one lane, the same every time, not lane 0: a kernel that assumes
// lane 0 (a per-thread commit, a lane-0 store) fails here. No issue anchor: ptxas emits ELECT for its own
// loops over the lanes too, so the SASS's ELECTs are not this twin's calls.
KDA_EMU_RT inline bool elect_one_sync() {
  ::kda_emu::warp_barrier(::kda_emu::g_cur, "elect_one_sync");
  return ::kda_emu::g_cur->lane == 31;
}
KDA_EMU_RT inline bool mbarrier_try_wait_parity(u64* bar, u32 parity) {
  KDA_EMU_ANCHOR(mb_wait, KDA_EMU_PC);
  return ::kda_emu::mb_wait(bar, parity);
}
KDA_EMU_RT inline bool mbarrier_test_wait_parity(u64* bar, u32 parity) {
  KDA_EMU_ANCHOR(mb_test, KDA_EMU_PC);
  return ::kda_emu::mb_test(bar, parity, "mbarrier.test_wait.parity");
}
KDA_EMU_RT inline void cp_async_bulk_g2s(void* dst, const void* src, u32 bytes, u64* bar) {
  KDA_EMU_ANCHOR(bulk, KDA_EMU_PC);
  ::kda_emu::bulk_copy(dst, src, bytes, bar, KDA_EMU_PC);
}
// Orders nothing here (the emulation has one proxy); racecheck counts it per thread.
KDA_EMU_RT inline void fence_proxy_async_smem() {
  KDA_EMU_ANCHOR(fence_proxy, KDA_EMU_PC);
#ifdef KDA_EMU_CHECK
  ::kda_emu::proxy_fence();
#endif
}
// Ordering only (the emulation's bulk copies read global memory when they land); anchored as the shared
// one is (SASS: FENCE.VIEW.ASYNC.G); racecheck asks for it between an acquire and a bulk copy.
KDA_EMU_RT inline void fence_proxy_async_global() {
  KDA_EMU_ANCHOR(fence_proxy, KDA_EMU_PC);
#ifdef KDA_EMU_CHECK
  ::kda_emu::global_proxy_fence();
#endif
}
// Flags between blocks: real acquire / release atomics (the blocks run on OS threads). A reader that
// spins gives up its OS thread's slice each time (sched_yield): the writer's block may share the core;
// and a block spinning on a flag that a failed block would have set is abandoned with the launch.
namespace kda_emu {
KDA_EMU_RT inline void spin_yield() {
  sched_yield();
  if (__atomic_load_n(&g_worker->L->abort, __ATOMIC_RELAXED)) to_sched(g_cur);
}
}  // namespace kda_emu
KDA_EMU_RT inline u32 ld_acquire_gpu(const u32* p) {
  KDA_EMU_ATOMIC(p);
#ifdef KDA_EMU_CHECK
  ::kda_emu::acquire_mark();
#endif
  const u32 v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
  ::kda_emu::spin_yield();
  return v;
}
// One read counted and anchored however long it spins (each spin a bare acquire load): the counters
// price the wait as the writer ahead, whatever the OS threads' timing was.
KDA_EMU_RT inline u32 wait_acquire_gpu_geq(const u32* p, u32 need) {
  KDA_EMU_ATOMIC(p);
#ifdef KDA_EMU_CHECK
  ::kda_emu::acquire_mark();
#endif
  for (;;) {
    const u32 v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    if (v >= need) return v;
    ::kda_emu::spin_yield();
  }
}
KDA_EMU_RT inline void st_release_gpu(u32* p, u32 v) {
  KDA_EMU_ATOMIC(p);
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
KDA_EMU_RT inline void red_release_gpu_add(u32* p, u32 v) {
  KDA_EMU_ATOMIC(p);
  __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
}
// ---- Blackwell (kernels/ptx.cuh: sm_100a there, always here) ------------------------------------
KDA_EMU_RT inline void tmem_alloc(u32* slot, u32 ncols) { ::kda_emu::tm_alloc(slot, ncols); }
KDA_EMU_RT inline void tmem_relinquish() { ::kda_emu::tm_relinquish(); }
KDA_EMU_RT inline void tmem_dealloc(u32 taddr, u32 ncols) { ::kda_emu::tm_dealloc(taddr, ncols); }
KDA_EMU_RT inline void umma_bf16(u32 d_tmem, u64 a_desc, u64 b_desc, u32 idesc, bool accumulate) {
  ::kda_emu::tc_mma(d_tmem, a_desc, b_desc, idesc, accumulate, KDA_EMU_PC);
}
KDA_EMU_RT inline void umma_bf16_ts(u32 d_tmem, u32 a_tmem, u64 b_desc, u32 idesc, bool accumulate) {
  ::kda_emu::tc_mma(d_tmem, a_tmem, b_desc, idesc, accumulate, KDA_EMU_PC, true);
}
KDA_EMU_RT inline void umma_commit(u64* bar) { ::kda_emu::tc_commit(bar); }
template <int N>
KDA_EMU_RT inline void tmem_ld_32x32b(u32 taddr, float (&r)[N]) {
  static_assert(N == 8 || N == 16, "tmem_ld_32x32b: N = 8 or 16");
  ::kda_emu::tm_ld(taddr, r, N);
}
KDA_EMU_RT inline void tmem_wait_ld() { ::kda_emu::tm_wait_ld(); }
KDA_EMU_RT inline void tmem_st_32x32b_x8(u32 taddr, const float (&r)[8]) { ::kda_emu::tm_st(taddr, r, 8); }
template <int N>
KDA_EMU_RT inline void tmem_ld_16x256b(u32 taddr, float (&r)[4 * N]) {
  static_assert(N == 4 || N == 8, "tmem_ld_16x256b: N = 4 or 8");
  ::kda_emu::tm_ld(taddr, r, 4 * N, ::kda_emu::TM_16x256b);
}
template <int N>
KDA_EMU_RT inline void tmem_st_16x256b(u32 taddr, const float (&r)[4 * N]) {
  static_assert(N == 4 || N == 8, "tmem_st_16x256b: N = 4 or 8");
  ::kda_emu::tm_st(taddr, r, 4 * N, ::kda_emu::TM_16x256b);
}
template <int N>
KDA_EMU_RT inline void tmem_ld_16x128b(u32 taddr, float (&r)[2 * N]) {
  static_assert(N == 4 || N == 8, "tmem_ld_16x128b: N = 4 or 8");
  ::kda_emu::tm_ld(taddr, r, 2 * N, ::kda_emu::TM_16x128b);
}
template <int N>
KDA_EMU_RT inline void tmem_st_16x128b(u32 taddr, const float (&r)[2 * N]) {
  static_assert(N == 4 || N == 8, "tmem_st_16x128b: N = 4 or 8");
  ::kda_emu::tm_st(taddr, r, 2 * N, ::kda_emu::TM_16x128b);
}
KDA_EMU_RT inline void tmem_wait_st() { ::kda_emu::tm_wait_st(); }
KDA_EMU_RT inline void tcgen05_fence_before_sync() {}  // ordering only: the emulation's threads are ordered
KDA_EMU_RT inline void tcgen05_fence_after_sync() {}

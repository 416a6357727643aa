// Hardware counters of an instrumented build (KDACUPY_EMULATE_PROFILE=1): Nsight
// Compute's request / wavefront / sector vocabulary, computed exactly from the
// emulated run (docs/design.md section 11). Included by checks.h: the same
// -fsanitize=thread hooks that feed the checks feed these counters.
//
// A request is one execution of one warp-level instruction. The emulation runs
// a warp's lanes one after another between warp-synchronising points (warp
// collectives, __syncthreads, block end), so the lanes' accesses are grouped
// into requests per warp by (code address, the lane's occurrence count of that
// address since the warp's last synchronising point): lane 5's third execution
// of an instruction joins lane 9's third. This is the hardware's grouping for
// straight-line code, loops and if-branches; a divergent inner loop that lanes
// run in different iterations of an outer loop is grouped by occurrence, as
// if the inactive iterations were compacted.
//  - shared memory: 32 banks of 4 bytes; a request is served in phases (all 32
//    lanes for accesses of up to 4 bytes, half-warps for 8, quarter-warps for
//    16); per phase, distinct 4-byte words in one bank serialise (wavefronts),
//    equal words broadcast. Ideal: the same phases with no conflict
//    (ceil(distinct words / 32) each). ldmatrix: one phase per 8x8 matrix.
//    cp.async: its 16-byte shared write per lane, like a 16-byte store.
//  - global memory: 32-byte sectors touched per request, and the distinct bytes
//    the lanes asked for. Sectors are counted from the start of each launch
//    array (a GPU allocation is 256-byte aligned; a NumPy array need not be).
//    dram: distinct sectors the launch touched (read, written, either), i.e.
//    the traffic with an ideal L2: a sector counts as read if a read reached it
//    before any write of the launch (a sector the launch wrote first is read
//    from L2). Memory reached through a raw address (no array passed) counts
//    from absolute addresses, read and written alike; stack and local arrays
//    are not device memory.
//  - sfu: warp-level .approx instructions (ex2, lg2, rsqrt, rcp, tanh), and the
//    active lanes they ran for.
//  - the dependent path (docs/design.md section 11.1): per warp, a clock of its
//    in-order issue and the times its loads and results complete, from the
//    instructions above in the order the emulation runs them; barriers align the
//    warps. A time is the count of steps of each kind on its path (PT); the longer
//    of two paths is the one with more cycles at PATH_REF, Hopper's latencies
//    (the roofline prices the steps per GPU). Per launch: the steps of the
//    longest CTA path (path_max_*), their sum over CTAs (path_sum_*), and the
//    most bytes of global loads one CTA has in flight at once (inflight_peak_bytes).
#pragma once

namespace kda_emu {

// The counters, in the order of kda_emu_profile_names() (the loader reads the names from there).
#define KDA_EMU_PROFILE_COUNTERS(X)                                                                   \
  X(smem_requests) X(smem_wavefronts) X(smem_wavefronts_ideal)                                        \
  X(smem_load_requests) X(smem_load_wavefronts) X(smem_load_wavefronts_ideal)                         \
  X(smem_store_requests) X(smem_store_wavefronts) X(smem_store_wavefronts_ideal)                      \
  X(gmem_requests) X(gmem_sectors) X(gmem_bytes)                                                      \
  X(gmem_load_requests) X(gmem_load_sectors) X(gmem_load_bytes)                                       \
  X(gmem_store_requests) X(gmem_store_sectors) X(gmem_store_bytes)                                    \
  X(dram_bytes) X(dram_read_bytes) X(dram_write_bytes)                                                \
  X(mma) X(ldmatrix) X(cp_async_requests) X(cp_async_bytes) X(shuffles) X(sfu) X(sfu_lanes)          \
  X(barriers) X(ctas) X(warps)                                                                      \
  X(path_max_issue) X(path_max_dram) X(path_max_smem) X(path_max_ldmatrix)                          \
  X(path_max_mma) X(path_max_sfu) X(path_max_shuffle) X(path_max_barrier)                           \
  X(path_sum_issue) X(path_sum_dram) X(path_sum_smem) X(path_sum_ldmatrix)                          \
  X(path_sum_mma) X(path_sum_sfu) X(path_sum_shuffle) X(path_sum_barrier)                           \
  X(inflight_peak_bytes) X(wgmma) X(wgmma_smem_bytes) X(bulk_copy_bytes) X(mbarrier_waits)            \
  X(tcgen05_flop) X(tcgen05_smem_bytes) X(tmem_ld_bytes) X(tmem_cols)
#define KDA_EMU_PROFILE_ENUM(n) PR_##n,
enum : int { KDA_EMU_PROFILE_COUNTERS(KDA_EMU_PROFILE_ENUM) PR_N };
#undef KDA_EMU_PROFILE_ENUM
constexpr int PR_OUT = 64;   // slots of the loader's counter array; the last holds the per-pc entry count,
                             // the two before it the issue anchors' rows and the rows that did not fit
constexpr int PC_FIELDS = 6;  // per code address: offset, kind, requests, wavefronts|sectors, ideal|bytes, write
static_assert(PR_N < PR_OUT - 3, "counter array");

// Issue anchors (docs/design.md section 11.4): the warp-level executions of every instruction whose
// SASS counterpart is known by construction -- the kernel's shared and global loads, stores and
// atomics, and the twins of kernels/ptx.cuh and of the CUDA intrinsics -- per warp of the CTA,
// code address and calling context (the return addresses of the kernel's calls the host compiler
// did not inline). kdacupy/cli/issue.py fits the SASS's basic-block counts to them. A warp executes
// an instruction as often as its busiest lane does between two synchronising points (the
// requests' grouping); bulk copies also count per lane (ptxas issues UBLKCP one lane at a time).
#define KDA_EMU_ANCHOR_CLASSES(X)                                                                     \
  X(load) X(store) X(atomic) X(ldmatrix) X(cp_async) X(cp_commit) X(cp_wait) X(mma) X(shfl) X(vote)    \
  X(bar) X(ex2) X(lg2) X(rsqrt) X(rcp) X(tanh) X(wgmma) X(wg_fence) X(wg_commit) X(wg_wait) X(mb_init)  \
  X(mb_arrive) X(mb_wait) X(mb_test) X(bulk) X(fence_proxy)
#define KDA_EMU_ANCHOR_ENUM(n) AN_##n,
enum : unsigned { KDA_EMU_ANCHOR_CLASSES(KDA_EMU_ANCHOR_ENUM) AN_N };
#undef KDA_EMU_ANCHOR_ENUM
static_assert(AN_N <= 64, "anchor classes: 6 bits of the key");
constexpr int ANC_FIELDS = 7 + KDA_EMU_CALLERS;  // offset, class, warp, warp executions, lane executions, bytes
                                                 // per lane (loads, stores, atomics), callers, then the callers'
                                                 // offsets, outermost first

enum : unsigned char { SP_SMEM = 1, SP_GMEM = 2, SP_SFU = 3, SP_CPLAND = 4 };  // CPLAND: a cp.async wait lands a copy
enum : unsigned { SUB_PLAIN = 0, SUB_CP_DST = 1, SUB_CP_SRC = 2, SUB_SFU = 3 };  // key = pc * 4 + sub

struct PAcc {          // one lane's part of a request
  uintptr_t addr;      // shared: the address; global: the offset in its region (no region: the address)
  int region;          // global: index in Launch::prof_regions, or -1; a cp.async's shared write: 1 if it reads global memory
  unsigned size;
  unsigned char space, write, atomic;
};
struct PGroup {        // one request being assembled: (key, occurrence) of one warp
  uintptr_t key;
  unsigned mask;
  PAcc acc[32];
};
struct PLaneEnt { uintptr_t key; unsigned gen, count; };    // (key, lane) -> occurrences this interval
struct PGroupEnt { uintptr_t key; unsigned k, gen; int idx; };  // (key, occurrence) -> group
struct PIvl {          // an anchor's executions by each lane since the warp's last synchronising point
  unsigned long long key;
  unsigned gen;
  int anc;             // its row in Prof::av
  unsigned most, lanes[32];
};
struct PWarp {
  unsigned gen;  // entries of older intervals are free slots
  PIvl* it;      // the anchors of this interval
  unsigned icap, ilive;
  PLaneEnt* lt;
  unsigned lcap, llive;
  PGroupEnt* gt;
  unsigned gcap;
  PGroup* g;
  unsigned ng, gmax;
};
struct PPc { uintptr_t pc; long long kind, req, a, b, write; };  // per code address (offset from the library base)
struct PAnc {          // one issue anchor of one warp of the CTA, summed over this worker's CTAs
  unsigned long long key;
  uintptr_t pc;
  unsigned cls, warp, bytes;
  long long wexec, lexec;
  int depth;
  uintptr_t callers[KDA_EMU_CALLERS];
};
struct PSet {          // sectors outside the launch arrays: key = sector + 1, bits 1 read, 2 written
  unsigned long long* key;
  unsigned char* bits;
  size_t cap, live;
};
// Kinds of dependent step, in the order of the path_* counters; PATH_REF: their cycles on Hopper
// (kdacupy/cli/roofline.py's HOPPER_LATENCY, sourced in docs/design.md section 11.1), which pick
// the longer of two paths. issue: one per warp instruction seen, and per wavefront after a
// request's first.
enum : int { PK_issue, PK_dram, PK_smem, PK_ldmatrix, PK_mma, PK_sfu, PK_shuffle, PK_barrier, PK_N };
constexpr long long PATH_REF[PK_N] = {1, 700, 29, 29, 24, 23, 29, 0};
struct PT { int n[PK_N]; long long cyc; };  // a time: the steps of each kind on its path, their cycles
constexpr int PATH_A = 32;                     // A operands remembered per warp between barriers
struct PASlot { unsigned long long h; PT ready; };
struct PPath {         // one warp's clocks and what it waits for
  PT t;                // in-order issue of what uses values: the next one issues no earlier
  PT tl;               // issue of loads (and cp.async), as early as the fences allow, one per clock
  PT fence_s;          // shared loads issue after it: the last barrier, shared store or cp.async wait
  PT fence_g;          // global loads issue after it: the last barrier or global store
  PT loads;            // completion of the latest plain (shared, global) loads issued
  PT results;          // completion of the latest mma, SFU and shuffle results
  PT nosfu;            // ... of the mma and shuffle results
  PT noshfl;           // ... of the mma and SFU results
  PT stores;           // completion of the shared stores (a barrier waits for them)
  PT sunk;             // issue of the latest store (the warp reaches a barrier or its end after it)
  PT cp;               // issue of the last cp.async (its global read's interval)
  PASlot a[PATH_A];    // mma A operands (by value) since the last barrier: when they were ready
  int na, anext;
  PT wgres;            // the results as of the warpgroup's last wgmma.fence (what a new A is made of)
  PT wgfree;           // when the tensor cores are done streaming the warpgroup's wgmma issued so far
  PT tcfree;           // ... the tcgen05.mma this warp's thread issued so far (one thread issues them)
  PT tcdone;           // when the last of those is complete (what its tcgen05.commit's arrival waits for)
};
struct PIv { long long from, to, bytes; };   // a global load in flight: reference cycles, bytes
struct Prof {
  long long c[PR_N];
  PWarp* warps;
  int nwarps;
  PPc* pcs;
  unsigned pcap, plive;
  PSet loose;
  PPath* path;         // per warp, this CTA
  PT* land;            // per 16 bytes of dynamic shared memory: when its cp.async lands
  unsigned char* pending;  // ... or 1: a cp.async into it is queued, not yet on the path
  size_t nland;
  PIv* iv;             // this CTA's global loads
  size_t niv, civ;
  PT worst;            // the longest CTA path of this worker
  long long peak;      // the most bytes one of its CTAs had in flight
  PAnc* av;            // the issue anchors, in order of first sight
  unsigned an, acap;
  int* ah;             // their hash index (-1: free)
  unsigned ahcap;
};
struct PRegion {       // a launch array (overlapping ones merged): its sectors ever read / written
  uintptr_t lo, hi;
  unsigned long long *rd, *wr;
  long long nrd, nwr;  // at the launch's end: how many
};

KDA_EMU_RT inline unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

KDA_EMU_RT inline Prof* prof() { return g_worker->pf; }

// -- the per-warp tables ------------------------------------------------------------
KDA_EMU_RT inline void lane_grow(PWarp& p) {
  unsigned ncap = p.lcap ? 2 * p.lcap : 256;
  PLaneEnt* nt = (PLaneEnt*)calloc(ncap, sizeof(PLaneEnt));
  if (!nt) fail("profile: out of memory");
  for (unsigned i = 0; i < p.lcap; i++) {
    const PLaneEnt& e = p.lt[i];
    if (e.gen != p.gen || !e.count) continue;
    unsigned j = (unsigned)mix64(e.key) & (ncap - 1);
    while (nt[j].count) j = (j + 1) & (ncap - 1);
    nt[j] = e;
  }
  free(p.lt);
  p.lt = nt;
  p.lcap = ncap;
}

// This lane's occurrences of `key` before this one, since the warp's last synchronising point.
KDA_EMU_RT inline unsigned occurrence(PWarp& p, uintptr_t key, int lane) {
  if (2 * (p.llive + 1) > p.lcap) lane_grow(p);
  uintptr_t k = key * 32 + (uintptr_t)lane;
  unsigned j = (unsigned)mix64(k) & (p.lcap - 1);
  for (;; j = (j + 1) & (p.lcap - 1)) {
    PLaneEnt& e = p.lt[j];
    if (e.gen != p.gen || !e.count) {  // free: first occurrence
      e = PLaneEnt{k, p.gen, 1};
      p.llive++;
      return 0;
    }
    if (e.key == k) return e.count++;
  }
}

KDA_EMU_RT inline void group_grow(PWarp& p) {
  unsigned ncap = p.gcap ? 2 * p.gcap : 256;
  PGroupEnt* nt = (PGroupEnt*)calloc(ncap, sizeof(PGroupEnt));
  if (!nt) fail("profile: out of memory");
  for (unsigned i = 0; i < p.gcap; i++) {
    const PGroupEnt& e = p.gt[i];
    if (e.gen != p.gen || e.idx < 0) continue;
    unsigned j = (unsigned)mix64(e.key ^ ((unsigned long long)e.k << 40)) & (ncap - 1);
    while (nt[j].gen == p.gen && nt[j].idx >= 0) j = (j + 1) & (ncap - 1);
    nt[j] = e;
  }
  for (unsigned j = 0; j < ncap; j++)
    if (!(nt[j].gen == p.gen && nt[j].idx >= 0)) nt[j].idx = -1;
  free(p.gt);
  p.gt = nt;
  p.gcap = ncap;
}

// The request (site, occurrence k) of a warp; `key` (pc * 4 + sub) is what the request records.
KDA_EMU_RT inline PGroup& group_of(PWarp& p, uintptr_t site, unsigned k, uintptr_t key) {
  if (2 * (p.ng + 1) > p.gcap) group_grow(p);
  unsigned j = (unsigned)mix64(site ^ ((unsigned long long)k << 40)) & (p.gcap - 1);
  for (;; j = (j + 1) & (p.gcap - 1)) {
    PGroupEnt& e = p.gt[j];
    if (e.gen != p.gen || e.idx < 0) {
      if (p.ng == p.gmax) {
        p.gmax = p.gmax ? 2 * p.gmax : 64;
        p.g = (PGroup*)realloc(p.g, sizeof(PGroup) * p.gmax);
        if (!p.g) fail("profile: out of memory");
      }
      e = PGroupEnt{site, k, p.gen, (int)p.ng};
      PGroup& g = p.g[p.ng++];
      g.key = key;
      g.mask = 0;
      return g;
    }
    if (e.key == site && e.k == k) return p.g[e.idx];
  }
}

// One lane's access (or SFU instruction) under `key`.
KDA_EMU_RT inline void prof_lane(uintptr_t key, const PAcc& a) {
  Fiber* f = g_cur;
  PWarp& p = prof()->warps[f->warp];
  // grouped by calling context too: a call the host compiler left out of line (a lambda at -Og) groups
  // its lanes per call site, as the copies ptxas inlines at each site issue apart
  const int d = f->depth < KDA_EMU_CALLERS ? f->depth : KDA_EMU_CALLERS;
  const uintptr_t site = f->ctx[d] ? (uintptr_t)mix64(key ^ f->ctx[d]) : key;
  PGroup& g = group_of(p, site, occurrence(p, site, f->lane), key);
  g.mask |= 1u << f->lane;
  g.acc[f->lane] = a;
}

// -- issue anchors ------------------------------------------------------------------------------
KDA_EMU_RT inline void ivl_grow(PWarp& p) {
  unsigned ncap = p.icap ? 2 * p.icap : 64;
  PIvl* nt = (PIvl*)calloc(ncap, sizeof(PIvl));
  if (!nt) fail("profile: out of memory");
  for (unsigned i = 0; i < p.icap; i++) {
    const PIvl& e = p.it[i];
    if (e.gen != p.gen || !e.key) continue;
    unsigned j = (unsigned)mix64(e.key) & (ncap - 1);
    while (nt[j].key) j = (j + 1) & (ncap - 1);
    nt[j] = e;
  }
  free(p.it);
  p.it = nt;
  p.icap = ncap;
}

// The row of (key, warp) in P->av, made on first sight with the thread's calling context.
KDA_EMU_RT inline int anchor_row(Prof* P, unsigned long long key, unsigned cls, uintptr_t pc, const Fiber* f) {
  if (2 * (P->an + 1) > P->ahcap) {
    unsigned ncap = P->ahcap ? 2 * P->ahcap : 256;
    int* nh = (int*)malloc(sizeof(int) * ncap);
    if (!nh) fail("profile: out of memory");
    for (unsigned j = 0; j < ncap; j++) nh[j] = -1;
    for (unsigned i = 0; i < P->an; i++) {
      unsigned j = (unsigned)mix64(P->av[i].key + P->av[i].warp) & (ncap - 1);
      while (nh[j] >= 0) j = (j + 1) & (ncap - 1);
      nh[j] = (int)i;
    }
    free(P->ah);
    P->ah = nh;
    P->ahcap = ncap;
  }
  unsigned j = (unsigned)mix64(key + (unsigned)f->warp) & (P->ahcap - 1);
  for (;; j = (j + 1) & (P->ahcap - 1)) {
    int i = P->ah[j];
    if (i < 0) break;
    if (P->av[i].key == key && P->av[i].warp == (unsigned)f->warp) return i;
  }
  if (P->an == P->acap) {
    P->acap = P->acap ? 2 * P->acap : 256;
    P->av = (PAnc*)realloc(P->av, sizeof(PAnc) * P->acap);
    if (!P->av) fail("profile: out of memory");
  }
  PAnc& a = P->av[P->an];
  a = PAnc{key, pc, cls, (unsigned)f->warp, 0, 0, 0, f->depth, {}};
  for (int k = 0; k < f->depth && k < KDA_EMU_CALLERS; k++) a.callers[k] = f->callers[k];
  P->ah[j] = (int)P->an;
  return (int)P->an++;
}

// One lane executes an anchor of class `cls` at code address `pc` (a return address: the
// instruction before it), accessing `bytes` (loads, stores, atomics; their widest lane counts).
KDA_EMU_RT inline void prof_anchor(unsigned cls, uintptr_t pc, unsigned bytes = 0) {
  Worker* w = g_worker;
  Fiber* f = g_cur;
  if (!w || !w->pf || !f) return;
  Prof* P = w->pf;
  const int d = f->depth < KDA_EMU_CALLERS ? f->depth : KDA_EMU_CALLERS;
  unsigned long long key = mix64(((unsigned long long)pc << 6 | cls) ^ f->ctx[d]);
  key += !key;  // 0 marks a free slot
  PWarp& p = P->warps[f->warp];
  if (2 * (p.ilive + 1) > p.icap) ivl_grow(p);
  unsigned j = (unsigned)mix64(key) & (p.icap - 1);
  for (;; j = (j + 1) & (p.icap - 1)) {
    PIvl& e = p.it[j];
    if (e.gen != p.gen || !e.key) {  // first sight in this interval
      e.key = key, e.gen = p.gen, e.anc = anchor_row(P, key, cls, pc, f), e.most = 0;
      memset(e.lanes, 0, sizeof e.lanes);
      p.ilive++;
    }
    if (e.key != key) continue;
    PAnc& a = P->av[e.anc];
    a.lexec++;
    if (bytes > a.bytes) a.bytes = bytes;
    if (++e.lanes[f->lane] > e.most) e.most = e.lanes[f->lane], a.wexec++;
    return;
  }
}

// -- costs of one request ----------------------------------------------------------------
KDA_EMU_RT inline void sort_u64(unsigned long long* x, int n) {  // small n: insertion sort
  for (int i = 1; i < n; i++) {
    unsigned long long v = x[i];
    int j = i - 1;
    while (j >= 0 && x[j] > v) x[j + 1] = x[j], j--;
    x[j + 1] = v;
  }
}

// Wavefronts of one phase given its 4-byte word addresses (n of them, duplicates allowed).
KDA_EMU_RT inline void phase_cost(unsigned long long* words, int n, long long* wf, long long* ideal) {
  if (!n) return;
  sort_u64(words, n);
  int cnt[32] = {0}, distinct = 0, worst = 0;
  for (int i = 0; i < n; i++) {
    if (i && words[i] == words[i - 1]) continue;  // the same word: a broadcast
    distinct++;
    int b = (int)(words[i] & 31);
    if (++cnt[b] > worst) worst = cnt[b];
  }
  *wf += worst;
  *ideal += (distinct + 31) / 32;
}

constexpr int MAX_WORDS = 16;  // per lane and phase: wider accesses (memcpy-like ranges) are cut to 64 bytes

// Shared-memory wavefronts of the lanes in `mask` (their widest access sets the phases).
KDA_EMU_RT inline void smem_cost(const PGroup& g, unsigned mask, long long* wf, long long* ideal) {
  unsigned width = 0;
  for (int l = 0; l < 32; l++)
    if ((mask >> l & 1) && g.acc[l].size > width) width = g.acc[l].size;
  const int per = width <= 4 ? 32 : width <= 8 ? 16 : 8;
  unsigned long long words[32 * MAX_WORDS];
  for (int p0 = 0; p0 < 32; p0 += per) {
    int n = 0;
    for (int l = p0; l < p0 + per; l++) {
      if (!(mask >> l & 1)) continue;
      const PAcc& a = g.acc[l];
      unsigned long long w0 = a.addr >> 2, w1 = (a.addr + a.size - 1) >> 2;
      for (unsigned long long w = w0; w <= w1 && w < w0 + MAX_WORDS; w++) words[n++] = w;
    }
    phase_cost(words, n, wf, ideal);
  }
}

KDA_EMU_RT inline void mark(unsigned long long* bits, unsigned long long s) {
  __atomic_fetch_or(&bits[s >> 6], 1ull << (s & 63), __ATOMIC_RELAXED);
}
KDA_EMU_RT inline bool marked(const unsigned long long* bits, unsigned long long s) {
  return __atomic_load_n(&bits[s >> 6], __ATOMIC_RELAXED) >> (s & 63) & 1;
}

KDA_EMU_RT inline bool set_add(PSet& t, unsigned long long sector, unsigned char bits) {
  if (2 * (t.live + 1) > t.cap) {
    size_t ncap = t.cap ? 2 * t.cap : 1024;
    unsigned long long* nk = (unsigned long long*)calloc(ncap, 8);
    unsigned char* nb = (unsigned char*)calloc(ncap, 1);
    if (!nk || !nb) {
      free(nk), free(nb);
      return false;
    }
    for (size_t i = 0; i < t.cap; i++) {
      if (!t.key[i]) continue;
      size_t j = mix64(t.key[i]) & (ncap - 1);
      while (nk[j]) j = (j + 1) & (ncap - 1);
      nk[j] = t.key[i], nb[j] = t.bits[i];
    }
    free(t.key), free(t.bits);
    t.key = nk, t.bits = nb, t.cap = ncap;
  }
  unsigned long long k = sector + 1;
  size_t j = mix64(k) & (t.cap - 1);
  while (t.key[j] && t.key[j] != k) j = (j + 1) & (t.cap - 1);
  if (!t.key[j]) t.key[j] = k, t.live++;
  t.bits[j] |= bits;
  return true;
}

// Global sectors and distinct bytes of the lanes in `mask`; marks the launch's sectors.
KDA_EMU_RT inline void gmem_cost(const PGroup& g, unsigned mask, long long* sectors, long long* bytes) {
  Launch* L = g_worker->L;
  unsigned long long keys[32 * MAX_WORDS], lo[32], hi[32];
  int ns = 0, ni = 0;
  for (int l = 0; l < 32; l++) {
    if (!(mask >> l & 1)) continue;
    const PAcc& a = g.acc[l];
    unsigned long long tag = a.region < 0 ? 0 : (unsigned long long)(a.region + 1) << 48;  // addresses < 2^48
    unsigned long long s0 = a.addr >> 5, s1 = (a.addr + a.size - 1) >> 5;
    for (unsigned long long s = s0; s <= s1 && s < s0 + MAX_WORDS; s++) {
      keys[ns++] = tag | s;
      if (a.region < 0 && !set_add(prof()->loose, s, (!a.write || a.atomic ? 1 : 0) | (a.write ? 2 : 0))) {
        fail("profile: out of memory");
      }
    }
    lo[ni] = tag | a.addr;
    hi[ni++] = (tag | a.addr) + a.size;
  }
  sort_u64(keys, ns);
  long long distinct = 0;
  for (int i = 0; i < ns; i++) distinct += !i || keys[i] != keys[i - 1];
  *sectors += distinct;
  for (int i = 1; i < ni; i++) {  // intervals by start (insertion sort of pairs)
    unsigned long long a = lo[i], b = hi[i];
    int j = i - 1;
    while (j >= 0 && lo[j] > a) lo[j + 1] = lo[j], hi[j + 1] = hi[j], j--;
    lo[j + 1] = a, hi[j + 1] = b;
  }
  unsigned long long end = 0;
  for (int i = 0; i < ni; i++) {
    unsigned long long s = lo[i] > end ? lo[i] : end;
    if (hi[i] > s) *bytes += (long long)(hi[i] - s);
    if (hi[i] > end) end = hi[i];
  }
}

// Per code address totals (offset from the library base; the loader turns it into a source line).
KDA_EMU_RT inline void pc_add(uintptr_t pc, long long kind, long long req, long long a, long long b, long long write) {
  Prof* P = prof();
  if (2 * (P->plive + 1) > P->pcap) {
    unsigned ncap = P->pcap ? 2 * P->pcap : 256;
    PPc* nt = (PPc*)calloc(ncap, sizeof(PPc));
    if (!nt) fail("profile: out of memory");
    for (unsigned i = 0; i < P->pcap; i++) {
      if (!P->pcs[i].kind) continue;
      unsigned j = (unsigned)mix64(P->pcs[i].pc * 8 + P->pcs[i].kind) & (ncap - 1);
      while (nt[j].kind) j = (j + 1) & (ncap - 1);
      nt[j] = P->pcs[i];
    }
    free(P->pcs);
    P->pcs = nt;
    P->pcap = ncap;
  }
  unsigned j = (unsigned)mix64(pc * 8 + kind) & (P->pcap - 1);
  for (;; j = (j + 1) & (P->pcap - 1)) {
    PPc& e = P->pcs[j];
    if (!e.kind) {
      e = PPc{pc, kind, 0, 0, 0, write};
      P->plive++;
    }
    if (e.pc == pc && e.kind == kind) {
      e.req += req, e.a += a, e.b += b;
      return;
    }
  }
}

KDA_EMU_RT inline unsigned pc_of_key(uintptr_t key) {
  uintptr_t pc = key >> 2;
  return pc ? (unsigned)(pc - 1 - g_worker->ck->base) : 0;  // return address - 1: inside the instruction
}

// -- the dependent path ---------------------------------------------------------------------
// Rules (docs/design.md section 11.1): loads (shared, ldmatrix, global, cp.async) issue one per
// clock as early as the warp's last barrier, store to the same space or cp.async wait allows (as
// if the compiler hoisted them); what uses values (mma, SFU, shuffle, stores) issues in order, one
// per clock, after every plain load before it; an mma also waits for its A operand (a new one:
// every result so far; one seen since the last barrier: the time it was first ready), an SFU for
// the mma and shuffle results, a shuffle for the mma and SFU results (shuffles are taken as
// independent of each other: moves of data, not a reduction's steps), a store for every result,
// without holding up what follows it (as if the compiler scheduled independent work ahead of it);
// a cp.async wait for the copies it lands; a barrier for every warp's issue and stores.
KDA_EMU_RT inline void pt_max(PT& a, const PT& b) {
  if (b.cyc > a.cyc) a = b;
}
KDA_EMU_RT inline PT pt_add(PT a, int kind, long long m = 1) {
  a.n[kind] += (int)m;
  a.cyc += m * PATH_REF[kind];
  return a;
}
KDA_EMU_RT inline bool pt_longer(const PT& a, const PT& b) {  // a total order: cycles, then the steps
  if (a.cyc != b.cyc) return a.cyc > b.cyc;
  for (int k = 0; k < PK_N; k++)
    if (a.n[k] != b.n[k]) return a.n[k] > b.n[k];
  return false;
}
KDA_EMU_RT inline PPath& path_of(int warp) { return prof()->path[warp]; }

// A load's (or cp.async's) issue on the load clock, after the fences of the spaces it reads or writes.
KDA_EMU_RT inline PT load_issue(PPath& p, bool shared, bool global) {
  PT s = p.tl;
  if (shared) pt_max(s, p.fence_s);
  if (global) pt_max(s, p.fence_g);
  p.tl = pt_add(s, PK_issue);
  return s;
}
// A load of `kind` (PK_dram: global, else shared): its data `extra` cycles after the kind's latency.
// Returns its issue.
KDA_EMU_RT inline PT path_load(PPath& p, int kind, long long extra) {
  PT s = load_issue(p, kind != PK_dram, kind == PK_dram);
  pt_max(p.loads, pt_add(pt_add(s, kind), PK_issue, extra));
  return s;
}
// An instruction that uses values: issued in order when the plain loads before it and `dep` are
// done; returns its issue.
KDA_EMU_RT inline PT use_issue(PPath& p, const PT& dep) {
  PT s = p.t;
  pt_max(s, p.loads);
  pt_max(s, dep);
  p.t = pt_add(s, PK_issue);
  return s;
}
// ... and when its own result is ready (kind's latency, `extra` cycles more).
KDA_EMU_RT inline PT path_use(PPath& p, int kind, const PT& dep, long long extra = 0) {
  return pt_add(pt_add(use_issue(p, dep), kind), PK_issue, extra);
}
// A store (kind PK_smem: shared, else global) once its data is there; it takes an issue slot but
// holds up nothing after it; the loads of its space after it issue after it.
KDA_EMU_RT inline PT path_store(PPath& p, int kind, long long extra) {
  PT s = p.t;
  pt_max(s, p.loads);
  pt_max(s, p.results);
  p.t = pt_add(p.t, PK_issue);
  PT issued = pt_add(s, PK_issue);
  pt_max(p.sunk, issued);
  pt_max(kind == PK_smem ? p.fence_s : p.fence_g, issued);
  return pt_add(pt_add(s, kind), PK_issue, extra);
}
KDA_EMU_RT inline void path_in_flight(const PT& issue, long long bytes) {
  Prof* P = prof();
  if (P->niv == P->civ) {
    size_t n = P->civ ? 2 * P->civ : 1024;
    PIv* nv = (PIv*)realloc(P->iv, n * sizeof(PIv));
    if (!nv) fail("profile: out of memory");
    P->iv = nv, P->civ = n;
  }
  P->iv[P->niv++] = PIv{issue.cyc, issue.cyc + PATH_REF[PK_dram], bytes};
}
// A cp.async destination's slot in Prof::land (>= nland: outside the dynamic shared memory).
KDA_EMU_RT inline size_t land_index(uintptr_t a) { return (a - (uintptr_t)g_worker->smem) / 16; }

// An mma of `warp` whose A fragments hash to h (A is known by its values); its result `extra`
// cycles after the mma latency.
KDA_EMU_RT inline void path_mma_of(int warp, unsigned long long h, long long extra) {
  PPath& p = path_of(warp);
  PT dep = p.results;
  int i = 0;
  while (i < p.na && p.a[i].h != h) i++;
  if (i < p.na) {
    dep = p.a[i].ready;
  } else {  // a new operand: made from the results so far
    int j = p.na < PATH_A ? p.na++ : (p.anext++ % PATH_A);
    p.a[j] = PASlot{h, p.results};
  }
  PT done = path_use(p, PK_mma, dep, extra);
  pt_max(p.results, done);
  pt_max(p.nosfu, done);
  pt_max(p.noshfl, done);
}
KDA_EMU_RT inline unsigned long long path_a_hash(const void* lanes /* 32 x 16 bytes */) {
  unsigned long long h = 0x9E3779B97F4A7C15ull;
  for (int l = 0; l < 32; l++) {
    unsigned long long w[2];
    memcpy(w, (const unsigned char*)lanes + 16 * l, 16);
    h = mix64(h ^ w[0]) + w[1];
  }
  return h;
}
// mma (by the last lane, its warp's A fragments in the exchange slots).
KDA_EMU_RT inline void path_mma() {
  Fiber* f = g_cur;
  Warp& wp = g_worker->warps[f->warp];
  unsigned char lanes[32][16];
  for (int l = 0; l < 32; l++) memcpy(lanes[l], wp.slot[wp.buf][l], 16);
  path_mma_of(f->warp, path_a_hash(lanes), 0);
}
// wgmma m64nNk16 (by the warpgroup's last thread, its requests flushed), on each of its 4 warps'
// paths: it issues in order once its A is ready (A known by the warp's fragments; a new one is
// made of the results as of the last wgmma.fence, not of the wgmma in flight since); the tensor
// cores stream the warpgroup's wgmma one after another, N / 2 cycles each (the SM's 2048 dense
// bf16 FMA a clock over 64 x N x 16), and a result is ready an mma latency after its streaming
// ends. An estimate: docs/design.md section 11.1.
KDA_EMU_RT inline void path_wgmma(int warp0, const u32 (*a)[4], int n) {
  Worker* w = g_worker;
  if (!w->pf) return;
  for (int k = 0; k < 4; k++) {
    PPath& p = path_of(warp0 + k);
    const unsigned long long h = path_a_hash(a + 32 * k);
    PT dep = p.wgres;
    int i = 0;
    while (i < p.na && p.a[i].h != h) i++;
    if (i < p.na) {
      dep = p.a[i].ready;
    } else {
      int j = p.na < PATH_A ? p.na++ : (p.anext++ % PATH_A);
      p.a[j] = PASlot{h, p.wgres};
    }
    PT s = use_issue(p, dep);
    pt_max(s, p.wgfree);
    p.wgfree = pt_add(s, PK_issue, n / 2);
    PT done = pt_add(p.wgfree, PK_mma);
    pt_max(p.results, done);
    pt_max(p.nosfu, done);
    pt_max(p.noshfl, done);
  }
}
// wgmma.fence (by the warpgroup's last thread): the A operands made from here on may read every
// result so far.
KDA_EMU_RT inline void path_wgmma_fence(int warp0) {
  if (!g_worker->pf) return;
  for (int k = 0; k < 4; k++) path_of(warp0 + k).wgres = path_of(warp0 + k).results;
}
// cp.async.bulk issued by the current thread: its source's sectors are DRAM reads of the launch
// where the launch did not write them first (no warp request: the async proxy reads them); it takes a load issue slot of its warp, its bytes
// are in flight a DRAM latency, and its mbarrier's 16-byte slot of Prof::land lands then, so a
// wait on it (prof_cp_land) waits for the latest copy it completes.
KDA_EMU_RT inline int region_of(uintptr_t a);
KDA_EMU_RT inline void path_bulk(const u64* bar, const void* src, long long bytes) {
  Worker* w = g_worker;
  if (!w->pf) return;
  Prof* P = prof();
  const uintptr_t a = (uintptr_t)src;
  const int r = region_of(a);
  const uintptr_t rel = r < 0 ? a : a - w->L->prof_regions[r].lo;
  for (unsigned long long sec = rel >> 5; sec <= (rel + bytes - 1) >> 5; sec++) {
    if (r >= 0) {
      if (!marked(w->L->prof_regions[r].wr, sec)) mark(w->L->prof_regions[r].rd, sec);
    } else if (!set_add(P->loose, sec, 1)) {
      fail("profile: out of memory");
    }
  }
  PT s = load_issue(path_of(g_cur->warp), true, true);
  path_in_flight(s, bytes);
  size_t i = land_index((uintptr_t)bar);
  if (i >= P->nland) return;
  P->land[i] = pt_add(s, PK_dram);  // a phase's copies issue in order: the last lands last
  P->pending[i] = 0;
}
// tcgen05.mma (M x N x 16, by the current thread): it issues in order after its warp's loads before it (its
// operands were written before the barrier or mbarrier wait that let it issue); the tensor cores
// stream the thread's tcgen05.mma one after another at the datasheet's dense rate, B200's 4096 bf16
// FMA a clock an SM (M N / 256 cycles), and each is complete an mma latency after its streaming ends,
// as wgmma's (assumed: no tcgen05 latency read; docs/design.md section 11.1).
KDA_EMU_RT inline void prof_flush_warp(Worker* w, int warp);
KDA_EMU_RT inline void path_tcgen05_mma(int m, int n) {
  if (!g_worker->pf) return;
  prof_flush_warp(g_worker, g_cur->warp);  // a synchronising point of its warp: the loads it follows are costed
  PPath& p = path_of(g_cur->warp);
  PT s = use_issue(p, PT{});
  pt_max(s, p.tcfree);
  p.tcfree = pt_add(s, PK_issue, m * n / 256);
  p.tcdone = pt_add(p.tcfree, PK_mma);
}
// tcgen05.commit to bar (by the thread that issued the MMAs): the barrier's arrival lands when they are
// complete, so a wait on it (prof_cp_land) waits for them.
KDA_EMU_RT inline void path_tcgen05_commit(const u64* bar) {
  if (!g_worker->pf) return;
  Prof* P = prof();
  PPath& p = path_of(g_cur->warp);
  p.t = pt_add(p.t, PK_issue);
  size_t i = land_index((uintptr_t)bar);
  if (i >= P->nland) return;
  pt_max(P->land[i], p.tcdone);
  P->pending[i] = 0;
}
// tcgen05.ld / st (by the warp, counted at its lane 0): a shared load's latency and a shared store
// (assumed: no tensor-memory latency read); what uses the registers waits for the load.
KDA_EMU_RT inline void path_tmem(bool store) {
  if (!g_worker->pf || g_cur->lane != 0) return;
  PPath& p = path_of(g_cur->warp);
  if (store) path_store(p, PK_smem, 0);
  else path_load(p, PK_smem, 0);
}
KDA_EMU_RT inline void path_shuffle() {
  PPath& p = path_of(g_cur->warp);
  PT done = path_use(p, PK_shuffle, p.noshfl);
  pt_max(p.results, done);
  pt_max(p.nosfu, done);
}

// One request of a warp, at its synchronising point, in the order its lanes ran.
KDA_EMU_RT inline void path_request(PPath& p, const PGroup& g, unsigned sm, unsigned gm, unsigned sfu, bool write,
                                    long long wf, long long sectors) {
  const unsigned sub = (unsigned)(g.key & 3);
  if (sub == SUB_CP_DST) {  // each lane's 16 bytes land a DRAM latency after the issue (zfill: a shared one)
    PT s = load_issue(p, true, true);
    p.cp = s;
    Prof* P = prof();
    for (int l = 0; l < 32; l++) {
      size_t i = land_index(g.acc[l].addr);
      if (!(sm >> l & 1) || i >= P->nland) continue;
      P->land[i] = pt_add(s, g.acc[l].region ? PK_dram : PK_smem);
      P->pending[i] = 0;
    }
    return;
  }
  if (sub == SUB_CP_SRC) {
    path_in_flight(p.cp, 32 * sectors);
    return;
  }
  if (sfu) {
    PT done = path_use(p, PK_sfu, p.nosfu);
    pt_max(p.results, done);
    pt_max(p.noshfl, done);
  } else if (sm && write) {
    pt_max(p.stores, path_store(p, PK_smem, wf - 1));
  } else if (sm) {
    path_load(p, PK_smem, wf - 1);
  } else if (gm && write) {
    path_store(p, PK_issue, 0);  // a global store: nothing waits for its completion
  } else if (gm) {
    path_in_flight(path_load(p, PK_dram, 0), 32 * sectors);
  }
}

// A cp.async wait landing a lane's copy (checks.h's cp_land): that lane's warp waits for it.
KDA_EMU_RT inline void prof_cp_land(const void* dst, uintptr_t pc) {
  PAcc x{};
  x.space = SP_CPLAND;
  x.addr = (uintptr_t)dst;
  prof_lane(pc * 4 + SUB_SFU, x);
}

// __syncthreads (its warps' requests done): every warp goes on from the last arrival.
KDA_EMU_RT inline void path_barrier(Worker* w) {
  PT T{};
  for (int i = 0; i < w->nwarps; i++) {
    pt_max(T, path_of(i).t);
    pt_max(T, path_of(i).tl);
    pt_max(T, path_of(i).stores);
    pt_max(T, path_of(i).sunk);
  }
  T = pt_add(T, PK_barrier);
  for (int i = 0; i < w->nwarps; i++) {
    PPath& p = path_of(i);
    p.t = p.tl = p.fence_s = p.fence_g = T;
    p.na = 0;
  }
}

KDA_EMU_RT inline int iv_order(const void* a, const void* b) {  // (time, +1 start / -1 end): ends first
  const long long* x = (const long long*)a;
  const long long* y = (const long long*)b;
  if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
  return (x[1] > 0) - (y[1] > 0);
}

// The block's path: its last warp's issue, results or shared stores; the most bytes in flight.
KDA_EMU_RT inline void path_block_end(Worker* w) {
  Prof* P = w->pf;
  PT cta{};
  for (int i = 0; i < w->nwarps; i++) {
    pt_max(cta, P->path[i].t);
    pt_max(cta, P->path[i].tl);
    pt_max(cta, P->path[i].results);
    pt_max(cta, P->path[i].stores);
    pt_max(cta, P->path[i].sunk);
  }
  for (int k = 0; k < PK_N; k++) P->c[PR_path_sum_issue + k] += cta.n[k];
  if (pt_longer(cta, P->worst)) P->worst = cta;
  if (P->niv) {
    long long* ev = (long long*)malloc(P->niv * 4 * sizeof(long long));
    if (!ev) fail("profile: out of memory");
    for (size_t i = 0; i < P->niv; i++) {
      ev[4 * i] = P->iv[i].from, ev[4 * i + 1] = P->iv[i].bytes;
      ev[4 * i + 2] = P->iv[i].to, ev[4 * i + 3] = -P->iv[i].bytes;
    }
    qsort(ev, 2 * P->niv, 2 * sizeof(long long), iv_order);
    long long cur = 0;
    for (size_t i = 0; i < 2 * P->niv; i++) {
      cur += ev[2 * i + 1];
      if (cur > P->peak) P->peak = cur;
    }
    free(ev);
    P->niv = 0;
  }
  memset(P->path, 0, sizeof(PPath) * w->nwarps);
  // the next block this worker runs starts its clocks at zero: a landing time left here would be a later
  // block's wait (a tcgen05.commit takes the latest of it and its own), and which block follows which on a
  // worker is the OS threads' race
  memset(P->land, 0, sizeof(PT) * P->nland);
  memset(P->pending, 0, P->nland);
}

KDA_EMU_RT inline void smem_request(long long* c, bool write, long long wf, long long ideal) {
  c[PR_smem_requests]++, c[PR_smem_wavefronts] += wf, c[PR_smem_wavefronts_ideal] += ideal;
  if (write) c[PR_smem_store_requests]++, c[PR_smem_store_wavefronts] += wf, c[PR_smem_store_wavefronts_ideal] += ideal;
  else c[PR_smem_load_requests]++, c[PR_smem_load_wavefronts] += wf, c[PR_smem_load_wavefronts_ideal] += ideal;
}

KDA_EMU_RT inline void request_cost(PWarp& w, unsigned gi, PPath& path);
// A wait lands lane l's copy into `a` whose cp.async is still pending: a lane that ran first met
// the wait before the instruction (divergent code); that request comes later in the list: cost it now.
KDA_EMU_RT inline void cost_pending_copy(PWarp& w, unsigned gi, int l, uintptr_t a, PPath& path) {
  for (unsigned j = gi + 1; j < w.ng; j++) {
    PGroup& h = w.g[j];
    if ((h.key & 3) == SUB_CP_DST && (h.mask >> l & 1) && h.acc[l].addr == a) {
      request_cost(w, j, path);
      h.mask = 0;  // done
      return;
    }
  }
}

KDA_EMU_RT inline void request_cost(PWarp& w, unsigned gi, PPath& path) {
  const PGroup& g = w.g[gi];
  long long* c = prof()->c;
  unsigned sm = 0, gm = 0, sfu = 0;
  bool write = false;
  for (int l = 0; l < 32; l++) {
    if (!(g.mask >> l & 1)) continue;
    const PAcc& a = g.acc[l];
    if (a.space == SP_CPLAND) {  // not an instruction of its own: the lane's wait for this copy
      size_t i = land_index(a.addr);
      if (i >= prof()->nland) continue;
      if (prof()->pending[i]) cost_pending_copy(w, gi, l, a.addr, path);
      pt_max(path.t, prof()->land[i]);
      pt_max(path.fence_s, prof()->land[i]);
      continue;
    }
    if (a.space == SP_SMEM) sm |= 1u << l;
    else if (a.space == SP_GMEM) gm |= 1u << l;
    else sfu |= 1u << l;
    write |= a.write;
  }
  if (!(sm | gm | sfu)) return;
  unsigned pco = pc_of_key(g.key);
  if ((g.key & 3) == SUB_CP_DST) c[PR_cp_async_requests]++;
  if (sfu) c[PR_sfu]++, c[PR_sfu_lanes] += __builtin_popcount(sfu);
  long long wf = 0, sectors = 0;
  if (sm) {
    long long ideal = 0;
    smem_cost(g, sm, &wf, &ideal);
    smem_request(c, write, wf, ideal);
    pc_add(pco, SP_SMEM, 1, wf, ideal, write);
  }
  if (gm) {
    long long bytes = 0;
    gmem_cost(g, gm, &sectors, &bytes);
    c[PR_gmem_requests]++, c[PR_gmem_sectors] += sectors, c[PR_gmem_bytes] += bytes;
    if (write) c[PR_gmem_store_requests]++, c[PR_gmem_store_sectors] += sectors, c[PR_gmem_store_bytes] += bytes;
    else c[PR_gmem_load_requests]++, c[PR_gmem_load_sectors] += sectors, c[PR_gmem_load_bytes] += bytes;
    pc_add(pco, SP_GMEM, 1, sectors, bytes, write);
  }
  path_request(path, g, sm, gm, sfu, write, wf, sectors);
}

// -- synchronising points: the warp's pending requests are complete ----------------------
KDA_EMU_RT inline void prof_flush_warp(Worker* w, int warp) {
  if (!w->pf) return;
  PWarp& p = w->pf->warps[warp];
  for (unsigned i = 0; i < p.ng; i++) request_cost(p, i, w->pf->path[warp]);
  p.ng = 0;
  p.llive = 0;
  p.ilive = 0;
  p.gen++;  // every table entry is now free
}

KDA_EMU_RT inline void prof_barrier(Worker* w) {
  if (!w->pf) return;
  w->pf->c[PR_barriers]++;
  for (int i = 0; i < w->nwarps; i++) prof_flush_warp(w, i);
  path_barrier(w);
}

KDA_EMU_RT inline void prof_block_end(Worker* w) {
  if (!w->pf) return;
  for (int i = 0; i < w->nwarps; i++) prof_flush_warp(w, i);
  w->pf->c[PR_ctas]++;
  w->pf->c[PR_warps] += w->nwarps;
  path_block_end(w);
}

// -- what the kernel does ----------------------------------------------------------------
KDA_EMU_RT inline int region_of_launch(const Launch* L, uintptr_t a) {
  int lo = 0, hi = L->prof_nregions - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    const PRegion& r = L->prof_regions[mid];
    if (a < r.lo) hi = mid - 1;
    else if (a >= r.hi) lo = mid + 1;
    else return mid;
  }
  return -1;
}
KDA_EMU_RT inline int region_of(uintptr_t a) { return region_of_launch(g_worker->L, a); }

// A hooked load or store (or atomic) outside the thread's stack; `shared`: in shared memory.
KDA_EMU_RT inline void prof_access(uintptr_t a, unsigned n, unsigned fl, uintptr_t pc, bool shared,
                                   unsigned sub = SUB_PLAIN) {
  PAcc x{};
  x.size = n;
  x.write = (fl & AC_WRITE) != 0;
  x.atomic = (fl & AC_ATOMIC) != 0;
  if (shared) {
    x.space = SP_SMEM;
    x.addr = a;
  } else {
    int r = region_of(a);
    x.space = SP_GMEM;
    x.region = r;
    x.addr = r < 0 ? a : a - g_worker->L->prof_regions[r].lo;
    if (r >= 0) {  // a region's sectors marked as the access happens (a request is costed later)
      const PRegion& reg = g_worker->L->prof_regions[r];
      const unsigned long long s0 = x.addr >> 5, s1 = (x.addr + (n ? n : 1) - 1) >> 5;
      for (unsigned long long sec = s0; sec <= s1 && sec < s0 + MAX_WORDS; sec++) {  // (gmem_cost's sectors)
        // read from DRAM unless the launch wrote the sector first: an ideal L2 holds what was written
        if ((!x.write || x.atomic) && !marked(reg.wr, sec)) mark(reg.rd, sec);
        if (x.write) mark(reg.wr, sec);
      }
    }
  }
  prof_lane(pc * 4 + sub, x);
  if (sub == SUB_PLAIN) prof_anchor(x.atomic ? AN_atomic : x.write ? AN_store : AN_load, pc, n);
}

[[gnu::noinline]] KDA_EMU_RT inline void prof_sfu(unsigned cls) {
  if (!g_worker->pf) return;
  PAcc x{};
  x.space = SP_SFU;
  const uintptr_t pc = (uintptr_t)__builtin_return_address(0);
  prof_lane(pc * 4 + SUB_SFU, x);
  prof_anchor(cls, pc);
}

KDA_EMU_RT inline void prof_cp_async(void* dst, const void* src, unsigned bytes, uintptr_t pc) {
  if (!g_worker->pf) return;
  prof()->c[PR_cp_async_bytes] += bytes;
  PAcc x{};  // the 16-byte shared write; region: whether it reads global memory (else zfill)
  x.space = SP_SMEM, x.write = 1, x.size = 16, x.addr = (uintptr_t)dst, x.region = bytes != 0;
  prof_lane(pc * 4 + SUB_CP_DST, x);
  prof_anchor(AN_cp_async, pc);
  size_t i = land_index(x.addr);
  if (i < prof()->nland) prof()->pending[i] = 1;
  if (bytes) prof_access((uintptr_t)src, bytes, 0, pc, false, SUB_CP_SRC);
}

// ldmatrix (by the last lane to arrive): matrix m's 8 rows are one phase.
KDA_EMU_RT inline void prof_ldmatrix(const void* const* rows, int nm, uintptr_t pc) {
  if (!g_worker->pf) return;
  long long wf = 0, ideal = 0;
  for (int m = 0; m < nm; m++) {
    unsigned long long words[32];
    int n = 0;
    for (int i = 8 * m; i < 8 * m + 8; i++)
      for (int k = 0; k < 4; k++) words[n++] = ((uintptr_t)rows[i] >> 2) + k;
    phase_cost(words, n, &wf, &ideal);
  }
  long long* c = prof()->c;
  c[PR_ldmatrix]++;
  smem_request(c, false, wf, ideal);
  path_load(path_of(g_cur->warp), PK_ldmatrix, wf - 1);
  pc_add(pc ? (unsigned)(pc - 1 - g_worker->ck->base) : 0, SP_SMEM, 1, wf, ideal, 0);
}

// mma and shuffles (by the last lane of the warp collective)
KDA_EMU_RT inline void prof_count(int which) {
  if (!g_worker->pf) return;
  g_worker->pf->c[which]++;
  if (which == PR_mma) path_mma();
  if (which == PR_shuffles) path_shuffle();
}

// -- a worker (OS thread) and a launch --------------------------------------------------------
KDA_EMU_RT inline bool prof_begin(Worker* w) {
  Prof* P = (Prof*)calloc(1, sizeof(Prof));
  if (!P) return false;
  P->nwarps = w->nwarps;
  P->warps = (PWarp*)calloc(w->nwarps, sizeof(PWarp));
  P->path = (PPath*)calloc(w->nwarps, sizeof(PPath));
  P->nland = w->smem_size / 16 + 1;
  P->land = (PT*)calloc(P->nland, sizeof(PT));
  P->pending = (unsigned char*)calloc(P->nland, 1);
  w->pf = P;
  if (!P->warps || !P->path || !P->land || !P->pending) return false;
  for (int i = 0; i < w->nwarps; i++) P->warps[i].gen = 1;  // calloc'ed table entries (gen 0) are free
  return true;
}

KDA_EMU_RT inline void prof_end(Worker* w) {
  Prof* P = w->pf;
  if (!P) return;
  Launch* L = w->L;
  pthread_mutex_lock(&L->mu);
  for (int i = 0; i < PR_N; i++) L->prof_out[i] += P->c[i];
  PT launch{};  // the longest CTA path so far, from the launch's counters
  for (int k = 0; k < PK_N; k++) launch = pt_add(launch, k, L->prof_out[PR_path_max_issue + k]);
  if (pt_longer(P->worst, launch))
    for (int k = 0; k < PK_N; k++) L->prof_out[PR_path_max_issue + k] = P->worst.n[k];
  if (P->peak > L->prof_out[PR_inflight_peak_bytes]) L->prof_out[PR_inflight_peak_bytes] = P->peak;
  long long& npc = L->prof_out[PR_OUT - 1];
  for (unsigned i = 0; i < P->pcap; i++) {  // merge into the loader's per-pc array
    const PPc& e = P->pcs[i];
    if (!e.kind) continue;
    long long* row = nullptr;
    for (long long k = 0; k < npc && !row; k++)
      if (L->prof_pcs[k * PC_FIELDS] == (long long)e.pc && L->prof_pcs[k * PC_FIELDS + 1] == e.kind)
        row = &L->prof_pcs[k * PC_FIELDS];
    if (!row && npc < L->prof_pc_cap) {
      row = &L->prof_pcs[npc++ * PC_FIELDS];
      row[0] = (long long)e.pc, row[1] = e.kind, row[2] = row[3] = row[4] = 0, row[5] = e.write;
    }
    if (row) row[2] += e.req, row[3] += e.a, row[4] += e.b;
  }
  if (L->prof_anchors) {  // this worker's anchors, appended (the loader adds up equal rows)
    long long& nrow = L->prof_out[PR_OUT - 2];
    const uintptr_t base = w->ck->base;
    auto off = [base](uintptr_t pc) { return pc ? (long long)(pc - 1 - base) : -1LL; };  // inside the instruction
    for (unsigned i = 0; i < P->an; i++) {
      const PAnc& a = P->av[i];
      if (nrow >= L->prof_anchor_cap) {
        L->prof_out[PR_OUT - 3]++;
        continue;
      }
      long long* row = &L->prof_anchors[nrow++ * ANC_FIELDS];
      const int d = a.depth < KDA_EMU_CALLERS ? a.depth : KDA_EMU_CALLERS;
      row[0] = off(a.pc), row[1] = a.cls, row[2] = a.warp, row[3] = a.wexec, row[4] = a.lexec, row[5] = a.bytes;
      row[6] = d;
      for (int k = 0; k < KDA_EMU_CALLERS; k++) row[7 + k] = k < d ? off(a.callers[k]) : -1;
    }
  }
  bool ok = true;
  for (size_t i = 0; i < P->loose.cap && ok; i++)  // this worker's loose sectors into the launch's
    if (P->loose.key[i]) ok = set_add(*L->prof_loose, P->loose.key[i] - 1, P->loose.bits[i]);
  pthread_mutex_unlock(&L->mu);
  if (!ok) record_error(L, "emulator: out of memory for the profile's sector set");
  free(P->loose.key);
  free(P->loose.bits);
  free(P->av);
  free(P->ah);
  for (int i = 0; i < P->nwarps; i++) {
    free(P->warps[i].it);
    free(P->warps[i].lt);
    free(P->warps[i].gt);
    free(P->warps[i].g);
  }
  free(P->warps);
  free(P->pcs);
  free(P->path);
  free(P->land);
  free(P->pending);
  free(P->iv);
  free(P);
  w->pf = nullptr;
}

// The launch arrays' allocations as sorted, merged regions with sector bitmaps; false: out of memory.
KDA_EMU_RT inline bool prof_launch_begin(Launch* L) {
  int n = L->n_ext;
  PRegion* r = (PRegion*)calloc(n > 0 ? n : 1, sizeof(PRegion));
  if (!r) return false;
  const long long* a = L->prof_allocs;
  for (int i = 0; i < n; i++)
    r[i].lo = (uintptr_t)(a ? a[2 * i] : L->ext[3 * i]), r[i].hi = (uintptr_t)(a ? a[2 * i + 1] : L->ext[3 * i + 1]);
  for (int i = 1; i < n; i++) {  // by start
    PRegion v = r[i];
    int j = i - 1;
    while (j >= 0 && r[j].lo > v.lo) r[j + 1] = r[j], j--;
    r[j + 1] = v;
  }
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].hi <= r[i].lo) continue;  // empty arrays
    if (m && r[i].lo < r[m - 1].hi) {
      if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
    } else {
      r[m++] = r[i];
    }
  }
  L->prof_regions = r;
  L->prof_nregions = m;
  L->prof_loose = (PSet*)calloc(1, sizeof(PSet));
  if (!L->prof_loose) return false;
  for (int i = 0; i < m; i++) {
    size_t words = ((r[i].hi - r[i].lo + 31) / 32 + 63) / 64 + 1;
    r[i].rd = (unsigned long long*)calloc(words, 8);
    r[i].wr = (unsigned long long*)calloc(words, 8);
    if (!r[i].rd || !r[i].wr) return false;
  }
  return true;
}

KDA_EMU_RT inline void prof_launch_end(Launch* L) {
  long long rd = 0, wr = 0, any = 0;
  for (int i = 0; i < L->prof_nregions; i++) {
    PRegion& r = L->prof_regions[i];
    size_t words = ((r.hi - r.lo + 31) / 32 + 63) / 64 + 1;
    for (size_t k = 0; r.rd && r.wr && k < words; k++) {
      r.nrd += __builtin_popcountll(r.rd[k]);
      r.nwr += __builtin_popcountll(r.wr[k]);
      any += __builtin_popcountll(r.rd[k] | r.wr[k]);
    }
    rd += r.nrd, wr += r.nwr;
    free(r.rd);
    free(r.wr);
  }
  if (L->prof_args)  // per launch array: its region (the first array of a region carries the bytes)
    for (int i = 0; i < L->n_ext; i++) {
      const long long* a = L->prof_allocs;
      int k = region_of_launch(L, (uintptr_t)(a ? a[2 * i] : L->ext[3 * i]));
      bool first = k >= 0;
      for (int j = 0; j < i && first; j++)
        first = region_of_launch(L, (uintptr_t)(a ? a[2 * j] : L->ext[3 * j])) != k;
      L->prof_args[3 * i] = k;
      L->prof_args[3 * i + 1] = first ? 32 * L->prof_regions[k].nrd : 0;
      L->prof_args[3 * i + 2] = first ? 32 * L->prof_regions[k].nwr : 0;
    }
  free(L->prof_regions);
  L->prof_regions = nullptr;
  L->prof_nregions = 0;
  PSet* t = L->prof_loose;
  for (size_t i = 0; t && i < t->cap; i++) {
    if (!t->key[i]) continue;
    rd += (t->bits[i] & 1) != 0;
    wr += (t->bits[i] & 2) != 0;
    any++;
  }
  if (t) free(t->key), free(t->bits), free(t);
  L->prof_loose = nullptr;
  L->prof_out[PR_dram_bytes] = 32 * any;
  L->prof_out[PR_dram_read_bytes] = 32 * rd;
  L->prof_out[PR_dram_write_bytes] = 32 * wr;
}
}  // namespace kda_emu

#define KDA_EMU_PROFILE_NAME(n) #n ","
extern "C" __attribute__((visibility("default"))) KDA_EMU_RT const char* kda_emu_profile_names() {
  return KDA_EMU_PROFILE_COUNTERS(KDA_EMU_PROFILE_NAME);
}
extern "C" __attribute__((visibility("default"))) KDA_EMU_RT const char* kda_emu_anchor_classes() {
  return KDA_EMU_ANCHOR_CLASSES(KDA_EMU_PROFILE_NAME);
}
#undef KDA_EMU_PROFILE_NAME

// -fsanitize=thread's function entry / exit hooks (tsan_hooks.cpp): the kernel's calls the host
// compiler did not inline, as the calling context of the issue anchors; only while a profiled
// launch runs (kda_emu_prof_live: the checks' launches pay a load and a branch per call).
extern "C" __attribute__((visibility("hidden"))) int kda_emu_prof_live = 0;
extern "C" __attribute__((visibility("hidden"))) KDA_EMU_RT void kda_emu_func_entry(void* caller) {
  kda_emu::Fiber* f = kda_emu::g_cur;
  if (!f || !kda_emu::g_worker->pf) return;
  if (f->depth < KDA_EMU_CALLERS) {
    f->callers[f->depth] = (uintptr_t)caller;
    f->ctx[f->depth + 1] = kda_emu::mix64(f->ctx[f->depth] ^ (uintptr_t)caller);
  }
  f->depth++;
}
extern "C" __attribute__((visibility("hidden"))) KDA_EMU_RT void kda_emu_func_exit() {
  kda_emu::Fiber* f = kda_emu::g_cur;
  if (f && kda_emu::g_worker->pf && f->depth > 0) f->depth--;
}

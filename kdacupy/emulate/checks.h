// The checks of a checked build (KDACUPY_EMULATE_CHECK): a CPU compute-sanitizer.
// Included by cuda_emu.h when KDA_EMU_CHECK is defined. The kernel is compiled
// with -fsanitize=thread, whose hooks (__tsan_read4, ...) tsan_hooks.cpp
// forwards to kda_emu_access() before the access happens, so a bad write is
// reported instead of done. The emulator's own code is not instrumented
// (KDA_EMU_RT): every hooked access is the kernel's. Its twins (cp.async,
// ldmatrix, atomics) call the same checks explicitly.
//  - memcheck: a global access must lie inside one array of the launch (the
//    loader passes their byte extents), a shared one inside the dynamic shared
//    memory or the static __shared__ variables; locals and this library's own
//    constants are fine.
//  - racecheck: per byte of shared memory, the last writer and the readers of
//    the current barrier interval (epoch). Another thread's access in the same
//    interval conflicts unless both are lanes of one warp with a __syncwarp
//    between. A cp.async is a write that may land any time from its issue to
//    the cp_async_wait covering it: conflicting accesses at issue or meanwhile
//    are hazards; at the wait it becomes the issuer's write.
//    The asynchronous proxy (docs/design.md section 4): a cp.async.bulk destination is
//    in flight from the issue until a wait finds its mbarrier phase complete (any
//    access meanwhile is a hazard); the B operand of an issued wgmma is read until
//    the wgmma.wait_group covering it (a generic write meanwhile is a hazard), and a
//    generic write the wgmma reads needs the writer's fence.proxy.async in between, as does
//    an mbarrier.init (a generic write) before a bulk copy completes on that mbarrier (the
//    async proxy): the initialising thread's fence after the init.
//    memcheck checks a bulk copy's source and destination extents.
//  - aligncheck: an access of a naturally aligned type (what the hardware
//    requires: 8-byte and 16-byte vectors included) must be aligned; ldmatrix
//    rows and cp.async addresses are always checked (16 bytes).
// Messages carry {pc:OFFSET} tokens (a code offset in this library) that the
// loader turns into a source location with addr2line.
// The same hooks feed the counters of KDACUPY_EMULATE_PROFILE (profile.h).
#pragma once

namespace kda_emu {
enum : unsigned { CK_MEM = 1, CK_RACE = 2, CK_ALIGN = 4 };
enum : unsigned { AC_WRITE = 1, AC_NATURAL = 2, AC_ATOMIC = 4 };
constexpr u16 NOBODY = 0xFFFF;

struct Shadow {            // one byte of shared memory
  unsigned we, ws, wpc;    // last write: epoch, the writer warp's __syncwarp count, code offset
  unsigned re, rs, rpc;    // reads of epoch re (by lanes of one warp: its __syncwarp count), latest code offset
  unsigned fe, fpc;        // in-flight cp.async: epoch of issue (0 or < epoch0: none), code offset
  u16 wt, r1, r2, ft;      // writer, first reader, another reader (NOBODY), cp.async issuer
  unsigned char rcross;    // the readers are in more than one warp
  unsigned wpf;            // the writer's fence.proxy.async count at the write
  unsigned be, bpc;        // in-flight cp.async.bulk: epoch of issue (0 or < epoch0: none), code offset
  unsigned ge, gpc;        // wgmma reading it as B: epoch of the latest issue, its code offset
  u16 bt, gn;              // the bulk copy's issuer; wgmma reading it, issued and not yet waited for
};

struct BulkMark {          // a bulk copy's destination, in flight until its mbarrier phase completes
  uintptr_t dst;
  unsigned bytes, phase;
  const u64* bar;
};

struct MbInit {            // an mbarrier.init: by which thread, in which epoch, after how many of its proxy fences
  uintptr_t bar;
  unsigned epoch, fences;
  u16 thread;
  unsigned pc;
};

struct Checks {
  uintptr_t base;          // load address of this library
  uintptr_t seg[8][2];     // its loaded segments: constants and globals of the kernel source
  int nseg;
  uintptr_t tls_lo;        // this OS thread's TLS block of this library: the static
  size_t tls_size;         // __shared__ variables (and g_cur/g_worker, never hooked)
  Shadow* dyn;             // racecheck shadow of the dynamic shared memory
  Shadow* stat;            // ... and of the TLS block
  int hint;                // the launch array of the last global hit
  unsigned pfence[1024];   // per thread of the block: fence.proxy.async executed
  unsigned char gacq[1024];  // per thread of the block: an ld.acquire since its last fence.proxy.async.global
  BulkMark* bm;            // racecheck: bulk copies in flight
  int nbm, capbm;
  MbInit* mi;              // racecheck: the mbarrier initialisations of the block
  int nmi, capmi;
};

}  // namespace kda_emu
#include "profile.h"

namespace kda_emu {
struct PhdrFind {
  uintptr_t marker;
  Checks* c;
};

KDA_EMU_RT inline int find_self(struct dl_phdr_info* info, size_t, void* arg) {
  PhdrFind* q = static_cast<PhdrFind*>(arg);
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && q->marker - lo < ph.p_memsz) mine = true;
  }
  if (!mine) return 0;
  Checks* c = q->c;
  c->base = info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && c->nseg < 8) {
      c->seg[c->nseg][0] = info->dlpi_addr + ph.p_vaddr;
      c->seg[c->nseg++][1] = info->dlpi_addr + ph.p_vaddr + ph.p_memsz;
    }
    if (ph.p_type == PT_TLS && info->dlpi_tls_data) {
      c->tls_lo = (uintptr_t)info->dlpi_tls_data;
      c->tls_size = ph.p_memsz;
    }
  }
  return 1;
}

// Per OS thread and launch, after g_worker is set (which allocates the TLS block);
// racecheck's shadows only when it is on.
KDA_EMU_RT inline bool checks_begin(Worker* w) {
  Checks* c = (Checks*)calloc(1, sizeof(Checks));
  w->ck = c;
  if (!c) return false;
  PhdrFind q{(uintptr_t)&find_self, c};
  dl_iterate_phdr(find_self, &q);
  if (!(w->L->check & CK_RACE)) return true;
  c->dyn = (Shadow*)calloc(w->smem_size + 1, sizeof(Shadow));
  c->stat = (Shadow*)calloc(c->tls_size + 1, sizeof(Shadow));
  return c->dyn && c->stat;
}

KDA_EMU_RT inline void checks_end(Worker* w) {
  if (!w->ck) return;
  free(w->ck->dyn);
  free(w->ck->stat);
  free(w->ck->bm);
  free(w->ck->mi);
  free(w->ck);
  w->ck = nullptr;
}

// " at {pc:OFFSET}" for messages (the loader resolves it), or "" without one.
struct Where {
  char s[40];
};
KDA_EMU_RT inline Where where(unsigned pco) {
  Where r{};
  if (pco) snprintf(r.s, sizeof r.s, " {pc:%x}", pco - 1);  // return address - 1: inside the access
  return r;
}
KDA_EMU_RT inline unsigned pc_off(uintptr_t pc) { return pc ? (unsigned)(pc - g_worker->ck->base) : 0; }

// "byte offset 4096 of argument 1 (4096 bytes)" etc.: the region nearest to [a, a + n).
KDA_EMU_RT inline void describe(char* out, size_t len, uintptr_t a, unsigned n) {
  Worker* w = g_worker;
  Launch* L = w->L;
  Checks* c = w->ck;
  uintptr_t best = ~(uintptr_t)0, lo = 0, hi = 0;
  int arg = -3;  // -1 dynamic shared memory, -2 static shared memory
  auto consider = [&](uintptr_t l, uintptr_t h, int which) KDA_EMU_RT {
    uintptr_t d = a + n <= l ? l - a : a >= h ? a + n - h : 0;
    if (d < best) best = d, lo = l, hi = h, arg = which;
  };
  for (int i = 0; i < L->n_ext; i++) consider((uintptr_t)L->ext[3 * i], (uintptr_t)L->ext[3 * i + 1], (int)L->ext[3 * i + 2]);
  consider((uintptr_t)w->smem, (uintptr_t)w->smem + w->smem_size, -1);
  if (c->tls_size) consider(c->tls_lo, c->tls_lo + c->tls_size, -2);
  if (arg == -3 || best > (1u << 20)) {
    snprintf(out, len, "address %p (no launch array or shared memory within 1 MiB)", (void*)a);
    return;
  }
  char name[48];
  if (arg == -1) snprintf(name, sizeof name, "the dynamic shared memory");
  else if (arg == -2) snprintf(name, sizeof name, "the static __shared__ variables");
  else snprintf(name, sizeof name, "argument %d", arg);
  snprintf(out, len, "byte offset %lld of %s (%llu bytes)", (long long)(a - lo), name, (unsigned long long)(hi - lo));
}

[[noreturn]] KDA_EMU_RT inline void out_of_bounds(uintptr_t a, unsigned n, unsigned fl, uintptr_t pc) {
  char d[160];
  describe(d, sizeof d, a, n);
  fail("out of bounds: %s%s of %u bytes at %s%s", fl & AC_ATOMIC ? "atomic " : "", fl & AC_WRITE ? "write" : "read",
       n, d, where(pc_off(pc)).s);
}

// Whether [a, a + n) lies inside one launch array or this library's segments.
KDA_EMU_RT inline bool in_global(uintptr_t a, unsigned n) {
  Worker* w = g_worker;
  Launch* L = w->L;
  Checks* c = w->ck;
  const long long* e = L->ext;
  int h = c->hint;
  if (h < L->n_ext && a >= (uintptr_t)e[3 * h] && a + n <= (uintptr_t)e[3 * h + 1]) return true;
  for (int i = 0; i < L->n_ext; i++)
    if (a >= (uintptr_t)e[3 * i] && a + n <= (uintptr_t)e[3 * i + 1]) {
      c->hint = i;
      return true;
    }
  for (int i = 0; i < c->nseg; i++)
    if (a >= c->seg[i][0] && a + n <= c->seg[i][1]) return true;
  return false;
}

KDA_EMU_RT inline uint3 tid_of(int lin) { return g_worker->fibers[lin].tid; }

[[noreturn]] KDA_EMU_RT inline void hazard(const char* kind, const char* region, size_t off, unsigned n, bool write,
                                           int t, unsigned pco, int u, bool u_wrote, unsigned upco, bool same_warp) {
  uint3 a = tid_of(t), b = tid_of(u);
  fail("racecheck: %s hazard at byte offset %zu of %s (%u-byte %s): thread (%u,%u,%u) %s it%s, thread (%u,%u,%u) %s "
       "it%s, with no __syncthreads%s between",
       kind, off, region, n, write ? "write" : "read", a.x, a.y, a.z, write ? "writes" : "reads", where(pco).s, b.x,
       b.y, b.z, u_wrote ? "wrote" : "read", where(upco).s, same_warp ? " or __syncwarp" : "");
}

[[noreturn]] KDA_EMU_RT inline void in_flight(const char* region, size_t off, unsigned n, bool write, int t,
                                              unsigned pco, const Shadow& x) {
  uint3 a = tid_of(t), b = tid_of(x.ft);
  if (x.ft == t)
    fail("racecheck: thread (%u,%u,%u) %s byte offset %zu of %s (%u bytes)%s before the cp_async_wait that covers "
         "its own cp.async into it%s",
         a.x, a.y, a.z, write ? "writes" : "reads", off, region, n, where(pco).s, where(x.fpc).s);
  fail("racecheck: cp.async hazard at byte offset %zu of %s (%u-byte %s): thread (%u,%u,%u) %s it%s while the "
       "cp.async of thread (%u,%u,%u)%s into it is in flight (it lands by that thread's covering cp_async_wait, "
       "then needs a __syncthreads)",
       off, region, n, write ? "write" : "read", a.x, a.y, a.z, write ? "writes" : "reads", where(pco).s, b.x, b.y,
       b.z, where(x.fpc).s);
}

[[noreturn]] KDA_EMU_RT inline void bulk_in_flight(const char* region, size_t off, unsigned n, bool write, int t,
                                                   unsigned pco, const Shadow& x) {
  uint3 a = tid_of(t), b = tid_of(x.bt);
  fail("racecheck: cp.async.bulk hazard at byte offset %zu of %s (%u-byte %s): thread (%u,%u,%u) %s it%s while the "
       "cp.async.bulk of thread (%u,%u,%u)%s into it is in flight (it lands when its mbarrier phase completes: "
       "wait on the mbarrier first)",
       off, region, n, write ? "write" : "read", a.x, a.y, a.z, write ? "writes" : "reads", where(pco).s, b.x, b.y,
       b.z, where(x.bpc).s);
}

[[noreturn]] KDA_EMU_RT inline void wgmma_reading(const char* region, size_t off, unsigned n, int t, unsigned pco,
                                                  const Shadow& x) {
  uint3 a = tid_of(t);
  fail("racecheck: wgmma hazard at byte offset %zu of %s (%u-byte write): thread (%u,%u,%u) writes it%s while the "
       "wgmma.mma_async%s still reads it as its B operand (until the wgmma.wait_group covering it)",
       off, region, n, a.x, a.y, a.z, where(pco).s, where(x.gpc).s);
}

// An access of n bytes at shadow sh[off...] by thread t (linear index), code offset pco.
KDA_EMU_RT inline void race(Shadow* sh, const char* region, size_t off, unsigned n, bool write, int t, unsigned pco) {
  Worker* w = g_worker;
  const unsigned e = w->epoch, e0 = w->epoch0, W = (unsigned)t >> 5, s = w->warps[W].sync;
  for (unsigned i = 0; i < n; i++) {
    Shadow& x = sh[off + i];
    if (x.fe >= e0 && x.fe) in_flight(region, off, n, write, t, pco, x);
    if (x.be >= e0 && x.be) bulk_in_flight(region, off, n, write, t, pco, x);
    if (write && x.gn && x.ge >= e0) wgmma_reading(region, off, n, t, pco, x);
    if (x.we == e && x.wt != t && ((x.wt >> 5) != W || x.ws == s))
      hazard(write ? "write-after-write" : "read-after-write", region, off, n, write, t, pco, x.wt, true, x.wpc,
             (x.wt >> 5) == W);
    if (write && x.re == e) {
      int other = x.r1 != t ? x.r1 : x.r2;
      if (other != NOBODY && (x.rcross || ((unsigned)other >> 5) != W || x.rs == s))
        hazard("write-after-read", region, off, n, write, t, pco, other, false, x.rpc, ((unsigned)other >> 5) == W);
    }
    if (write) {
      x.we = e, x.ws = s, x.wt = (u16)t, x.wpc = pco, x.wpf = w->ck->pfence[t];
    } else {
      if (x.re != e || (!x.rcross && ((unsigned)x.r1 >> 5) == W && x.rs != s)) {
        x.re = e, x.r1 = (u16)t, x.r2 = NOBODY, x.rcross = 0;  // earlier reads are ordered before this warp's
      } else if (x.r1 != t) {
        if (x.r2 == NOBODY) x.r2 = (u16)t;
        if (((unsigned)x.r1 >> 5) != W) x.rcross = 1;
      }
      x.rs = s, x.rpc = pco;
    }
  }
}

// Which shared memory holds address a (0: none, 1: dynamic, 2: static __shared__), its
// name, the offset of a in it and its size.
KDA_EMU_RT inline int shared_region(uintptr_t a, const char** region, size_t* off, size_t* size, unsigned n = 1) {
  Worker* w = g_worker;
  Checks* c = w->ck;
  uintptr_t d = (uintptr_t)w->smem;
  if (a - d < w->smem_size) {
    *region = "the dynamic shared memory", *off = a - d, *size = w->smem_size;
    return 1;
  }
  if (a - c->tls_lo < c->tls_size) {
    uintptr_t cur = (uintptr_t)&g_cur, wk = (uintptr_t)&g_worker;  // the emulator's: out of bounds
    if ((a < cur + sizeof g_cur && cur < a + n) || (a < wk + sizeof g_worker && wk < a + n)) return 0;
    *region = "the static __shared__ variables", *off = a - c->tls_lo, *size = c->tls_size;
    return 2;
  }
  return 0;
}

// The racecheck shadow of a shared address, or nullptr.
KDA_EMU_RT inline Shadow* shared_shadow(uintptr_t a, const char** region, size_t* off, size_t* size,
                                        unsigned n = 1) {
  int which = shared_region(a, region, off, size, n);
  return which == 1 ? g_worker->ck->dyn : which == 2 ? g_worker->ck->stat : nullptr;
}

// Every hooked load and store of the kernel, before it happens.
KDA_EMU_RT inline void access(uintptr_t a, unsigned n, unsigned fl, uintptr_t pc) {
  Fiber* f = g_cur;
  if (!f || !n) return;  // not on a CUDA thread (library constructors)
  Worker* w = g_worker;
  Launch* L = w->L;
  if (a - (uintptr_t)f->stack < L->stack_bytes) return;  // the thread's own local memory
  const unsigned ck = L->check;
  if ((ck & CK_ALIGN) && (fl & AC_NATURAL) && (a & (n - 1))) {
    char d[160];
    describe(d, sizeof d, a, n);
    fail("misaligned address: %u-byte %s at %s: address %p is not %u-byte aligned%s", n,
         fl & AC_WRITE ? "write" : "read", d, (void*)a, n, where(pc_off(pc)).s);
  }
  const char* region;
  size_t off, size;
  if (int which = shared_region(a, &region, &off, &size, n)) {
    if (off + n > size) {
      if (ck & CK_MEM) out_of_bounds(a, n, fl, pc);
      n = (unsigned)(size - off);
    }
    if (L->prof) prof_access(a, n, fl, pc, true);
    if ((ck & CK_RACE) && !(fl & AC_ATOMIC))
      race(which == 1 ? w->ck->dyn : w->ck->stat, region, off, n, fl & AC_WRITE, f->lin, pc_off(pc));
    return;
  }
  if ((ck & CK_MEM) && !in_global(a, n)) out_of_bounds(a, n, fl, pc);
  if (L->prof) prof_access(a, n, fl, pc, false);
}

template <class T>
KDA_EMU_RT inline void on_atomic(T* p, unsigned n, uintptr_t pc) {
  access((uintptr_t)p, n, AC_WRITE | AC_NATURAL | AC_ATOMIC, pc);
}

// cp.async: the global source at issue (memcheck), the destination as a write
// that is in flight until the covering wait (racecheck).
KDA_EMU_RT inline void cp_issue(void* dst, const void* src, unsigned bytes, uintptr_t pc) {
  Worker* w = g_worker;
  const unsigned ck = w->L->check;
  Fiber* f = g_cur;
  if (bytes && (ck & CK_MEM)) {
    uintptr_t a = (uintptr_t)src;
    const char* region;
    size_t off, size;
    if (shared_shadow(a, &region, &off, &size) || !in_global(a, 16)) out_of_bounds(a, 16, 0, pc);
  }
  if (!(ck & CK_RACE)) return;
  const char* region;
  size_t off, size;
  Shadow* sh = shared_shadow((uintptr_t)dst, &region, &off, &size);  // inside: check_smem16 passed
  unsigned pco = pc_off(pc);
  race(sh, region, off, 16, true, f->lin, pco);
  for (int i = 0; i < 16; i++) {
    Shadow& x = sh[off + i];
    x.fe = w->epoch, x.ft = (u16)f->lin, x.fpc = pco;
  }
}

KDA_EMU_RT inline void cp_land(void* dst, uintptr_t pc) {
  Worker* w = g_worker;
  if (w->pf) prof_cp_land(dst, pc);  // the dependent path: this lane waits for the copy (profile.h)
  if (!(w->L->check & CK_RACE)) return;
  const char* region;
  size_t off, size;
  Shadow* sh = shared_shadow((uintptr_t)dst, &region, &off, &size);
  Fiber* f = g_cur;
  unsigned s = w->warps[f->warp].sync, pco = pc_off(pc);
  for (int i = 0; i < 16; i++) {
    Shadow& x = sh[off + i];
    if (x.ft == f->lin) x.fe = 0;
    x.we = w->epoch, x.ws = s, x.wt = (u16)f->lin, x.wpc = pco, x.wpf = w->ck->pfence[f->lin];
  }
}

// -- the asynchronous proxy -------------------------------------------------------------------
KDA_EMU_RT inline void proxy_fence() {
  if (g_worker->ck) g_worker->ck->pfence[g_cur->lin]++;
}
// Global memory between blocks: what a thread's ld.acquire made visible (another block's generic stores)
// reaches the async proxy only through its fence.proxy.async.global; a bulk copy the thread issues in
// between may read the old bytes (the fused forward's ring, kernels/chunk_ring.cuh).
KDA_EMU_RT inline void acquire_mark() {
  if (g_worker->ck) g_worker->ck->gacq[g_cur->lin] = 1;
}
KDA_EMU_RT inline void global_proxy_fence() {
  if (g_worker->ck) g_worker->ck->gacq[g_cur->lin] = 0;
}
KDA_EMU_RT inline void bulk_after_acquire(const void* src) {
  if (g_worker->ck && g_worker->ck->gacq[g_cur->lin])
    fail("racecheck: proxy hazard: thread (%u,%u,%u) issues a cp.async.bulk from %p (async proxy) after its ld.acquire "
         "with no fence.proxy.async.global in between: the stores the acquire made visible may not reach the copy",
         g_cur->tid.x, g_cur->tid.y, g_cur->tid.z, src);
}

// mbarrier.init by the current thread: remembered with its proxy-fence count, so a bulk copy that
// completes on the barrier can ask whether the init was made visible to the async proxy.
KDA_EMU_RT inline void mbarrier_init_mark(const u64* bar, uintptr_t pc) {
  Worker* w = g_worker;
  Checks* c = w->ck;
  if (!c || !(w->L->check & CK_RACE)) return;
  int i = 0;
  while (i < c->nmi && (c->mi[i].bar != (uintptr_t)bar || c->mi[i].epoch < w->epoch0)) i++;
  if (i == c->nmi) {
    for (i = 0; i < c->nmi && c->mi[i].epoch >= w->epoch0; i++) {
    }
    if (i == c->nmi) {
      if (c->nmi == c->capmi) {
        c->capmi = c->capmi ? 2 * c->capmi : 16;
        c->mi = (MbInit*)realloc(c->mi, sizeof(MbInit) * c->capmi);
        if (!c->mi) fail("mbarrier.init: out of memory");
      }
      c->nmi++;
    }
  }
  c->mi[i] = MbInit{(uintptr_t)bar, w->epoch, c->pfence[g_cur->lin], (u16)g_cur->lin, pc_off(pc)};
}

// A bulk copy completing on bar: its initialisation (in this block) must have been followed by a
// fence.proxy.async of the initialising thread (docs/design.md section 9.2).
KDA_EMU_RT inline void mbarrier_init_fenced(const u64* bar, unsigned pco) {
  Worker* w = g_worker;
  Checks* c = w->ck;
  for (int i = 0; i < c->nmi; i++) {
    const MbInit& m = c->mi[i];
    if (m.bar != (uintptr_t)bar || m.epoch < w->epoch0) continue;
    if (c->pfence[m.thread] == m.fences) {
      uint3 b = tid_of(m.thread);
      fail("racecheck: proxy hazard on the mbarrier at %p: the cp.async.bulk%s completes on it (async proxy) "
           "after thread (%u,%u,%u) initialised it%s (generic proxy) with no fence.proxy.async by that thread in "
           "between",
           (const void*)bar, where(pco).s, b.x, b.y, b.z, where(m.pc).s);
    }
    return;
  }
}

// cp.async.bulk: memcheck of both extents (through the error path of every out-of-bounds access),
// then racecheck: the destination is in flight until a wait finds the phase `phase` of bar complete.
KDA_EMU_RT inline void bulk_issue(void* dst, const void* src, unsigned bytes, const u64* bar, unsigned phase,
                                  uintptr_t pc) {
  Worker* w = g_worker;
  const unsigned ck = w->L->check;
  uintptr_t a = (uintptr_t)dst, lo = (uintptr_t)w->smem;
  if (ck & CK_MEM) {
    if (a < lo || a + bytes > lo + w->smem_size) out_of_bounds(a, bytes, AC_WRITE, pc);
    const char* region;
    size_t off, size;
    if (shared_shadow((uintptr_t)src, &region, &off, &size) || !in_global((uintptr_t)src, bytes))
      out_of_bounds((uintptr_t)src, bytes, 0, pc);
  }
  if (!(ck & CK_RACE) || a < lo || a + bytes > lo + w->smem_size) return;
  Checks* c = w->ck;
  int t = g_cur->lin;
  unsigned pco = pc_off(pc);
  mbarrier_init_fenced(bar, pco);
  // Against the async proxy only: the generic reads of a stage before its refill are ordered by
  // an mbarrier (the ring's "empty" barrier), which racecheck does not follow for generic accesses.
  for (unsigned i = 0; i < bytes; i++) {
    Shadow& x = c->dyn[a - lo + i];
    if (x.be >= w->epoch0 && x.be) bulk_in_flight("the dynamic shared memory", a - lo, bytes, true, t, pco, x);
    if (x.gn && x.ge >= w->epoch0) wgmma_reading("the dynamic shared memory", a - lo, bytes, t, pco, x);
    x.be = w->epoch, x.bt = (u16)t, x.bpc = pco;
  }
  if (c->nbm == c->capbm) {
    c->capbm = c->capbm ? 2 * c->capbm : 16;
    c->bm = (BulkMark*)realloc(c->bm, sizeof(BulkMark) * c->capbm);
    if (!c->bm) fail("cp.async.bulk: out of memory");
  }
  c->bm[c->nbm++] = BulkMark{a, bytes, phase, bar};
}

// A wait (or test) saw bar's current phase: the copies of the phases before it have landed, as
// writes of the async proxy (no generic writer: nothing for a fence.proxy.async to order).
KDA_EMU_RT inline void bulk_settle(const u64* bar, unsigned phase) {
  Worker* w = g_worker;
  Checks* c = w->ck;
  if (!c || !c->nbm) return;
  int k = 0;
  for (int i = 0; i < c->nbm; i++) {
    BulkMark& m = c->bm[i];
    if (m.bar != bar || m.phase == phase) {
      c->bm[k++] = m;
      continue;
    }
    for (unsigned j = 0; j < m.bytes; j++) {
      Shadow& x = c->dyn[m.dst - (uintptr_t)w->smem + j];
      x.be = 0, x.we = 0, x.wt = NOBODY, x.re = 0;  // the reads before the refill: ordered by the mbarrier
    }
  }
  c->nbm = k;
}

// wgmma's B operand, 2 bytes at p (by the warpgroup's last thread at the issue): a generic write
// there needs its writer's fence.proxy.async; the bytes are read until the covering wait (done).
KDA_EMU_RT inline void wgmma_b_operand(const void* p, bool done, uintptr_t pc) {
  Worker* w = g_worker;
  Checks* c = w->ck;
  if (!c || !(w->L->check & CK_RACE)) return;
  size_t off = (const unsigned char*)p - w->smem;
  unsigned pco = pc_off(pc);
  for (int i = 0; i < 2; i++) {
    Shadow& x = c->dyn[off + i];
    if (done) {
      if (x.gn) x.gn--;
      continue;
    }
    if (x.be >= w->epoch0 && x.be) bulk_in_flight("the dynamic shared memory", off, 2, false, g_cur->lin, pco, x);
    if (x.we && x.we >= w->epoch0 && x.wt != NOBODY && c->pfence[x.wt] == x.wpf) {
      uint3 b = tid_of(x.wt);
      fail("racecheck: proxy hazard at byte offset %zu of the dynamic shared memory: the wgmma.mma_async%s reads it "
           "(async proxy) after thread (%u,%u,%u) wrote it%s (generic proxy) with no fence.proxy.async by that "
           "thread in between",
           off + i, where(pco).s, b.x, b.y, b.z, where(x.wpc).s);
    }
    if (x.ge < w->epoch0) x.gn = 0;
    x.gn++, x.ge = w->epoch, x.gpc = pco;
  }
}

// ldmatrix: row i (16 bytes at p) read by lane i of the current warp.
KDA_EMU_RT inline void ldmatrix_row(const void* p, int lane, uintptr_t pc) {
  Worker* w = g_worker;
  if (!(w->L->check & CK_RACE)) return;
  const char* region;
  size_t off, size;
  Shadow* sh = shared_shadow((uintptr_t)p, &region, &off, &size);
  int t = g_cur->warp * 32 + lane;
  w->blame = &w->fibers[t];
  race(sh, region, off, 16, false, t, pc_off(pc));
  w->blame = nullptr;
}
}  // namespace kda_emu

// The hooks' target (tsan_hooks.cpp): fl = AC_* bits.
extern "C" __attribute__((visibility("hidden"))) KDA_EMU_RT void kda_emu_access(void* p, unsigned n, unsigned fl,
                                                                                void* pc) {
  ::kda_emu::access((uintptr_t)p, n, fl, (uintptr_t)pc);
}

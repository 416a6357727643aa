// CPU emulation of the CUDA execution model, force-included (g++ -include)
// before a rendered kernel source compiled with -DKDA_EMULATE.
//
// Model: a launch runs its blocks on a pool of OS threads (KDACUPY_EMULATE_THREADS),
// one block at a time per OS thread. The threads of a block are fibers on that
// OS thread (own stack, KDACUPY_EMULATE_STACK_KB, default 256), switched
// cooperatively only at __syncthreads*, warp collectives (shuffles, votes,
// __syncwarp, ldmatrix, mma), warpgroup collectives (wgmma and its fence,
// commit and wait), mbarrier waits on an incomplete phase and exit. Hence, kernel authors:
//  - between two such points a thread runs alone: races inside a block do not
//    show by themselves; KDACUPY_EMULATE_ORDER=reverse reorders the threads and
//    KDACUPY_EMULATE_CP_ASYNC=eager lands cp.async and bulk copies at issue (and
//    wgmma reads its shared operand then), to expose them;
//  - spinning on memory another thread of the block writes never ends;
//  - __shared__ = static thread_local: shared by the block running on this OS
//    thread, NOT reset between blocks. Dynamic shared memory (dynamic_smem())
//    is, to 0xFF bytes (reads as NaN); ldmatrix/cp.async must target it;
//  - warp collectives need full masks (0xffffffff), blocks of whole warps and
//    no exited lane in the warp; exited threads do count at __syncthreads;
//  - out-of-bounds accesses, shared-memory races and misaligned accesses are
//    caught only in checked builds (KDACUPY_EMULATE_CHECK, checks.h); fiber
//    stack overflow is not caught (crash); the same instrumented builds count
//    requests, wavefronts and sectors (KDACUPY_EMULATE_PROFILE, profile.h);
//  - errors (deadlock, __trap, assert, bad ldmatrix/cp.async address, checks)
//    stop the launch and come back as kdacupy.emulate.EmulationError.
#pragma once
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <type_traits>
#include <utility>
#ifdef KDA_EMU_CHECK
// Checked build: the kernel is compiled with -fsanitize=thread, which calls a
// hook before every load and store (checks.h). The emulator's own code is
// excluded from that instrumentation (KDA_EMU_RT), so every hooked access is
// the kernel's; KDA_EMU_PC is the kernel's return address (for messages).
#include <dlfcn.h>
#include <link.h>
#define KDA_EMU_RT __attribute__((no_sanitize("thread")))
#define KDA_EMU_PC ((uintptr_t)__builtin_return_address(0))
#else
#define KDA_EMU_RT
#define KDA_EMU_PC ((uintptr_t)0)
#endif
#if !defined(__x86_64__) || defined(KDA_EMU_UCONTEXT)
#include <ucontext.h>  // portable, slow fallback: swapcontext makes a system call
#undef KDA_EMU_UCONTEXT
#define KDA_EMU_UCONTEXT 1
#endif

// ---- CUDA keywords --------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))  // as nvcc does, at -Og too (build.py)
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local  // one block per OS thread at a time
// __restrict__ is a g++ keyword already; `#pragma unroll` is ignored (-Wno-unknown-pragmas).

typedef unsigned char u8;  // identical to kernels/types.cuh (repeating a typedef is legal)
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

struct uint3 { unsigned int x, y, z; };
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// ---- fibers ----------------------------------------------------------------
namespace kda_emu {
struct Fiber;
}
extern "C" __attribute__((visibility("hidden"), noreturn, used)) void kda_emu_fiber_main(kda_emu::Fiber* f);

#ifndef KDA_EMU_UCONTEXT
// kda_emu_swap(&save_sp, load_sp): save the callee-saved registers, MXCSR and
// the x87 control word on this stack, switch stacks, restore, return. No
// system call (ucontext's swapcontext saves the signal mask with one).
extern "C" void kda_emu_swap(void** save_sp, void* load_sp) __attribute__((visibility("hidden")));
asm(R"(
  .text
  .globl kda_emu_swap
  .hidden kda_emu_swap
  .type kda_emu_swap, @function
kda_emu_swap:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size kda_emu_swap, .-kda_emu_swap

  .globl kda_emu_trampoline
  .hidden kda_emu_trampoline
  .type kda_emu_trampoline, @function
kda_emu_trampoline:
  movq %rbx, %rdi
  andq $-16, %rsp
  call kda_emu_fiber_main@PLT
  ud2
  .size kda_emu_trampoline, .-kda_emu_trampoline
)");
extern "C" void kda_emu_trampoline() __attribute__((visibility("hidden")));
#endif

namespace kda_emu {

#define KDA_EMU_CALLERS 16  // calling contexts of the issue anchors: callers kept per thread (profile.h)

enum State : int { READY, RUNNING, WAIT_BAR, WAIT_WARP, EXITED, WAIT_WG, WAIT_MBAR };

struct Copy { void* dst; const void* src; unsigned bytes, group, done; };  // one queued cp.async (done: eager)
struct Bulk { void* dst; const void* src; unsigned bytes; u64* bar; };  // one queued cp.async.bulk

// Per-warpgroup state of the wgmma twins (ptx_twins.h): the lanes' deposits at a warpgroup
// collective, and the issued wgmma not yet performed, in issue order.
struct WgOp;
struct WgLane { u32 a[4]; float* d; u64 desc; unsigned acc; };
struct WarpGroup {
  int arrived;
  const char* what;
  int fenced;           // a wgmma.fence since the last wgmma.wait_group (or the block's start)
  unsigned open_group;  // id of the group new wgmma join; commit increments it
  WgLane lane[128];
  WgOp** ops;
  int nops, capops;
};

struct Fiber {
  uint3 tid;
  int lin, lane, warp;
  State st;
  const char* what;  // what a WAIT_WARP fiber waits in (for error messages)
#ifdef KDA_EMU_UCONTEXT
  ucontext_t uc;
#else
  void* sp;
#endif
  char* stack;  // lowest usable byte; a PROT_NONE guard page lies below
  Copy* cp;     // cp.async copies not yet performed, in issue order
  int ncp, capcp;
  unsigned open_group;  // id of the group new copies join; commit increments it
  const u64* mbar;      // the mbarrier a WAIT_MBAR fiber waits on
#ifdef KDA_EMU_CHECK
  // The kernel's calls not inlined by the host compiler (-fsanitize=thread's function entry and
  // exit hooks): their return addresses, outermost first, and a hash of each prefix (profile.h's
  // issue anchors are per calling context, as the GPU compiler inlines every call).
  uintptr_t callers[KDA_EMU_CALLERS];
  unsigned long long ctx[KDA_EMU_CALLERS + 1];
  int depth;
#endif
};

// Per-warp exchange area. Lanes deposit into slot[buf], meet at the warp
// barrier, then read slot[buf]; the barrier flips buf, so a lane that runs on
// to the next collective writes the other half while slow lanes still read.
struct Warp {
  int nlanes, arrived, exited, buf;
  unsigned sync;  // __syncwarp calls completed (racecheck: orders the lanes' accesses)
  const char* what;
  alignas(16) unsigned char slot[2][32][32];
  alignas(16) unsigned char snap[2][32][16];  // ldmatrix rows, read by the last arriver
};

struct Launch {
  void (*entry)(void* ctx);
  void* ctx;
  dim3 grid, block;
  size_t smem, stack_bytes;
  long long nblocks, next;  // next: block counter shared by the workers (atomic)
  int cp_eager;             // cp.async lands at issue (exposes write-after-read hazards)
  int reverse;              // run fibers in reverse order (exposes missing barriers)
  int abort;                // set on the first error: stop everything (atomic)
  unsigned check;           // KDACUPY_EMULATE_CHECK bits (checks.h)
  const long long* ext;     // launch arrays: (first byte, end, argument index) triples
  int n_ext;
  int prof;                 // counters on (instrumented builds, profile.h)
  long long* prof_out;      // the loader's counters (PR_OUT slots), summed by the workers
  long long* prof_pcs;      // ... and its per-code-address rows (PC_FIELDS each)
  long long prof_pc_cap;
  struct PRegion* prof_regions;  // the launch arrays, merged and sorted, with their sectors
  int prof_nregions;
  struct PSet* prof_loose;  // sectors reached outside them
  const long long* prof_allocs;  // per ext triple, the (first byte, end) of its allocation, or null
  long long* prof_args;     // out, per ext triple: region, DRAM bytes read, written (or null)
  long long* prof_anchors;  // out: the issue anchors' rows (profile.h ANC_FIELDS each), or null
  long long prof_anchor_cap;
  pthread_mutex_t mu;
  char err[2048];
};

struct Worker {
  Launch* L;
  int n, nwarps, live;
  Fiber* fibers;
  Warp* warps;
  int* ready;  // ring of runnable fiber indices (each at most once)
  int rhead, rcount;
  int bar_arrived, bar_exited, bar_gen;
  int bar_acc[2], bar_res[2], bar_resn[2];  // __syncthreads_count/and/or, by gen parity
  uint3 bid;
  dim3 bdim, gdim;
  unsigned char* smem;
  size_t smem_size;
  unsigned epoch, epoch0;  // barrier intervals of this OS thread (monotonic); epoch0: this block's first
  Fiber* blame;            // set while the last lane of a warp collective acts for another lane
  WarpGroup* wgs;          // (nwarps + 3) / 4 of them
  Bulk* bulk;              // bulk copies not yet landed, in issue order (deferred mode)
  int nbulk, capbulk;
  struct Tmem* tm;         // tensor memory and tcgen05's pending work (ptx_twins.h), made at first use
#ifdef KDA_EMU_CHECK
  struct Checks* ck;
  struct Prof* pf;         // counters of this OS thread (KDACUPY_EMULATE_PROFILE), or null
#endif
#ifdef KDA_EMU_UCONTEXT
  ucontext_t sched;
#else
  void* sched;
#endif
};

static thread_local Fiber* g_cur;      // the running CUDA thread
static thread_local Worker* g_worker;  // the block this OS thread runs

#ifdef KDA_EMU_CHECK  // profile.h: a warp's lanes are all at a synchronising point
// profiled launches running in this library (profile.h): the function entry hooks do nothing else
extern "C" __attribute__((visibility("hidden"))) int kda_emu_prof_live;
KDA_EMU_RT inline void prof_flush_warp(Worker* w, int warp);
KDA_EMU_RT inline void prof_barrier(Worker* w);
#define KDA_EMU_PROF_WARP(w, warp) prof_flush_warp(w, warp)
#define KDA_EMU_PROF_BARRIER(w) prof_barrier(w)
#else
#define KDA_EMU_PROF_WARP(w, warp) (void)0
#define KDA_EMU_PROF_BARRIER(w) (void)0
#endif

KDA_EMU_RT inline Fiber* cur() { return g_cur; }

// -- error handling: record the first message, stop the launch, never return --
KDA_EMU_RT inline void record_error(Launch* L, const char* msg) {
  pthread_mutex_lock(&L->mu);
  if (!L->err[0]) snprintf(L->err, sizeof L->err, "%s", msg);
  pthread_mutex_unlock(&L->mu);
  __atomic_store_n(&L->abort, 1, __ATOMIC_RELAXED);
}

KDA_EMU_RT inline void to_sched(Fiber* f) {
  Worker* w = g_worker;
  g_cur = nullptr;
#ifdef KDA_EMU_UCONTEXT
  swapcontext(&f->uc, &w->sched);
#else
  kda_emu_swap(&f->sp, w->sched);
#endif
}

[[noreturn]] KDA_EMU_RT __attribute__((format(printf, 1, 2))) inline void fail(const char* fmt, ...) {
  Fiber* f = g_cur;
  Worker* w = g_worker;
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char full[2048];
  const Fiber* who = w->blame ? w->blame : f;  // a lane whose part of a warp collective failed
  snprintf(full, sizeof full, "block (%u,%u,%u) thread (%u,%u,%u): %s", w->bid.x, w->bid.y, w->bid.z,
           who->tid.x, who->tid.y, who->tid.z, msg);
  record_error(w->L, full);
  to_sched(f);  // the scheduler abandons this block: never resumed
  __builtin_unreachable();
}

// -- scheduling ----------------------------------------------------------------
KDA_EMU_RT inline void push_ready(Worker* w, Fiber* f) {
  f->st = READY;
  w->ready[(w->rhead + w->rcount++) % w->n] = f->lin;
}

// Front of the queue: the lanes of a warp released by a warp collective run
// next, so one warp runs ahead until it meets a block barrier (as warps may on
// a GPU), which opens the windows where missing barriers show.
KDA_EMU_RT inline void push_front(Worker* w, Fiber* f) {
  f->st = READY;
  w->rhead = (w->rhead + w->n - 1) % w->n;
  w->rcount++;
  w->ready[w->rhead] = f->lin;
}

// Give up the OS thread: run the next ready fiber, or go back to the scheduler
// when none is (block done, deadlock, or error). Returns when resumed.
KDA_EMU_RT inline void yield_blocked(Fiber* f) {
  Worker* w = g_worker;
  if (w->rcount == 0 || __atomic_load_n(&w->L->abort, __ATOMIC_RELAXED)) {
    to_sched(f);
    return;
  }
  Fiber* nx = &w->fibers[w->ready[w->rhead]];
  w->rhead = (w->rhead + 1) % w->n;
  w->rcount--;
  nx->st = RUNNING;
  g_cur = nx;
#ifdef KDA_EMU_UCONTEXT
  swapcontext(&f->uc, &nx->uc);
#else
  kda_emu_swap(&f->sp, nx->sp);
#endif
}

// -- __syncthreads: exited threads count as arrived (as on current GPUs) --------
KDA_EMU_RT inline void bar_release(Worker* w) {
  KDA_EMU_PROF_BARRIER(w);
  int p = w->bar_gen & 1;
  w->bar_res[p] = w->bar_acc[p];
  w->bar_resn[p] = w->bar_arrived;
  w->bar_acc[p] = 0;
  w->bar_arrived = 0;
  w->bar_gen++;
  w->epoch++;
  for (int k = 0; k < w->n; k++) {
    Fiber* f = &w->fibers[w->L->reverse ? w->n - 1 - k : k];
    if (f->st == WAIT_BAR) push_ready(w, f);
  }
}

// Returns how many arrived threads had pred != 0; *n_arrived = how many arrived.
KDA_EMU_RT inline int block_barrier(int pred, int* n_arrived) {
  Fiber* f = g_cur;
  Worker* w = g_worker;
  int p = w->bar_gen & 1;
  w->bar_acc[p] += pred != 0;
  if (++w->bar_arrived + w->bar_exited == w->n) {
    bar_release(w);  // the last arriver goes on without a switch
  } else {
    f->st = WAIT_BAR;
    yield_blocked(f);
  }
  if (n_arrived) *n_arrived = w->bar_resn[p];
  return w->bar_res[p];
}

// -- warp barrier with an exchange: on_last runs once, by the last lane to arrive --
template <class F>
KDA_EMU_RT inline void warp_barrier(Fiber* f, const char* what, F&& on_last) {
  Worker* w = g_worker;
  Warp& wp = w->warps[f->warp];
  if (wp.nlanes != 32)
    fail("%s in warp %d, which has only %d threads: the emulator needs blocks of whole warps for warp collectives",
         what, f->warp, wp.nlanes);
  if (wp.exited)
    fail("%s in warp %d after %d of its lanes exited (full-warp mask)", what, f->warp, wp.exited);
  if (wp.arrived == 0) {
    wp.what = what;
  } else if (wp.what != what && strcmp(wp.what, what) != 0) {
    fail("lanes of warp %d meet in different warp collectives: %s and %s", f->warp, wp.what, what);
  }
  if (++wp.arrived == 32) {
    KDA_EMU_PROF_WARP(w, f->warp);  // before on_last: its own counts belong to the next interval
    on_last();
    wp.arrived = 0;
    wp.buf ^= 1;
    Fiber* lanes = &w->fibers[f->warp * 32];
    for (int k = 0; k < 32; k++) {  // pushed to the front last-first: lane 0 (31 if reverse) runs first
      Fiber* l = &lanes[w->L->reverse ? k : 31 - k];
      if (l->st == WAIT_WARP) push_front(w, l);
    }
  } else {
    f->st = WAIT_WARP;
    f->what = what;
    yield_blocked(f);
  }
}
KDA_EMU_RT inline void warp_barrier(Fiber* f, const char* what) {
  warp_barrier(f, what, [] {});
}

KDA_EMU_RT inline void check_mask(unsigned mask, const char* what) {
  if (mask != 0xffffffffu) fail("%s with mask 0x%08x: the emulator supports full-warp masks only", what, mask);
}

// -- thread exit ------------------------------------------------------------------
[[noreturn]] KDA_EMU_RT inline void thread_exit(Fiber* f) {
  Worker* w = g_worker;
  Warp& wp = w->warps[f->warp];
  if (wp.arrived > 0)
    fail("thread exited while %d lane(s) of its warp %d wait in %s (full-warp mask)", wp.arrived, f->warp, wp.what);
  if (w->wgs[f->warp >> 2].arrived > 0)
    fail("thread exited while %d thread(s) of its warpgroup %d wait in %s", w->wgs[f->warp >> 2].arrived,
         f->warp >> 2, w->wgs[f->warp >> 2].what);
  f->st = EXITED;
  f->ncp = 0;  // copies never waited for are dropped (their shared memory dies with the block)
  w->live--;
  wp.exited++;
  w->bar_exited++;
  if (w->bar_arrived > 0 && w->bar_arrived + w->bar_exited == w->n) bar_release(w);
  yield_blocked(f);  // never resumed
  __builtin_unreachable();
}

// -- shared-memory pointer checks (ldmatrix, cp.async) -------------------------------
KDA_EMU_RT inline void check_smem16(const void* p, const char* what) {
  Worker* w = g_worker;
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)w->smem;
  if (a < lo || a + 16 > lo + w->smem_size)
    fail("%s: shared address %p is not inside the block's dynamic shared memory [%p, +%zu)", what, p, (void*)w->smem,
         w->smem_size);
  if (a % 16) fail("%s: shared address %p is not 16-byte aligned", what, p);
}
}  // namespace kda_emu

#ifdef KDA_EMU_CHECK
#include "checks.h"
// One lane executes an instruction of issue-anchor class `cls` (profile.h) at return address `pc`.
#define KDA_EMU_ANCHOR(cls, pc) ::kda_emu::prof_anchor(::kda_emu::AN_##cls, pc)
#else
#define KDA_EMU_ANCHOR(cls, pc) (void)0
#endif

namespace kda_emu {

// -- blocks -----------------------------------------------------------------------------
KDA_EMU_RT inline void init_fiber_stack(Worker* w, Fiber* f) {
  char* top = f->stack + w->L->stack_bytes;
#ifdef KDA_EMU_UCONTEXT
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack;
  f->uc.uc_stack.ss_size = w->L->stack_bytes;
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, +[]() KDA_EMU_RT { kda_emu_fiber_main(g_cur); }, 0);
  (void)top;
#else
  // Frame popped by kda_emu_swap: [mxcsr|fpcw] r15 r14 r13 r12 rbx rbp ret(=trampoline) 0
  uint64_t* s = (uint64_t*)((uintptr_t)top & ~(uintptr_t)15) - 9;
  uint32_t csr[2];
  asm volatile("stmxcsr %0; fnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
  memcpy(&s[0], csr, 8);
  for (int i = 1; i <= 6; i++) s[i] = 0;
  s[5] = (uint64_t)(uintptr_t)f;  // rbx -> argument of kda_emu_fiber_main
  s[7] = (uint64_t)(uintptr_t)&kda_emu_trampoline;
  s[8] = 0;
  f->sp = s;
#endif
}

KDA_EMU_RT inline void tmem_block_begin(Worker* w);  // ptx_twins.h
KDA_EMU_RT inline void tmem_block_end(Worker* w);

KDA_EMU_RT inline void run_block(Worker* w, long long b) {
  Launch* L = w->L;
  w->bid = {(unsigned)(b % L->grid.x), (unsigned)((b / L->grid.x) % L->grid.y),
            (unsigned)(b / ((long long)L->grid.x * L->grid.y))};
  memset(w->smem, 0xFF, w->smem_size);  // unwritten shared memory reads as NaN
  w->epoch0 = ++w->epoch;                 // racecheck: nothing of an earlier block conflicts
  w->live = w->n;
  w->rhead = w->rcount = 0;
  w->bar_arrived = w->bar_exited = w->bar_gen = 0;
  w->bar_acc[0] = w->bar_acc[1] = 0;
  for (int i = 0; i < w->nwarps; i++) {
    Warp& wp = w->warps[i];
    wp.nlanes = w->n - 32 * i < 32 ? w->n - 32 * i : 32;
    wp.arrived = wp.exited = wp.buf = 0;
    wp.what = "";
  }
  for (int i = 0; i < (w->nwarps + 3) / 4; i++) {  // wgmma never waited for die with the block
    WarpGroup& g = w->wgs[i];
    for (int k = 0; k < g.nops; k++) free(g.ops[k]);
    g.nops = g.arrived = g.fenced = 0;
    g.open_group = 0;
    g.what = "";
  }
  w->nbulk = 0;  // so do bulk copies never waited for
  tmem_block_begin(w);
  for (int k = 0; k < w->n; k++) {
    Fiber* f = &w->fibers[L->reverse ? w->n - 1 - k : k];
    f->ncp = 0;
    f->open_group = 0;
#ifdef KDA_EMU_CHECK
    f->depth = 0;
    f->ctx[0] = 0;
#endif
    init_fiber_stack(w, f);
    push_ready(w, f);
  }
  Fiber* first = &w->fibers[w->ready[0]];
  w->rhead = 1 % w->n;
  w->rcount--;
  first->st = RUNNING;
  g_cur = first;
#ifdef KDA_EMU_UCONTEXT
  swapcontext(&w->sched, &first->uc);
#else
  kda_emu_swap(&w->sched, first->sp);
#endif
  g_cur = nullptr;
#ifdef KDA_EMU_CHECK
  prof_block_end(w);
#endif
  // Back here when no fiber can run: all exited, an error, or a deadlock.
  if (w->live == 0 && !__atomic_load_n(&L->abort, __ATOMIC_RELAXED)) tmem_block_end(w);
  if (w->live == 0 || __atomic_load_n(&L->abort, __ATOMIC_RELAXED)) return;
  char msg[2048];
  int len = snprintf(msg, sizeof msg, "deadlock in block (%u,%u,%u):", w->bid.x, w->bid.y, w->bid.z);
  int nbar = 0, nmbar = 0;
  for (int i = 0; i < w->n; i++) nbar += w->fibers[i].st == WAIT_BAR, nmbar += w->fibers[i].st == WAIT_MBAR;
  if (nbar)
    len += snprintf(msg + len, sizeof msg - len, " %d thread(s) wait at __syncthreads;", nbar);
  if (nmbar)
    len += snprintf(msg + len, sizeof msg - len, " %d thread(s) wait for an mbarrier phase;", nmbar);
  for (int k = 0; k < (w->nwarps + 3) / 4 && len < (int)sizeof msg - 128; k++)
    if (w->wgs[k].arrived)
      len += snprintf(msg + len, sizeof msg - len, " warpgroup %d: %d thread(s) wait in %s;", k, w->wgs[k].arrived,
                      w->wgs[k].what);
  for (int k = 0; k < w->nwarps && len < (int)sizeof msg - 128; k++)
    if (w->warps[k].arrived)
      len += snprintf(msg + len, sizeof msg - len, " warp %d: %d lane(s) wait in %s;", k, w->warps[k].arrived,
                      w->warps[k].what);
  snprintf(msg + len, sizeof msg - len, " %d thread(s) exited, %d in all", w->n - w->live, w->n);
  record_error(L, msg);
}

// Fiber stacks of n threads (each above a PROT_NONE guard page), kept across
// launches: mapping them and faulting their first pages in cost more than a
// small launch itself. Each guard page splits the mapping, so the cache is capped
// in stacks (2 mappings each) to stay far below vm.max_map_count (65530).
struct Stacks { char* base; size_t stride; int n; Stacks* next; };
static Stacks* g_stack_cache;
static int g_stack_cached;  // stacks in the cache
static pthread_mutex_t g_stack_mu = PTHREAD_MUTEX_INITIALIZER;

KDA_EMU_RT inline Stacks* get_stacks(int n, size_t stride) {
  pthread_mutex_lock(&g_stack_mu);
  for (Stacks** p = &g_stack_cache; *p; p = &(*p)->next)
    if ((*p)->n == n && (*p)->stride == stride) {
      Stacks* r = *p;
      *p = r->next;
      g_stack_cached -= r->n;
      pthread_mutex_unlock(&g_stack_mu);
      return r;
    }
  pthread_mutex_unlock(&g_stack_mu);
  char* base = (char*)mmap(nullptr, stride * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
  if (base == (char*)MAP_FAILED) return nullptr;
  for (int i = 0; i < n; i++) mprotect(base + stride * i, 4096, PROT_NONE);
  Stacks* r = (Stacks*)malloc(sizeof(Stacks));
  if (!r) { munmap(base, stride * n); return nullptr; }
  *r = Stacks{base, stride, n, nullptr};
  return r;
}

KDA_EMU_RT inline void put_stacks(Stacks* s) {
  pthread_mutex_lock(&g_stack_mu);
  if (g_stack_cached + s->n <= 8192) {
    s->next = g_stack_cache;
    g_stack_cache = s;
    g_stack_cached += s->n;
    s = nullptr;
  }
  pthread_mutex_unlock(&g_stack_mu);
  if (s) { munmap(s->base, s->stride * s->n); free(s); }
}

KDA_EMU_RT inline void release_stacks() {
  pthread_mutex_lock(&g_stack_mu);
  Stacks* s = g_stack_cache;
  g_stack_cache = nullptr;
  g_stack_cached = 0;
  pthread_mutex_unlock(&g_stack_mu);
  while (s) {
    Stacks* nx = s->next;
    munmap(s->base, s->stride * s->n);
    free(s);
    s = nx;
  }
}

KDA_EMU_RT inline void* worker_main(void* arg) {
  Launch* L = (Launch*)arg;
  Worker w{};
  w.L = L;
  w.bdim = L->block;
  w.gdim = L->grid;
  w.n = (int)(L->block.x * L->block.y * L->block.z);
  w.nwarps = (w.n + 31) / 32;
  w.fibers = (Fiber*)calloc(w.n, sizeof(Fiber));
  w.warps = (Warp*)aligned_alloc(64, (sizeof(Warp) * w.nwarps + 63) / 64 * 64);
  w.ready = (int*)calloc(w.n, sizeof(int));
  w.wgs = (WarpGroup*)calloc((w.nwarps + 3) / 4, sizeof(WarpGroup));
  w.smem_size = L->smem;
  w.smem = (unsigned char*)aligned_alloc(128, (L->smem + 127) / 128 * 128 + 128);
  Stacks* stacks = get_stacks(w.n, L->stack_bytes + 4096);
  if (!w.fibers || !w.warps || !w.ready || !w.wgs || !w.smem || !stacks) {
    record_error(L, "emulator: out of memory for a block's fibers");
  } else {
    for (int i = 0; i < w.n; i++) {
      Fiber* f = &w.fibers[i];
      f->lin = i;
      f->tid = {(unsigned)(i % w.bdim.x), (unsigned)((i / w.bdim.x) % w.bdim.y),
                (unsigned)(i / (w.bdim.x * w.bdim.y))};
      f->lane = i & 31;
      f->warp = i >> 5;
      f->stack = stacks->base + stacks->stride * i + 4096;
    }
    Worker* saved = g_worker;
    g_worker = &w;
#ifdef KDA_EMU_CHECK
    if ((L->check || L->prof) && !checks_begin(&w)) {
      record_error(L, "emulator: out of memory for the checks' shadow memory");
    }
    if (L->prof && !prof_begin(&w)) record_error(L, "emulator: out of memory for the profile's counters");
#endif
    for (;;) {
      if (__atomic_load_n(&L->abort, __ATOMIC_RELAXED)) break;
      long long b = __atomic_fetch_add(&L->next, 1, __ATOMIC_RELAXED);
      if (b >= L->nblocks) break;
      run_block(&w, b);
    }
    g_worker = saved;
  }
  tmem_block_begin(&w);  // the last block's pending tcgen05.mma freed
  free(w.tm);
  if (w.fibers)
    for (int i = 0; i < w.n; i++) free(w.fibers[i].cp);
  if (w.wgs)
    for (int i = 0; i < (w.nwarps + 3) / 4; i++) {
      for (int k = 0; k < w.wgs[i].nops; k++) free(w.wgs[i].ops[k]);
      free(w.wgs[i].ops);
    }
  free(w.wgs);
  free(w.bulk);
  if (stacks) put_stacks(stacks);
#ifdef KDA_EMU_CHECK
  prof_end(&w);
  checks_end(&w);
#endif
  free(w.fibers);
  free(w.warps);
  free(w.ready);
  free(w.smem);
  return nullptr;
}

// cfg: grid x,y,z, block x,y,z, shared_mem bytes, OS threads, fiber stack bytes,
// mode bits (1: cp.async eager, 2: reverse fiber order), check bits (checks.h;
// checked builds only), then (instrumented builds only; 0: off) the address of the
// counters (PR_OUT long longs, zeroed by the caller), of the per-code-address rows
// and their capacity, of next (first byte, end) pairs: the allocation each array of
// ext lies in (0: the arrays themselves), and of next (region, DRAM bytes read,
// written) triples filled at the end (profile.h), and of the issue anchors' rows and
// their capacity (profile.h). ext: next (first byte, end, argument) triples.
KDA_EMU_RT inline int run_launch(void (*entry)(void*), void* ctx, const long long* cfg, const long long* ext,
                                 int next, char* err, int errlen) {
  auto bad = [&](const char* m) {
    snprintf(err, errlen, "%s", m);
    return 1;
  };
  for (int i = 0; i < 6; i++)
    if (cfg[i] < 1) return bad("grid and block dimensions must be >= 1");
  if (cfg[0] > 2147483647LL || cfg[1] > 65535 || cfg[2] > 65535) return bad("grid dimensions exceed the CUDA limits");
  if (cfg[3] > 1024 || cfg[4] > 1024 || cfg[5] > 64 || cfg[3] * cfg[4] * cfg[5] > 1024)
    return bad("block dimensions exceed the CUDA limits (at most 1024 threads, z <= 64)");
  if (cfg[6] < 0 || cfg[6] > 232448) return bad("shared_mem exceeds 227 KiB, the per-block limit of a Hopper GPU");
  Launch L{};
  L.entry = entry;
  L.ctx = ctx;
  L.grid = dim3((unsigned)cfg[0], (unsigned)cfg[1], (unsigned)cfg[2]);
  L.block = dim3((unsigned)cfg[3], (unsigned)cfg[4], (unsigned)cfg[5]);
  L.smem = (size_t)cfg[6];
  L.stack_bytes = ((size_t)(cfg[8] > 16384 ? cfg[8] : 16384) + 4095) / 4096 * 4096;
  L.nblocks = cfg[0] * cfg[1] * cfg[2];
  L.cp_eager = (cfg[9] & 1) != 0;
  L.reverse = (cfg[9] & 2) != 0;
  L.check = (unsigned)cfg[10];
  L.ext = ext;
  L.n_ext = next;
  L.prof_out = (long long*)(uintptr_t)cfg[11];
  L.prof_pcs = (long long*)(uintptr_t)cfg[12];
  L.prof_pc_cap = cfg[13];
  L.prof_allocs = (const long long*)(uintptr_t)cfg[14];
  L.prof_args = (long long*)(uintptr_t)cfg[15];
  L.prof_anchors = (long long*)(uintptr_t)cfg[16];
  L.prof_anchor_cap = cfg[17];
  L.prof = L.prof_out != nullptr;
#ifndef KDA_EMU_CHECK
  if (L.check) return bad("KDACUPY_EMULATE_CHECK needs a checked build (the loader makes one)");
  if (L.prof) return bad("KDACUPY_EMULATE_PROFILE needs an instrumented build (the loader makes one)");
#else
  if (L.prof && !prof_launch_begin(&L)) return bad("emulator: out of memory for the profile's sector maps");
  if (L.prof) __atomic_add_fetch(&kda_emu_prof_live, 1, __ATOMIC_RELAXED);
#endif
  pthread_mutex_init(&L.mu, nullptr);
  long long nw = cfg[7] < 1 ? 1 : cfg[7];
  if (nw > L.nblocks) nw = L.nblocks;
  pthread_t* th = (pthread_t*)calloc(nw, sizeof(pthread_t));
  int started = 0;
  for (long long i = 1; i < nw; i++)  // the calling thread is worker 0
    if (pthread_create(&th[started], nullptr, worker_main, &L) == 0) started++;
  worker_main(&L);
  for (int i = 0; i < started; i++) pthread_join(th[i], nullptr);
  free(th);
  fflush(stdout);  // kernel printf
  pthread_mutex_destroy(&L.mu);
#ifdef KDA_EMU_CHECK
  if (L.prof) prof_launch_end(&L), __atomic_sub_fetch(&kda_emu_prof_live, 1, __ATOMIC_RELAXED);
#endif
  if (L.err[0]) {
    snprintf(err, errlen, "%s", L.err);
    return 1;
  }
  return 0;
}

// -- typed entry points: unpack void** args like cuLaunchKernel's kernelParams --
template <class... A, size_t... I>
KDA_EMU_RT inline void call_kernel(void (*k)(A...), void* const* args, std::index_sequence<I...>) {
  k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

// KDA_EMU_NUMERICS=1 (hardware): fp32 arithmetic flushes subnormal inputs and results to
// zero for the launch, as CuPy's -ftz=true build does on the GPU (x86 MXCSR FTZ|DAZ, Arm
// FPCR.FZ); worker threads inherit it from the launching thread, which gets its mode back.
#ifndef KDA_EMU_NUMERICS
#define KDA_EMU_NUMERICS 0
#endif
struct FtzScope {
#if KDA_EMU_NUMERICS == 1 && (defined(__x86_64__) || defined(__i386__))
  unsigned saved = __builtin_ia32_stmxcsr();
  FtzScope() { __builtin_ia32_ldmxcsr(saved | 0x8040u); }
  ~FtzScope() { __builtin_ia32_ldmxcsr(saved); }
#elif KDA_EMU_NUMERICS == 1 && defined(__aarch64__)
  unsigned long saved;
  FtzScope() { __asm__ volatile("mrs %0, fpcr" : "=r"(saved)); __asm__ volatile("msr fpcr, %0" ::"r"(saved | (1ul << 24))); }
  ~FtzScope() { __asm__ volatile("msr fpcr, %0" ::"r"(saved)); }
#endif
};

template <class... A>
KDA_EMU_RT inline int launch(void (*k)(A...), const long long* cfg, void** args, int nargs, const long long* ext,
                             int next, char* err, int errlen) {
  if (nargs != (int)sizeof...(A)) {
    snprintf(err, errlen, "kernel takes %d argument(s), %d given", (int)sizeof...(A), nargs);
    return 1;
  }
  struct Ctx {
    void (*k)(A...);
    void** args;
  } ctx{k, args};
  auto entry = [](void* c) KDA_EMU_RT {
    Ctx* x = static_cast<Ctx*>(c);
    call_kernel(x->k, x->args, std::index_sequence_for<A...>{});
  };
  FtzScope ftz;
  return run_launch(entry, &ctx, cfg, ext, next, err, errlen);
}

template <class... A>
KDA_EMU_RT inline int arity(void (*)(A...)) {
  return (int)sizeof...(A);
}

// sizes[i] = byte size of parameter i; kinds[i] = 1 pointer, 2 floating, 0 other.
template <class... A>
KDA_EMU_RT inline void params(void (*)(A...), int* sizes, int* kinds) {
  int i = 0;
  ((sizes[i] = (int)sizeof(A), kinds[i] = std::is_pointer<A>::value ? 1 : std::is_floating_point<A>::value ? 2 : 0,
    i++),
   ...);
  (void)sizes;
  (void)kinds;
  (void)i;
}

}  // namespace kda_emu

// One per library: the loader calls it when another library launches, so only
// the most recently used kernel library keeps cached stacks.
extern "C" __attribute__((visibility("default"))) KDA_EMU_RT void kda_emu_release_stacks() { kda_emu::release_stacks(); }

extern "C" KDA_EMU_RT void kda_emu_fiber_main(kda_emu::Fiber* f) {
  kda_emu::Launch* L = kda_emu::g_worker->L;
  L->entry(L->ctx);
  kda_emu::thread_exit(f);
}

#define KDA_EMU_EXPORT(name)                                                                               \
  extern "C" __attribute__((visibility("default"))) KDA_EMU_RT int kda_emu_arity__##name() {               \
    return ::kda_emu::arity(&name);                                                                        \
  }                                                                                                        \
  extern "C" __attribute__((visibility("default"))) KDA_EMU_RT void kda_emu_params__##name(int* sizes,      \
                                                                                         int* kinds) {     \
    ::kda_emu::params(&name, sizes, kinds);                                                                \
  }                                                                                                        \
  extern "C" __attribute__((visibility("default"))) KDA_EMU_RT int kda_emu_launch__##name(                 \
      const long long* cfg, void** args, int nargs, const long long* ext, int next, char* err, int errlen) {  \
    return ::kda_emu::launch(&name, cfg, args, nargs, ext, next, err, errlen);                             \
  }

// ---- built-in variables (per fiber / per block) -------------------------------------
#ifdef KDA_EMU_CHECK  // through uninstrumented calls: the emulator's state is not the kernel's memory
namespace kda_emu {
KDA_EMU_RT inline uint3 tid_now() { return g_cur->tid; }
KDA_EMU_RT inline uint3 bid_now() { return g_worker->bid; }
KDA_EMU_RT inline dim3 bdim_now() { return g_worker->bdim; }
KDA_EMU_RT inline dim3 gdim_now() { return g_worker->gdim; }
}  // namespace kda_emu
#define threadIdx (::kda_emu::tid_now())
#define blockIdx (::kda_emu::bid_now())
#define blockDim (::kda_emu::bdim_now())
#define gridDim (::kda_emu::gdim_now())
#else
#define threadIdx (::kda_emu::g_cur->tid)
#define blockIdx (::kda_emu::g_worker->bid)
#define blockDim (::kda_emu::g_worker->bdim)
#define gridDim (::kda_emu::g_worker->gdim)
#endif
constexpr int warpSize = 32;

// ---- synchronisation -----------------------------------------------------------------
KDA_EMU_RT inline void __syncthreads() {
  KDA_EMU_ANCHOR(bar, KDA_EMU_PC);
  ::kda_emu::block_barrier(0, nullptr);
}
KDA_EMU_RT inline int __syncthreads_count(int p) {
  KDA_EMU_ANCHOR(bar, KDA_EMU_PC);
  return ::kda_emu::block_barrier(p, nullptr);
}
KDA_EMU_RT inline int __syncthreads_or(int p) {
  KDA_EMU_ANCHOR(bar, KDA_EMU_PC);
  return ::kda_emu::block_barrier(p, nullptr) != 0;
}
KDA_EMU_RT inline int __syncthreads_and(int p) {
  KDA_EMU_ANCHOR(bar, KDA_EMU_PC);
  int n;
  int c = ::kda_emu::block_barrier(p, &n);
  return c == n;
}
KDA_EMU_RT inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::kda_emu::check_mask(mask, "__syncwarp");
  ::kda_emu::warp_barrier(::kda_emu::g_cur, "__syncwarp", [] KDA_EMU_RT { ::kda_emu::g_worker->warps[::kda_emu::g_cur->warp].sync++; });
}
KDA_EMU_RT inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
KDA_EMU_RT inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] KDA_EMU_RT inline void __trap() { ::kda_emu::fail("__trap() called"); }
#ifndef assert
#define assert(e) ((e) ? (void)0 : ::kda_emu::fail("assertion failed: %s (%s:%d)", #e, __FILE__, __LINE__))
#endif

// ---- warp shuffles and votes -------------------------------------------------------
#ifdef KDA_EMU_CHECK
#define KDA_EMU_PROF_COUNT(which) ::kda_emu::prof_count(::kda_emu::which)
#else
#define KDA_EMU_PROF_COUNT(which) (void)0
#endif
namespace kda_emu {
enum ShflKind { SHFL_IDX, SHFL_XOR, SHFL_DOWN, SHFL_UP };
template <class T>
KDA_EMU_RT inline T shfl(unsigned mask, T v, int arg, int width, ShflKind kind, const char* what, uintptr_t pc) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
  check_mask(mask, what);
  KDA_EMU_ANCHOR(shfl, pc);
  (void)pc;
  if (width < 1 || width > 32 || (width & (width - 1))) fail("%s: width %d is not a power of two <= 32", what, width);
  Fiber* f = g_cur;
  Warp& wp = g_worker->warps[f->warp];
  int b = wp.buf, lane = f->lane;
  memcpy(wp.slot[b][lane], &v, sizeof(T));
  warp_barrier(f, what, [] KDA_EMU_RT { KDA_EMU_PROF_COUNT(PR_shuffles); });
  // PTX shfl.sync with CUDA's c operand: segmask = 32 - width, clamp 31 (0 for up).
  int segmask = 32 - width, bval = arg & 31;
  int minl = lane & segmask, maxl = minl | ((kind == SHFL_UP ? 0 : 31) & ~segmask), j = lane;
  bool ok = false;
  switch (kind) {
    case SHFL_IDX: j = minl | (bval & ~segmask); ok = j <= maxl; break;
    case SHFL_XOR: j = lane ^ bval; ok = j <= maxl; break;
    case SHFL_DOWN: j = lane + bval; ok = j <= maxl; break;
    case SHFL_UP: j = lane - bval; ok = j >= maxl; break;
  }
  int src = ok ? j : lane;
  T r;
  memcpy(&r, wp.slot[b][src], sizeof(T));
  return r;
}
KDA_EMU_RT inline unsigned ballot(unsigned mask, int pred, const char* what, uintptr_t pc) {
  check_mask(mask, what);
  KDA_EMU_ANCHOR(vote, pc);
  (void)pc;
  Fiber* f = g_cur;
  Warp& wp = g_worker->warps[f->warp];
  int b = wp.buf;
  wp.slot[b][f->lane][0] = pred != 0;
  warp_barrier(f, what, [] KDA_EMU_RT { KDA_EMU_PROF_COUNT(PR_shuffles); });
  unsigned r = 0;
  for (int i = 0; i < 32; i++) r |= (unsigned)wp.slot[b][i][0] << i;
  return r;
}
}  // namespace kda_emu

#define KDA_EMU_SHFL(T)                                                                   \
  KDA_EMU_RT inline T __shfl_sync(unsigned m, T v, int s, int w = 32) {                              \
    return ::kda_emu::shfl(m, v, s, w, ::kda_emu::SHFL_IDX, "__shfl_sync", KDA_EMU_PC);               \
  }                                                                                       \
  KDA_EMU_RT inline T __shfl_xor_sync(unsigned m, T v, int s, int w = 32) {                          \
    return ::kda_emu::shfl(m, v, s, w, ::kda_emu::SHFL_XOR, "__shfl_xor_sync", KDA_EMU_PC);           \
  }                                                                                       \
  KDA_EMU_RT inline T __shfl_down_sync(unsigned m, T v, unsigned s, int w = 32) {                    \
    return ::kda_emu::shfl(m, v, (int)s, w, ::kda_emu::SHFL_DOWN, "__shfl_down_sync", KDA_EMU_PC);    \
  }                                                                                       \
  KDA_EMU_RT inline T __shfl_up_sync(unsigned m, T v, unsigned s, int w = 32) {                      \
    return ::kda_emu::shfl(m, v, (int)s, w, ::kda_emu::SHFL_UP, "__shfl_up_sync", KDA_EMU_PC);        \
  }
KDA_EMU_SHFL(int)
KDA_EMU_SHFL(unsigned int)
KDA_EMU_SHFL(long)
KDA_EMU_SHFL(unsigned long)
KDA_EMU_SHFL(long long)
KDA_EMU_SHFL(unsigned long long)
KDA_EMU_SHFL(float)
KDA_EMU_SHFL(double)
#undef KDA_EMU_SHFL
KDA_EMU_RT inline unsigned __ballot_sync(unsigned m, int p) { return ::kda_emu::ballot(m, p, "__ballot_sync", KDA_EMU_PC); }
KDA_EMU_RT inline int __any_sync(unsigned m, int p) { return ::kda_emu::ballot(m, p, "__any_sync", KDA_EMU_PC) != 0; }
KDA_EMU_RT inline int __all_sync(unsigned m, int p) { return ::kda_emu::ballot(m, p, "__all_sync", KDA_EMU_PC) == 0xffffffffu; }

// ---- math and bit intrinsics -----------------------------------------------------------
inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T> inline T __ldg(const T* p) { return *p; }
// CUDA's global min/max overloads (int, unsigned, mixed signedness -> unsigned, 64-bit, float).
#define KDA_EMU_MINMAX(R, A, B)                                  \
  inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }   \
  inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
KDA_EMU_MINMAX(int, int, int)
KDA_EMU_MINMAX(unsigned int, unsigned int, unsigned int)
KDA_EMU_MINMAX(unsigned int, int, unsigned int)
KDA_EMU_MINMAX(unsigned int, unsigned int, int)
KDA_EMU_MINMAX(long, long, long)
KDA_EMU_MINMAX(unsigned long, unsigned long, unsigned long)
KDA_EMU_MINMAX(long long, long long, long long)
KDA_EMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
KDA_EMU_MINMAX(unsigned long long, long long, unsigned long long)
KDA_EMU_MINMAX(unsigned long long, unsigned long long, long long)
#undef KDA_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// ---- atomics (real atomics: blocks run on several OS threads) -----------------------------
#ifdef KDA_EMU_CHECK  // memcheck and aligncheck (not racecheck: atomics do not race with each other)
#define KDA_EMU_ATOMIC(p) ::kda_emu::on_atomic(p, sizeof *(p), KDA_EMU_PC)
#else
#define KDA_EMU_ATOMIC(p) (void)0
#endif
KDA_EMU_RT inline int atomicAdd(int* p, int v) {
  KDA_EMU_ATOMIC(p);
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
KDA_EMU_RT inline unsigned atomicAdd(unsigned* p, unsigned v) {
  KDA_EMU_ATOMIC(p);
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
KDA_EMU_RT inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  KDA_EMU_ATOMIC(p);
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
KDA_EMU_RT inline float atomicAdd(float* p, float v) {
  KDA_EMU_ATOMIC(p);
  unsigned* q = reinterpret_cast<unsigned*>(p);
  unsigned old = __atomic_load_n(q, __ATOMIC_RELAXED), nv;
  do nv = __float_as_uint(__uint_as_float(old) + v);
  while (!__atomic_compare_exchange_n(q, &old, nv, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return __uint_as_float(old);
}
KDA_EMU_RT inline int atomicMax(int* p, int v) {
  KDA_EMU_ATOMIC(p);
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

#include "ptx_twins.h"

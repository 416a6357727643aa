// The ONE place with inline PTX. Every wrapper here has a CPU twin of the same
// name and signature in kdacupy/emulate/ptx_twins.h (used when KDA_EMULATE is
// defined) and a unit test in tests/emulate/test_ptx_twins.py (the Hopper ones:
// tests/emulate/test_ptx_twins_async.py, the Blackwell ones: test_ptx_twins_tcgen05.py). Keep them in step.
// Fragment layouts (g = lane>>2, t = lane&3, lower index in the low 16 bits):
//   mma m16n8k16 A: a0=(g, 2t..2t+1) a1=(g+8, 2t..) a2=(g, 2t+8..) a3=(g+8, 2t+8..)
//                B: b0=(k 2t..2t+1, n g) b1=(k 2t+8..2t+9, n g)
//                C/D: c0,c1=(g, 2t,2t+1) c2,c3=(g+8, 2t,2t+1)
//   ldmatrix: lane 8i+j gives row j of matrix i; r[i] = matrix i (row l/4, cols 2(l%4)..+1);
//             .trans: r[i] = (row 2(l%4), col l/4) low, (row 2(l%4)+1, col l/4) high.
//   wgmma m64nNk16 (warp w = (thread / 32) % 4 of the warpgroup; g, t of its lane):
//                A: the mma A layout above, rows + 16w: a0=(16w+g, 2t..2t+1) a1=(16w+g+8, 2t..)
//                   a2=(16w+g, 2t+8..) a3=(16w+g+8, 2t+8..)
//                D: d[4j..4j+3] = the mma C/D layout of columns 8j..8j+7, rows + 16w:
//                   d[4j]=(16w+g, 8j+2t) d[4j+1]=(.., 8j+2t+1) d[4j+2]=(16w+g+8, 8j+2t) d[4j+3]
//                B (N x 16, bf16) in shared memory through a matrix descriptor (wgmma_desc below),
//                   element (k, n) at start + (swizzle W bytes: 0 none, 128, 64, 32):
//                   K-major (rows of n, k contiguous): none (n%8)*16 + (n/8)*SBO + (k/8)*LBO + (k%8)*2
//                                                      W    (n%8)*W + (n/8)*SBO + k*2
//                   N-major (rows of k, n contiguous): none (k%8)*16 + (k/8)*LBO + (n/8)*SBO + (n%8)*2
//                                                      W    (k%8)*W + (k/8)*SBO + (n/(W/2))*LBO + (n%(W/2))*2
//                   then, swizzled, address bits [4, 4+log2(W/16)) ^= bits [7, ..): a pattern starts
//                   at a multiple of 8*W in the shared window (base offset 0), so align tiles by
//                   smem_u32(), not by generic pointers.
#pragma once
#include "types.cuh"

#ifndef KDA_EMULATE

namespace kda_ptx_detail {
// 32-bit .shared address of a generic pointer into shared memory (what ldmatrix / cp.async take).
// NVRTC's builtin, not an asm cvta: the compiler then knows the conversion and does a tile's address
// arithmetic in 32 bits, folding offsets (the asm kept every address a 64-bit generic one, converted at
// each use: 10-13% of kda_bwd_chunk's, kda_bwd_chain's and the mma.sync recurrence's instructions).
// A kernel that defines KDA_SMEM_ADDR_ASM keeps the asm (kda_bwd_chain at K = 256, whose 255-register
// variants spilled 4-24 bytes more with the builtin).
__device__ __forceinline__ u32 smem_addr(const void* p) {
#if defined(KDA_SMEM_ADDR_ASM) && KDA_SMEM_ADDR_ASM
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
#else
  return static_cast<u32>(__cvta_generic_to_shared(p));
#endif
}
}  // namespace kda_ptx_detail

// Two floats -> packed bf16x2, round-to-nearest-even; PTX puts operand a in the HIGH half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Two floats -> packed f16x2, round-to-nearest-even; same operand order as above.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// float -> bf16 bits, round-to-nearest-even (no cuda_bf16.h available under NVRTC here).
__device__ __forceinline__ u16 f32_to_bf16(float x) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}
// float -> f16 bits, round-to-nearest-even (subnormals kept, overflow -> inf).
__device__ __forceinline__ u16 f32_to_f16(float x) {
  u16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}
// f16 bits -> float (exact).
__device__ __forceinline__ float f16_to_f32(u16 h) {
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
  return r;
}
// 2^x on the SFU; subnormal inputs and results flush to zero.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// log2(x) on the SFU; subnormal inputs flush to zero (-> -inf).
__device__ __forceinline__ float lg2_approx_ftz(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// 1/sqrt(x) on the SFU; subnormal inputs flush to zero (-> inf).
__device__ __forceinline__ float rsqrt_approx_ftz(float x) {
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// 1/x on the SFU; subnormal inputs and results flush to zero.
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// tanh(x) in one SFU instruction (sm_75+).
__device__ __forceinline__ float tanh_approx(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Two fp32 lanes in one instruction where sm_100 has it (FFMA2, FADD2, FMUL2: fma / sub / mul / add .f32x2),
// each lane rounded once as its scalar twin (fmaf, -, *, +), subnormals flushed as the -ftz=true build's
// scalar ones; elsewhere the two scalar operations. d = (a.x op b.x [+ c.x], a.y op b.y [+ c.y]).
#if __CUDA_ARCH__ >= 1000
__device__ __forceinline__ float2 fma2_ftz(float2 a, float2 b, float2 c) {
  float2 d;
  asm("{ .reg .b64 a, b, c, d;\n\t mov.b64 a, {%2, %3};\n\t mov.b64 b, {%4, %5};\n\t mov.b64 c, {%6, %7};\n\t"
      "fma.rn.ftz.f32x2 d, a, b, c;\n\t mov.b64 {%0, %1}, d; }"
      : "=f"(d.x), "=f"(d.y) : "f"(a.x), "f"(a.y), "f"(b.x), "f"(b.y), "f"(c.x), "f"(c.y));
  return d;
}
__device__ __forceinline__ float2 sub2_ftz(float2 a, float2 b) {
  float2 d;
  asm("{ .reg .b64 a, b, d;\n\t mov.b64 a, {%2, %3};\n\t mov.b64 b, {%4, %5};\n\t"
      "sub.rn.ftz.f32x2 d, a, b;\n\t mov.b64 {%0, %1}, d; }"
      : "=f"(d.x), "=f"(d.y) : "f"(a.x), "f"(a.y), "f"(b.x), "f"(b.y));
  return d;
}
__device__ __forceinline__ float2 mul2_ftz(float2 a, float2 b) {
  float2 d;
  asm("{ .reg .b64 a, b, d;\n\t mov.b64 a, {%2, %3};\n\t mov.b64 b, {%4, %5};\n\t"
      "mul.rn.ftz.f32x2 d, a, b;\n\t mov.b64 {%0, %1}, d; }"
      : "=f"(d.x), "=f"(d.y) : "f"(a.x), "f"(a.y), "f"(b.x), "f"(b.y));
  return d;
}
__device__ __forceinline__ float2 add2_ftz(float2 a, float2 b) {
  float2 d;
  asm("{ .reg .b64 a, b, d;\n\t mov.b64 a, {%2, %3};\n\t mov.b64 b, {%4, %5};\n\t"
      "add.rn.ftz.f32x2 d, a, b;\n\t mov.b64 {%0, %1}, d; }"
      : "=f"(d.x), "=f"(d.y) : "f"(a.x), "f"(a.y), "f"(b.x), "f"(b.y));
  return d;
}
#else
__device__ __forceinline__ float2 fma2_ftz(float2 a, float2 b, float2 c) {
  return make_float2(fmaf(a.x, b.x, c.x), fmaf(a.y, b.y, c.y));
}
__device__ __forceinline__ float2 sub2_ftz(float2 a, float2 b) { return make_float2(a.x - b.x, a.y - b.y); }
__device__ __forceinline__ float2 mul2_ftz(float2 a, float2 b) { return make_float2(a.x * b.x, a.y * b.y); }
__device__ __forceinline__ float2 add2_ftz(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
#endif

// Four 8x8 b16 matrices from shared memory; every lane gives one 16-byte row address.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(kda_ptx_detail::smem_addr(smem_row))
               : "memory");
}
// Same, each matrix transposed on the way (e.g. a K-major tile as the mma B operand).
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(kda_ptx_detail::smem_addr(smem_row))
               : "memory");
}
// Two 8x8 b16 matrices; lanes 0-15 give the row addresses (16-31 ignored).
__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(kda_ptx_detail::smem_addr(smem_row))
               : "memory");
}
// Two transposed 8x8 b16 matrices.
__device__ __forceinline__ void ldmatrix_x2_trans(u32 (&r)[2], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(kda_ptx_detail::smem_addr(smem_row))
               : "memory");
}

// D = A(16x16 bf16, row) * B(16x8 bf16, col) + C, fp32 accumulate, whole warp.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const u32 (&a)[4],
                                                  const u32 (&b)[2], const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
// Same with f16 inputs.
__device__ __forceinline__ void mma_f16_m16n8k16(float (&d)[4], const u32 (&a)[4],
                                                 const u32 (&b)[2], const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// Asynchronous 16-byte global->shared copy (L2 only, .cg); lands after cp_async_wait.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  asm volatile(
      "{ .reg .u64 g; cvta.to.global.u64 g, %1; cp.async.cg.shared.global [%0], [g], 16; }"
      :
      : "r"(kda_ptx_detail::smem_addr(smem_dst)), "l"(gmem_src)
      : "memory");
}
// Same, but writes 16 zero bytes (reads nothing) when !valid: bounds-checked tile edges.
__device__ __forceinline__ void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile(
      "{ .reg .u64 g; cvta.to.global.u64 g, %1; cp.async.cg.shared.global [%0], [g], 16, %2; }"
      :
      : "r"(kda_ptx_detail::smem_addr(smem_dst)), "l"(gmem_src), "r"(valid ? 16u : 0u)
      : "memory");
}
// Closes this thread's open group of cp.async copies.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most the N newest committed groups of this thread are pending
// (uncommitted copies are not waited for). Other threads need __syncthreads after.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The block's dynamic shared memory (size = the launch's shared_mem), 128-byte aligned.
__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char kda_dsmem[];
  return kda_dsmem;
}

// The 32-bit shared-window address of a pointer into shared memory (what descriptors encode).
__device__ __forceinline__ u32 smem_u32(const void* p) { return kda_ptx_detail::smem_addr(p); }

// ---- flags between blocks of one launch ---------------------------------------------------------
// A block hands data to another through global memory: the writer's stores, then st_release_gpu of
// a flag; the reader's ld_acquire_gpu of the flag, and once it sees the value its later reads see the
// stores (the PTX memory model's release / acquire at GPU scope). A reader spinning on a flag waits for
// a block that must be running: the launch's blocks have to be co-resident (the emulation's
// co_resident launches).
__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Spins on the flag at p until it reaches ``need`` (each read an acquire); returns the last value read.
// (The twin counts one read however long it spins: the model prices a wait as its producer ahead.)
__device__ __forceinline__ u32 wait_acquire_gpu_geq(const u32* p, u32 need) {
  u32 v;
  while ((v = ld_acquire_gpu(p)) < need) {
  }
  return v;
}
// Adds v to a counter with release semantics (the adder's earlier accesses before it): a count that
// several blocks each bump once they are done with something.
__device__ __forceinline__ void red_release_gpu_add(u32* p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- Hopper's asynchronous instructions --------------------------------------------------------
// mbarrier, bulk copies and the async-proxy fence exist from sm_90 on (sm_90a, sm_100a too); wgmma
// only on sm_90a (__CUDA_ARCH_FEAT_SM90_ALL: NVRTC defines it for -arch=sm_90a alone), so a kernel
// that calls them fails to compile elsewhere instead of running something else.
#if __CUDA_ARCH__ >= 900
// mbarrier in shared memory (8 bytes, 8-byte aligned): a phase completes when `count` arrivals
// and the transaction bytes expected of it have come; phases alternate parity 0, 1, 0, ...
__device__ __forceinline__ void mbarrier_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(kda_ptx_detail::smem_addr(bar)), "r"(count)
               : "memory");
}
// One arrival on the current phase.
__device__ __forceinline__ void mbarrier_arrive(u64* bar) {
  asm volatile("{ .reg .b64 s; mbarrier.arrive.shared::cta.b64 s, [%0]; }" ::"r"(kda_ptx_detail::smem_addr(bar))
               : "memory");
}
// One arrival, after adding `bytes` to the transaction bytes the current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u64* bar, u32 bytes) {
  asm volatile("{ .reg .b64 s; mbarrier.arrive.expect_tx.shared::cta.b64 s, [%0], %1; }"
               ::"r"(kda_ptx_detail::smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Whether the phase of parity `parity` completed (the thread may be suspended a while first).
__device__ __forceinline__ bool mbarrier_try_wait_parity(u64* bar, u32 parity) {
  u32 done;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done)
               : "r"(kda_ptx_detail::smem_addr(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
// Same, never suspending.
__device__ __forceinline__ bool mbarrier_test_wait_parity(u64* bar, u32 parity) {
  u32 done;
  asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done)
               : "r"(kda_ptx_detail::smem_addr(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared
// memory by the async proxy; its bytes count as transaction bytes of `bar`'s current phase.
__device__ __forceinline__ void cp_async_bulk_g2s(void* smem_dst, const void* gmem_src, u32 bytes, u64* bar) {
  asm volatile(
      "{ .reg .u64 g; cvta.to.global.u64 g, %1; "
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [g], %2, [%3]; }"
      :
      : "r"(kda_ptx_detail::smem_addr(smem_dst)), "l"(gmem_src), "r"(bytes), "r"(kda_ptx_detail::smem_addr(bar))
      : "memory");
}
// True on one lane of the warp, the same lane every time (the ISA does not say which); all 32 lanes
// execute it. A single-thread instruction of uniform operands (tcgen05.mma, its commit) issued under
// `warp == w && elect_one_sync()` is one instruction; under `tid == 0` ptxas wraps each in a loop
// over the active lanes (ELECT, predicate moves and a branch: 5 more instructions a product).
__device__ __forceinline__ bool elect_one_sync() {
  u32 elected;
  asm volatile("{ .reg .pred p; elect.sync _|p, 0xffffffff; selp.u32 %0, 1, 0, p; }" : "=r"(elected));
  return elected != 0;
}
// Orders this thread's generic-proxy shared-memory accesses before later async-proxy ones (wgmma
// operands, bulk copies) and after earlier ones: needed between a generic write and an async read.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The same for global memory: a block's generic view of global data (stores of its own, or another
// block's seen through an acquire), before its async-proxy reads of it (a bulk copy from global).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
#endif  // __CUDA_ARCH__ >= 900

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Warpgroup MMA (4 consecutive warps, the first a multiple of 4, all 128 threads together).
// Before the first wgmma reading registers (A or accumulators) that other instructions wrote.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Closes the warpgroup's open group of wgmma.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most the N newest committed groups are pending: the accumulators of the others
// are final only now (reading or writing them, or their A registers, before is undefined).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// No instruction: tells the compiler the registers change here, so it moves no access of the
// accumulators across a fence or wait (place it on both sides of a wgmma batch).
template <int R>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

namespace kda_ptx_detail {
#define KDA_WGMMA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define KDA_WGMMA_F16(i) KDA_WGMMA_F4(i), KDA_WGMMA_F4(i + 4), KDA_WGMMA_F4(i + 8), KDA_WGMMA_F4(i + 12)
#define KDA_WGMMA_D4 KDA_WGMMA_F4(0)
#define KDA_WGMMA_D8 KDA_WGMMA_F4(0), KDA_WGMMA_F4(4)
#define KDA_WGMMA_D16 KDA_WGMMA_F16(0)
#define KDA_WGMMA_D32 KDA_WGMMA_F16(0), KDA_WGMMA_F16(16)
#define KDA_WGMMA_D64 KDA_WGMMA_D32, KDA_WGMMA_F16(32), KDA_WGMMA_F16(48)
#define KDA_WGMMA_D128 KDA_WGMMA_D64, KDA_WGMMA_F16(64), KDA_WGMMA_F16(80), KDA_WGMMA_F16(96), KDA_WGMMA_F16(112)
template <int N>
struct Wgmma;
template <>
struct Wgmma<8> {
  template <int TRANS_B>
  static __device__ __forceinline__ void run(float (&d)[4], const u32 (&a)[4], u64 desc, u32 acc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %9, 0; "
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3"
        "}, {%4, %5, %6, %7}, %8, p, 1, 1, %10; }"
        : KDA_WGMMA_D4
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANS_B));
  }
};

template <>
struct Wgmma<16> {
  template <int TRANS_B>
  static __device__ __forceinline__ void run(float (&d)[8], const u32 (&a)[4], u64 desc, u32 acc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %13, 0; "
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7"
        "}, {%8, %9, %10, %11}, %12, p, 1, 1, %14; }"
        : KDA_WGMMA_D8
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANS_B));
  }
};

template <>
struct Wgmma<32> {
  template <int TRANS_B>
  static __device__ __forceinline__ void run(float (&d)[16], const u32 (&a)[4], u64 desc, u32 acc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %21, 0; "
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, {%16, %17, %18, %19}, %20, p, 1, 1, %22; }"
        : KDA_WGMMA_D16
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANS_B));
  }
};

template <>
struct Wgmma<64> {
  template <int TRANS_B>
  static __device__ __forceinline__ void run(float (&d)[32], const u32 (&a)[4], u64 desc, u32 acc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %37, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38; }"
        : KDA_WGMMA_D32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANS_B));
  }
};

template <>
struct Wgmma<128> {
  template <int TRANS_B>
  static __device__ __forceinline__ void run(float (&d)[64], const u32 (&a)[4], u64 desc, u32 acc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %69, 0; "
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70; }"
        : KDA_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANS_B));
  }
};

template <>
struct Wgmma<256> {
  template <int TRANS_B>
  static __device__ __forceinline__ void run(float (&d)[128], const u32 (&a)[4], u64 desc, u32 acc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %133, 0; "
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134; }"
        : KDA_WGMMA_D128
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANS_B));
  }
};
#undef KDA_WGMMA_F4
#undef KDA_WGMMA_F16
#undef KDA_WGMMA_D4
#undef KDA_WGMMA_D8
#undef KDA_WGMMA_D16
#undef KDA_WGMMA_D32
#undef KDA_WGMMA_D64
#undef KDA_WGMMA_D128
}  // namespace kda_ptx_detail

// D(64 x N, fp32) = A(64 x 16, bf16, registers) * B(16 x N, bf16, shared memory through b_desc)
// + (accumulate ? D : 0), issued asynchronously for the warpgroup (N = 8, 16, 32, 64, 128, 256;
// B_N_MAJOR: B's rows are k, n contiguous, else n rows of contiguous k). d is final after the
// wgmma_wait that covers its group; until then neither d nor a may be touched.
template <int N, bool B_N_MAJOR>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 2], const u32 (&a)[4], u64 b_desc, bool accumulate) {
  kda_ptx_detail::Wgmma<N>::template run<B_N_MAJOR ? 1 : 0>(d, a, b_desc, accumulate ? 1u : 0u);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---- Blackwell's fifth-generation tensor cores: tcgen05 and tensor memory (sm_100a only) -------
// Tensor memory (TMEM): 128 lanes x 512 columns of 32 bits a CTA; an address is lane << 16 | column.
// Allocated by columns (a power of 2 in [32, 512]) by one whole warp, which must free them before the
// CTA exits. tcgen05.mma is issued by ONE thread: D (TMEM, fp32) = A (shared memory, umma_desc) x
// B (shared memory) + (accumulate ? D : 0) (umma_bf16_ts: A from tensor memory); it completes
// asynchronously, signalled by umma_commit's arrival on an mbarrier (every earlier tcgen05.mma of the
// issuing thread). D's rows: M = 128, row i in lane i; M = 64, row i in lane 32 (i / 16) + i % 16 +
// (D's lane field: 0 or 16, each warp's quarter's first or last 16 lanes);
// column j in column (d's column) + j. tcgen05.ld 32x32b.xN: warp w (of its warpgroup, w = warp % 4)
// reads lanes 32w..32w+31, thread t lane 32w + t, N consecutive columns into r[0..N); r is undefined
// until tmem_wait_ld (tcgen05.st's writes land by tmem_wait_st). Across threads, tcgen05 work is
// ordered by tcgen05_fence_before_sync / _after_sync around the barrier or mbarrier wait.
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
__device__ __forceinline__ void tmem_alloc(u32* slot, u32 ncols) {  // whole warp; *slot = the base address
  asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(
                   kda_ptx_detail::smem_addr(slot)), "r"(ncols)
               : "memory");
}
__device__ __forceinline__ void tmem_relinquish() {  // whole warp: this CTA allocates no more
  asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void tmem_dealloc(u32 taddr, u32 ncols) {  // whole warp
  asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(taddr), "r"(ncols) : "memory");
}
// One thread: D at d_tmem (+)= A x B, bf16 operands, fp32 D, shapes and majors in idesc (umma_idesc_bf16).
__device__ __forceinline__ void umma_bf16(u32 d_tmem, u64 a_desc, u64 b_desc, u32 idesc, bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %4, 0; tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p; }" ::"r"(d_tmem),
      "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(accumulate ? 1u : 0u)
      : "memory");
}
// One thread: the same with A from tensor memory (a_tmem: A's first column, its lane field D's), K-major:
// row i in the lane D's row i takes, k16 step's 16 bf16 in 8 columns, k even in a column's low half
// (the ISA packs sub-word A elements contiguously in a 32-bit column). M = 64 (layout F, half the
// lanes): A and D at lane field 0 or 16, the same for both; M = 128: 0. No transposed A from here.
__device__ __forceinline__ void umma_bf16_ts(u32 d_tmem, u32 a_tmem, u64 b_desc, u32 idesc, bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %4, 0; tcgen05.mma.cta_group::1.kind::f16 [%0], [%1], %2, %3, p; }" ::"r"(d_tmem),
      "r"(a_tmem), "l"(b_desc), "r"(idesc), "r"(accumulate ? 1u : 0u)
      : "memory");
}
// One thread: one arrival on bar once every earlier tcgen05.mma of this thread completed.
__device__ __forceinline__ void umma_commit(u64* bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(
                   kda_ptx_detail::smem_addr(bar))
               : "memory");
}
namespace kda_ptx_detail {
template <int N>
struct TmemLd;
template <>
struct TmemLd<8> {
  static __device__ __forceinline__ void run(u32 taddr, float (&r)[8]) {
    asm volatile("tcgen05.ld.sync.aligned.32x32b.x8.b32 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8];"
                 : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]), "=f"(r[4]), "=f"(r[5]), "=f"(r[6]), "=f"(r[7])
                 : "r"(taddr));
  }
};
template <>
struct TmemLd<16> {
  static __device__ __forceinline__ void run(u32 taddr, float (&r)[16]) {
    asm volatile(
        "tcgen05.ld.sync.aligned.32x32b.x16.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
        "%15}, [%16];"
        : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]), "=f"(r[4]), "=f"(r[5]), "=f"(r[6]), "=f"(r[7]), "=f"(r[8]),
          "=f"(r[9]), "=f"(r[10]), "=f"(r[11]), "=f"(r[12]), "=f"(r[13]), "=f"(r[14]), "=f"(r[15])
        : "r"(taddr));
  }
};
// The 16-lane shapes (bits a lane 128 or 256; the PTX ISA's matrix fragments): 16x256b.xN, thread l's register r
// at lane l / 4 + 8 (r / 2 % 2) and column r % 2 + 2 (l % 4) + 8 (r / 4) from the address (8 N columns: the mma
// accumulator's layout, a thread two adjacent columns of two rows each 8 columns); 16x128b.xN, lane l / 4 +
// 8 (r % 2), column l % 4 + 4 (r / 2) (4 N columns). The address's lane field takes the first or the last 16
// lanes of the warp's quarter.
template <int SHAPE, int N>
struct TmemLdShape;
template <int SHAPE, int N>
struct TmemStShape;
template <>
struct TmemLdShape<256, 4> {
  static __device__ __forceinline__ void run(u32 taddr, float* r) {
    asm volatile(
        "tcgen05.ld.sync.aligned.16x256b.x4.b32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, [%16];"
        : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]), "=f"(r[4]), "=f"(r[5]), "=f"(r[6]), "=f"(r[7]),
          "=f"(r[8]), "=f"(r[9]), "=f"(r[10]), "=f"(r[11]), "=f"(r[12]), "=f"(r[13]), "=f"(r[14]), "=f"(r[15])
        : "r"(taddr));
  }
};
template <>
struct TmemStShape<256, 4> {
  static __device__ __forceinline__ void run(u32 taddr, const float* r) {
    asm volatile(
        "tcgen05.st.sync.aligned.16x256b.x4.b32 [%0], {"
        "%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16};"
        ::"r"(taddr),
          "f"(r[0]), "f"(r[1]), "f"(r[2]), "f"(r[3]), "f"(r[4]), "f"(r[5]), "f"(r[6]), "f"(r[7]),
          "f"(r[8]), "f"(r[9]), "f"(r[10]), "f"(r[11]), "f"(r[12]), "f"(r[13]), "f"(r[14]), "f"(r[15])
        : "memory");
  }
};
template <>
struct TmemLdShape<256, 8> {
  static __device__ __forceinline__ void run(u32 taddr, float* r) {
    asm volatile(
        "tcgen05.ld.sync.aligned.16x256b.x8.b32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];"
        : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]), "=f"(r[4]), "=f"(r[5]), "=f"(r[6]), "=f"(r[7]),
          "=f"(r[8]), "=f"(r[9]), "=f"(r[10]), "=f"(r[11]), "=f"(r[12]), "=f"(r[13]), "=f"(r[14]), "=f"(r[15]),
          "=f"(r[16]), "=f"(r[17]), "=f"(r[18]), "=f"(r[19]), "=f"(r[20]), "=f"(r[21]), "=f"(r[22]), "=f"(r[23]),
          "=f"(r[24]), "=f"(r[25]), "=f"(r[26]), "=f"(r[27]), "=f"(r[28]), "=f"(r[29]), "=f"(r[30]), "=f"(r[31])
        : "r"(taddr));
  }
};
template <>
struct TmemStShape<256, 8> {
  static __device__ __forceinline__ void run(u32 taddr, const float* r) {
    asm volatile(
        "tcgen05.st.sync.aligned.16x256b.x8.b32 [%0], {"
        "%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
        "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32};"
        ::"r"(taddr),
          "f"(r[0]), "f"(r[1]), "f"(r[2]), "f"(r[3]), "f"(r[4]), "f"(r[5]), "f"(r[6]), "f"(r[7]),
          "f"(r[8]), "f"(r[9]), "f"(r[10]), "f"(r[11]), "f"(r[12]), "f"(r[13]), "f"(r[14]), "f"(r[15]),
          "f"(r[16]), "f"(r[17]), "f"(r[18]), "f"(r[19]), "f"(r[20]), "f"(r[21]), "f"(r[22]), "f"(r[23]),
          "f"(r[24]), "f"(r[25]), "f"(r[26]), "f"(r[27]), "f"(r[28]), "f"(r[29]), "f"(r[30]), "f"(r[31])
        : "memory");
  }
};
template <>
struct TmemLdShape<128, 4> {
  static __device__ __forceinline__ void run(u32 taddr, float* r) {
    asm volatile("tcgen05.ld.sync.aligned.16x128b.x4.b32 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8];"
        : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]), "=f"(r[4]), "=f"(r[5]), "=f"(r[6]), "=f"(r[7])
        : "r"(taddr));
  }
};
template <>
struct TmemStShape<128, 4> {
  static __device__ __forceinline__ void run(u32 taddr, const float* r) {
    asm volatile(
        "tcgen05.st.sync.aligned.16x128b.x4.b32 [%0], {"
        "%1, %2, %3, %4, %5, %6, %7, %8};"
        ::"r"(taddr),
          "f"(r[0]), "f"(r[1]), "f"(r[2]), "f"(r[3]), "f"(r[4]), "f"(r[5]), "f"(r[6]), "f"(r[7])
        : "memory");
  }
};
template <>
struct TmemLdShape<128, 8> {
  static __device__ __forceinline__ void run(u32 taddr, float* r) {
    asm volatile(
        "tcgen05.ld.sync.aligned.16x128b.x8.b32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, [%16];"
        : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]), "=f"(r[4]), "=f"(r[5]), "=f"(r[6]), "=f"(r[7]),
          "=f"(r[8]), "=f"(r[9]), "=f"(r[10]), "=f"(r[11]), "=f"(r[12]), "=f"(r[13]), "=f"(r[14]), "=f"(r[15])
        : "r"(taddr));
  }
};
template <>
struct TmemStShape<128, 8> {
  static __device__ __forceinline__ void run(u32 taddr, const float* r) {
    asm volatile(
        "tcgen05.st.sync.aligned.16x128b.x8.b32 [%0], {"
        "%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16};"
        ::"r"(taddr),
          "f"(r[0]), "f"(r[1]), "f"(r[2]), "f"(r[3]), "f"(r[4]), "f"(r[5]), "f"(r[6]), "f"(r[7]),
          "f"(r[8]), "f"(r[9]), "f"(r[10]), "f"(r[11]), "f"(r[12]), "f"(r[13]), "f"(r[14]), "f"(r[15])
        : "memory");
  }
};
}  // namespace kda_ptx_detail
// Whole warp: thread t's N columns of lane 32 (warp % 4) + t from taddr (N = 8, 16); undefined until
// tmem_wait_ld.
template <int N>
__device__ __forceinline__ void tmem_ld_32x32b(u32 taddr, float (&r)[N]) {
  kda_ptx_detail::TmemLd<N>::run(taddr, r);
}
__device__ __forceinline__ void tmem_wait_ld() { asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory"); }
// Whole warp: thread t's 8 values to columns taddr.. of lane 32 (warp % 4) + t; complete (readable by a
// tcgen05.ld or tcgen05.mma) after tmem_wait_st.
__device__ __forceinline__ void tmem_st_32x32b_x8(u32 taddr, const float (&r)[8]) {
  asm volatile("tcgen05.st.sync.aligned.32x32b.x8.b32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8};" ::"r"(taddr),
               "f"(r[0]), "f"(r[1]), "f"(r[2]), "f"(r[3]), "f"(r[4]), "f"(r[5]), "f"(r[6]), "f"(r[7])
               : "memory");
}
__device__ __forceinline__ void tmem_wait_st() { asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory"); }
// Whole warp: the 16-lane shapes (kda_ptx_detail::TmemLdShape's layouts; N = 4 or 8): 4 N registers of
// 16x256b, 2 N of 16x128b, loaded (undefined until tmem_wait_ld) or stored (landed by tmem_wait_st).
template <int N>
__device__ __forceinline__ void tmem_ld_16x256b(u32 taddr, float (&r)[4 * N]) {
  kda_ptx_detail::TmemLdShape<256, N>::run(taddr, r);
}
template <int N>
__device__ __forceinline__ void tmem_st_16x256b(u32 taddr, const float (&r)[4 * N]) {
  kda_ptx_detail::TmemStShape<256, N>::run(taddr, r);
}
template <int N>
__device__ __forceinline__ void tmem_ld_16x128b(u32 taddr, float (&r)[2 * N]) {
  kda_ptx_detail::TmemLdShape<128, N>::run(taddr, r);
}
template <int N>
__device__ __forceinline__ void tmem_st_16x128b(u32 taddr, const float (&r)[2 * N]) {
  kda_ptx_detail::TmemStShape<128, N>::run(taddr, r);
}
__device__ __forceinline__ void tcgen05_fence_before_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
__device__ __forceinline__ void tcgen05_fence_after_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}
#endif  // __CUDA_ARCH_FEAT_SM100_ALL

#endif  // KDA_EMULATE

// ---- shared by the GPU and the emulation (no PTX) ----------------------------------------------
// Swizzle modes of a wgmma matrix descriptor (bits 62-63).
enum : int { WGMMA_SWIZZLE_NONE = 0, WGMMA_SWIZZLE_128B = 1, WGMMA_SWIZZLE_64B = 2, WGMMA_SWIZZLE_32B = 3 };
// The wgmma matrix descriptor of a tile at `tile` in shared memory (16-byte aligned; swizzled: its
// pattern aligned as above): bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45
// stride byte offset >> 4, 49-51 base offset (0), 62-63 swizzle. Offsets are multiples of 16.
__device__ __forceinline__ u64 wgmma_desc(const void* tile, u32 lead_bytes, u32 stride_bytes, int swizzle) {
  return (u64)((smem_u32(tile) & 0x3FFFFu) >> 4) | (u64)((lead_bytes & 0x3FFFFu) >> 4) << 16 |
         (u64)((stride_bytes & 0x3FFFFu) >> 4) << 32 | (u64)(swizzle & 3) << 62;
}
// The descriptor of the tile `bytes` (a multiple of 16) past desc's: an add to the start address (the
// low 14 bits, in 16-byte units; a shared address below 256 KB never carries out of them), so a tile's
// descriptor is built once and advanced, as CUTLASS's descriptor iterator does, not rebuilt from a
// generic pointer for every MMA. A plain 64-bit add (no carry reaches the high word): ptxas emits one
// UIADD3.64 into the MMA's descriptor registers, where masking the low word cost a ULOP3 and a UMOV of
// the high word more per wgmma. The sm_100 descriptor has the same start-address field.
__device__ __forceinline__ u64 wgmma_desc_add(u64 desc, u32 bytes) { return desc + (u64)(bytes >> 4); }

// The sm_100 shared-memory descriptor of a tcgen05.mma operand tile (the wgmma descriptor's fields, and
// bits 46-48 = 0b001, the version; swizzle in bits 61-63: 0 none, 2 128B, 4 64B, 6 32B). No-swizzle
// K-major tiles: 8-row x 16-byte core matrices, lead = the bytes between core matrices along K, stride =
// along M or N (the layouts of the header's wgmma B, for A too).
enum : int { UMMA_SWIZZLE_NONE = 0, UMMA_SWIZZLE_128B = 2, UMMA_SWIZZLE_64B = 4, UMMA_SWIZZLE_32B = 6 };
__device__ __forceinline__ u64 umma_desc(const void* tile, u32 lead_bytes, u32 stride_bytes, int swizzle) {
  return (u64)((smem_u32(tile) & 0x3FFFFu) >> 4) | (u64)((lead_bytes & 0x3FFFFu) >> 4) << 16 |
         (u64)((stride_bytes & 0x3FFFFu) >> 4) << 32 | 1ull << 46 | (u64)(swizzle & 7) << 61;
}
// The instruction descriptor of tcgen05.mma.kind::f16 with bf16 A and B and an fp32 D: bits 4-5 D's
// format (1 = f32), 7-9 A's and 10-12 B's (1 = bf16), 15 / 16 A / B major (0 K-major, 1 M / N-major),
// 17-22 N >> 3, 24-28 M >> 4; the rest 0 (dense, no negation, no saturation).
template <int M, int N, bool A_MN_MAJOR, bool B_MN_MAJOR>
__device__ __forceinline__ constexpr u32 umma_idesc_bf16() {
  static_assert((M == 64 && N % 8 == 0 && N >= 8 && N <= 256) || (M == 128 && N % 16 == 0 && N >= 16 && N <= 256),
                "tcgen05.mma cta_group::1 shapes: M = 64 (N a multiple of 8) or 128 (of 16), N <= 256");
  return 1u << 4 | 1u << 7 | 1u << 10 | (A_MN_MAJOR ? 1u : 0u) << 15 | (B_MN_MAJOR ? 1u : 0u) << 16 |
         (u32)(N >> 3) << 17 | (u32)(M >> 4) << 24;
}

#if defined(KDA_EMULATE) || __CUDA_ARCH__ >= 900
// Waits until the phase of parity `parity` of `bar` completed.
__device__ __forceinline__ void mbarrier_wait_parity(u64* bar, u32 parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}
#endif

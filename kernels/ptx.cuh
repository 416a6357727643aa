// The ONE place with inline PTX. Every wrapper here has a CPU twin of the same
// name and signature in kdacupy/emulate/ptx_twins.h (used when KDA_EMULATE is
// defined) and a unit test in tests/emulate/test_ptx_twins.py. Keep the two in step.
// Fragment layouts (g = lane>>2, t = lane&3, lower index in the low 16 bits):
//   mma m16n8k16 A: a0=(g, 2t..2t+1) a1=(g+8, 2t..) a2=(g, 2t+8..) a3=(g+8, 2t+8..)
//                B: b0=(k 2t..2t+1, n g) b1=(k 2t+8..2t+9, n g)
//                C/D: c0,c1=(g, 2t,2t+1) c2,c3=(g+8, 2t,2t+1)
//   ldmatrix: lane 8i+j gives row j of matrix i; r[i] = matrix i (row l/4, cols 2(l%4)..+1);
//             .trans: r[i] = (row 2(l%4), col l/4) low, (row 2(l%4)+1, col l/4) high.
#pragma once
#include "types.cuh"

#ifndef KDA_EMULATE

namespace kda_ptx_detail {
// 32-bit .shared address of a generic pointer into shared memory (what
// ldmatrix / cp.async take); no CUDA headers, so no __cvta_generic_to_shared.
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
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

#endif  // KDA_EMULATE

// A ring of chunk blocks in global memory between the blocks of one launch (docs/design.md section 5:
// the fused forward's hand-over): producer blocks fill a stream's slots, one chunk a slot, R slots a
// stream, and publish each by a ready flag; the stream's `ncons` consumer blocks acquire the flag, read
// the block (a bulk copy: fence.proxy.async.global first) and each release the slot once its reads are
// done; a producer refills slot c % R for chunk c once all consumers released the slot's chunk c - R.
//
// Per slot: ready = c + 1 when chunk c is in it (0: never filled), consumed = the releases of it, ncons
// for each chunk it held. A count per slot, not per stream: a consumer may run R chunks ahead of another,
// so a stream's total would let the fast one free a slot the slow one still has to read. The waits spin on
// thread 0 of a block and the block's barrier passes the acquire on to its other threads, so every block
// of the launch must be running: a launch of at most the device's resident blocks (the emulation's
// co_resident launches). Deadlock-free when producers take their (stream, chunk) items in chunk order (an
// atomic counter): a producer waits only on consumers, which wait only on items taken before it.
#pragma once
#include "ptx.cuh"

namespace kda {

// Producer, thread 0: spin until chunk c's slot is free (every consumer released the c / R chunks it held).
__device__ __forceinline__ void ring_wait_free(const u32* consumed, int c, int R, int ncons) {
  const u32 need = static_cast<u32>(c / R) * static_cast<u32>(ncons);
  wait_acquire_gpu_geq(consumed, need);
}
// Producer, thread 0, after the block's stores of the chunk and a __syncthreads: the slot holds chunk c.
__device__ __forceinline__ void ring_publish(u32* ready, int c) { st_release_gpu(ready, static_cast<u32>(c) + 1u); }
// Consumer, thread 0: spin until the slot holds chunk c; then a __syncthreads for the block's readers, and
// fence_proxy_async_global before a bulk copy reads the slot. False if it already holds a later chunk (a
// producer refilled it before this consumer released it: a broken protocol, reported, not waited on for ever).
__device__ __forceinline__ bool ring_wait_ready(const u32* ready, int c) {
  return wait_acquire_gpu_geq(ready, static_cast<u32>(c) + 1u) == static_cast<u32>(c) + 1u;
}
// Consumer, thread 0, after the block's last read of the slot (a __syncthreads, or the copy's mbarrier wait).
__device__ __forceinline__ void ring_release(u32* consumed) { red_release_gpu_add(consumed, 1u); }

}  // namespace kda

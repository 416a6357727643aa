"""kernels/chunk_ring.cuh: the fused forward's hand-over of chunk blocks between the blocks of one launch,
through a ring in global memory (docs/design.md section 5), on the emulation's co-resident launches.

Producer blocks take (stream, chunk) items in chunk order from a counter, wait for the item's slot to be
free, write a 64-word block and publish it; each stream's consumers acquire every chunk in turn, copy it
in by a bulk copy and release the slot. Every consumer must see every chunk of its stream intact, whatever
the ring's depth, the number of producers and of consumers a stream: a slot refilled before all its
consumers released it, or read before it was published, shows as a wrong word. tests/gpu/test_gpu_ptx.py
runs the same kernel on a GPU."""
import re
from pathlib import Path

import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, EmulationError

from .test_ptx_twins import kernel_source

pytestmark = pytest.mark.emulate

ROOT = Path(__file__).resolve().parents[2]

RING_KERNELS = r"""
// Blocks [0, NS * NCONS) consume stream b / NCONS, the rest produce. A chunk block is 64 words
// (s << 20 | c << 8 | t); seen[b] counts the chunks consumer b found intact.
// lag: acquiring loads thread 0 of a consumer makes between its copy's issue and its wait, so that a
// producer that refills a slot too early has the time to (each yields the OS thread in the emulation).
extern "C" __global__ void k_ring(u32* ring, u32* ready, u32* consumed, u32* ticket, u32* seen, int NS, int NCONS,
                                  int R, int nchunks, int lag) {
  unsigned char* sm = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(sm);
  u32* buf = reinterpret_cast<u32*>(sm + 128);
  __shared__ u32 item;
  const int b = blockIdx.x, t = threadIdx.x;
  if (b < NS * NCONS) {
    const int s = b / NCONS;
    if (t == 0) {
      mbarrier_init(bar, 1);
      fence_proxy_async_smem();
    }
    __syncthreads();
    u32 ok = 0;
    bool in_order = true;  // thread 0's: the slot held chunk c, not a later one
    for (int c = 0; c < nchunks; ++c) {
      const int slot = s * R + c % R;
      if (t == 0) {
        in_order = kda::ring_wait_ready(&ready[slot], c);
        fence_proxy_async_global();  // the producer's generic stores, before this bulk copy reads them
        mbarrier_arrive_expect_tx(bar, 256);
        cp_async_bulk_g2s(buf, ring + slot * 64, 256, bar);
        for (int i = 0; i < lag; ++i) (void)ld_acquire_gpu(ticket);
      }
      mbarrier_wait_parity(bar, c & 1);
      const u32 want = (u32)s << 20 | (u32)c << 8 | (u32)t;
      const int intact = __syncthreads_count(buf[t] == want);  // every read of buf done: the slot may go
      ok += intact == 64 && in_order;
      if (t == 0) kda::ring_release(&consumed[slot]);
    }
    if (t == 0) seen[b] = ok;
    return;
  }
  for (;;) {
    if (t == 0) item = atomicAdd(ticket, 1u);
    __syncthreads();
    const u32 it = item;
    if (it >= (u32)(NS * nchunks)) break;
    const int c = (int)it / NS, s = (int)it % NS, slot = s * R + c % R;  // chunk-major
    if (t == 0) kda::ring_wait_free(&consumed[slot], c, R, NCONS);
    __syncthreads();  // the slot is free for every thread's store (and item read by all)
    ring[slot * 64 + t] = (u32)s << 20 | (u32)c << 8 | (u32)t;
    __syncthreads();  // every store, before the publish (release, cumulative)
    if (t == 0) kda::ring_publish(&ready[slot], c);
  }
}
"""


def ring_source() -> str:
    header = (ROOT / "kernels" / "chunk_ring.cuh").read_text()
    return kernel_source(re.sub(r'^\s*#include\s+"[^"]*"\s*$', "", header, flags=re.M) + RING_KERNELS)


def ring_args(ns, ncons, R, nchunks):
    """The ring's arrays (ring, ready and consumed a slot, ticket, seen) and the kernel's scalars."""
    arrays = (np.zeros(ns * R * 64, np.uint32), np.zeros(ns * R, np.uint32), np.zeros(ns * R, np.uint32),
              np.zeros(1, np.uint32), np.zeros(ns * ncons, np.uint32))
    return arrays, (np.int32(ns), np.int32(ncons), np.int32(R), np.int32(nchunks), np.int32(LAG))


def check_ring(out, ns, ncons, R, producers, nchunks):
    ring, ready, consumed, ticket, seen = out
    assert list(seen) == [nchunks] * (ns * ncons)  # every consumer saw every chunk of its stream intact
    held = [len(range(r, nchunks, R)) for r in range(R)]  # the chunks each slot held
    assert list(consumed) == [n * ncons for _ in range(ns) for n in held]
    assert int(ticket[0]) == ns * nchunks + producers  # every item taken once, and one ticket past the end each
    last = [max(c for c in range(nchunks) if c % R == r) for r in range(R)]  # the chunk each slot held last
    assert list(ready) == [c + 1 for _ in range(ns) for c in last]


LAG = 20  # consumers slow enough that a too-early refill shows
CASES = [(2, 2, 1, 1), (3, 1, 2, 3), (2, 2, 3, 2), (1, 3, 2, 4)]  # streams, consumers a stream, depth, producers


@pytest.fixture(scope="module")
def mod():
    return EmulatedModule(ring_source(), names=["k_ring"])


@pytest.mark.parametrize("ns, ncons, R, producers", CASES, ids=[f"s{a}c{b}R{c}p{d}" for a, b, c, d in CASES])
def test_every_consumer_sees_every_chunk_intact(mod, monkeypatch, ns, ncons, R, producers):
    monkeypatch.setenv("KDACUPY_EMULATE_THREADS", "1")  # co_resident gives every block its own thread
    nchunks = 7
    arrays, scalars = ring_args(ns, ncons, R, nchunks)
    mod.get_function("k_ring")(ns * ncons + producers, 64, (*arrays, *scalars), shared_mem=128 + 256,
                               co_resident=True)
    check_ring(arrays, ns, ncons, R, producers, nchunks)


def test_racecheck_asks_for_the_global_proxy_fence_between_acquire_and_bulk_copy(monkeypatch):
    """A consumer's bulk copy after its acquire and without fence.proxy.async.global may read the slot's
    old bytes on a GPU (the producer's stores are the generic proxy's): racecheck names it; the ring with
    the fence runs clean."""
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "racecheck")
    monkeypatch.setenv("KDACUPY_EMULATE_THREADS", "1")
    fence = "fence_proxy_async_global();  // the producer's generic stores"
    source = ring_source()
    assert source.count(fence) == 1
    for text, ok in ((source, True), (source.replace(fence, "// (no fence)"), False)):
        arrays, scalars = ring_args(1, 1, 2, 3)
        run = EmulatedModule(text, names=["k_ring"]).get_function("k_ring")
        if ok:
            run(2, 64, (*arrays, *scalars), shared_mem=128 + 256, co_resident=True)
            check_ring(arrays, 1, 1, 2, 1, 3)
        else:
            with pytest.raises(EmulationError, match="after its ld.acquire with no fence.proxy.async.global"):
                run(2, 64, (*arrays, *scalars), shared_mem=128 + 256, co_resident=True)

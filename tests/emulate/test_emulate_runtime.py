"""The CUDA execution model of the CPU emulation: barriers, warps, blocks, shared memory,
atomics, errors, the build cache."""

import os
import re
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, EmulationError, find_compiler
from kdacupy.emulate import build as emu_build
from kdacupy.emulate import loader as emu_loader

ROOT = Path(__file__).resolve().parents[2]
FULL = np.uint32(0xFFFFFFFF)


def kernel_source(body: str) -> str:
    text = "".join((ROOT / "kernels" / f).read_text() for f in ("types.cuh", "ptx.cuh"))
    return re.sub(r'^\s*#include\s+"[^"]*"\s*$', "", text, flags=re.M) + body


KERNELS = r"""
// Shared-memory tree reduction: wrong without the barriers (a thread would read
// partial sums not yet written, or the 0xFF fill of dynamic shared memory).
extern "C" __global__ void tree_sum(const int* x, int* out, int* votes) {
  int* s = reinterpret_cast<int*>(dynamic_smem());
  int t = threadIdx.x, n = blockDim.x;
  s[t] = x[blockIdx.x * n + t];
  __syncthreads();
  for (int h = n / 2; h > 0; h /= 2) {
    if (t < h) s[t] += s[t + h];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
  int v = x[blockIdx.x * n + t];
  int c = __syncthreads_count(v > 0), o = __syncthreads_or(v > 1000), a = __syncthreads_and(v > -1000);
  if (t == 0) { votes[3 * blockIdx.x] = c; votes[3 * blockIdx.x + 1] = o; votes[3 * blockIdx.x + 2] = a; }
}

// Half the threads leave early; exited threads count as arrived at __syncthreads.
extern "C" __global__ void early_exit(int* out) {
  if (threadIdx.x >= 64) return;
  __shared__ int s[64];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
}

// One row of 32 results per (op, lane).
extern "C" __global__ void shuffles(const int* xi, const float* xf, const double* xd, const long long* xl,
                                    int* oi, float* of, double* od, long long* ol, unsigned* ov) {
  int l = threadIdx.x, k = 0;
  int vi = xi[l]; float vf = xf[l]; double vd = xd[l]; long long vl = xl[l];
  const int idx_src[] = {0, 5, 31, 37, -1};
  for (int s : idx_src) {
    oi[32 * k + l] = __shfl_sync(0xffffffffu, vi, s);
    of[32 * k + l] = __shfl_sync(0xffffffffu, vf, (s + l) & 31);
    od[32 * k + l] = __shfl_sync(0xffffffffu, vd, s, 8);
    ol[32 * k + l] = __shfl_sync(0xffffffffu, vl, s, 16);
    k++;
  }
  for (int m : {1, 3, 16, 9, 31}) {
    oi[32 * k + l] = __shfl_xor_sync(0xffffffffu, vi, m);
    of[32 * k + l] = __shfl_xor_sync(0xffffffffu, vf, m, 8);
    od[32 * k + l] = __shfl_xor_sync(0xffffffffu, vd, m, 16);
    ol[32 * k + l] = __shfl_xor_sync(0xffffffffu, vl, m);
    k++;
  }
  for (unsigned d : {1u, 4u, 17u}) {
    oi[32 * k + l] = __shfl_down_sync(0xffffffffu, vi, d);
    of[32 * k + l] = __shfl_down_sync(0xffffffffu, vf, d, 8);
    od[32 * k + l] = __shfl_up_sync(0xffffffffu, vd, d);
    ol[32 * k + l] = __shfl_up_sync(0xffffffffu, vl, d, 16);
    k++;
  }
  ov[4 * l] = __ballot_sync(0xffffffffu, vi & 1);
  ov[4 * l + 1] = __any_sync(0xffffffffu, vi == xi[7]);
  ov[4 * l + 2] = __all_sync(0xffffffffu, vi != 12345);
  ov[4 * l + 3] = __all_sync(0xffffffffu, l != 7);
}

extern "C" __global__ void dims(unsigned* out) {
  unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  unsigned* o = out + 12 * (b * nt + t);
  unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                    blockDim.x,  blockDim.y,  blockDim.z,  gridDim.x,  gridDim.y,  gridDim.z};
  for (int i = 0; i < 12; i++) o[i] = v[i] + (warpSize == 32 ? 0 : 1000);
}

// Reads the dynamic shared memory before writing it (expects the 0xFF fill),
// then passes values between threads through it.
extern "C" __global__ void smem_fill(unsigned* out, unsigned* addr_mod) {
  unsigned char* s = dynamic_smem();
  int t = threadIdx.x, nb = 64 * 4;
  unsigned all_ff = 1;
  for (int i = t; i < nb; i += blockDim.x) all_ff &= s[i] == 0xFF;
  __syncthreads();
  reinterpret_cast<unsigned*>(s)[t] = 1000u * blockIdx.x + t;
  __syncthreads();
  out[blockIdx.x * 64 + t] = all_ff ? reinterpret_cast<unsigned*>(s)[63 - t] : 0xDEADu;
  if (t == 0) addr_mod[blockIdx.x] = (unsigned)(reinterpret_cast<unsigned long long>(s) % 128);
}

extern "C" __global__ void atomics(int* i, unsigned* u, unsigned long long* ull, float* f, int* mx) {
  int g = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(i, 1);
  atomicAdd(u, 2u);
  atomicAdd(ull, 1ull << 33);
  atomicAdd(f, 0.5f);
  atomicMax(mx, (g * 7919) % 100003);
}

extern "C" __global__ void divergent_sync(int* out) {
  if (threadIdx.x & 16) __syncwarp(); else __syncthreads();
  out[threadIdx.x] = 1;
}

extern "C" __global__ void shfl_after_exit(int* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

extern "C" __global__ void partial_mask(int* out) {
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 0);
}

extern "C" __global__ void trap_if(int* out, int bad_block) {
  if (blockIdx.x == bad_block && threadIdx.x == 5) __trap();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 7;
}

extern "C" __global__ void ldmatrix_at(int offset, unsigned* out) {
  u32 r[4];
  ldmatrix_x4(r, dynamic_smem() + 16 * threadIdx.x + offset);
  out[threadIdx.x] = r[0];
}

extern "C" __global__ void cp_async_from(const float* g, int offset) {
  cp_async_16(dynamic_smem() + 16 * threadIdx.x, reinterpret_cast<const unsigned char*>(g) + offset);
  cp_async_commit();
  cp_async_wait<0>();
}

extern "C" __global__ void three_args(float* a, int n, float s) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) a[i] *= s;
}

// Warp 1 reads what warp 0 wrote with no __syncthreads between (a bug).
extern "C" __global__ void missing_barrier(int* out) {
  int* s = reinterpret_cast<int*>(dynamic_smem());
  if (threadIdx.x < 32) s[threadIdx.x] = threadIdx.x + 1;
  __syncwarp();  // orders one warp only
  if (threadIdx.x >= 32) out[threadIdx.x - 32] = s[threadIdx.x - 32];
}

// A barrier-heavy workload: rounds of 2 __syncthreads and a 5-step xor reduction.
extern "C" __global__ void workload(float* out, int rounds) {
  __shared__ float s[128];
  float v = (float)(threadIdx.x + blockIdx.x);
  for (int r = 0; r < rounds; r++) {
    s[threadIdx.x] = v;
    __syncthreads();
    v = s[(threadIdx.x + 1) % 128];
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    v *= 1.0f / 32;
  }
  out[blockIdx.x * 128 + threadIdx.x] = v;
}
"""
NAMES = re.findall(r'extern "C" __global__ void (\w+)', KERNELS)


@pytest.fixture(scope="module")
def mod():
    return EmulatedModule(kernel_source(KERNELS), NAMES)


def test_syncthreads_tree_reduction_and_vote_barriers(mod):
    rng = np.random.default_rng(1)
    x = rng.integers(-999, 999, (6, 256)).astype(np.int32)
    x[2] = np.abs(x[2]) + 1  # all positive: count 256, and 1
    x[4, 17] = 5000  # or 1
    out, votes = np.zeros(6, np.int32), np.zeros((6, 3), np.int32)
    mod.get_function("tree_sum")(6, 256, (x, out, votes), shared_mem=256 * 4)
    np.testing.assert_array_equal(out, x.sum(axis=1))
    np.testing.assert_array_equal(votes[:, 0], (x > 0).sum(axis=1))
    np.testing.assert_array_equal(votes[:, 1], (x > 1000).any(axis=1))
    np.testing.assert_array_equal(votes[:, 2], (x > -1000).all(axis=1))


def test_exited_threads_count_as_arrived(mod):
    out = np.zeros(64, np.int32)
    mod.get_function("early_exit")(1, 128, (out,))
    np.testing.assert_array_equal(out, 63 - np.arange(64))


# CUDA semantics (programming guide), written independently of the emulator.
def shfl_idx(v, src, width=32):
    return np.array([v[(lane // width) * width + src % width] for lane in range(32)])


def shfl_xor(v, m, width=32):  # a later group is out of reach: own value
    return np.array([v[lane ^ m] if (lane ^ m) // width <= lane // width else v[lane] for lane in range(32)])


def shfl_down(v, d, width=32):
    return np.array([v[lane + d] if (lane % width) + d < width else v[lane] for lane in range(32)])


def shfl_up(v, d, width=32):
    return np.array([v[lane - d] if (lane % width) - d >= 0 else v[lane] for lane in range(32)])


def test_warp_shuffles_and_votes(mod):
    rng = np.random.default_rng(2)
    xi = rng.integers(-1000, 1000, 32).astype(np.int32)
    xf = rng.standard_normal(32).astype(np.float32)
    xd = rng.standard_normal(32)
    xl = rng.integers(-(2 ** 62), 2 ** 62, 32).astype(np.int64)
    oi, of, od, ol = (np.zeros((13, 32), t) for t in (np.int32, np.float32, np.float64, np.int64))
    ov = np.zeros((32, 4), np.uint32)
    mod.get_function("shuffles")(1, 32, (xi, xf, xd, xl, oi, of, od, ol, ov))
    k = 0
    for s in (0, 5, 31, 37, -1):
        np.testing.assert_array_equal(oi[k], shfl_idx(xi, s))
        np.testing.assert_array_equal(of[k], [xf[(s + lane) & 31] for lane in range(32)])
        np.testing.assert_array_equal(od[k], shfl_idx(xd, s, 8))
        np.testing.assert_array_equal(ol[k], shfl_idx(xl, s, 16))
        k += 1
    for m in (1, 3, 16, 9, 31):
        np.testing.assert_array_equal(oi[k], shfl_xor(xi, m))
        np.testing.assert_array_equal(of[k], shfl_xor(xf, m, 8))
        np.testing.assert_array_equal(od[k], shfl_xor(xd, m, 16))
        np.testing.assert_array_equal(ol[k], shfl_xor(xl, m))
        k += 1
    for d in (1, 4, 17):
        np.testing.assert_array_equal(oi[k], shfl_down(xi, d))
        np.testing.assert_array_equal(of[k], shfl_down(xf, d, 8))
        np.testing.assert_array_equal(od[k], shfl_up(xd, d))
        np.testing.assert_array_equal(ol[k], shfl_up(xl, d, 16))
        k += 1
    ballot = sum(1 << lane for lane in range(32) if xi[lane] & 1)
    np.testing.assert_array_equal(ov, np.tile([ballot, 1, 1, 0], (32, 1)))


def test_grid_and_block_dims_3d(mod):
    grid, block = (3, 2, 2), (4, 8, 2)
    nb, nt = 12, 64
    out = np.zeros((nb, nt, 12), np.uint32)
    mod.get_function("dims")(grid, block, (out,))
    for b in range(nb):
        bx, by, bz = b % 3, (b // 3) % 2, b // 6
        for t in range(nt):
            tx, ty, tz = t % 4, (t // 4) % 8, t // 32
            assert list(out[b, t]) == [tx, ty, tz, bx, by, bz, *block, *grid]
    out1 = np.zeros((5, 32, 12), np.uint32)  # int grid and 1-tuple block
    mod.get_function("dims")(5, (32,), (out1,))
    assert list(out1[4, 31]) == [31, 0, 0, 4, 0, 0, 32, 1, 1, 5, 1, 1]


def test_dynamic_smem_fill_alignment_and_limit(mod, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_THREADS", "1")  # one OS thread reuses its buffer for every block
    out, mod128 = np.zeros((4, 64), np.uint32), np.ones(4, np.uint32)
    mod.get_function("smem_fill")(4, 64, (out, mod128), shared_mem=64 * 4)
    np.testing.assert_array_equal(out, 1000 * np.arange(4)[:, None] + 63 - np.arange(64)[None, :])
    np.testing.assert_array_equal(mod128, 0)
    with pytest.raises(EmulationError, match="227 KiB"):
        mod.get_function("smem_fill")(1, 64, (out, mod128), shared_mem=227 * 1024 + 16)
    mod.get_function("smem_fill")(1, 64, (out, mod128), shared_mem=227 * 1024)  # the limit itself is fine


def test_atomics_across_blocks(mod, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_THREADS", "2")
    i, u = np.zeros(1, np.int32), np.zeros(1, np.uint32)
    ull, f, mx = np.zeros(1, np.uint64), np.zeros(1, np.float32), np.full(1, -5, np.int32)
    nb, nt = 64, 128
    mod.get_function("atomics")(nb, nt, (i, u, ull, f, mx))
    n = nb * nt
    assert i[0] == n and u[0] == 2 * n and ull[0] == n << 33 and f[0] == 0.5 * n
    assert mx[0] == max((g * 7919) % 100003 for g in range(n))


def test_deadlock_is_reported(mod):
    with pytest.raises(EmulationError, match=r"deadlock in block \([01],0,0\).*__syncthreads.*__syncwarp"):
        mod.get_function("divergent_sync")((2,), 64, (np.zeros(64, np.int32),))


def test_warp_collective_errors(mod):
    out = np.zeros(64, np.int32)
    with pytest.raises(EmulationError, match="exited"):
        mod.get_function("shfl_after_exit")(1, 32, (out,))
    with pytest.raises(EmulationError, match="full-warp masks only"):
        mod.get_function("partial_mask")(1, 32, (out,))
    with pytest.raises(EmulationError, match="whole warps"):
        mod.get_function("workload")(1, 48, (out.view(np.float32), np.int32(1)))


def test_trap_aborts_the_launch_not_the_process(mod):
    out = np.zeros(4 * 64, np.int32)
    with pytest.raises(EmulationError, match=r"block \(2,0,0\) thread \(5,0,0\): __trap\(\) called"):
        mod.get_function("trap_if")(4, 64, (out, np.int32(2)))
    mod.get_function("trap_if")(4, 64, (out, np.int32(-1)))  # the module still works
    assert np.all(out == 7)


def test_address_checks(mod):
    out = np.zeros(32, np.uint32)
    mod.get_function("ldmatrix_at")(1, 32, (np.int32(0), out), shared_mem=512)
    assert np.all(out == 0xFFFFFFFF)
    with pytest.raises(EmulationError, match="not 16-byte aligned"):
        mod.get_function("ldmatrix_at")(1, 32, (np.int32(8), out), shared_mem=1024)
    with pytest.raises(EmulationError, match="not inside the block's dynamic shared memory"):
        mod.get_function("ldmatrix_at")(1, 32, (np.int32(16), out), shared_mem=512)
    g = np.zeros(256, np.float32)
    mod.get_function("cp_async_from")(1, 32, (g, np.int32(0)), shared_mem=512)
    with pytest.raises(EmulationError, match="global address .* not 16-byte aligned"):
        mod.get_function("cp_async_from")(1, 32, (g, np.int32(4)), shared_mem=512)


def test_argument_checks(mod):
    fn = mod.get_function("three_args")
    a = np.arange(10, dtype=np.float32)
    fn(1, 32, (a, np.int32(10), np.float32(2)))
    np.testing.assert_array_equal(a, 2 * np.arange(10))
    assert fn.arity == 3 and fn.param_sizes == (8, 4, 4)
    with pytest.raises(EmulationError, match="takes 3 argument"):
        fn(1, 32, (a, np.int32(10)))
    with pytest.raises(EmulationError, match="float32 given for a 4-byte integer"):
        fn(1, 32, (a, np.float32(10), np.float32(2)))
    with pytest.raises(EmulationError, match="int64 given for a 4-byte integer"):
        fn(1, 32, (a, np.int64(10), np.float32(2)))
    with pytest.raises(EmulationError, match="not C-contiguous"):
        fn(1, 32, (np.zeros((4, 4), np.float32)[:, 1], np.int32(4), np.float32(2)))
    with pytest.raises(EmulationError, match="not supported"):
        fn(1, 32, (a, 10, np.float32(2)))
    fn(1, 32, (np.uint64(0), np.int32(0), np.float32(1)))  # a null pointer, never dereferenced
    with pytest.raises(EmulationError, match="not among"):
        mod.get_function("nope")


def test_reverse_order_exposes_a_missing_barrier(mod, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_ORDER", "forward")
    out = np.zeros(32, np.int32)
    mod.get_function("missing_barrier")(1, 64, (out,), shared_mem=128)
    np.testing.assert_array_equal(out, np.arange(1, 33))  # forward order hides the bug
    monkeypatch.setenv("KDACUPY_EMULATE_ORDER", "reverse")
    mod.get_function("missing_barrier")(1, 64, (out,), shared_mem=128)
    np.testing.assert_array_equal(out, -1)  # warp 1 ran first: the 0xFF fill
    monkeypatch.setenv("KDACUPY_EMULATE_ORDER", "sideways")
    with pytest.raises(EmulationError, match="KDACUPY_EMULATE_ORDER"):
        mod.get_function("missing_barrier")(1, 64, (out,), shared_mem=128)


def test_launched_names_the_launches_in_order_with_no_instrumented_build(tmp_path, monkeypatch):
    """kdacupy.emulate.launched(): the kernel names of the launches inside the block, nested blocks each
    their own; plain launches stay plain (counting() would build the instrumented library)."""
    from kdacupy.emulate import launched

    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    tag = uuid.uuid4().int % 1000
    mod = EmulatedModule(kernel_source(f"""
extern "C" __global__ void first(int* o) {{ o[threadIdx.x] = {tag}; }}
extern "C" __global__ void second(int* o) {{ o[threadIdx.x] += 1; }}
"""), ["first", "second"])
    out = np.zeros(32, np.int32)
    before = emu_build.stats["compiled"]
    with launched() as outer:
        mod.get_function("first")(1, 32, (out,))
        with launched() as inner:
            mod.get_function("second")(1, 32, (out,))
        mod.get_function("second")(1, 32, (out,))
    mod.get_function("first")(1, 32, (out,))  # after the block: not recorded
    assert outer == ["first", "second", "second"] and inner == ["second"]
    assert emu_build.stats["compiled"] == before and not list((tmp_path / "emulate").glob("*.cpp"))
    np.testing.assert_array_equal(out, tag)


def test_build_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    src = kernel_source(f"""
extern "C" __global__ void cached(int* o) {{ o[threadIdx.x] = {uuid.uuid4().int % 1000} + threadIdx.x; }}
""")
    before = dict(emu_build.stats)
    t0 = time.perf_counter()
    EmulatedModule(src, ["cached"])
    build_s = time.perf_counter() - t0
    libs = list((tmp_path / "emulate").glob("*.so"))
    assert emu_build.stats["compiled"] == before["compiled"] + 1 and len(libs) == 1
    mtime = libs[0].stat().st_mtime_ns
    EmulatedModule(src, ["cached"])  # same process: no build, no disk look-up
    assert emu_build.stats["compiled"] == before["compiled"] + 1
    assert emu_build.stats["memory_hits"] == before["memory_hits"] + 1
    monkeypatch.setattr(emu_loader, "_loaded", {})  # as a new process would: found on disk
    m = EmulatedModule(src, ["cached"])
    assert emu_build.stats["compiled"] == before["compiled"] + 1
    assert emu_build.stats["disk_hits"] == before["disk_hits"] + 1
    assert libs[0].stat().st_mtime_ns == mtime and not list((tmp_path / "emulate").glob("*.tmp"))
    out = np.zeros(32, np.int32)
    m.get_function("cached")(1, 32, (out,))
    assert out[1] - out[0] == 1
    print(f"\nbuild of a small kernel: {build_s:.2f} s")


def test_processes_that_need_one_build_at_once_compile_it_once(tmp_path):
    """Two processes (as two pytest-xdist workers) ask for the same new variant at the same moment:
    one compiles it, the other waits on the key's lock and finds the library."""
    import subprocess
    import sys
    src = kernel_source(f'extern "C" __global__ void once(int* o) {{ o[threadIdx.x] = {uuid.uuid4().int % 1000}; }}')
    (tmp_path / "kernel.cu").write_text(src)
    go = tmp_path / "go"
    code = f"""
import pathlib, time
from kdacupy.emulate import build as b
src = pathlib.Path({str(tmp_path / "kernel.cu")!r}).read_text()
b.find_compiler(); b._version(b.find_compiler())
print("ready", flush=True)
while not pathlib.Path({str(go)!r}).exists():
    time.sleep(0.001)
b.build(src, ["once"])
print(b.stats["compiled"], flush=True)
"""
    env = dict(os.environ, KDACUPY_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    compiled = [int(p.communicate(timeout=120)[0].strip()) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(compiled) == [0, 1]
    assert len(list((tmp_path / "cache" / "emulate").glob("*.so"))) == 1


def test_builds_share_one_precompiled_prelude(tmp_path, monkeypatch):
    """g++ builds force-include cuda_emu.h through one precompiled header per compiler and flags;
    a damaged one is passed over (g++ then parses the header itself), never a wrong build."""
    if "clang" in emu_build._version(emu_build.find_compiler()).lower():
        pytest.skip("clang builds include cuda_emu.h itself (no precompiled prelude)")
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    tag = uuid.uuid4().int % 1000
    srcs = [kernel_source(f'extern "C" __global__ void k{i}(int* o) {{ o[threadIdx.x] = {tag + i} * threadIdx.x; }}')
            for i in range(3)]
    EmulatedModule(srcs[0], ["k0"])
    (gch,) = (tmp_path / "emulate" / "prelude").glob("*/cuda_emu.h.gch")
    EmulatedModule(srcs[1], ["k1"])
    assert list((tmp_path / "emulate" / "prelude").glob("*/cuda_emu.h.gch")) == [gch]  # the same flags: shared
    gch.write_bytes(gch.read_bytes()[:4096])  # damaged
    out = np.zeros(32, np.int32)
    EmulatedModule(srcs[2], ["k2"]).get_function("k2")(1, 32, (out,))
    np.testing.assert_array_equal(out, (tag + 2) * np.arange(32))


def test_missing_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/bin/g++")
    msg = re.escape("backend='emulate' needs a C++17 compiler (g++ or clang++) on PATH, or set CXX")
    with pytest.raises(EmulationError, match=msg):
        find_compiler()
    with pytest.raises(EmulationError, match=msg):
        EmulatedModule(kernel_source(f"// {uuid.uuid4()}\n"), [])


def test_compile_error_shows_compiler_output(monkeypatch, tmp_path):
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    with pytest.raises(EmulationError, match="emulation build failed(.|\n)*undeclared_thing"):
        EmulatedModule('extern "C" __global__ void bad(int* o) { o[0] = undeclared_thing; }', ["bad"])
    assert not [p for p in (tmp_path / "emulate").iterdir() if p.name not in ("prelude", "locks")]  # no partial file left behind
    assert not list((tmp_path / "emulate").glob("prelude/*/*.tmp"))


def test_fiber_workload(mod):
    """The fiber scheduler's cost: 32 blocks of 128 threads, 200 rounds of 2 __syncthreads
    and a 5-step xor-shuffle reduction (3.3 s with ucontext fibers). Functional check;
    the time is printed, not asserted."""
    out = np.zeros((32, 128), np.float32)
    t0 = time.perf_counter()
    mod.get_function("workload")(32, 128, (out, np.int32(200)))
    elapsed = time.perf_counter() - t0
    v = (np.arange(128)[None, :] + np.arange(32)[:, None]).astype(np.float32)
    lanes = np.arange(128)
    for _ in range(200):
        v = v[:, (lanes + 1) % 128]
        for o in (16, 8, 4, 2, 1):
            v = v + v[:, lanes ^ o]  # xor stays inside each warp of 32
        v = v * np.float32(1.0 / 32)
    np.testing.assert_array_equal(out, v)
    print(f"\nfiber workload (32 x 128 threads, 200 rounds): {elapsed:.3f} s "
          f"on {os.environ.get('KDACUPY_EMULATE_THREADS') or os.cpu_count()} OS threads")

"""The checks of the CPU emulation (KDACUPY_EMULATE_CHECK): one buggy probe kernel per class
must be reported as an EmulationError that says what and where; correct probes pass with the
results of the unchecked build; the deleted-barrier mutation of kda_recurrence is caught."""

import re
import shutil
import subprocess

import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, EmulationError, find_compiler
from kdacupy.emulate import build as emu_build

from .test_emulate_runtime import kernel_source

try:
    find_compiler()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"no host C++ compiler for the emulation: {e}", allow_module_level=True)

PROBES = r"""
// memcheck: y[i + wr] = x[i + rd] over one block per 32 elements.
extern "C" __global__ void copy_shifted(const float* x, float* y, int rd, int wr) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i + wr] = x[i + rd];
}

// memcheck: a store into the dynamic shared memory at thread + off.
extern "C" __global__ void smem_store(float* out, int off) {
  float* s = reinterpret_cast<float*>(dynamic_smem());
  s[threadIdx.x + off] = (float)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

// memcheck: a store into a static __shared__ array at thread + off.
extern "C" __global__ void static_store(int* out, int off) {
  __shared__ int s[64];
  s[threadIdx.x + off] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
}

// racecheck: warp 0 writes, warp 1 reads; `sync` 1: __syncthreads between, 0: only __syncwarp (a bug).
extern "C" __global__ void warp_handoff(int* out, int sync) {
  int* s = reinterpret_cast<int*>(dynamic_smem());
  if (threadIdx.x < 32) s[threadIdx.x] = threadIdx.x + 1;
  if (sync) __syncthreads(); else __syncwarp();
  if (threadIdx.x >= 32) out[threadIdx.x - 32] = s[threadIdx.x - 32];
}

// racecheck: lanes of one warp swap through shared memory; `sync` 0 drops the __syncwarp (a bug).
extern "C" __global__ void lane_swap(int* out, int sync) {
  int* s = reinterpret_cast<int*>(dynamic_smem());
  s[threadIdx.x] = 10 * threadIdx.x;
  if (sync) __syncwarp();
  out[threadIdx.x] = s[threadIdx.x ^ 1];
}

// racecheck: each thread refills the slot that its neighbour warp reads; `sync` 0 drops the
// __syncthreads between the reads and the refill (write-after-read).
extern "C" __global__ void refill(int* out, int sync) {
  int* s = reinterpret_cast<int*>(dynamic_smem());
  int t = threadIdx.x, n = blockDim.x;
  s[t] = t;
  __syncthreads();
  int v = s[(t + 32) % n];
  if (sync) __syncthreads();
  s[t] = v + 100;
  __syncthreads();
  out[t] = s[t];
}

// racecheck: a cp.async destination read before the cp_async_wait that covers it (a bug when `early`).
extern "C" __global__ void cp_async_read(const float* g, float* out, int early) {
  unsigned char* s = dynamic_smem();
  cp_async_16(s + 16 * threadIdx.x, g + 4 * threadIdx.x);
  cp_async_commit();
  float first = early ? reinterpret_cast<const float*>(s)[4 * threadIdx.x] : 0.f;
  cp_async_wait<0>();
  __syncthreads();
  out[threadIdx.x] = first + reinterpret_cast<const float*>(s)[4 * ((threadIdx.x + 1) % blockDim.x)];
}

// aligncheck: a `width`-byte vector load (8: float2, 16: float4) at x + off floats.
extern "C" __global__ void vec_load(const float* x, float* out, int off, int width) {
  float r;
  if (width == 16) {
    float4 v = reinterpret_cast<const float4*>(x + off)[threadIdx.x];
    r = v.x + v.y + v.z + v.w;
  } else {
    float2 v = reinterpret_cast<const float2*>(x + off)[threadIdx.x];
    r = v.x + v.y;
  }
  out[threadIdx.x] = r;
}

// memcheck: atomics on global memory; index + off.
extern "C" __global__ void atomic_at(int* c, int off) { atomicAdd(c + threadIdx.x % 4 + off, 1); }
"""
NAMES = re.findall(r'extern "C" __global__ void (\w+)', PROBES)
LINE = re.compile(r"at rendered line \d+ `")


@pytest.fixture(scope="module")
def mod():
    return EmulatedModule(kernel_source(PROBES), NAMES)


@pytest.fixture(autouse=True)
def default_modes(monkeypatch):  # the messages below name the first thread in the default order
    monkeypatch.delenv("KDACUPY_EMULATE_CP_ASYNC", raising=False)
    monkeypatch.delenv("KDACUPY_EMULATE_ORDER", raising=False)


@pytest.fixture
def checks(monkeypatch):
    def set_to(value):
        monkeypatch.setenv("KDACUPY_EMULATE_CHECK", value)
    set_to("all")
    return set_to


def caught(fn, *args, **kw) -> str:
    with pytest.raises(EmulationError) as e:
        fn(*args, **kw)
    return str(e.value)


def test_global_read_one_past_the_end(mod, checks):
    x, y = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    fn = mod.get_function("copy_shifted")
    fn(2, 32, (x, y, np.int32(0), np.int32(0)))  # in bounds
    np.testing.assert_array_equal(y, x)
    msg = caught(fn, 2, 32, (x, y, np.int32(1), np.int32(0)))
    # only thread 31 of block 1 reads x[64]
    assert msg.startswith("copy_shifted: block (1,0,0) thread (31,0,0): out of bounds: read of 4 bytes "
                          "at byte offset 256 of argument 0 (x) (256 bytes) at rendered line"), msg
    assert "`y[i + wr] = x[i + rd];`" in msg


def test_global_write_one_past_the_end(mod, checks):
    x, y = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    msg = caught(mod.get_function("copy_shifted"), 2, 32, (x, y, np.int32(0), np.int32(1)))
    assert "block (1,0,0) thread (31,0,0): out of bounds: write of 4 bytes at byte offset 256 of argument 1 (y)" \
        in msg and "`y[i + wr] = x[i + rd];`" in msg, msg


def test_write_past_dynamic_shared_memory_raises_and_the_process_goes_on(mod, checks):
    out = np.zeros(32, np.float32)
    fn = mod.get_function("smem_store")
    for off in (1, 32, 100):  # just past the end, a block past it, into the heap
        msg = caught(fn, 1, 32, (out, np.int32(off)), shared_mem=128)
        assert "out of bounds: write of 4 bytes at byte offset" in msg and "dynamic shared memory (128 bytes)" \
            in msg and "`s[threadIdx.x + off] = (float)threadIdx.x;`" in msg, msg
    assert "thread (31,0,0)" in caught(fn, 1, 32, (out, np.int32(1)), shared_mem=128)  # the first one over
    fn(1, 32, (out, np.int32(0)), shared_mem=128)  # the module still works
    np.testing.assert_array_equal(out, np.arange(32))


def test_static_shared_out_of_bounds(mod, checks):
    out = np.zeros(64, np.int32)
    fn = mod.get_function("static_store")
    fn(1, 64, (out, np.int32(0)))
    np.testing.assert_array_equal(out, 63 - np.arange(64))
    msg = caught(fn, 1, 64, (out, np.int32(64)))
    assert "out of bounds: write of 4 bytes" in msg and "`s[threadIdx.x + off] = threadIdx.x;`" in msg, msg


def test_missing_syncthreads_between_warps(mod, checks):
    out = np.zeros(32, np.int32)
    fn = mod.get_function("warp_handoff")
    fn(1, 64, (out, np.int32(1)), shared_mem=256)
    np.testing.assert_array_equal(out, np.arange(1, 33))
    msg = caught(fn, 1, 64, (out, np.int32(0)), shared_mem=256)
    m = re.search(r"racecheck: read-after-write hazard at byte offset (\d+) of the dynamic shared memory "
                  r"\(4-byte read\): thread \((\d+),0,0\) reads it at .*, thread \((\d+),0,0\) wrote it at .*, "
                  r"with no __syncthreads between", msg)
    assert m, msg
    off, reader, writer = (int(g) for g in m.groups())
    assert reader == writer + 32 and off == 4 * writer  # both threads and the address
    assert "`if (threadIdx.x < 32) s[threadIdx.x] = threadIdx.x + 1;`" in msg
    assert "`if (threadIdx.x >= 32) out[threadIdx.x - 32] = s[threadIdx.x - 32];`" in msg


def test_missing_syncwarp_between_lanes(mod, checks):
    out = np.zeros(32, np.int32)
    fn = mod.get_function("lane_swap")
    fn(1, 32, (out, np.int32(1)), shared_mem=128)
    np.testing.assert_array_equal(out, 10 * (np.arange(32) ^ 1))
    msg = caught(fn, 1, 32, (out, np.int32(0)), shared_mem=128)
    # thread 0 runs first: it reads s[1] before thread 1 writes it
    assert "thread (1,0,0): racecheck: write-after-read hazard at byte offset 4 " in msg, msg
    assert "thread (0,0,0) read it at" in msg and "no __syncthreads or __syncwarp between" in msg, msg


def test_write_after_read_without_barrier(mod, checks):
    out = np.zeros(64, np.int32)
    fn = mod.get_function("refill")
    fn(1, 64, (out, np.int32(1)), shared_mem=256)
    np.testing.assert_array_equal(out, (np.arange(64) + 32) % 64 + 100)
    msg = caught(fn, 1, 64, (out, np.int32(0)), shared_mem=256)
    assert re.search(r"(write-after-read|read-after-write) hazard", msg) and "`s[t] = v + 100;`" in msg, msg


def test_cp_async_destination_read_before_its_wait(mod, checks):
    g, out = np.arange(128, dtype=np.float32), np.zeros(32, np.float32)
    fn = mod.get_function("cp_async_read")
    fn(1, 32, (g, out, np.int32(0)), shared_mem=512)
    np.testing.assert_array_equal(out, 4 * ((np.arange(32) + 1) % 32))
    msg = caught(fn, 1, 32, (g, out, np.int32(1)), shared_mem=512)
    assert "before the cp_async_wait that covers its own cp.async" in msg and "cp_async_16(" in msg, msg


def test_misaligned_vector_loads(mod, checks):
    x, out = np.arange(256, dtype=np.float32), np.zeros(32, np.float32)
    fn = mod.get_function("vec_load")
    fn(1, 32, (x, out, np.int32(4), np.int32(16)))
    np.testing.assert_array_equal(out, [x[4 + 4 * i: 8 + 4 * i].sum() for i in range(32)])
    fn(1, 32, (x, out, np.int32(2), np.int32(8)))
    msg = caught(fn, 1, 32, (x, out, np.int32(1), np.int32(16)))  # 4-byte aligned
    assert re.search(r"thread \(0,0,0\): misaligned address: 16-byte read at byte offset 4 of argument 0 \(x\) "
                     r"\(1024 bytes\): address 0x[0-9a-f]+ is not 16-byte aligned at rendered line \d+ "
                     r"`float4 v = ", msg), msg
    msg = caught(fn, 1, 32, (x, out, np.int32(1), np.int32(8)))
    assert "misaligned address: 8-byte read at byte offset 4 of argument 0 (x)" in msg and "`float2 v = " in msg


def test_atomics_are_bounds_checked(mod, checks):
    c = np.zeros(4, np.int32)
    fn = mod.get_function("atomic_at")
    fn(1, 64, (c, np.int32(0)))
    np.testing.assert_array_equal(c, 16)
    msg = caught(fn, 1, 64, (c, np.int32(1)))
    assert "out of bounds: atomic write of 4 bytes at byte offset 16 of argument 0 (c) (16 bytes)" in msg, msg


def test_checks_are_selected_by_name(mod, checks):
    x, out = np.arange(256, dtype=np.float32), np.zeros(32, np.int32)
    checks("memcheck,aligncheck")
    mod.get_function("warp_handoff")(1, 64, (out, np.int32(0)), shared_mem=256)  # the race goes unseen
    checks(" racecheck ")
    mod.get_function("vec_load")(1, 32, (x, out.view(np.float32), np.int32(1), np.int32(16)))
    checks("racecheck,memcheck")
    assert "hazard" in caught(mod.get_function("warp_handoff"), 1, 64, (out, np.int32(0)), shared_mem=256)
    checks("memcheck,bogus")
    msg = caught(mod.get_function("warp_handoff"), 1, 64, (out, np.int32(1)), shared_mem=256)
    assert "KDACUPY_EMULATE_CHECK='memcheck,bogus' is not valid: expected a comma list of memcheck" in msg, msg


def test_memcheck_sees_the_extent_of_a_strided_view(mod, checks):
    from kdacupy.emulate import pointer
    base = np.arange(128, dtype=np.float32)
    view, y = base[::2], np.zeros(64, np.float32)  # spans base[0] .. base[126]: 127 floats
    fn = mod.get_function("copy_shifted")
    fn(2, 32, (pointer(view), y, np.int32(63), np.int32(0)))  # reads base[63..126], inside the span
    np.testing.assert_array_equal(y, base[63:127])
    msg = caught(fn, 2, 32, (pointer(view), y, np.int32(64), np.int32(0)))
    assert "out of bounds: read of 4 bytes at byte offset 508 of argument 0 (x) (508 bytes)" in msg, msg
    with pytest.raises(TypeError, match="expected a numpy array"):
        pointer([1.0])


def test_correct_probes_give_the_unchecked_results(mod, monkeypatch):
    """Every correct probe above, unchecked and under every check: bit-identical outputs."""
    g = np.arange(1024, dtype=np.float32) * np.float32(0.37)

    def run_all():
        outs = []
        for name, grid, block, args, smem in [
                ("copy_shifted", 2, 32, (g[:64], np.zeros(64, np.float32), np.int32(0), np.int32(0)), 0),
                ("smem_store", 1, 32, (np.zeros(32, np.float32), np.int32(0)), 128),
                ("static_store", 3, 64, (np.zeros(64, np.int32), np.int32(0)), 0),
                ("warp_handoff", 2, 64, (np.zeros(32, np.int32), np.int32(1)), 256),
                ("lane_swap", 1, 64, (np.zeros(64, np.int32), np.int32(1)), 256),
                ("refill", 2, 128, (np.zeros(128, np.int32), np.int32(1)), 512),
                ("cp_async_read", 1, 32, (g, np.zeros(32, np.float32), np.int32(0)), 512),
                ("vec_load", 1, 32, (g, np.zeros(32, np.float32), np.int32(8), np.int32(16)), 0),
                ("atomic_at", 4, 64, (np.zeros(8, np.int32), np.int32(4)), 0)]:
            mod.get_function(name)(grid, block, args, shared_mem=smem)
            outs.append([a.copy() for a in args if isinstance(a, np.ndarray)])
        return outs

    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "")
    plain = run_all()
    for mode in ("all", "memcheck", "racecheck", "aligncheck"):
        monkeypatch.setenv("KDACUPY_EMULATE_CHECK", mode)
        for a, b in zip(plain, run_all()):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)


def test_checked_builds_are_cached_apart_and_need_no_libtsan(tmp_path, monkeypatch):
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    src = kernel_source('extern "C" __global__ void tiny(int* o) { o[threadIdx.x] = 3 * threadIdx.x + 1; }\n')
    before = emu_build.stats["compiled"]
    plain = emu_build.build(src, ["tiny"])
    checked = emu_build.build(src, ["tiny"], checked=True)
    assert plain != checked and emu_build.stats["compiled"] == before + 2
    assert checked.with_suffix(".cpp").is_file()  # kept for the source locations
    assert emu_build.build(src, ["tiny"], checked=True) == checked and emu_build.stats["compiled"] == before + 2
    (hooks,) = (tmp_path / "emulate" / "hooks").glob("*.o")  # the hooks' object, compiled once ...
    stamp = hooks.stat().st_mtime_ns
    other = emu_build.build(src.replace("3 * threadIdx.x", "5 * threadIdx.x"), ["tiny"], checked=True)
    assert other != checked and list((tmp_path / "emulate" / "hooks").glob("*.o")) == [hooks]
    assert hooks.stat().st_mtime_ns == stamp  # ... and linked by the next instrumented build as it is
    readelf = shutil.which("readelf")
    if readelf:
        dyn = subprocess.run([readelf, "-d", "--dyn-syms", str(checked)], capture_output=True, text=True).stdout
        assert "NEEDED" in dyn and "tsan" not in dyn.replace("__tsan", "")  # hooks are ours, hidden
        assert "__tsan_read4" not in dyn


def test_deleted_recurrence_barrier_is_caught_by_racecheck(monkeypatch):
    """The __syncthreads that keeps kda_recurrence from refilling a pipeline stage while other
    warps still read it, deleted (in the rendered source only): racecheck catches the refill in
    the default cp.async mode, where the unchecked emulation computes the right result."""
    import kdacupy
    import kdacupy.jit.loaders as loaders
    import kdacupy.jit.render as jit
    import kdacupy.ops.forward.kernels as kernels
    from kdacupy.ops.forward.tuning import TileConfig

    from ..inputs import make_inputs
    barrier = "    __syncthreads();  // the stage is refilled by the next iteration's issue()\n"
    assert jit._read("kda_recurrence.cu").count(barrier) == 1
    real = jit._read
    monkeypatch.setattr(jit, "_read", lambda name: real(name).replace(barrier, "") if name == "kda_recurrence.cu"
                        else real(name))
    monkeypatch.setattr(kernels, "loader", lambda kind: loaders.EmulateLoader())  # no variant cached unmutated
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(64, 2))  # 4 warps per block
    monkeypatch.delenv("KDACUPY_EMULATE_CP_ASYNC", raising=False)
    x, opts = make_inputs(T=45, H=1, K=64, V=64, state=np.float32)
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "")
    kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")  # unseen without checks
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "racecheck")
    with pytest.raises(EmulationError) as e:
        kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
    msg = str(e.value)
    assert msg.startswith("kda_recurrence: block (") and "racecheck:" in msg, msg
    # the refill (the stage copy of kernels/chunk_stream.cuh, inlined in kda_recurrence) ...
    assert re.search(r"writes it at kernels/chunk_stream.cuh:\d+ `cp_async_16\(stage \+ dst,.*, inlined at "
                     r"kernels/kda_recurrence.cu:\d+ `", msg), msg
    assert re.search(r"read it at kernels/kda_recurrence.cu:\d+ `", msg), msg  # ... and where another thread reads the stage


def test_kernels_hand_the_launch_their_arrays(monkeypatch):
    """kdacupy.kernels passes every array with its extent: a workspace 16 bytes short is caught
    where kda_prepare writes past its end."""
    import kdacupy
    import kdacupy.ops.forward.kernels as kernels

    from ..inputs import make_inputs

    class ShortWorkspace:  # numpy, except that the uint8 workspace loses its last 16 bytes
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(shape, dtype):
            a = np.empty(shape, dtype)
            return a[:-16] if np.dtype(dtype) == np.uint8 else a

    x, opts = make_inputs(T=32, H=1, K=64, V=64)
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "memcheck")
    kdacupy.kda_forward(**x, **opts, backend="emulate")
    monkeypatch.setattr(kernels, "np", ShortWorkspace())
    with pytest.raises(EmulationError, match=r"^kda_prepare: block \(1,0,0\) thread \(\d+,0,0\): out of bounds: "
                       r"write of \d+ bytes at byte offset \d+ of argument 29 \(ws\) .* at kernels/kda_prepare.cu:"):
        kdacupy.kda_forward(**x, **opts, backend="emulate")

"""The emulation's hardware counters (KDACUPY_EMULATE_PROFILE=1, kdacupy/emulate/profile.h) on
probes whose counts are known by hand: one warp-level request per execution of an instruction,
shared-memory wavefronts with 32 banks of 4 bytes (broadcasts, 8/16-byte phases, ldmatrix per
matrix), global sectors of 32 bytes, DRAM bytes as distinct sectors, the dependent path's steps
and the bytes in flight (docs/design.md section 11.1); and the kernels' results with the
counters on are bit-identical to the plain build's."""
import re
from pathlib import Path

import numpy as np
import pytest

import kdacupy
from kdacupy.emulate import EmulatedModule, EmulationError, counting, hotspots, profile_records, profile_reset

from kdacupy.cli.roofline import HOPPER_LATENCY
from kdacupy.emulate.profile import PATH_KINDS

from ..cases import case_inputs
from .test_emulate_runtime import kernel_source

PROBES = r"""
// lane l reads the 4-byte word l * stride of the dynamic shared memory (stride 0: one word)
extern "C" __global__ void smem_load(float* out, int stride) {
  const float* s = reinterpret_cast<const float*>(dynamic_smem());
  out[threadIdx.x] = s[threadIdx.x * stride];
}
// lane l writes word l * stride
extern "C" __global__ void smem_store(int stride) {
  float* s = reinterpret_cast<float*>(dynamic_smem());
  s[threadIdx.x * stride] = 1.f;
}
// lane l reads the 8- (float2) or 16-byte (float4) element l * stride
extern "C" __global__ void smem_wide(float* out, int width, int stride) {
  const unsigned char* s = dynamic_smem();
  float r;
  if (width == 8) {
    float2 v = reinterpret_cast<const float2*>(s)[threadIdx.x * stride];
    r = v.x + v.y;
  } else {
    float4 v = reinterpret_cast<const float4*>(s)[threadIdx.x * stride];
    r = v.x + v.y + v.z + v.w;
  }
  out[threadIdx.x] = r;
}
// ldmatrix.x4: lane l gives row l at l * row_bytes; matrix m is rows 8m..8m+7
extern "C" __global__ void ldsm(unsigned* out, int row_bytes) {
  u32 r[4];
  ldmatrix_x4(r, dynamic_smem() + threadIdx.x * row_bytes);
  for (int i = 0; i < 4; ++i) out[i * 32 + threadIdx.x] = r[i];
}
// cp.async of 16 bytes per lane from g + 16 * l * stride bytes into 16 contiguous bytes per lane
extern "C" __global__ void cp16(const float* g, float* out, int stride) {
  unsigned char* s = dynamic_smem();
  cp_async_16(s + 16 * threadIdx.x, g + 4 * threadIdx.x * stride);
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  out[threadIdx.x] = reinterpret_cast<const float*>(s)[threadIdx.x];
}
// every block: lane l reads x[l * stride] and writes out[block * 32 + l]
extern "C" __global__ void gmem_load(const float* x, float* out, int stride) {
  out[blockIdx.x * 32 + threadIdx.x] = x[threadIdx.x * stride];
}
// x[l] += 1 in place; then the block writes y[l] and reads its neighbour's back into out[l]
extern "C" __global__ void write_read(float* x, float* y, float* out) {
  x[threadIdx.x] += 1.f;
  y[threadIdx.x] = 2.f;
  __syncthreads();
  out[threadIdx.x] = y[threadIdx.x ^ 1];
}
// the block writes x; then one bulk copy of x (written first) and one of y (not) into shared memory
extern "C" __global__ void bulk_after_write(float* x, const float* y, float* out) {
  unsigned char* s = dynamic_smem();
  u64* bar = reinterpret_cast<u64*>(s);
  float* buf = reinterpret_cast<float*>(s + 128);
  x[threadIdx.x] = 1.f;
  if (threadIdx.x == 0) mbarrier_init(bar, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_proxy_async_global();
    mbarrier_arrive_expect_tx(bar, 256);
    cp_async_bulk_g2s(buf, x, 128, bar);
    cp_async_bulk_g2s(buf + 32, y, 128, bar);
  }
  mbarrier_wait_parity(bar, 0);
  out[threadIdx.x] = buf[threadIdx.x] + buf[32 + threadIdx.x];
}
// n stores per lane in a loop (one request per iteration and warp); a local array is not device memory
extern "C" __global__ void loop_store(float* out, int n) {
  volatile float local[8];
  for (int i = 0; i < 8; ++i) local[i] = (float)i;
  for (int i = 0; i < n; ++i) out[i * blockDim.x + threadIdx.x] = local[i & 7];
}
// odd lanes run one ex2; two mma and two barriers per warp
extern "C" __global__ void units(float* out) {
  float x = out[blockIdx.x * blockDim.x + threadIdx.x];
  if (threadIdx.x & 1) x = ex2_approx_ftz(x);
  u32 a[4] = {0u, 0u, 0u, 0u}, b[2] = {0u, 0u};
  float c[4] = {x, 0.f, 0.f, 0.f};
  mma_bf16_m16n8k16(c, a, b, c);
  __syncthreads();
  mma_bf16_m16n8k16(c, a, b, c);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = c[0];
}
// n mma into one accumulator: with a new A fragment each step (new_a) or the same one
extern "C" __global__ void mma_steps(float* out, int n, int new_a) {
  u32 a[4] = {threadIdx.x + 1u, 2u, 3u, 4u}, b[2] = {1u, 1u};
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < n; ++i) {
    if (new_a) a[0] = a[0] * 3u + 1u;
    mma_bf16_m16n8k16(c, a, b, c);
  }
  out[threadIdx.x] = c[0];
}
// two global loads, then their sum stored (fenced: the second load after a store)
extern "C" __global__ void two_loads(const float* x, float* out, int fenced) {
  const float v = x[threadIdx.x];
  if (fenced) out[threadIdx.x] = v;
  const float w = x[threadIdx.x + 32];
  out[threadIdx.x + 32] = v + w;
}
// two barriers around a store
extern "C" __global__ void bars(float* out) {
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1.f;
  __syncthreads();
}
// n chunks of 16 bytes per thread through a two-stage cp.async pipeline (the recurrence's pattern)
extern "C" __global__ void cp_pipe(const float* g, float* out, int n) {
  unsigned char* s = dynamic_smem();
  float acc = 0.f;
  for (int c = -1; c < n; ++c) {
    if (c + 1 < n) cp_async_16(s + ((c + 1) % 2) * 1024 + 16 * threadIdx.x, g + 4 * threadIdx.x);
    cp_async_commit();
    if (c < 0) continue;
    cp_async_wait<1>();
    __syncthreads();
    acc += reinterpret_cast<const float*>(s + (c % 2) * 1024)[threadIdx.x];
    __syncthreads();
  }
  cp_async_wait<0>();
  out[threadIdx.x] = acc;
}
// a call left out of line, from two sites (lanes 0-15 at one, 16-31 at the other): ptxas inlines it, so
// each site's store is an instruction of its own, a request each
__device__ __noinline__ void store_at(float* out, int i) { out[i] = 1.f; }
extern "C" __global__ void two_sites(float* out) {
  if (threadIdx.x < 16) store_at(out, threadIdx.x);
  else store_at(out + 32, threadIdx.x);
}
"""
NAMES = ["two_sites", "smem_load", "smem_store", "smem_wide", "ldsm", "cp16", "gmem_load", "loop_store", "units",
         "mma_steps", "two_loads", "bars", "cp_pipe", "write_read", "bulk_after_write"]


@pytest.fixture(scope="module")
def probes():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KDACUPY_EMULATE_PROFILE", "1")
        yield EmulatedModule(kernel_source(PROBES), NAMES)


@pytest.fixture
def run(probes, monkeypatch):
    """run(name, grid, block, args, smem) -> the launch's record."""
    monkeypatch.setenv("KDACUPY_EMULATE_PROFILE", "1")

    def go(name, grid, block, args, smem=0):
        profile_reset()
        probes.get_function(name)(grid, block, args, shared_mem=smem)
        (rec,) = profile_records()
        assert rec["kernel"] == name
        return rec
    return go


def smem(rec):
    return rec["smem_requests"], rec["smem_wavefronts"], rec["smem_wavefronts_ideal"]


@pytest.mark.parametrize("stride, wavefronts", [(1, 1), (2, 2), (32, 32), (0, 1), (33, 1), (16, 16)])
def test_shared_loads_of_4_bytes(run, stride, wavefronts):
    rec = run("smem_load", 1, 32, (np.zeros(32, np.float32), np.int32(stride)), 32 * 33 * 4)
    assert smem(rec) == (1, wavefronts, 1)
    assert (rec["smem_load_requests"], rec["smem_store_requests"]) == (1, 0)


def test_shared_stores_count_as_stores(run):
    rec = run("smem_store", 1, 64, (np.int32(2),), 64 * 2 * 4)  # two warps, each 2-way
    assert smem(rec) == (2, 4, 2)
    assert (rec["smem_store_requests"], rec["smem_store_wavefronts"], rec["smem_load_requests"]) == (2, 4, 0)


@pytest.mark.parametrize("width, stride, wavefronts, ideal", [
    (16, 1, 4, 4),   # contiguous: one 128-byte quarter-warp phase each
    (16, 2, 8, 4),   # 32-byte stride: each phase spans 256 bytes, two lanes per bank group
    (8, 1, 2, 2),    # contiguous: two half-warp phases
    (8, 4, 8, 2),    # 32-byte stride: 4 lanes of a half-warp per bank pair
    (16, 0, 4, 4),   # every lane the same 16 bytes: a broadcast in each of the 4 phases
])
def test_shared_loads_of_8_and_16_bytes(run, width, stride, wavefronts, ideal):
    rec = run("smem_wide", 1, 32, (np.zeros(32, np.float32), np.int32(width), np.int32(stride)), 32 * 16 * 4)
    assert smem(rec) == (1, wavefronts, ideal)


@pytest.mark.parametrize("row_bytes, wavefronts", [(16, 4), (128, 32), (144, 4), (64, 16)])
def test_ldmatrix_one_phase_per_matrix(run, row_bytes, wavefronts):
    rec = run("ldsm", 1, 32, (np.zeros(128, np.uint32), np.int32(row_bytes)), 32 * 144)
    assert smem(rec) == (1, wavefronts, 4)
    assert rec["ldmatrix"] == 1
    assert (rec["gmem_store_requests"], rec["gmem_store_sectors"]) == (4, 16)


@pytest.mark.parametrize("stride, sectors", [(1, 16), (2, 32)])
def test_cp_async(run, stride, sectors):
    g = np.zeros(32 * 4 * stride, np.float32)
    rec = run("cp16", 1, 32, (g, np.zeros(32, np.float32), np.int32(stride)), 512)
    # the 16-byte shared writes (4 phases) and the 4-byte read back (1)
    assert smem(rec) == (2, 5, 5)
    assert (rec["cp_async_requests"], rec["cp_async_bytes"]) == (1, 512)
    assert (rec["gmem_load_requests"], rec["gmem_load_sectors"], rec["gmem_load_bytes"]) == (1, sectors, 512)


@pytest.mark.parametrize("stride, sectors", [(1, 4), (8, 32), (2, 8), (0, 1)])
def test_global_sectors_per_request(run, stride, sectors):
    x = np.zeros(32 * 8, np.float32)
    rec = run("gmem_load", 1, 32, (x, np.zeros(32, np.float32), np.int32(stride)))
    assert (rec["gmem_load_requests"], rec["gmem_load_sectors"]) == (1, sectors)
    assert rec["gmem_load_bytes"] == (4 if stride == 0 else 128)  # the distinct bytes asked for
    assert (rec["gmem_store_requests"], rec["gmem_store_sectors"], rec["gmem_store_bytes"]) == (1, 4, 128)
    assert rec["dram_read_bytes"] == 32 * sectors


def test_an_array_read_twice_is_read_once_from_dram(run):
    x = np.zeros(32, np.float32)
    rec = run("gmem_load", 3, 32, (x, np.zeros(96, np.float32), np.int32(1)))  # three blocks read all of x
    assert (rec["gmem_load_requests"], rec["gmem_load_sectors"]) == (3, 12)
    assert (rec["dram_read_bytes"], rec["dram_write_bytes"], rec["dram_bytes"]) == (128, 384, 512)
    assert rec["dram_by_argument"] == {"x": [128, 0], "out": [0, 384]}
    assert (rec["ctas"], rec["warps"]) == (3, 3)


def test_a_sector_written_first_is_read_from_l2_one_read_first_from_dram(run):
    x, y, out = np.zeros(32, np.float32), np.zeros(32, np.float32), np.zeros(32, np.float32)
    rec = run("write_read", 1, 32, (x, y, out))
    # x read then written in place: both ways; y written then read back: written only
    assert rec["dram_by_argument"] == {"x": [128, 128], "y": [0, 128], "out": [0, 128]}
    assert (rec["dram_read_bytes"], rec["dram_write_bytes"], rec["dram_bytes"]) == (128, 384, 384)
    assert rec["gmem_load_sectors"] == 8  # the requests still count every sector they touch


def test_a_bulk_copy_of_sectors_written_first_reads_them_from_l2(run):
    x, y, out = np.zeros(32, np.float32), np.full(32, 2, np.float32), np.zeros(32, np.float32)
    rec = run("bulk_after_write", 1, 32, (x, y, out), 512)
    np.testing.assert_array_equal(out, 3)
    assert rec["dram_by_argument"] == {"x": [0, 128], "y": [128, 0], "out": [0, 128]}
    assert rec["bulk_copy_bytes"] == 256


def test_sectors_count_from_the_allocation_not_the_view(run):
    base = np.zeros(64, np.float32)
    rec = run("gmem_load", 1, 32, (base[1:33], np.zeros(32, np.float32), np.int32(1)))  # 4 bytes in
    assert rec["gmem_load_sectors"] == 5
    same = np.zeros(64, np.float32)
    rec = run("gmem_load", 1, 32, (same, same[32:], np.int32(1)))  # one allocation: its sectors once
    assert (rec["gmem_sectors"], rec["dram_bytes"]) == (8, 256)


def test_loops_and_warps_group_by_occurrence_and_locals_are_not_device_memory(run):
    rec = run("loop_store", 1, 64, (np.zeros(4 * 64, np.float32), np.int32(4)))
    assert (rec["gmem_requests"], rec["gmem_sectors"], rec["gmem_bytes"]) == (8, 32, 1024)
    assert rec["smem_requests"] == 0 and rec["dram_bytes"] == 1024


def test_a_call_left_out_of_line_counts_a_request_per_call_site(run):
    rec = run("two_sites", 1, 32, (np.zeros(64, np.float32),))
    assert (rec["gmem_requests"], rec["gmem_store_requests"], rec["gmem_bytes"]) == (2, 2, 128)


def test_sfu_mma_barriers(run):
    rec = run("units", 3, 64, (np.zeros(3 * 64, np.float32),))
    assert (rec["sfu"], rec["sfu_lanes"]) == (6, 6 * 16)
    assert (rec["mma"], rec["barriers"], rec["ctas"], rec["warps"]) == (12, 6, 3, 6)


def path(rec, which="max"):
    """The dependent path's nonzero steps per kind."""
    return {k: rec[f"path_{which}_{k}"] for k in PATH_KINDS if rec[f"path_{which}_{k}"]}


@pytest.mark.parametrize("new_a, mma", [(1, 5), (0, 1)])
def test_the_path_chains_mma_over_new_a_fragments(run, new_a, mma):
    """Each new A fragment waits for the results so far: 5 dependent mma; one fragment for all 5:
    they issue a clock apart, and the store waits for the last (4 issues, 1 mma, its own issue)."""
    rec = run("mma_steps", 1, 32, (np.zeros(32, np.float32), np.int32(5), np.int32(new_a)))
    assert path(rec) == ({"mma": 5, "issue": 1} if new_a else {"mma": 1, "issue": 5})


@pytest.mark.parametrize("fenced, steps", [(0, {"dram": 1, "issue": 2}), (1, {"dram": 2, "issue": 2})])
def test_loads_overlap_until_a_store_fences_them(run, fenced, steps):
    """Two loads issue a clock apart and the sum waits for both: one DRAM latency, both loads' 128
    bytes in flight at once; a store between them keeps the second load after it (after the first
    one's data): two latencies, 128 bytes in flight at a time."""
    rec = run("two_loads", 1, 32, (np.zeros(64, np.float32), np.zeros(64, np.float32), np.int32(fenced)))
    assert path(rec) == steps
    assert rec["inflight_peak_bytes"] == (128 if fenced else 256)


def test_barriers_align_the_warps_and_the_longest_cta_is_kept(run):
    rec = run("bars", 5, 64, (np.zeros(5 * 64, np.float32),))
    assert path(rec) == {"barrier": 2, "issue": 1}  # barrier, store, barrier
    assert path(rec, "sum") == {"barrier": 10, "issue": 5}  # the 5 CTAs alike


@pytest.mark.parametrize("n", [4, 8])
def test_a_two_stage_cp_async_pipeline_waits_half_its_chunks(run, n):
    """Chunk c + 1's copies leave as chunk c starts; with almost nothing to compute, chunk c + 1's
    wait finds them a DRAM latency after chunk c's: every other chunk's wait is on the path. Both
    stages' 1 KB are in flight at once."""
    rec = run("cp_pipe", 1, 64, (np.zeros(256, np.float32), np.zeros(64, np.float32), np.int32(n)), 2048)
    assert rec["path_max_dram"] == n // 2 and rec["path_max_mma"] == 0
    assert rec["inflight_peak_bytes"] == 2048


def test_profile_h_picks_paths_with_the_roofline_s_hopper_latencies():
    text = (Path(__file__).resolve().parents[2] / "kdacupy" / "emulate" / "profile.h").read_text()
    kinds = re.search(r"enum : int \{ (PK_[^}]*)\}", text).group(1).replace("PK_", "").replace(" ", "").split(",")
    ref = [int(x) for x in re.search(r"PATH_REF\[PK_N\] = \{([^}]*)\}", text).group(1).split(",")]
    assert tuple(kinds[:-1]) == PATH_KINDS and kinds[-1] == "N"
    assert dict(zip(PATH_KINDS, ref)) == HOPPER_LATENCY


def test_hotspots_name_the_source_line(run):
    rec = run("smem_load", 1, 32, (np.zeros(32, np.float32), np.int32(32)), 32 * 33 * 4)
    (top,) = hotspots(rec)
    assert (top["space"], top["requests"], top["wavefronts"], top["ideal"], top["excess"]) == ("shared", 1, 32, 1, 31)
    assert "s[threadIdx.x * stride]" in top["where"]


def test_records_accumulate_until_reset(probes, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_PROFILE", "1")
    profile_reset()
    for stride in (1, 2):
        probes.get_function("smem_load")(1, 32, (np.zeros(32, np.float32), np.int32(stride)), shared_mem=256)
    recs = profile_records()
    assert [r["smem_wavefronts"] for r in recs] == [1, 2]
    monkeypatch.setenv("KDACUPY_EMULATE_PROFILE", "0")  # off: nothing recorded
    probes.get_function("smem_load")(1, 32, (np.zeros(32, np.float32), np.int32(1)), shared_mem=256)
    assert len(profile_records()) == 2
    profile_reset()
    assert profile_records() == []


def test_counting_blocks_count_without_the_switch(probes, monkeypatch):
    monkeypatch.delenv("KDACUPY_EMULATE_PROFILE", raising=False)
    with counting() as recs:
        probes.get_function("smem_load")(1, 32, (np.zeros(32, np.float32), np.int32(2)), shared_mem=256)
    assert [r["smem_wavefronts"] for r in recs] == [2]
    probes.get_function("smem_load")(1, 32, (np.zeros(32, np.float32), np.int32(2)), shared_mem=256)
    assert profile_records() == []  # outside the block: not counted


def test_a_bad_switch_value_is_refused(probes, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_PROFILE", "yes")
    with pytest.raises(EmulationError, match="KDACUPY_EMULATE_PROFILE='yes'"):
        probes.get_function("smem_load")(1, 32, (np.zeros(32, np.float32), np.int32(1)), shared_mem=256)


def test_forward_results_are_bit_identical_with_the_counters(monkeypatch):
    x, opts = case_inputs("fixed-gva-sigmoid", "bf16")
    plain = kdacupy.kda_forward(**x, **opts, backend="emulate")
    monkeypatch.setenv("KDACUPY_EMULATE_PROFILE", "1")
    profile_reset()
    counted = kdacupy.kda_forward(**x, **opts, backend="emulate")
    for a, b in zip(plain, counted):
        np.testing.assert_array_equal(a, b)
    prep, rec = profile_records()
    assert (prep["kernel"], rec["kernel"]) == ("kda_prepare", "kda_recurrence")
    assert prep["ctas"] == prep["grid"][0] * prep["grid"][1] and rec["mma"] > 0 and rec["cp_async_bytes"] > 0
    # every byte of q, k, g, beta is read from DRAM once (K = 64 bf16 rows fill whole sectors)
    assert prep["dram_read_bytes"] >= sum(x[n].nbytes for n in ("q", "k", "g"))

"""The issue term (docs/design.md section 11.4) on kernels whose counts are known by construction:
the emulation's anchors per warp, class and calling context (profile.h), and the instructions
each warp issues, from the SASS NVRTC builds for sm_90a, fitted to them (kdacupy/cli/issue.py):
a loop of w * n + 1 trips on warp w issues the rest once and the loop's block that often; lanes
with different trips make their warp run the longest; ptxas's loop over a bulk copy's lanes runs
once per lane."""
import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, counting, source_text
from kdacupy.jit import sass_cfg

from .test_emulate_runtime import kernel_source

pytest.importorskip("scipy", reason="the issue fit needs scipy (pip install 'kdacupy[profile]')")
pytestmark = [pytest.mark.nvrtc,
              pytest.mark.skipif(sass_cfg.nvdisasm() is None, reason="needs nvdisasm (pip install 'kdacupy[test]')")]

from kdacupy.cli import issue, roofline  # noqa: E402

KERNELS = kernel_source(r"""
// warp w loads w * n + 1 elements, one per trip of a loop kept rolled
extern "C" __global__ void trips(const float* in, float* out, int n) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float acc = 0.f;
#pragma unroll 1
  for (int i = 0; i <= warp * n; ++i) acc += in[(i * 32 + lane) & 1023];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
// lane l of warp w loads (l % 8) + w elements: the warp runs the loop as often as its longest lane
extern "C" __global__ void lanes(const float* in, float* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float acc = 0.f;
#pragma unroll 1
  for (int i = 0; i < (lane & 7) + warp; ++i) acc += in[(i * 32 + lane) & 1023];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
// one helper the host compiler keeps a call, from two places: the anchors tell them apart
__device__ __noinline__ float fetch(const float* p, int i) { return p[i & 1023]; }
extern "C" __global__ void contexts(const float* in, float* out) {
  const int warp = threadIdx.x >> 5;
  float acc = fetch(in, threadIdx.x);
  for (int i = 0; i < warp; ++i) acc += fetch(in, threadIdx.x + 32 * i);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
// warp 0's lanes 0..rows-1 copy a 16-byte row each with cp.async.bulk (ptxas: one lane a trip)
extern "C" __global__ void bulk_rows(const float* in, float* out, int rows) {
  u64* bar = reinterpret_cast<u64*>(dynamic_smem());
  unsigned char* dst = dynamic_smem() + 16;
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    fence_proxy_async_smem();
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) mbarrier_arrive_expect_tx(bar, 16 * rows);
    __syncwarp();
    if (threadIdx.x < rows) cp_async_bulk_g2s(dst + 16 * threadIdx.x, in + 4 * threadIdx.x, 16, bar);
  }
  mbarrier_wait_parity(bar, 0);
  out[blockIdx.x * blockDim.x + threadIdx.x] = reinterpret_cast<const float*>(dst)[threadIdx.x & 63];
}
""")


@pytest.fixture(scope="module")
def module():
    return EmulatedModule(KERNELS, ["trips", "lanes", "contexts", "bulk_rows"])


def run(module, name, grid, block, args, shared_mem=0):
    with counting() as recs:
        module.get_function(name)((grid,), (block,), args, shared_mem=shared_mem)
    (rec,) = recs
    return rec, sass_cfg.kernel_sass(source_text(rec["source"]), "sm_90a")[name]


def self_loop(fn):
    """The one block that loops to itself (the kernel's rolled loop), and the others' sizes."""
    loops = [b for b in fn.reachable() if b in fn.blocks[b].succ]
    assert len(loops) == 1, f"expected one rolled loop, found {loops}"
    return loops[0], sum(fn.blocks[b].size for b in fn.reachable() if b != loops[0])


def test_anchors_count_each_warps_executions(module):
    """3 CTAs: warp w's loop load runs 3 (w * 5 + 1) times a warp, 32 lanes each; the store once."""
    x = np.arange(1024, dtype=np.float32)
    rec, _ = run(module, "trips", 3, 128, (x, np.zeros(3 * 128, np.float32), np.int32(5)))
    loads = {a[2]: a for a in rec["anchors"] if a[1] == "load"}
    stores = {a[2]: a for a in rec["anchors"] if a[1] == "store"}
    assert sorted(loads) == sorted(stores) == [0, 1, 2, 3]
    for w in range(4):
        assert loads[w][3:6] == [3 * (5 * w + 1), 3 * 32 * (5 * w + 1), 4]  # warp and lane executions, bytes
        assert stores[w][3:6] == [3, 3 * 32, 4]


def test_a_loop_of_known_trips_by_construction(module):
    """Per CTA, warp w issues every block but the loop once and the loop's w * 5 + 1 times."""
    x = np.arange(1024, dtype=np.float32)
    rec, fn = run(module, "trips", 3, 128, (x, np.zeros(3 * 128, np.float32), np.int32(5)))
    loop, once = self_loop(fn)
    got = issue.count(rec, "sm_90a", source_text(rec["source"]))
    want = [once + (5 * w + 1) * fn.blocks[loop].size for w in range(4)]
    assert got.warps == pytest.approx(want, abs=1e-3) and got.misfit == pytest.approx(0, abs=1e-6)
    assert roofline.schedulers(got.warps) == pytest.approx(want, abs=1e-3)  # one warp a scheduler
    assert got.opcodes["LDG"] == pytest.approx(sum(5 * w + 1 for w in range(4)), abs=1e-3)


def test_a_diverged_loop_runs_as_long_as_its_longest_lane(module):
    rec, fn = run(module, "lanes", 2, 128, (np.arange(1024, dtype=np.float32), np.zeros(2 * 128, np.float32)))
    loop, once = self_loop(fn)
    got = issue.count(rec, "sm_90a", source_text(rec["source"]))
    # lanes 7, 15, 23, 31 run 7 + w trips; lane 0 of warp 0 none: the warp still runs the loop
    assert got.warps == pytest.approx([once + (7 + w) * fn.blocks[loop].size for w in range(4)], abs=1e-3)


def test_calling_contexts_tell_the_call_sites_apart(module):
    """fetch's load, called from two lines: one key each, with its own executions per warp."""
    rec, _ = run(module, "contexts", 1, 128, (np.arange(1024, dtype=np.float32), np.zeros(128, np.float32)))
    keys = {k: v for k, v in issue.host_keys(rec).items() if k[0] == "load"}
    assert len(keys) == 2 and len({lines[-1] for _, lines in keys}) == 1  # the same innermost line, two contexts
    by_calls = sorted(keys.values(), key=lambda v: sum(v.values()))
    assert by_calls[0] == {w: 1.0 * 4 for w in range(4)}  # bytes: once per warp, 4 bytes a lane
    assert by_calls[1] == {w: 4.0 * w for w in range(1, 4)}  # w times in the loop


def test_a_bulk_copy_runs_once_per_lane_on_warp_0(module):
    """UBLKCP takes uniform operands: ptxas issues it in a loop over the active lanes. The fit runs
    that loop 12 times for warp 0 (12 rows), and not at all for the other warps."""
    x = np.arange(1024, dtype=np.float32)
    rec, fn = run(module, "bulk_rows", 2, 128, (x, np.zeros(2 * 128, np.float32), np.int32(12)), shared_mem=2048)
    lanes = [a for a in rec["anchors"] if a[1] == "bulk"]
    assert {a[2] for a in lanes} == {0} and sum(a[4] for a in lanes) == 2 * 12 and sum(a[3] for a in lanes) == 2
    got = issue.count(rec, "sm_90a", source_text(rec["source"]))
    block = next(b for b in fn.reachable() if any(fn.instrs[i].base == "UBLKCP" for i in
                                                 range(fn.blocks[b].first, fn.blocks[b].end)))
    size = fn.blocks[block].size
    assert got.warps[0] - got.warps[1] >= 12 * size  # the lane loop and warp 0's own path
    assert got.opcodes["UBLKCP"] == pytest.approx(12, abs=1e-3)


def test_warpgroup_mmas_match_by_class_whatever_lines_ptxas_gives_them():
    """ptxas may attribute a wgmma to another product's line (since the 64-bit descriptor add it gives the
    o^T and U^T products the first loop's): matched by line, those anchors went unmatched and the fit
    undercounted the chain. HGMMAs are matched by class over the function: one equation, every HGMMA's
    block against the host's count of them all, on whichever lines; other classes stay by line."""
    from kdacupy.jit.sass_cfg import Block, Function, Instr

    instrs = [Instr(0, None, "HGMMA.64x16x16.F32.BF16", "HGMMA", (10,)),
              Instr(16, None, "HGMMA.64x128x16.F32.BF16", "HGMMA", (10,)),  # the host ran this one at line 30
              Instr(32, None, "LDS.128", "LDS.128", (40,)),
              Instr(48, None, "EXIT", "EXIT", (50,))]
    fn = Function("k", instrs, [Block(0, 4, leaves=True)])
    host = {("wgmma", (10,)): {0: 64.0}, ("wgmma", (30,)): {0: 64.0}, ("load", (40,)): {0: 512.0}}
    eqs = issue.equations(fn, [0], host)
    wg = [e for e in eqs if any(instrs[i].base == "HGMMA" for i, _ in e.terms)]
    assert [(e.kind, sorted(i for i, _ in e.terms), e.host) for e in wg] == [("coarse", [0, 1], {0: 128.0})]
    lds = [e for e in eqs if e.kind == "coarse" and any(instrs[i].base == "LDS" for i, _ in e.terms)]
    assert [e.host for e in lds] == [{0: 512.0}]


def test_warps_met_alike_share_one_fit(module, monkeypatch):
    """bulk_rows' warps 1-3 meet their anchors alike (only warp 0 copies): one fit serves the three."""
    x = np.arange(1024, dtype=np.float32)
    rec, _ = run(module, "bulk_rows", 2, 128, (x, np.zeros(2 * 128, np.float32), np.int32(12)), shared_mem=2048)
    calls = []
    real = issue._fit
    monkeypatch.setattr(issue, "_fit", lambda *a: calls.append(a[3]) or real(*a))
    got = issue.count(rec, "sm_90a", source_text(rec["source"]))
    assert len(calls) == 2 and calls[0] != calls[1]
    assert got.warps[1] == got.warps[2] == got.warps[3] < got.warps[0]

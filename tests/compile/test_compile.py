"""Every arch compiles the kernels on the CPU (NVRTC), within the resource budgets:
no spills and no local memory in the recurrence at the default configurations,
its matmuls on the tensor cores, shared memory within each arch's limit.
The reports come from tests/compile/reports.py: one parallel batch for the points this run selects,
the SASS mix on its SASS_ARCH (and on every arch for each kernel's first variant). The default run
takes a sample of each matrix, every arch and the Kimi defaults; the rest is a sweep (tests/sweeps.py)."""
import subprocess
import sys

import pytest

from kdacupy.jit import registry, render as jit
from kdacupy.jit.nvrtc import ARCHS, SMEM_LIMIT
from kdacupy.ops.forward.variants import prepare_variants, recurrence_variants
from kdacupy.numerics.dtypes import BF16, F32
from kdacupy.ops.forward.kernels import PrepareVariant, RecurrenceVariant
from kdacupy.ops.forward.tuning import TileConfig
from kdacupy.ops.decode.variants import decode_variants
from kdacupy.ops.decode.kernels import DecodeTiles, DecodeVariant, decode_candidates

from ..sweeps import sample
from .reports import HAVE_NVDISASM, SASS_ARCH, compile_for, every_arch, matrix, report, running

pytestmark = pytest.mark.nvrtc  # skipped where NVRTC cannot load (tests/conftest.py)

# the variants the Kimi shapes run with (the heuristic picks BV 32 or 128 there)
DEFAULTS = [RecurrenceVariant(128, 128, BF16, fp32, TileConfig(bv, 2))
            for bv in (32, 64, 128) for fp32 in (False, True)]
# checked on every arch: the heuristic's BV 32 and 128 with the fp32 state (twice the state registers), and
# the bf16 state at BV = 128;
# the rest on SASS_ARCH, the tuned target (`python -m kdacupy.compile` records every variant on every
# arch in benchmarks/compile-report.md; each budget compile here costs about a second of the cold run,
# so the default run takes a sample of these pairs, the rest a sweep)
EVERY_ARCH = {registry.label(v) for v in DEFAULTS if (v.state_fp32 and v.tiles.BV != 64) or v.tiles.BV == 128}


def first_everywhere(variants, everywhere):
    return next(v for v in variants if registry.label(v) in everywhere)


def arch_pairs(variants, everywhere, keep):
    """(arch, variant) for every variant on SASS_ARCH, and for those labelled in ``everywhere`` on every arch;
    the default run's sample those for which ``keep(arch, var)``: not every variant (the list itself), every arch."""
    pairs = [(a, v) for v in variants for a in ARCHS if a == SASS_ARCH or registry.label(v) in everywhere]
    return every_arch(sample(pairs, keep, lambda a, v: f"{a}-{registry.label(v)}", cover=False))


def pair_jobs(params, variants, everywhere):
    """The compile jobs of ``arch_pairs``: SASS on SASS_ARCH, and on every arch for the first variant there."""
    first = first_everywhere(variants, everywhere)
    return [(v, a, a == SASS_ARCH or v is first) for a, v in (p.values for p in params)]
PREPARE_DEFAULTS = [PrepareVariant(128, BF16, BF16, BF16, "sigmoid", "sigmoid", True),
                    PrepareVariant(128, BF16, F32, F32, "softplus", "raw", False)]

# tensor-core MMAs per chunk and warp: W and o (2 x 2 x K/16), U and U Mqk (2 + 2), the state update (K/8)
HMMA_PER_CHUNK = 2 * 2 * 128 // 16 + 4 + 128 // 8


# the default run: the bf16 state at BV = 128 on sm_80, the Kimi default its forward runs (mma.sync), in its
# smallest shared memory; the first (the heuristic's BV 32, the fp32 state's registers) on the other two, its
# SASS mix read on both
RECURRENCE_PAIRS = arch_pairs(DEFAULTS, EVERY_ARCH, lambda a, v: (a, v) in {
    ("sm_80", DEFAULTS[4]), (SASS_ARCH, DEFAULTS[1]), ("sm_100a", DEFAULTS[1])})


@pytest.mark.parametrize("arch, var", RECURRENCE_PAIRS)
@pytest.mark.usefixtures("compiled")
def test_recurrence_budget(arch, var):
    res = report(var, arch)
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads, res.stack) == (0, 0, 0), res.log
    assert var.smem + res.static_smem <= SMEM_LIMIT[arch]
    if res.sass:
        assert res.sass["LDL"] == 0 and res.sass["STL"] == 0
        assert res.sass["HMMA"] == HMMA_PER_CHUNK  # the chunk loop is not unrolled: one chunk's worth
        assert res.sass["LDSM"] > 0 and res.sass["LDGSTS"] > 0  # ldmatrix operands, cp.async pipeline


# the wgmma recurrence (sm_90a only) at K = V = 128, bf16 values, one warpgroup: both state precisions
WGMMA_DEFAULTS = [RecurrenceVariant(128, 128, BF16, fp32, TileConfig(64, 2, "wgmma")) for fp32 in (False, True)]
# per chunk and warpgroup: W and o (2 x K/16 m64n16k16), U and U Mqk (2), dS (one m64n128k16)
HGMMA_PER_CHUNK = 2 * 128 // 16 + 2 + 1


# the default run: the bf16 state (the default precision); one arch, the axis the variant list itself
@pytest.mark.parametrize("var", sample(WGMMA_DEFAULTS, lambda v: not v.state_fp32, registry.label, cover=False))
@pytest.mark.usefixtures("compiled")
def test_wgmma_recurrence_budget(var):
    res = report(var, "sm_90a")
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads, res.stack) == (0, 0, 0), res.log
    assert var.smem + res.static_smem <= SMEM_LIMIT["sm_90a"]
    if res.sass:
        assert res.sass["LDL"] == 0 and res.sass["STL"] == 0
        assert res.sass["HGMMA"] == HGMMA_PER_CHUNK and res.sass["HMMA"] == 0
        assert res.sass["UBLKCP"] > 0 and res.sass["LDGSTS"] == 0  # bulk copies, no cp.async


# the default run: the Kimi options on every arch; the variants are the list itself, the other a sweep
PREPARE_PAIRS = every_arch(sample([(v, a) for v in PREPARE_DEFAULTS for a in ARCHS],
                                  lambda v, a: v == PREPARE_DEFAULTS[0], lambda v, a: f"{registry.label(v)}-{a}",
                                  cover=False), at=1)


@pytest.mark.parametrize("var, arch", PREPARE_PAIRS)
@pytest.mark.usefixtures("compiled")
def test_prepare_budget(arch, var):
    res = report(var, arch)
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads) == (0, 0), res.log
    assert var.smem + res.static_smem <= SMEM_LIMIT[arch]
    if res.sass:
        assert res.sass["HMMA"] > 0 and res.sass["LDL"] == 0


# a point in the default run and one in the sweep's, so that `-m sweep --sweeps` checks the swept points' SASS too
@pytest.mark.parametrize("run", sample(["default", "sweep"], lambda run: run == "default", cover=False))
def test_the_sass_mix_is_taken_where_the_budgets_read_it(compiled, run):
    """On SASS_ARCH for every variant, on every arch for each kernel's first: of the points this run selects."""
    if not HAVE_NVDISASM:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    firsts = {"recurrence": first_everywhere(DEFAULTS, EVERY_ARCH), "prepare": PREPARE_DEFAULTS[0],
              "decode": first_everywhere(DECODE_DEFAULTS, DECODE_EVERY_ARCH)}
    for kernel, pairs in compiled.items():
        assert all(report(v, a).sass for v, a in pairs if a == SASS_ARCH or v == firsts[kernel])


def test_variant_enumeration_covers_the_options():
    prep = list(prepare_variants())
    rec = list(recurrence_variants())
    assert {v.gate for v in prep} == {"log", "softplus", "sigmoid"}
    assert {v.beta_mode for v in prep} == {"none", "raw", "sigmoid", "sigmoid2"}
    assert {(v.K, v.V) for v in rec} == {(k, v) for k in (64, 128, 256) for v in (64, 128, 256)}
    assert all(v.tiles.BV <= v.V for v in rec)
    assert len(set(map(registry.label, prep + rec))) == len(prep) + len(rec)


def test_cli_reports_one_line_per_variant():
    out = subprocess.run([sys.executable, "-m", "kdacupy.compile", "--arch", "sm_80", "--kernel", "recurrence",
                          "--match", "K=64 V=64 dt=float16 state=bf16 BV=64"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("kda_recurrence")]
    assert len(lines) == 2  # stages 2 and 3
    assert all("regs=" in ln and "spill_stores=0" in ln and "smem=" in ln for ln in lines)


def test_render_inlines_headers_and_rejects_non_integers():
    src = jit.render("kda_recurrence", DEFAULTS[0].config())
    assert '#include "' not in src and "#define KDA_BV 32" in src
    assert src.count("constexpr int CHUNK = 16;") == 1  # common.cuh once, though several headers include it
    with pytest.raises(ValueError, match="config"):
        jit.render("kda_recurrence", {"KDA_K": "128; system()"})
    with pytest.raises(ValueError, match="config"):
        jit.render("kda_recurrence", {"kda_k": 128})


# decode: the Kimi options (sigmoid gate, beta logits, l2norm) at K = V = 128, both pools and layouts,
# the default tiles and the most registers per thread (BV=64 on 4 warps: 16 rows x 4 keys per lane)
DECODE_DEFAULTS = [DecodeVariant(128, 128, BF16, BF16, BF16, "sigmoid", "sigmoid", True, pool, layout, tiles)
                   for pool, layout, tiles in [(BF16, "vk", DecodeTiles()), (F32, "vk", DecodeTiles()),
                                               (BF16, "kv", DecodeTiles()), (F32, "kv", DecodeTiles()),
                                               (F32, "vk", DecodeTiles(64, 4)), (BF16, "vk", DecodeTiles(8, 8))]]
# and the any-size variants (head dims outside {64, 128, 256}, the sizes at launch) of the largest and a
# small key tile
DECODE_DEFAULTS += [DecodeVariant(256, 0, BF16, BF16, BF16, "sigmoid", "sigmoid", True, F32, "vk", DecodeTiles()),
                    DecodeVariant(64, 0, BF16, BF16, BF16, "sigmoid", "sigmoid", True, BF16, "kv", DecodeTiles(8, 4))]
# on every arch: the most registers per thread (BV = 64 on 4 warps), the largest any-size key tile, the kv layout
DECODE_EVERY_ARCH = {registry.label(DECODE_DEFAULTS[i]) for i in (2, 4, 6)}
# the default run: the Kimi default (bf16 pool, vk) on SASS_ARCH, the first (its kv layout, its SASS mix read)
# on the other two
DECODE_PAIRS = arch_pairs(DECODE_DEFAULTS, DECODE_EVERY_ARCH, lambda a, v: (a, v) in {
    (SASS_ARCH, DECODE_DEFAULTS[0]), ("sm_80", DECODE_DEFAULTS[2]), ("sm_100a", DECODE_DEFAULTS[2])})


@pytest.mark.parametrize("arch, var", DECODE_PAIRS)
@pytest.mark.usefixtures("compiled")
def test_decode_budget(arch, var):
    res = report(var, arch)
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads, res.stack) == (0, 0, 0), res.log
    if res.sass:
        assert res.sass["LDL"] == 0 and res.sass["STL"] == 0 and res.sass["HMMA"] == 0


def other_head_dims(K):
    return [DecodeVariant(K, K, BF16, BF16, BF16, "softplus", "raw", False, BF16, "vk", tiles)
            for tiles in decode_candidates(K, K)[::4]]


@pytest.fixture(scope="module")
def compiled(request):
    """The (variant, arch) pairs of the budget points of this module that this run selects, by kernel, their
    reports compiled in one parallel batch before its first test."""
    def pairs(test, arch=None):
        return [(p["var"], arch or p["arch"]) for p in running(request, test)]
    runs = {"recurrence": pairs("test_recurrence_budget"), "prepare": pairs("test_prepare_budget"),
            "decode": pairs("test_decode_budget")}
    jobs = pair_jobs(RECURRENCE_PAIRS, DEFAULTS, EVERY_ARCH) + matrix(PREPARE_DEFAULTS, ARCHS)
    jobs += pair_jobs(DECODE_PAIRS, DECODE_DEFAULTS, DECODE_EVERY_ARCH) + [(v, "sm_90a", True) for v in WGMMA_DEFAULTS]
    jobs += [(v, "sm_90a", False) for K in (64, 256) for v in other_head_dims(K)]
    others = [(v, "sm_90a") for p in running(request, "test_decode_other_head_dims_compile_without_spills")
              for v in other_head_dims(p["K"])]
    compile_for(jobs, [pair for ps in runs.values() for pair in ps] + pairs("test_wgmma_recurrence_budget", "sm_90a")
                + others)
    return runs


# the default run: K = 256 (the larger state a thread holds); the axis is the variant list itself (each K its own)
@pytest.mark.parametrize("K", sample([64, 256], lambda K: K == 256, cover=False))
@pytest.mark.usefixtures("compiled")
def test_decode_other_head_dims_compile_without_spills(K):
    for var in other_head_dims(K):
        res = report(var, "sm_90a")
        assert res.ok and (res.spill_stores, res.spill_loads) == (0, 0), res.log


def test_decode_variant_enumeration_covers_the_options():
    dec = list(decode_variants())
    assert {v.gate for v in dec} == {"log", "softplus", "sigmoid"}
    assert {v.beta_mode for v in dec} == {"none", "raw", "sigmoid", "sigmoid2"}
    # the fixed sizes, and the any-size variant (V = 0: K up to the tile, any V) of every key tile
    assert {(v.K, v.V) for v in dec} == {(k, v) for k in (64, 128, 256) for v in (64, 128, 256)} | \
        {(k, 0) for k in range(32, 257, 32)}
    assert {(v.pool_dtype, v.layout) for v in dec} == {(p, lay) for p in (BF16, F32) for lay in ("vk", "kv")}
    assert all(v.tiles.valid_for(v.K, v.V or 256) for v in dec)  # V = 0: any V >= BV
    assert len(set(map(registry.label, dec))) == len(dec)

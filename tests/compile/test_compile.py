"""Every arch compiles the kernels on the CPU (NVRTC), within the resource budgets:
no spills and no local memory in the recurrence at the default configurations,
its matmuls on the tensor cores, shared memory within each arch's limit.
The reports come from tests/compile/reports.py: one parallel batch for the module,
the SASS mix on its SASS_ARCH (and on every arch for each kernel's first variant)."""
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

from .reports import HAVE_NVDISASM, SASS_ARCH, compile_all, matrix, report

pytestmark = pytest.mark.nvrtc  # skipped where NVRTC cannot load (tests/conftest.py)

# the variants the Kimi shapes run with (the heuristic picks BV 32 or 128 there)
DEFAULTS = [RecurrenceVariant(128, 128, BF16, fp32, TileConfig(bv, 2))
            for bv in (32, 64, 128) for fp32 in (False, True)]
# checked on every arch: the heuristic's BV 32 and 128 with the fp32 state (twice the state registers), and
# the bf16 state at BV = 128;
# the rest on SASS_ARCH, the tuned target (`python -m kdacupy.compile` records every variant on every
# arch in benchmarks/compile-report.md; each budget compile here costs about a second of the cold run)
EVERY_ARCH = {registry.label(v) for v in DEFAULTS if (v.state_fp32 and v.tiles.BV != 64) or v.tiles.BV == 128}


def arch_pairs(variants, everywhere):
    """(arch, variant) for every variant on SASS_ARCH, and for those labelled in ``everywhere`` on every arch."""
    return [pytest.param(a, v, id=f"{a}-{registry.label(v)}") for v in variants for a in ARCHS
            if a == SASS_ARCH or registry.label(v) in everywhere]


def first_everywhere(variants, everywhere):
    return next(v for v in variants if registry.label(v) in everywhere)


def pair_jobs(variants, everywhere):
    """The compile jobs of ``arch_pairs``: SASS on SASS_ARCH, and on every arch for the first variant there."""
    first = first_everywhere(variants, everywhere)
    return [(v, a, a == SASS_ARCH or v is first) for a, v in (p.values for p in arch_pairs(variants, everywhere))]
PREPARE_DEFAULTS = [PrepareVariant(128, BF16, BF16, BF16, "sigmoid", "sigmoid", True),
                    PrepareVariant(128, BF16, F32, F32, "softplus", "raw", False)]

# tensor-core MMAs per chunk and warp: W and o (2 x 2 x K/16), U and U Mqk (2 + 2), the state update (K/8)
HMMA_PER_CHUNK = 2 * 2 * 128 // 16 + 4 + 128 // 8


@pytest.mark.parametrize("arch, var", arch_pairs(DEFAULTS, EVERY_ARCH))
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


@pytest.mark.parametrize("var", WGMMA_DEFAULTS, ids=registry.label)
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


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("var", PREPARE_DEFAULTS, ids=registry.label)
@pytest.mark.usefixtures("compiled")
def test_prepare_budget(arch, var):
    res = report(var, arch)
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads) == (0, 0), res.log
    assert var.smem + res.static_smem <= SMEM_LIMIT[arch]
    if res.sass:
        assert res.sass["HMMA"] > 0 and res.sass["LDL"] == 0


@pytest.mark.usefixtures("compiled")
def test_the_sass_mix_is_taken_where_the_budgets_read_it():
    if not HAVE_NVDISASM:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    for variants, first in ((DEFAULTS, first_everywhere(DEFAULTS, EVERY_ARCH)), (PREPARE_DEFAULTS, PREPARE_DEFAULTS[0]),
                            (DECODE_DEFAULTS, first_everywhere(DECODE_DEFAULTS, DECODE_EVERY_ARCH))):
        assert all(report(v, SASS_ARCH).sass for v in variants)
        assert all(report(first, a).sass for a in ARCHS)


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


@pytest.mark.parametrize("arch, var", arch_pairs(DECODE_DEFAULTS, DECODE_EVERY_ARCH))
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
def compiled():
    """Every report this module checks, compiled in one parallel batch before its first test."""
    jobs = pair_jobs(DEFAULTS, EVERY_ARCH) + matrix(PREPARE_DEFAULTS, ARCHS) + pair_jobs(DECODE_DEFAULTS, DECODE_EVERY_ARCH)
    jobs += [(v, "sm_90a", True) for v in WGMMA_DEFAULTS]
    compile_all(jobs + [(v, "sm_90a", False) for K in (64, 256) for v in other_head_dims(K)])


@pytest.mark.parametrize("K", [64, 256])
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

"""The recurrence's map variant (KDA_NO_OUTPUT: final state only, fp32 state)
compiles on every arch without spills, and drops the output's matmuls. The default run takes a
sample of each matrix that builds on every arch, the rest is a sweep (tests/sweeps.py)."""
import pytest

from kdacupy.jit.nvrtc import ARCHS, SMEM_LIMIT
from kdacupy.jit.render import render
from kdacupy.numerics.dtypes import BF16
from kdacupy.ops.forward.kernels import RecurrenceVariant
from kdacupy.ops.forward.tuning import TileConfig

try:
    from kdacupy.jit.nvrtc import _nvrtc
    _nvrtc()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"NVRTC is not loadable here: {e}", allow_module_level=True)

from ..sweeps import kept, sample
from .reports import HAVE_NVDISASM, SASS_ARCH, Source, compile_for, every_arch, matrix, report, running

# per chunk and warp: W (2 x K/16), U (2), the state update (K/8); no o (2 x K/16) and no U Mqk (2)
HMMA_PER_CHUNK = 2 * 128 // 16 + 2 + 128 // 8
MAP_VARIANTS = [RecurrenceVariant(128, 128, BF16, True, TileConfig(bv, 2), no_output=True) for bv in (32, 128)]
# the wgmma maps (sm_90a: the split forward's on Hopper), one warpgroup at 3 stages and two at 2
WGMMA_MAPS = [RecurrenceVariant(128, 128, BF16, True, TileConfig(bv, st, "wgmma"), no_output=True)
              for bv, st in ((64, 3), (128, 2))]
# per chunk and warpgroup: W (K/16 m64n16k16), U (1), dS (one m64n128k16); no o and no U Mqk
HGMMA_PER_CHUNK = 128 // 16 + 1 + 1


def scan_source(K, V):
    from kdacupy.ops.seqpar import split
    return Source(f"kda_seqpar_scan K={K} V={V}", render("kda_seqpar_scan", split.scan_config(K, V)))


SCAN_SHAPES = [(64, 64), (128, 128), (256, 256)]


@pytest.fixture(scope="module")
def compiled(request):
    """The reports of the points this run selects, compiled in one parallel batch (tests/compile/reports.py)."""
    pairs = [(p["var"], p["arch"]) for p in running(request, "test_map_variant_budget")]
    pairs += [(p["var"], "sm_90a") for p in running(request, "test_wgmma_map_variant_budget")]
    pairs += [(scan_source(p["K"], p["V"]), p["arch"]) for p in running(request, "test_scan_kernel_budget")]
    compile_for(matrix(MAP_VARIANTS, ARCHS) + matrix(WGMMA_MAPS, ["sm_90a"])
                + [(scan_source(K, V), a, False) for K, V in SCAN_SHAPES for a in ARCHS], pairs)


# the default run: BV = 128 in sm_80's shared memory (the smallest), BV = 32 (its SASS mix read everywhere) under
# sm_100a's ptxas (the tightest); on sm_90a the wgmma map, the one Hopper runs (below); the rest a sweep
MAP_POINTS = sample([(v, a) for v in MAP_VARIANTS for a in ARCHS],
                    lambda v, a: (v, a) in {(MAP_VARIANTS[1], "sm_80"), (MAP_VARIANTS[0], "sm_100a")},
                    lambda v, a: f"BV={v.tiles.BV}-{a}", cover=False)
assert {a for _, a in kept(MAP_POINTS)} | {"sm_90a"} == set(ARCHS)  # every arch builds a map by default


@pytest.mark.parametrize("var, arch", MAP_POINTS)
@pytest.mark.usefixtures("compiled")
def test_map_variant_budget(arch, var):
    assert var.config()["KDA_NO_OUTPUT"] == 1
    res = report(var, arch)
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads, res.stack) == (0, 0, 0), res.log
    assert var.smem + res.static_smem <= SMEM_LIMIT[arch]
    assert bool(res.sass) == (HAVE_NVDISASM and (arch == SASS_ARCH or var is MAP_VARIANTS[0]))
    if res.sass:
        assert res.sass["HMMA"] == HMMA_PER_CHUNK
        assert res.sass["LDL"] == 0 and res.sass["STL"] == 0


# the default run: one warpgroup at 3 stages (the heuristic's); one arch, the axis the variant list itself
@pytest.mark.parametrize("var", sample(WGMMA_MAPS, lambda v: v is WGMMA_MAPS[0],
                                       lambda v: f"BV={v.tiles.BV}-stages={v.tiles.stages}", cover=False))
@pytest.mark.usefixtures("compiled")
def test_wgmma_map_variant_budget(var):
    res = report(var, "sm_90a")
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads, res.stack) == (0, 0, 0), res.log
    assert var.smem + res.static_smem <= SMEM_LIMIT["sm_90a"]
    if res.sass:
        assert res.sass["HGMMA"] == HGMMA_PER_CHUNK and res.sass["HMMA"] == 0
        assert res.sass["LDL"] == 0 and res.sass["STL"] == 0 and res.sass["UBLKCP"] > 0


def test_default_variant_config_is_unchanged():
    var = RecurrenceVariant(128, 128, BF16, False, TileConfig(32, 2))
    assert "KDA_NO_OUTPUT" not in var.config()  # existing variants keep their keys (and caches)


# the default run: the Kimi shape on every arch; the shapes are the scan's variant list, the others a sweep
@pytest.mark.parametrize("K, V, arch", every_arch(sample([(K, V, a) for K, V in SCAN_SHAPES for a in ARCHS],
                                                         lambda K, V, a: K == 128, lambda K, V, a: f"{K}-{V}-{a}",
                                                         cover=False), at=2))
@pytest.mark.usefixtures("compiled")
def test_scan_kernel_budget(arch, K, V):
    from kdacupy.ops.seqpar import split
    res = report(scan_source(K, V), arch)
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads) == (0, 0), res.log
    assert split.scan_smem(K) + res.static_smem <= 48 * 1024  # no opt-in needed


def test_compile_cli_lists_the_seqpar_variants(capsys):
    # in-process (test_compile.py runs `python -m kdacupy.compile` itself)
    from kdacupy.cli.compile import main
    from kdacupy.ops.forward.variants import recurrence_variants
    from kdacupy.ops.seqpar.variants import map_variants, scan_variants
    var = list(map_variants()) + list(scan_variants())
    label = lambda v: v.label()  # noqa: E731
    assert {v.K for v in var} == {64, 128, 256} and len(set(map(label, var))) == len(var)
    assert not set(map(label, var)) & set(map(label, recurrence_variants()))
    assert main(["--arch", "sm_80", "--kernel", "seqpar", "--match", "K=64 V=64", "--match", "BV=64 stages=2",
                 "--match", "bfloat16"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("kda_")]
    assert len(lines) == 1 and "no_output" in lines[0] and "spill_stores=0" in lines[0]
    assert main(["--arch", "sm_80", "--kernel", "seqpar", "--match", "kda_seqpar_scan K=256 V=64 "]) == 0
    assert capsys.readouterr().out.count("kda_seqpar_scan") == 1

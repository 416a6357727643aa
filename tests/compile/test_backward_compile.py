"""The backward's kernels compile on every arch (NVRTC on the CPU) within budget at the tuned
shape K = V = 128: no spills and no local memory, the matmuls on the tensor cores, shared
memory within the arch's limit; every option has its variant. The reports come from one parallel
batch for the points this run selects (tests/compile/reports.py): the default run takes the Kimi
per-chunk kernel each arch runs, the rest is a sweep (tests/sweeps.py)."""
import subprocess
import sys

import pytest

from kdacupy.jit import registry
from kdacupy.jit.nvrtc import ARCHS, SMEM_LIMIT
from kdacupy.numerics.dtypes import BF16, F32
from kdacupy.ops.backward.kernels import ChainVariant, ChunkVariant
from kdacupy.ops.backward.variants import chain_variants, chunk_variants, reduce_variants, state_store_variants
from kdacupy.ops.forward.kernels import RecurrenceVariant
from kdacupy.ops.forward.tuning import TileConfig

from ..sweeps import sample
from .reports import HAVE_NVDISASM, compile_for, every_arch, report, running

pytestmark = pytest.mark.nvrtc

CHUNK = ChunkVariant(128, BF16, BF16, BF16, "sigmoid", "sigmoid", True)
# the lightest per-chunk variant (fp32 inputs, log gate, no beta, no l2norm): under the plain bound sm_90a's
# ptxas settled it at 128 registers and spilled 12 bytes (the minimum-blocks figure of 1 in kda_bwd_chunk.cu)
LIGHT = ChunkVariant(128, F32, F32, F32, "log", "none", False)
CHAIN = ChainVariant(128, 128, BF16, TileConfig(32, 2))
STORE = RecurrenceVariant(128, 128, BF16, False, TileConfig(32, 2), no_output=True, store_states=True)
# the per-chunk kernel is the one near the register limit (sm_100a's ptxas takes 240-250): every arch;
# the chain (~220-245 registers) and the state store (the forward's recurrence plus one store) on sm_90a
# here, every arch in the compile report (benchmarks/backward-compile.md)
# the wide value block (sm_90a and sm_100a's at K = 128: 200 KB of shared memory, 8 value-block rows a thread held
# over the head's first phases)
WIDE = ChunkVariant(128, BF16, BF16, BF16, "sigmoid", "sigmoid", True, bvc=128)
# kda_forward(save_for_backward=True)'s recurrence: the output and the chunk states, at the forward's Kimi tiles
KEPT = RecurrenceVariant(128, 128, BF16, False, TileConfig(64, 3), no_output=False, store_states=True)
CASES = [(a, CHUNK) for a in ARCHS] + [("sm_90a", LIGHT), ("sm_90a", CHAIN), ("sm_90a", STORE), ("sm_90a", WIDE),
                                       ("sm_100a", WIDE), ("sm_90a", KEPT)]
# the default run: the per-chunk kernel the Kimi shapes run on each arch (sm_80's block, the wide one where the
# shared memory holds it); the cases are the variant list itself, not every one kept (every arch is)
DEFAULT_RUN = {("sm_80", CHUNK), ("sm_90a", WIDE), ("sm_100a", WIDE)}
POINTS = every_arch(sample(CASES, lambda a, v: (a, v) in DEFAULT_RUN, lambda a, v: f"{a}-{v.label()}", cover=False))


@pytest.fixture(scope="module")
def compiled(request):
    """The reports of the points this run selects, compiled in one parallel batch before the first (the SASS mix
    on every arch)."""
    pairs = [(p["var"], p["arch"]) for p in running(request, "test_backward_budget")]
    compile_for([(v, a, True) for a, v in CASES], pairs)


@pytest.mark.parametrize("arch,var", POINTS)
@pytest.mark.usefixtures("compiled")
def test_backward_budget(arch, var):
    res = report(var, arch)
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads, res.stack) == (0, 0, 0), res.log
    assert var.smem + res.static_smem <= SMEM_LIMIT[arch]
    if HAVE_NVDISASM:
        assert res.sass["LDL"] == 0 and res.sass["STL"] == 0
        assert res.sass["HMMA"] > 0 and res.sass["LDSM"] > 0


def test_variants_cover_the_options():
    chunk, chain, store = list(chunk_variants()), list(chain_variants()), list(state_store_variants())
    assert {v.gate for v in chunk} == {"log", "softplus", "sigmoid"}
    assert {v.beta_mode for v in chunk} == {"none", "raw", "sigmoid", "sigmoid2"}
    assert {v.K for v in chunk} == {64, 128, 256} and {v.l2norm for v in chunk} == {False, True}
    assert {(v.K, v.V) for v in chain} == {(k, v) for k in (64, 128, 256) for v in (64, 128, 256)}
    assert all(v.store_states and v.no_output for v in store) and {v.state_fp32 for v in store} == {False, True}
    kept = list(registry.variants("kda_recurrence_kept"))
    assert all(v.store_states and not v.no_output and v.tiles.mma == "sync" for v in kept)
    assert {(v.K, v.V, v.state_fp32) for v in kept} == {(v.K, v.V, v.state_fp32) for v in store}
    every = chunk + chain + store + list(reduce_variants())
    assert len(set(map(registry.label, every))) == len(every)
    for v in chunk:  # the shared memory fits every arch it builds for (static smem is 0): the wide block not sm_80
        arches = v.only_arches or ARCHS
        assert v.smem <= min(SMEM_LIMIT[a] for a in arches), v.label()
    wide = [v for v in chunk if v.bvc]
    assert {v.K for v in wide} == {128} and len(wide) == sum(v.K == 128 and not v.bvc for v in chunk)
    assert all("sm_80" not in v.only_arches and {"sm_90a", "sm_100a"} <= set(v.only_arches) for v in wide)


def test_cli_compiles_the_backward():
    out = subprocess.run([sys.executable, "-m", "kdacupy.compile", "--arch", "sm_80", "--kernel", "backward",
                          "--match", "kda_bwd_reduce"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("kda_bwd_reduce")]
    assert len(lines) == 3 and all("spill_stores=0" in ln and "smem=" in ln for ln in lines)

"""The variants tree verify and checkpoints add (docs/design.md section 7.1) compile on every arch
within the budgets: no spills and no local memory, the decode with step states in the other state
dtype than the pool's, the recurrence storing checkpoints at the Kimi shapes' tiles (the chunk
loop still one chunk's mma, not unrolled). The default run takes a sample that builds on every arch,
the rest is a sweep (tests/sweeps.py)."""
import pytest

from kdacupy.jit import registry
from kdacupy.jit.nvrtc import ARCHS, SMEM_LIMIT
from kdacupy.numerics.dtypes import BF16, F32
from kdacupy.ops.decode.kernels import DecodeTiles, DecodeVariant
from kdacupy.ops.forward.kernels import RecurrenceVariant
from kdacupy.ops.forward.tuning import TileConfig

from ..sweeps import sample
from .reports import compile_for, every_arch, matrix, report, running

pytestmark = pytest.mark.nvrtc

CHECKPOINTS = [RecurrenceVariant(128, 128, BF16, fp32, TileConfig(bv, 2), checkpoints=True)
               for bv, fp32 in ((128, False), (32, True))]  # the widest slice, and the fp32 state's registers
STEPS = [DecodeVariant(128, 128, BF16, BF16, BF16, "sigmoid", "sigmoid", True, pool, layout, DecodeTiles(),
                       F32 if pool == BF16 else BF16) for pool, layout in [(BF16, "vk"), (F32, "kv")]]
HMMA_PER_CHUNK = 2 * 2 * 128 // 16 + 4 + 128 // 8  # as tests/compile/test_compile.py counts them


#: (variant, arch): the recurrence's on every arch (its registers differ most by arch), the decode's
#: step variants on the tuned target (the decode's own budget test covers its other arches)
JOBS = [(v, a) for v in CHECKPOINTS for a in ARCHS] + [(v, "sm_90a") for v in STEPS]
#: the default run: the widest slice in sm_80's shared memory (the smallest), the fp32 state's registers under
#: sm_100a's ptxas (the tightest), the Kimi pool (bf16, vk) on sm_90a; the pairs are the variant list itself,
#: not every one kept (every arch is)
DEFAULT_RUN = {(CHECKPOINTS[0], "sm_80"), (CHECKPOINTS[1], "sm_100a"), (STEPS[0], "sm_90a")}
POINTS = every_arch(sample(JOBS, lambda v, a: (v, a) in DEFAULT_RUN, lambda v, a: f"{registry.label(v)}-{a}",
                           cover=False), at=1)


@pytest.fixture(scope="module")
def compiled(request):
    """The reports of the points this run selects, compiled in one parallel batch (tests/compile/reports.py)."""
    pairs = [(p["var"], p["arch"]) for p in running(request, "test_budget")]
    compile_for(matrix(CHECKPOINTS, ARCHS) + matrix(STEPS, ["sm_90a"]), pairs)


@pytest.mark.parametrize("var,arch", POINTS)
@pytest.mark.usefixtures("compiled")
def test_budget(var, arch):
    res = report(var, arch)
    assert res.ok, res.log
    assert (res.spill_stores, res.spill_loads, res.stack) == (0, 0, 0), res.log
    assert var.smem + res.static_smem <= SMEM_LIMIT[arch]
    if res.sass:
        assert res.sass["LDL"] == 0 and res.sass["STL"] == 0
        if isinstance(var, RecurrenceVariant):
            assert res.sass["HMMA"] == HMMA_PER_CHUNK
        else:
            assert res.sass["HMMA"] == 0

"""Under the checks (KDACUPY_EMULATE_CHECK) the launchers' scratch memory and the outputs they
allocate start as NaN bytes (kdacupy/ops/alloc.py, kdacupy/emulate/loader.py ``empty``), so a
kernel that reads a byte nobody wrote fails every checked run, not only those that find unlucky
leftovers; on the GPU the allocation is a plain ``cupy.empty``. The backward's and the
forward's kernels are held to it by the checked suites (test_backward_checked.py,
test_kernels_checked.py)."""
import re
from pathlib import Path

import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule
from kdacupy.emulate import loader as emu_loader
from kdacupy.numerics.dtypes import BF16
from kdacupy.ops.alloc import empty

ROOT = Path(__file__).resolve().parents[2]

# A partial sum per element, then a result from it: ``add`` is the bug of a `+=` into a slot
# that nothing zeroed (a kernel's partial sums are written with `=`).
PARTIAL_SUMS = r"""
extern "C" __global__ void partial_sums(const float* x, float* part, float* out, int add) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (add) part[i] += x[i]; else part[i] = x[i];
  out[i] = 2.f * part[i];
}
"""


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "memcheck")


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, BF16, np.float16])
def test_checked_allocations_start_as_nan_bytes(dtype, checked):
    a = empty(np, (3, 5), dtype)
    assert a.shape == (3, 5) and a.dtype == dtype
    assert (a.view(np.uint8) == emu_loader.POISON).all()
    if dtype != np.uint8:
        assert np.isnan(a.astype(np.float32)).all()


def test_on_the_gpu_the_allocation_is_the_array_modules_own():
    calls = []

    class FakeCupy:
        @staticmethod
        def empty(shape, dtype):
            calls.append((shape, dtype))
            return "device array"

    assert empty(FakeCupy, (4, 2), np.float32) == "device array"
    assert calls == [((4, 2), np.float32)]


def test_a_read_of_unwritten_scratch_is_nan_on_every_checked_run(checked):
    text = "".join((ROOT / "kernels" / f).read_text() for f in ("types.cuh", "ptx.cuh"))
    source = re.sub(r'^\s*#include\s+"[^"]*"\s*$', "", text, flags=re.M) + PARTIAL_SUMS
    fn = EmulatedModule(source, ["partial_sums"]).get_function("partial_sums")
    x = np.arange(64, dtype=np.float32)
    for add in (0, 1, 1):
        zeros = np.zeros(64, np.float32)  # freed memory holding the "right" leftovers for the `+=`
        del zeros
        part, out = empty(np, 64, np.float32), empty(np, 64, np.float32)
        fn((2,), (32,), (x, part, out, np.int32(add)))
        if add:
            assert np.isnan(out).all()
        else:
            np.testing.assert_array_equal(out, 2 * x)

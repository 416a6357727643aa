"""The backward kernels under the emulation's checks (KDACUPY_EMULATE_CHECK=all: out-of-bounds,
shared-memory races, misaligned vectors) and its stress modes (cp.async landing at issue,
threads in reverse order): no finding, and gradients bit-identical to the unchecked run, which
is the model's (test_backward_emulate.py). One case, with that suite's kernel variants, covers
what the checks look for: the grouped heads' loop reusing shared memory, ragged tails and a
zero-length sequence, the vk layout, both initial and final state gradients (its chunks are all
factored: the pair form, and sequences long enough to wrap the cp.async rings, are
test_backward_rings.py's).
Under the checks the launchers' scratch and gradients start as NaN bytes (kdacupy/ops/alloc.py),
so a kernel that reads a partial sum it did not write, or leaves part of a gradient unwritten,
gives NaN in the checked run, every time."""
import numpy as np
import pytest

import kdacupy

from .test_backward_emulate import assert_bitwise, inputs

pytestmark = pytest.mark.emulate

CHECKED = "varlen-gva-softplus-vk-f32-gate-and-beta"
STRESS = {"eager": {"KDACUPY_EMULATE_CP_ASYNC": "eager"}, "reverse": {"KDACUPY_EMULATE_ORDER": "reverse"}}


def backward(name, monkeypatch, **env):
    for k in ("KDACUPY_EMULATE_CHECK", "KDACUPY_EMULATE_CP_ASYNC", "KDACUPY_EMULATE_ORDER"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    x, opts, do, ds = inputs(name)
    return kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="emulate")


def assert_no_unwritten_byte(grads):
    """The case's gradients are finite: a NaN in a checked run is a byte no kernel wrote."""
    for field, g in zip(grads._fields, grads):
        if g is None or not (bad := np.isnan(g.astype(np.float32))).any():
            continue
        pytest.fail(f"{field}: {int(bad.sum())} NaN element(s), the first at {tuple(np.argwhere(bad)[0].tolist())}: "
                    "a read of scratch no kernel wrote, or an element left unwritten (both start as NaN under the "
                    "checks)")


def test_checked_backward_is_bit_identical(monkeypatch):
    checked = backward(CHECKED, monkeypatch, KDACUPY_EMULATE_CHECK="all")
    assert_no_unwritten_byte(checked)
    assert_bitwise(checked, backward(CHECKED, monkeypatch))


@pytest.mark.parametrize("stress", list(STRESS))
def test_checked_stress_modes_are_bit_identical(stress, monkeypatch):
    stressed = backward(CHECKED, monkeypatch, KDACUPY_EMULATE_CHECK="all", **STRESS[stress])
    assert_no_unwritten_byte(stressed)
    assert_bitwise(stressed, backward(CHECKED, monkeypatch))


def test_a_missing_barrier_is_caught(monkeypatch):
    """The check sees the backward's own hazards: without the barrier between [B3] (each warp
    writes its 16 columns of dY, dX) and [B4] (every warp reads all of them), racecheck reports
    the race."""
    import kdacupy.jit.loaders as loaders
    import kdacupy.ops.backward.kernels as kernels
    from kdacupy.emulate import EmulationError
    from kdacupy.jit import render as jit
    monkeypatch.setattr(kernels, "loader", lambda kind: loaders.EmulateLoader())  # no variant cached unmutated
    real = jit._read
    marker = "      __syncthreads();\n      // [B4] the chains"
    assert real("kda_bwd_chunk.cu").count(marker) == 1
    monkeypatch.setattr(jit, "_read", lambda n: real(n).replace(marker, "      // [B4] the chains")
                        if n == "kda_bwd_chunk.cu" else real(n))
    with pytest.raises(EmulationError, match="racecheck"):
        backward(CHECKED, monkeypatch, KDACUPY_EMULATE_CHECK="racecheck")

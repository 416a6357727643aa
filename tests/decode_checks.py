"""One decode step's results against the decode precision model, shared by the
emulated suite (tests/emulate/test_decode_emulate.py, on the CPU) and the GPU suite
(tests/gpu/test_gpu_decode.py), so the comparison the GPU run is judged by is the
one the CPU runs every time."""
import numpy as np

import kdacupy
from kdacupy.numerics.parity import mismatch


def check_decode_step(o, pool_after, pool_before, x, opts, written, padded, tol):
    """``o`` and ``pool_after`` (NumPy) of one kernel step from ``pool_before``, against
    ``kda_decode(backend="model")`` on a copy of ``pool_before`` with the host options ``opts``
    (what device-only index values mean, e.g. a slot >= P written as -1): the live rows and
    the ``written`` slots within ``tol``, the ``padded`` rows exactly zero (and finite
    everywhere), every other slot bitwise unchanged, and each written slot changed.
    ``written`` and ``padded`` are the test's own statement of the index semantics."""
    pm = pool_before.copy()
    om = kdacupy.kda_decode(**x, state_pool=pm, **opts, backend="model")
    o = np.asarray(o)
    assert o.dtype == om.dtype and o.shape == om.shape
    assert np.isfinite(o.astype(np.float32)).all()
    live = [n for n in range(o.shape[0]) if n not in set(padded)]
    assert not np.any(o[list(padded)].astype(np.float32)), "padded rows must be zero"
    assert not np.any(om[list(padded)].astype(np.float32)), "the model pads those rows too"
    why = mismatch(o[live], om[live], tol)
    assert why is None, ("output", why)
    slots = sorted(written)
    why = mismatch(pool_after[slots], pm[slots], tol)
    assert why is None, ("written slots", why)
    for s in slots:
        assert not np.array_equal(pool_after[s], pool_before[s]), f"slot {s} was not written"
        assert not np.array_equal(pm[s], pool_before[s]), f"the model did not write slot {s}"
    keep = np.setdiff1d(np.arange(pool_before.shape[0]), slots)
    assert np.array_equal(pool_after[keep].view(np.uint8), pool_before[keep].view(np.uint8)), \
        "slots outside the written set changed"
    assert np.array_equal(pm[keep].view(np.uint8), pool_before[keep].view(np.uint8)), \
        "the model wrote outside the written set"

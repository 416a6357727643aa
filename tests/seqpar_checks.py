"""The split forward against the serial one, the model's split and the float64
reference, shared by the emulated suite (tests/numerics/test_seqpar.py, on the CPU)
and the GPU suite (tests/gpu/test_gpu_seqpar.py): a bug the split shares with the
serial path (both run the same kernels) cannot hide behind split-equals-serial."""
import numpy as np

import kdacupy
from kdacupy.numerics.parity import mismatch
from kdacupy.numerics.reference import kda_reference

from .inputs import rmse_ratio


def close(x, ref, tol, what):
    why = mismatch(x, ref, tol)
    assert why is None, (what, why)


def no_less_accurate(x, serial, ref, what):
    """The split's RMSE ratio against the reference within 5% (+ 1e-4) of the serial run's."""
    got, base = rmse_ratio(x, ref), rmse_ratio(serial, ref)
    assert got <= 1.05 * base + 1e-4, (what, got, base)


def check_split(run, x, opts, n, tol_serial, tol_model):
    """``run(x, opts, n) -> (o, final_state)`` as NumPy arrays with ``sequence_parallel=n``.
    The split (n) against the serial run (1) within ``tol_serial``, against
    ``kda_forward(backend="model", sequence_parallel=n)`` within ``tol_model``, and no less
    accurate than the serial run against the float64 reference."""
    o1, s1 = run(x, opts, 1)
    o2, s2 = run(x, opts, n)
    assert o2.dtype == o1.dtype and o2.shape == o1.shape and s2.dtype == s1.dtype and s2.shape == s1.shape
    for a in (o1, s1, o2, s2):
        assert np.isfinite(np.asarray(a, np.float64)).all()
    close(o2, o1, tol_serial, "split vs serial output")
    close(s2, s1, tol_serial, "split vs serial state")
    om, sm = kdacupy.kda_forward(**x, **opts, backend="model", sequence_parallel=n)
    close(o2, om, tol_model, "split vs the model's split, output")
    close(s2, sm, tol_model, "split vs the model's split, state")
    ro, rs = kda_reference(**x, **{k: v for k, v in opts.items() if k not in ("state_dtype", "state_precision")})
    no_less_accurate(o2, o1, ro, "output against the reference")
    no_less_accurate(s2, s1, rs, "state against the reference")

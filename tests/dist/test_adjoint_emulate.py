"""The state adjoint a context-parallel rank sends (kdacupy/distributed/adjoint.py) through the
CUDA kernels' own code on the CPU emulation: kda_prepare and kda_bwd_chain alone give, bit for
bit, the dinitial_state of the whole emulated backward, and of the precision model's adjoint
(the kernels' arithmetic). On the emulated backward suite's first case, whose kernels that suite
compiles too (tests/emulate/test_backward_emulate.py)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.distributed.adjoint import state_adjoint

from ..emulate.test_backward_emulate import inputs

pytestmark = pytest.mark.emulate


def test_prepare_and_chain_alone_are_the_backwards_dinitial_state():
    x, opts, do, ds = inputs("gva-sigmoid-l2norm-neg-eigval")
    assert opts.get("state_layout", "kv") == "kv"  # (the adjoint's states are "kv")
    opts = {n: a for n, a in opts.items() if n not in ("initial_state", "state_layout")}
    got = state_adjoint(do, **x, dfinal_state=ds, cu_seqlens=None, options=dict(opts, backend="emulate"),
                        xdtype=np.float32)
    whole = kdacupy.kda_backward(do, **x, dfinal_state=ds, initial_state=np.zeros_like(ds), backend="emulate",
                                 **opts)
    model = state_adjoint(do, **x, dfinal_state=ds, cu_seqlens=None, options=dict(opts, backend="model"),
                          xdtype=np.float32)
    assert got.dtype == np.float32 and got.shape == ds.shape
    np.testing.assert_array_equal(got, whole.dinitial_state)
    np.testing.assert_array_equal(got, model)

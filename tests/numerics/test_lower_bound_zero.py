"""``lower_bound=0`` (FlashKDA documents its gate's range as [-5, 0]): the sigmoid gate is then
zero, no decay, on every backend that takes it, and its gradients are those of no decay."""
from __future__ import annotations

import numpy as np
import pytest

import kdacupy
from tests.inputs import make_inputs


@pytest.mark.parametrize("backend", ["reference", "model"])
def test_lower_bound_zero_is_no_decay(backend):
    x, o = make_inputs(T=37, state=np.float32)
    zero_gate = dict(o, lower_bound=0.0)
    no_decay = {n: v for n, v in o.items() if n not in ("gate", "A_log", "dt_bias", "lower_bound")}
    out, fin = kdacupy.kda_forward(**x, **zero_gate, output_final_state=True, backend=backend)
    ref, ref_fin = kdacupy.kda_forward(**dict(x, g=np.zeros_like(x["g"])), **no_decay, output_final_state=True,
                                       backend=backend)
    assert np.array_equal(out.view(np.uint16), ref.view(np.uint16))
    assert np.array_equal(fin, ref_fin)
    # with a decay the same call differs: the gate is really read
    decayed, _ = kdacupy.kda_forward(**x, **dict(o, lower_bound=-1.0), backend=backend)
    assert not np.array_equal(decayed.view(np.uint16), out.view(np.uint16))


def test_lower_bound_zero_backward_has_no_gate_gradient():
    x, o = make_inputs(T=21)
    do = np.random.default_rng(1).standard_normal(x["v"].shape).astype(x["v"].dtype)
    grads = kdacupy.kda_backward(do, **x, **dict(o, lower_bound=0.0), backend="reference")
    assert not np.any(grads.dg) and not np.any(grads.dA_log) and not np.any(grads.ddt_bias)
    assert np.any(grads.dq)

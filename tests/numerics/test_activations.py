"""The gate and beta activations of the precision model and the emulated kernels
(forward and decode) against the definition written out by hand in tests/activations.py;
test_gpu_forward.py and test_gpu_decode.py run the same checks on a GPU."""
import pytest

import kdacupy

from .. import activations as act

BACKENDS = ["model", pytest.param("emulate", marks=pytest.mark.emulate)]


def forward(backend):
    return lambda x, opts: kdacupy.kda_forward(**x, **opts, backend=backend)


def decode(backend):
    def run(x, opts, pool):
        p = pool.copy()
        return kdacupy.kda_decode(**x, state_pool=p, **opts, backend=backend), p
    return run


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gate", act.GATES)
def test_gates_by_hand(gate, backend):
    act.forward_gate(forward(backend), gate)
    act.decode_gate(decode(backend), gate)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", act.BETAS)
def test_beta_by_hand(mode, backend):
    act.forward_beta(forward(backend), mode)
    act.decode_beta(decode(backend), mode)

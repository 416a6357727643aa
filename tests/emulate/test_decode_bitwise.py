"""The decode kernel on the CPU emulation bit for bit: the output and the whole pool after the call,
on every case of the decode option matrix (tests/decode_cases.py), against the decode precision
model (kdacupy/numerics/decode_model.py), which takes every sum over the K keys in the kernel's
order: each lane's fmaf chain over its keys l, l + 32, ... then a xor butterfly over the 32 lanes
(16, 8, 4, 2, 1). The model's own sum is checked here against a plain fmaf chain, so a change of
order in both would still be seen."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.backward_arith import fma_chain
from kdacupy.numerics.decode_model import warp_dot
from kdacupy.numerics.precision import r32

from ..decode_cases import DECODE_CASES, DECODE_SAMPLE, decode_case
from ..sweeps import sample

pytestmark = pytest.mark.emulate


def test_warp_dot_is_lane_chains_then_a_butterfly():
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((3, 128)).astype(np.float32).astype(np.float64) for _ in range(2))
    lanes = fma_chain(a.reshape(3, 4, 32), b.reshape(3, 4, 32), axis=1)  # lane l: keys l, l + 32, l + 64, l + 96
    for m in (16, 8, 4, 2, 1):
        lanes = r32(lanes + lanes[:, np.arange(32) ^ m])
    np.testing.assert_array_equal(warp_dot(a, b), lanes[:, 0])


# the parity suite's sample (test_decode_emulate.py, the same builds); the other cases are a sweep
# (cover=False: the axis is the cases themselves)
@pytest.mark.parametrize("name", sample(list(DECODE_CASES), lambda n: n in DECODE_SAMPLE, cover=False))
def test_emulated_decode_is_bit_for_bit(name):
    x, opts, pool = decode_case(name)
    got_pool, want_pool = pool.copy(), pool.copy()
    got = kdacupy.kda_decode(**x, state_pool=got_pool, **opts, backend="emulate")
    want = kdacupy.kda_decode(**x, state_pool=want_pool, **opts, backend="model")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(got_pool.view(np.uint8), want_pool.view(np.uint8))

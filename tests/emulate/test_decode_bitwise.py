"""The decode kernel on the CPU emulation bit for bit: the output and the whole pool after the call,
on every case of the decode option matrix (tests/decode_cases.py).

decode_model.py sums w, o and the l2norm's squares exactly and rounds once (steps 2, 4, 7), so the
parity suite (test_decode_emulate.py) holds the kernel within parity.EMULATE only, and an error of
an ulp in any step would pass it. The kernel's sums over the K keys are each lane's fmaf chain over
its keys l, l + 32, ... then a xor butterfly over the 32 lanes (16, 8, 4, 2, 1): ``warp_dot`` below;
everything else is decode_model.py's steps as they are (the gates and beta: precision.py's, which
the backward's suite holds to the bit)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.backward_arith import fma32, fma_chain
from kdacupy.numerics.decode_reference import decode_plan
from kdacupy.numerics.dtypes import round_to
from kdacupy.numerics.precision import EPS_F32, beta_f32, ex2, gate_f32, r32, scale_f32
from kdacupy.numerics.reference import state_from_kv, state_to_kv

from ..decode_cases import DECODE_CASES, decode_case

pytestmark = pytest.mark.emulate


def warp_dot(a, b):
    """sum_k a_k b_k over the last axis (K keys) as the decode kernel takes it, in fp32."""
    a, b = np.broadcast_arrays(a, b)
    lanes = a.shape[:-1] + (a.shape[-1] // 32, 32)  # key 32 i + l: lane l's i-th
    x = fma_chain(a.reshape(lanes), b.reshape(lanes), axis=-2)
    lane = np.arange(32)
    for m in (16, 8, 4, 2, 1):
        x = r32(x + x[..., lane ^ m])
    return x[..., 0]


def decode_exact(q, k, v, g, beta=None, *, state_pool, state_indices, num_accepted_tokens=None, scale=None,
                 qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None,
                 dt_bias=None, lower_bound=None, state_layout="vk"):
    """kda_decode on the emulation's default numerics, to the bit: updates ``state_pool``, returns o."""
    N, T, H, K = q.shape
    HV = v.shape[2]
    qn, kn = np.asarray(q, np.float64), np.asarray(k, np.float64)
    if qk_l2norm:  # [2] x r32(rsqrt(r32(sum x^2 + 1e-6)))
        qn, kn = (r32(x * r32(1.0 / np.sqrt(r32(warp_dot(x, x) + EPS_F32)))[..., None]) for x in (qn, kn))
    qn, kn = np.repeat(qn, HV // H, axis=2), np.repeat(kn, HV // H, axis=2)
    a = ex2(gate_f32(np.asarray(g, np.float64), gate, A_log, dt_bias, lower_bound))
    b = beta_f32(beta, (N, T, HV), beta_sigmoid, allow_neg_eigval)
    qs, kd = r32(qn * scale_f32(scale, K)), r32(kn * a)  # [3]
    vf = np.asarray(v, np.float64)
    start, write = decode_plan(state_indices, num_accepted_tokens, N, T, state_pool.shape[0])
    o = np.zeros(v.shape)
    for n in np.flatnonzero(start >= 0):
        S = np.asarray(state_to_kv(state_pool[start[n]], state_layout), np.float64)  # [HV, K, V], exact in fp32
        for t in range(T):
            w = warp_dot(kd[n, t][:, None, :], np.swapaxes(S, -1, -2))               # [4] [HV, V]
            u = r32(b[n, t][:, None] * r32(vf[n, t] - w))                             # [5]
            S = fma32(S, a[n, t][:, :, None], r32(kn[n, t][:, :, None] * u[:, None, :]))  # [6]
            o[n, t] = warp_dot(qs[n, t][:, None, :], np.swapaxes(S, -1, -2))          # [7]
            if write[n, t] >= 0:                                                       # [8]
                state_pool[write[n, t]] = round_to(state_from_kv(S, state_layout), state_pool.dtype)
    return round_to(o, v.dtype).astype(v.dtype)


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_emulated_decode_is_bit_for_bit(name):
    x, opts, pool = decode_case(name)
    got_pool, want_pool = pool.copy(), pool.copy()
    got = kdacupy.kda_decode(**x, state_pool=got_pool, **opts, backend="emulate")
    want = decode_exact(**x, state_pool=want_pool, **opts)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(got_pool.view(np.uint8), want_pool.view(np.uint8))

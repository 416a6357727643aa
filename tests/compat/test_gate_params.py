"""Gate parameters as models hold them, taken everywhere: A_log in the [1, 1, HV, 1] parameter
shape and bf16 / fp16 A_log and dt_bias, through kda_forward, kda_decode, kda_backward (the
gradients in the parameters' own shape and dtype), kdacupy.torch and kdacupy.compat.fla. The
conversion to float32 is exact, so each call must give bit for bit what it gives with the same
values in float32 [HV]."""
import ml_dtypes
import numpy as np
import pytest

import kdacupy
from tests.frameworks.common import one_thread

BF16 = np.dtype(ml_dtypes.bfloat16)
B, T, H, HV, K = 1, 6, 1, 2, 64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((B, T, HV, K)).astype(np.float32)
    g = rng.standard_normal((B, T, HV, K)).astype(np.float32)
    beta = rng.random((B, T, HV)).astype(np.float32)
    A_log = np.log(rng.uniform(1, 16, HV)).astype(BF16)  # values a bf16 model holds
    dt_bias = rng.standard_normal(HV * K).astype(np.float16)
    return (q, k, v, g, beta), A_log, dt_bias


@pytest.mark.parametrize("gate,lower_bound", [("softplus", None), ("sigmoid", -5.0)])
def test_the_core_takes_model_parameters(gate, lower_bound):
    x, A_log, dt_bias = inputs()
    opts = dict(gate=gate, lower_bound=lower_bound, qk_l2norm=True)
    as_model = dict(A_log=A_log.reshape(1, 1, HV, 1), dt_bias=dt_bias)
    as_f32 = dict(A_log=A_log.astype(np.float32), dt_bias=dt_bias.astype(np.float32))
    for backend in ("reference", "model"):
        a, b = (kdacupy.kda_forward(*x, backend=backend, **opts, **p)[0] for p in (as_model, as_f32))
        assert np.array_equal(a, b), backend
    pool = np.random.default_rng(1).standard_normal((3, HV, K, K)).astype(np.float32)
    pools = [pool.copy(), pool.copy()]
    a, b = (kdacupy.kda_decode(*(y[:, :2].reshape((2, 1) + y.shape[2:]) for y in x), state_pool=s,
                               state_indices=np.array([2, 0]), **opts, **p) for s, p in zip(pools, (as_model, as_f32)))
    assert np.array_equal(a, b) and np.array_equal(*pools)
    o = kdacupy.kda_forward(*x, **opts, **as_f32)[0]
    ga, gb = (kdacupy.kda_backward(o, *x, **opts, **p) for p in (as_model, as_f32))
    assert ga.dA_log.shape == (1, 1, HV, 1) and ga.dA_log.dtype == BF16 and ga.ddt_bias.dtype == np.float16
    assert np.array_equal(ga.dA_log.reshape(HV), gb.dA_log.astype(BF16))
    assert np.array_equal(ga.ddt_bias, gb.ddt_bias.astype(np.float16))
    assert np.array_equal(ga.dq, gb.dq)


@pytest.mark.torch
def test_torch_and_compat_fla_take_model_parameters():
    torch = pytest.importorskip("torch")
    import kdacupy.compat.fla as fla
    import kdacupy.torch as kt
    x, A_log, dt_bias = inputs(2)
    x = [torch.from_numpy(y) for y in x]
    A = torch.from_numpy(A_log.astype(np.float32)).bfloat16().reshape(1, 1, HV, 1).requires_grad_()
    dtb = torch.from_numpy(dt_bias).requires_grad_()
    A32, dtb32 = (y.detach().float().reshape(-1).requires_grad_() for y in (A, dtb))
    o, _ = kt.kda(*x, gate="softplus", A_log=A, dt_bias=dtb, qk_l2norm=True)
    o32, _ = kt.kda(*x, gate="softplus", A_log=A32, dt_bias=dtb32, qk_l2norm=True)
    assert torch.equal(o, o32)
    o.sum().backward()
    o32.sum().backward()
    assert A.grad.shape == A.shape and A.grad.dtype == torch.bfloat16 and dtb.grad.dtype == torch.float16
    assert torch.equal(A.grad.reshape(-1), A32.grad.bfloat16()) and torch.equal(dtb.grad, dtb32.grad.half())
    o_fla, _ = fla.chunk_kda(*x, A_log=A.detach(), dt_bias=dtb.detach(), use_gate_in_kernel=True,
                             use_qk_l2norm_in_kernel=True)
    assert torch.equal(o_fla, o32)
    pool = torch.zeros(2, HV, K, K)
    step = [y[:, :1] for y in x]
    o1 = kt.kda_decode(*step, state_pool=pool, state_indices=torch.tensor([1]), gate="softplus", A_log=A.detach(),
                       dt_bias=dtb.detach(), qk_l2norm=True)
    o1_32 = kt.kda_decode(*step, state_pool=torch.zeros(2, HV, K, K), state_indices=torch.tensor([1]),
                          gate="softplus", A_log=A32.detach(), dt_bias=dtb32.detach(), qk_l2norm=True)
    assert torch.equal(o1, o1_32) and pool[0].abs().max() == 0 and pool[1].abs().max() > 0

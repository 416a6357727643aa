"""kdacupy.jax takes gate parameters as models hold them: A_log [1, 1, HV, 1] and bf16 / fp16
A_log and dt_bias, with the same result as float32 [HV] parameters of the same values and the
gradients in the parameters' own shape and dtype.

Like tests/frameworks/test_jax.py this module names the emulation (backend="emulate"), so it
runs in a forked child (tests/isolation.py) and JAX's runtime never starts in the pytest
process, which forks the emulated modules' children later."""
import ml_dtypes
import numpy as np
import pytest

from tests.conftest import MARKERS

pytestmark = pytest.mark.jax
jax = pytest.importorskip("jax", reason=MARKERS["jax"])
pytest.importorskip("jax.experimental.buffer_callback", reason=MARKERS["jax"])

import jax.numpy as jnp  # noqa: E402

import kdacupy.jax as kj  # noqa: E402


def test_model_parameters_through_kda_and_its_gradient():
    rng = np.random.default_rng(0)
    B, T, H, HV, K = 1, 5, 1, 2, 64
    q, k = (jnp.asarray(rng.standard_normal((B, T, H, K)), jnp.float32) for _ in range(2))
    v, g = (jnp.asarray(rng.standard_normal((B, T, HV, K)), jnp.float32) for _ in range(2))
    beta = jnp.asarray(rng.random((B, T, HV)), jnp.float32)
    A_log = jnp.asarray(np.log(rng.uniform(1, 16, HV)).astype(ml_dtypes.bfloat16)).reshape(1, 1, HV, 1)
    dt_bias = jnp.asarray(rng.standard_normal(HV * K), jnp.float16)

    def loss(A, dtb):
        o, _ = kj.kda(q, k, v, g, beta, gate="softplus", A_log=A, dt_bias=dtb, qk_l2norm=True)
        return o.sum()

    as_f32 = (A_log.reshape(HV).astype(jnp.float32), dt_bias.astype(jnp.float32))
    assert loss(A_log, dt_bias) == loss(*as_f32)
    dA, ddt = jax.grad(loss, argnums=(0, 1))(A_log, dt_bias)
    dA32, ddt32 = jax.grad(loss, argnums=(0, 1))(*as_f32)
    assert dA.shape == (1, 1, HV, 1) and dA.dtype == jnp.bfloat16 and ddt.dtype == jnp.float16
    assert np.array_equal(np.asarray(dA).reshape(HV), np.asarray(dA32.astype(jnp.bfloat16)))
    assert np.array_equal(np.asarray(ddt), np.asarray(ddt32.astype(jnp.float16)))

"""A Kimi Delta Attention layer in JAX on kdacupy.jax, and a few jitted training steps.

The same layer as examples/torch_kda_layer.py, as pure functions of a parameter dict: q, k, v
projections through causal depthwise short convolutions and SiLU, a low-rank forget-gate
projection activated in the kernel (``gate="softplus"`` with ``A_log`` and ``dt_bias``),
beta logits, q/k L2 normalisation in the kernel, a per-head RMS norm times a sigmoid output
gate, the output projection. ``jax.jit(jax.value_and_grad(loss))`` differentiates through
``kdacupy.jax.kda`` (its backward is ``kdacupy.kda_backward``).

On a GPU the kernel runs on XLA's buffers and stream; on the CPU on the float64 reference:

    python examples/jax_kda_layer.py               # a few steps on the CPU
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import kdacupy.jax as kj

HEAD_DIM = 64


def init(key, hidden, heads, gate_rank=16, width=4):
    keys = iter(jax.random.split(key, 16))
    dense = lambda n_in, n_out: jax.random.normal(next(keys), (n_in, n_out)) / jnp.sqrt(n_in)  # noqa: E731
    C = heads * HEAD_DIM
    return dict(
        wq=dense(hidden, C), wk=dense(hidden, C), wv=dense(hidden, C),
        conv_q=jax.random.normal(next(keys), (width, C)) / width, conv_k=jax.random.normal(next(keys), (width, C)) / width,
        conv_v=jax.random.normal(next(keys), (width, C)) / width,
        wf1=dense(hidden, gate_rank), wf2=dense(gate_rank, C), wb=dense(hidden, heads),
        A_log=jnp.log(jax.random.uniform(next(keys), (heads,), minval=1.0, maxval=16.0)), dt_bias=jnp.zeros(C),
        wg1=dense(hidden, gate_rank), wg2=dense(gate_rank, C), bg=jnp.zeros(C),
        norm=jnp.ones(HEAD_DIM), wo=dense(C, hidden))


def short_conv(x, w):
    """Causal depthwise convolution over time of x [B, T, C] with taps w [W, C], then SiLU."""
    W, T = w.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (W - 1, 0), (0, 0)))
    return jax.nn.silu(sum(padded[:, j:j + T] * w[j] for j in range(W)))


def layer(p, x, initial_state=None):
    B, T, _ = x.shape
    heads = lambda y: y.reshape(B, T, -1, HEAD_DIM)  # noqa: E731
    q = heads(short_conv(x @ p["wq"], p["conv_q"]))
    k = heads(short_conv(x @ p["wk"], p["conv_k"]))
    v = heads(short_conv(x @ p["wv"], p["conv_v"]))
    f = heads(x @ p["wf1"] @ p["wf2"])
    o, state = kj.kda(q, k, v, f, x @ p["wb"], gate="softplus", A_log=p["A_log"], dt_bias=p["dt_bias"],
                      beta_sigmoid=True, qk_l2norm=True, initial_state=initial_state,
                      output_final_state=initial_state is not None)
    o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + 1e-6) * p["norm"]
    o = o * jax.nn.sigmoid(heads(x @ p["wg1"] @ p["wg2"] + p["bg"]))
    return o.reshape(B, T, -1) @ p["wo"], state


def loss(p, x):
    y, _ = layer(p, x[:, :-1])
    return jnp.mean((y - x[:, 1:]) ** 2)


def train(steps=4, hidden=64, T=24, seed=0, lr=3e-3):
    """A few jitted Adam steps of one layer on a fixed next-token regression batch; the losses."""
    key = jax.random.PRNGKey(seed)
    p = init(key, hidden, heads=1)
    x = jax.random.normal(jax.random.fold_in(key, 1), (2, T + 1, hidden))
    m = jax.tree.map(jnp.zeros_like, p)
    s = jax.tree.map(jnp.zeros_like, p)

    @jax.jit
    def step(p, m, s, i):
        value, grad = jax.value_and_grad(loss)(p, x)
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, grad)
        s = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, s, grad)
        p = jax.tree.map(lambda w, a, b: w - lr * (a / (1 - 0.9 ** i)) / (jnp.sqrt(b / (1 - 0.999 ** i)) + 1e-8),
                         p, m, s)
        return p, m, s, value

    losses = []
    for i in range(1, steps + 1):
        p, m, s, value = step(p, m, s, i)
        losses.append(float(value))
    return losses


if __name__ == "__main__":
    for i, value in enumerate(train(steps=8)):
        print(f"step {i}: loss {value:.4f}")

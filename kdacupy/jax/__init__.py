"""kdacupy for JAX (extra ``[jax]``): ``kda`` (``jax.custom_vjp``; ``jit``, ``grad``, ``vmap``, inside
``shard_map`` too), ``kda_decode`` (functional: returns the updated pool) and ``kda_cp`` (context
parallelism inside ``jax.shard_map`` over a mesh axis that shards the tokens, kdacupy/jax/cp.py).

Both run through ``jax.experimental.buffer_callback``: on a GPU kdacupy's CUDA
kernels read and write XLA's device buffers on XLA's stream (no host copy, no
``pure_callback``); on the CPU the NumPy backends run on XLA's host buffers. This
package is the only part of kdacupy that imports jax.
"""
try:
    from jax.experimental.buffer_callback import buffer_callback as _buffer_callback  # noqa: F401
except ImportError as e:  # jax older than the buffer callback
    raise ImportError("kdacupy.jax needs jax with jax.experimental.buffer_callback (jax >= 0.7); "
                      "pip install 'kdacupy[jax]'") from e

from .api import kda, kda_decode  # noqa: E402
from .cp import kda_cp  # noqa: E402

__all__ = ["kda", "kda_decode", "kda_cp"]

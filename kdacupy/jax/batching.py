"""``jax.vmap`` of the callbacks (``vmap_method="expand_dims"``).

Under vmap every argument of a callback gains the same leading dims, one per vmap
level: the mapped size for a batched argument, 1 for an unbatched one; results gain
the mapped sizes. ``run`` turns that into kdacupy calls: when only per-sequence
arrays are mapped (q, k, v, g, beta, the states: nothing per head, no cu_seqlens) the
leading dims fold into the batch dim B, one call for the whole vmap; otherwise one
call per mapped index, each on its slice.
"""
from __future__ import annotations

import numpy as np


def _xp(a):
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def _lead(a, base_ndim):
    return tuple(a.shape[:a.ndim - base_ndim])


def _fold(a, lead, base_ndim):
    """[*lead, B, ...] (leading dims 1 or full) -> [prod(lead) * B, ...], a view where it can be."""
    if a is None:
        return None
    xp = _xp(a)
    shape = lead + tuple(a.shape[a.ndim - base_ndim:])
    if tuple(a.shape) != shape:
        a = xp.ascontiguousarray(xp.broadcast_to(a, shape))
    return a.reshape((-1,) + shape[len(lead) + 1:])


def _index(a, idx, base_ndim):
    """Element ``idx`` of the leading dims (size-1 dims broadcast)."""
    if a is None:
        return None
    lead = _lead(a, base_ndim)
    return a[tuple(i if n > 1 else 0 for i, n in zip(idx, lead))]


def run(call, inputs, base, outputs, out_base, foldable, fold=True):
    """Run ``call(inputs, outputs)`` (dicts of arrays, without leading dims) over the vmap's
    leading dims. ``base``/``out_base``: each array's rank without them; ``foldable``: the
    inputs that may fold into B (every other present input must be unmapped to fold);
    ``fold=False`` when an output is not per sequence (e.g. a gradient of A_log)."""
    first = next(iter(outputs.values()))
    lead = _lead(first, out_base[next(iter(outputs))])
    if not lead:
        return call(inputs, outputs)
    unmapped = fold and all(all(n == 1 for n in _lead(a, base[k])) for k, a in inputs.items()
                   if a is not None and k not in foldable)
    if unmapped:
        return call({k: _fold(a, lead, base.get(k)) if k in foldable else _index(a, (0,) * len(lead), base.get(k))
                     for k, a in inputs.items()},
                    {k: _fold(a, lead, out_base[k]) for k, a in outputs.items()})
    for idx in np.ndindex(*lead):
        call({k: _index(a, idx, base.get(k)) for k, a in inputs.items()},
             {k: a[idx] for k, a in outputs.items()})

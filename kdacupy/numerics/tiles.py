"""The tiles the chunked kernels run a head dim on, as the models pad to them.

kda_prepare's row phase needs a power-of-two count of 16-byte pieces per thread (8 threads a row,
kernels/rows.cuh), so a key tile is 64, 128 or 256; value tiles take the same sizes. A head dim in
[16, 256] outside them runs on the smallest tile that holds it, the arrays padded with zeros
(docs/design.md section 2). The forward's launchers (kdacupy/ops/forward/limits.py) and the
bit-exact models read this one rule.
"""
from __future__ import annotations

import numpy as np

#: the head dims the chunked kernels are built for
TILES = (64, 128, 256)


def tile_of(dim: int) -> int:
    """The tile a head dim in [16, 256] runs on: the smallest of TILES that holds it (a tile size itself
    for the tile sizes)."""
    return next(t for t in TILES if t >= dim)


def exact_dims(K: int, V: int) -> bool:
    """Whether (K, V) has variants of its own (the sizes constants, no masks)."""
    return K in TILES and V in TILES


def pad_to(x, axis: int, n: int):
    """x with zeros after its size along ``axis``, to n (its dtype kept): an array on its tile."""
    width = [(0, 0)] * x.ndim
    width[axis] = (0, n - x.shape[axis])
    return np.pad(x, width)

"""What the forward kernels support: ``supports(problem) -> reason | None``, and the tiles a head
dim runs on.

Argument checks that hold for every backend live in kdacupy/validation/;
these are the kernel family's own limits (the NumPy backends mirror them, so a
call that runs on the CPU also runs on the GPU).
"""
from __future__ import annotations

#: head dims K and V the kernels are built for: the tiles. kda_prepare's row phase needs a
#: power-of-two count of 16-byte pieces per thread (8 threads a row, kernels/rows.cuh), so a key
#: tile is 64, 128 or 256; the forward runs any other K, V in [ANY_MIN, ANY_MAX] on the tile above
#: it with the true sizes as launch arguments (``tile_of``, KDA_ANY_DIMS)
DIMS = (64, 128, 256)
ANY_MIN, ANY_MAX = 16, 256
#: CUDA's limit on gridDim.y; the kernels put the value head there
MAX_GRID_Y = 65535


def tile_of(dim: int) -> int:
    """The tile a head dim in [ANY_MIN, ANY_MAX] runs on: the smallest of DIMS that holds it."""
    return next(t for t in DIMS if t >= dim)


def exact_dims(K: int, V: int) -> bool:
    """Whether (K, V) has variants of its own (the sizes constants, no masks)."""
    return K in DIMS and V in DIMS


def supports(p) -> str | None:
    """None if the kernels built for DIMS alone (the backward's, the split's) run ``p`` (a
    Problem, or the sizes validation reads first: anything with K and V), else why not (an error
    message)."""
    if p.HV > MAX_GRID_Y:
        return f"v: expected at most {MAX_GRID_Y} value heads (the kernels' gridDim.y), got HV = {p.HV}"
    if p.K not in DIMS:
        return f"q: expected head dim K in {DIMS}, got K = {p.K}"
    if p.V not in DIMS:
        return f"v: expected head dim V in {DIMS}, got V = {p.V}"
    return None

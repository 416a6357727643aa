"""What the forward kernels support: ``supports(problem) -> reason | None``, and the tiles a head
dim runs on.

Argument checks that hold for every backend live in kdacupy/validation/;
these are the kernel family's own limits (the NumPy backends mirror them, so a
call that runs on the CPU also runs on the GPU).
"""
from __future__ import annotations

from ...numerics.tiles import TILES, exact_dims, tile_of  # noqa: F401  (the launchers' tile rule)

#: head dims K and V the kernels are built for: the tiles (kdacupy/numerics/tiles.py); the forward and
#: the backward run any other K, V in [ANY_MIN, ANY_MAX] on the tile above it with the true sizes as
#: launch arguments (KDA_ANY_DIMS)
DIMS = TILES
ANY_MIN, ANY_MAX = 16, 256
#: CUDA's limit on gridDim.y; the kernels put the value head there
MAX_GRID_Y = 65535


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

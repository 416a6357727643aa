"""The chunked kernels' limits: the head dims they take and the tiles those run on, and the grid.

Argument checks that hold for every backend live in kdacupy/validation/ (head_dims.py applies
these); the NumPy backends mirror them, so a call that runs on the CPU also runs on the GPU.
"""
from __future__ import annotations

from ...numerics.tiles import TILES

#: head dims K and V the kernels are built for: the tiles (kdacupy/numerics/tiles.py); every chunked
#: kernel runs any other K, V in [ANY_MIN, ANY_MAX] on the tile above it with the true sizes as
#: launch arguments (KDA_ANY_DIMS)
DIMS = TILES
ANY_MIN, ANY_MAX = 16, 256
#: CUDA's limit on gridDim.y; the kernels put the value head there
MAX_GRID_Y = 65535

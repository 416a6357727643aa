"""What the forward kernels support: ``supports(problem) -> reason | None``.

Argument checks that hold for every backend live in kdacupy/validation/;
these are the kernel family's own limits (the NumPy backends mirror them, so a
call that runs on the CPU also runs on the GPU).
"""
from __future__ import annotations

#: head dims K and V the kernels are built for
DIMS = (64, 128, 256)
#: CUDA's limit on gridDim.y; the kernels put the value head there
MAX_GRID_Y = 65535


def supports(p) -> str | None:
    """None if the forward kernels run ``p`` (a Problem, or the sizes validation
    reads first: anything with K and V), else why not (an error message)."""
    if p.HV > MAX_GRID_Y:
        return f"v: expected at most {MAX_GRID_Y} value heads (the kernels' gridDim.y), got HV = {p.HV}"
    if p.K not in DIMS:
        return f"q: expected head dim K in {DIMS}, got K = {p.K}"
    if p.V not in DIMS:
        return f"v: expected head dim V in {DIMS}, got V = {p.V}"
    return None

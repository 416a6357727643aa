"""Which head dims K and V each path takes: the one place that says it.

``kda_decode`` takes any K and V in [16, 256] (its kernel masks its key tile and its value
rows at the true sizes, docs/design.md section 2); the chunked paths (``kda_forward``,
``kda_backward``, sequence parallelism, the state pool of the forward) take K, V in
{64, 128, 256}, the sizes their kernels are built for (kdacupy/ops/forward/limits.py).
Every backend applies the rule of its path, so a call that runs on the CPU also runs on
the GPU.
"""
from __future__ import annotations

from ..ops.forward.limits import DIMS, MAX_GRID_Y, supports

#: the decode's head dims: any from DECODE_MIN to DECODE_MAX
DECODE_MIN, DECODE_MAX = 16, 256
#: path -> the head dims it takes (a range or a tuple of sizes)
HEAD_DIMS = {"forward": DIMS, "backward": DIMS, "seqpar": DIMS,
             "decode": range(DECODE_MIN, DECODE_MAX + 1)}
PATHS = tuple(HEAD_DIMS)


def describe(path: str) -> str:
    dims = HEAD_DIMS[path]
    return f"[{dims.start}, {dims.stop - 1}]" if isinstance(dims, range) else str(dims)


def head_dims_problem(sizes, path: str = "forward") -> str | None:
    """None if ``path``'s kernels run head dims ``sizes.K``, ``sizes.V`` (and its grid the heads),
    else the error message, naming the argument."""
    if path not in HEAD_DIMS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    if path != "decode":
        return supports(sizes)
    if sizes.HV > MAX_GRID_Y:  # the decode puts the value head on gridDim.y too
        return f"v: expected at most {MAX_GRID_Y} value heads (the kernels' gridDim.y), got HV = {sizes.HV}"
    for name, dim, what in (("q", sizes.K, "K"), ("v", sizes.V, "V")):
        if dim not in HEAD_DIMS[path]:
            return f"{name}: expected head dim {what} in {describe(path)} (kda_decode), got {what} = {dim}"
    return None

"""Which head dims K and V each path takes: the one place that says it.

Every path (``kda_forward`` with its state pool and checkpoints, ``kda_backward``, sequence
parallelism: the split forward, ``state_maps`` and context parallelism, and ``kda_decode``) takes
any K and V in [16, 256], K != V included: K, V in {64, 128, 256} run on variants of their own,
any other size on the tile above it with loads and stores masked at the true size
(kdacupy/numerics/tiles.py, docs/design.md section 2). Every backend applies the same rule, so
a call that runs on the CPU also runs on the GPU.
"""
from __future__ import annotations

from ..ops.forward.limits import ANY_MAX, ANY_MIN, MAX_GRID_Y

#: path -> the head dims it takes
HEAD_DIMS = {path: range(ANY_MIN, ANY_MAX + 1) for path in ("forward", "backward", "seqpar", "decode")}
PATHS = tuple(HEAD_DIMS)
#: the function whose kernels a path runs, for the messages
_CALLS = {"forward": "kda_forward", "backward": "kda_backward", "seqpar": "sequence parallelism",
          "decode": "kda_decode"}


def describe(path: str) -> str:
    dims = HEAD_DIMS[path]
    return f"[{dims.start}, {dims.stop - 1}]"


def head_dims_problem(sizes, path: str = "forward") -> str | None:
    """None if ``path``'s kernels run head dims ``sizes.K``, ``sizes.V`` (and its grid the heads),
    else the error message, naming the argument."""
    if path not in HEAD_DIMS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    if sizes.HV > MAX_GRID_Y:  # the value head is on gridDim.y
        return f"v: expected at most {MAX_GRID_Y} value heads (the kernels' gridDim.y), got HV = {sizes.HV}"
    for name, dim, what in (("q", sizes.K, "K"), ("v", sizes.V, "V")):
        if dim not in HEAD_DIMS[path]:
            return f"{name}: expected head dim {what} in {describe(path)} ({_CALLS[path]}), got {what} = {dim}"
    return None

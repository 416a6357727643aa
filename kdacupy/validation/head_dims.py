"""Which head dims K and V each path takes: the one place that says it.

``kda_decode``, ``kda_forward`` (its state pool and checkpoints too) and ``kda_backward`` take any
K and V in [16, 256], K != V included: their kernels run the tile above the true size with loads
and stores masked at it (docs/design.md section 2). Sequence parallelism (the split forward,
``state_maps``, context parallelism) takes K, V in {64, 128, 256}, the sizes its kernels are built
for (kdacupy/ops/forward/limits.py). Every backend applies the rule of its
path, so a call that runs on the CPU also runs on the GPU.
"""
from __future__ import annotations

from ..ops.forward.limits import ANY_MAX, ANY_MIN, DIMS, MAX_GRID_Y, supports

#: path -> the head dims it takes (a range or a tuple of sizes)
HEAD_DIMS = {"forward": range(ANY_MIN, ANY_MAX + 1), "backward": range(ANY_MIN, ANY_MAX + 1), "seqpar": DIMS,
             "decode": range(ANY_MIN, ANY_MAX + 1)}
PATHS = tuple(HEAD_DIMS)
#: the function whose kernels a path is, for the messages of the any-size paths
_CALLS = {"forward": "kda_forward", "backward": "kda_backward", "decode": "kda_decode"}


def describe(path: str) -> str:
    dims = HEAD_DIMS[path]
    return f"[{dims.start}, {dims.stop - 1}]" if isinstance(dims, range) else str(dims)


def takes(path: str, K: int, V: int) -> bool:
    """Whether ``path``'s kernels run head dims K, V."""
    return K in HEAD_DIMS[path] and V in HEAD_DIMS[path]


def head_dims_problem(sizes, path: str = "forward") -> str | None:
    """None if ``path``'s kernels run head dims ``sizes.K``, ``sizes.V`` (and its grid the heads),
    else the error message, naming the argument."""
    if path not in HEAD_DIMS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    if not isinstance(HEAD_DIMS[path], range):
        return supports(sizes)
    if sizes.HV > MAX_GRID_Y:  # the value head is on gridDim.y
        return f"v: expected at most {MAX_GRID_Y} value heads (the kernels' gridDim.y), got HV = {sizes.HV}"
    for name, dim, what in (("q", sizes.K, "K"), ("v", sizes.V, "V")):
        if dim not in HEAD_DIMS[path]:
            return f"{name}: expected head dim {what} in {describe(path)} ({_CALLS[path]}), got {what} = {dim}"
    return None

"""What a forward keeps for its backward (``kda_forward(save_for_backward=True)``, docs/design.md
section 9.5): the prepare's workspace and the state entering every chunk, in one buffer, so that
``kda_backward(saved=...)`` skips the two launches that recompute them.

The buffer is written by the forward's own launches (kda_prepare in the row-major workspace layout,
the mma.sync kda_recurrence with its output and the chunk states): every byte is what the stateless
backward would recompute, so the gradients are the same to the bit. The NumPy backends keep nothing
(their backward recomputes whatever it is given).

A ``KDASaved`` carries the fingerprint of its call (the sizes, the options that change the result,
and each input array's address, shape, strides and dtype): the backward compares it with its own
on the host, so a buffer from other inputs is refused before anything runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..alloc import empty
from ..forward import kernels as fwd
from .kernels import forward_parts, place

#: the Problem fields the kept buffer depends on (not the final state's dtype or the backend's name:
#: "cuda" and "emulate" both read a buffer of their own kind, which the addresses tell apart)
_FIELDS = ("B", "T", "H", "HV", "K", "V", "N", "dtype", "g_dtype", "beta_dtype", "gate", "beta_mode", "qk_l2norm",
           "scale", "lower_bound", "state_layout", "state_in_dtype", "state_precision", "varlen", "device")
#: the inputs whose values the buffer holds a function of
INPUTS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias")


@dataclass(frozen=True, eq=False)
class KDASaved:
    """The forward's workspace and chunk states for ``kda_backward(saved=...)``; opaque. ``nbytes``:
    the device memory it holds (0 on the NumPy backends, which keep nothing)."""
    buffer: Any = field(repr=False)  # uint8 array, or None
    fingerprint: tuple = field(repr=False)

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else int(self.buffer.nbytes)


def _address(x) -> int:
    return int(x.__array_interface__["data"][0]) if isinstance(x, np.ndarray) else int(x.data.ptr)


def fingerprint(p, arrays: dict) -> tuple:
    """The call's identity: ``p``'s result-changing fields and, per input, None or (address, shape,
    strides, dtype) of the array the caller passed (``arrays``: name -> the argument as given, as a
    NumPy or CuPy view without a copy: kdacupy/saved.py)."""
    def one(x):
        return None if x is None else (_address(x), tuple(x.shape), tuple(x.strides), np.dtype(x.dtype).str)
    return tuple((n, getattr(p, n)) for n in _FIELDS) + tuple((n, one(arrays.get(n))) for n in INPUTS)


def difference(expected: tuple, got: tuple) -> str:
    """The first entry two fingerprints differ in, for the error message."""
    for (name, a), (_, b) in zip(expected, got):
        if a != b:
            return f"{name} differs ({a!r} kept, {b!r} now)" if name not in INPUTS else f"{name} is another array"
    return "nothing"


def nbytes(B: int, T: int, HV: int, K: int, V: int, N: int, varlen: bool, state_precision: str) -> int:
    """The kept buffer's size for these sizes (what a framework allocates for ``save_for_backward``)."""
    sizes = SimpleNamespace(B=B, T=T, HV=HV, K=K, V=V, N=N, varlen=varlen, state_precision=state_precision)
    return layout(sizes)["total"]


def layout(p) -> dict:
    """Byte offsets of the kept parts: the workspace and the chunk states, as the backward's scratch
    lays them out when it recomputes them (kernels.forward_parts)."""
    return place(forward_parts(p, fwd.slots(p)[0]))


def allocate(p, into=None) -> tuple[Any, dict]:
    """A buffer for ``p``'s kept parts, and its views. ``into``: the caller's buffer (a framework's
    allocation: torch's or XLA's), already checked to hold them (kdacupy/saved.py)."""
    lay = layout(p)
    buf = into
    if buf is None:
        xp = np
        if p.device:
            import cupy as xp
        buf = empty(xp, max(lay["total"], 1), np.uint8)
    return buf, views(buf, lay)


def views(buf, lay: dict) -> dict:
    return {n: buf[lay[n][0]:lay[n][0] + lay[n][1]] for n in ("ws", "states")}

"""The kept states' front: ``saved_nbytes`` and the checks of ``kda_forward(save_for_backward=...)`` and
``kda_backward(saved=...)`` (the kept buffer itself: kdacupy/ops/backward/saved.py; docs/design.md
section 9.5)."""
from __future__ import annotations

import numpy as np

from .ops.backward.saved import INPUTS, KDASaved, difference, fingerprint, layout, nbytes, views
from .validation import as_array, fail, is_device


def saved_nbytes(q_shape, v_shape, n_seqs=None, state_precision="bf16") -> int:
    """The bytes ``kda_forward(save_for_backward=...)`` keeps for q of shape ``q_shape`` [B, T, H, K] and v of
    ``v_shape`` [B, T, HV, V] (``n_seqs``: the sequences of a packed call, len(cu_seqlens) - 1; None: B
    fixed-length ones): the size of a buffer a framework allocates for it."""
    B, T, _, K = (int(d) for d in q_shape)
    HV, V = int(v_shape[2]), int(v_shape[3])
    if state_precision not in ("bf16", "fp32"):
        fail("state_precision", '"bf16" or "fp32"', repr(state_precision))
    return nbytes(B, T, HV, K, V, B if n_seqs is None else int(n_seqs), n_seqs is not None, state_precision)


def given(arrays: dict) -> dict:
    """The inputs as the caller passed them, as NumPy or CuPy views (no copy): what a fingerprint reads."""
    return {n: None if arrays.get(n) is None else as_array(n, arrays[n]) for n in INPUTS}


def check_exclusions(**given):
    """What ``save_for_backward=True`` excludes: a pool, checkpoints, a split forward."""
    for name in ("state_pool", "checkpoints", "checkpoint_every"):
        if given[name] is not None:
            fail(name, "None with save_for_backward=True (the backward starts from initial_state and keeps no "
                 "pool or checkpoints)", "a value")
    if given["sequence_parallel"] not in (None, 1):
        fail("sequence_parallel", "None or 1 with save_for_backward=True (the kept chunk states come from the serial "
             "recurrence)", given["sequence_parallel"])


def save_option(x):
    """``save_for_backward``: (whether to keep, the caller's buffer or None)."""
    if x is None or isinstance(x, (bool, np.bool_)):
        return bool(x), None
    return True, as_array("save_for_backward", x)  # a buffer, or a TypeError naming the argument


def check_buffer(buf, p, q):
    """A caller's buffer for the kept parts of ``p``: on q's device, 1-D uint8, C-contiguous, large enough."""
    need = layout(p)["total"]
    where = "a CuPy (device) array" if p.device else "a NumPy (host) array"
    if is_device(buf) != p.device or (p.device and buf.device.id != q.device.id):
        fail("save_for_backward", f"True, False or {where} on q's device", "a buffer elsewhere")
    if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous or buf.size < need:
        fail("save_for_backward", f"True, False or a C-contiguous 1-D uint8 buffer of at least {need} bytes",
             f"shape {tuple(buf.shape)}, dtype {buf.dtype}")
    return buf


def kept_views(saved, problem, arrays: dict):
    """``kda_backward``'s ``saved``: the kept buffer's views for the launchers (None: recompute), after
    checking it is a forward's of this very call."""
    if saved is None:
        return None
    if not isinstance(saved, KDASaved):
        fail("saved", "None or the KDASaved that kda_forward(..., save_for_backward=True) returned",
             type(saved).__name__, TypeError)
    key = fingerprint(problem, given(arrays))
    if saved.fingerprint is not None and key != saved.fingerprint:  # None: an autograd context's, this call's
        fail("saved", "the KDASaved of a kda_forward with these same arrays and options",
             f"one kept for another call ({difference(saved.fingerprint, key)})")
    if saved.buffer is None or problem.backend not in ("cuda", "emulate"):
        return None
    lay = layout(problem)
    if saved.nbytes < lay["total"]:
        fail("saved", f"a kept buffer of at least {lay['total']} bytes for these sizes", f"{saved.nbytes} bytes")
    return views(saved.buffer, lay)

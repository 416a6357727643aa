"""Argument checking for ``kda_forward``'s checkpoints (prefix caching, docs/design.md section
7.1): ``checkpoint_every``, ``checkpoints``, ``checkpoint_indices``.

A boundary is counted per sequence from its own first token (with cu_seqlens too): boundary j
of sequence n is its state after ``j * checkpoint_every`` tokens, written where j * every is
at most the sequence's length and j at most J. ``checkpoints`` is either [N, J, HV, K, V]
("kv"; "vk": [N, J, HV, V, K]), boundary j of sequence n at [n, j - 1], or, with
``checkpoint_indices`` [N, J], a pool of rows [R, HV, ., .] (``state_pool`` itself included),
boundary j at row ``checkpoint_indices[n, j - 1]`` (negative: not written). Host rows are
checked (``< R``, distinct, apart from the pool slots the call reads and writes); device rows
are not read by the host: the kernel skips a row outside ``[0, R)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..numerics.dtypes import STATE_DTYPES
from .arrays import as_array, capturing, check_dtype, cupy_module, fail, is_device
from .memory import check_place
from .pool import _index_array

CHUNK = 16  # the kernels' chunk: boundaries fall between chunks


@dataclass(frozen=True)
class Checkpoints:
    """The validated checkpoint arguments."""
    array: object  # the destination, [rows, HV, ., .] as the kernel addresses it
    indices: Optional[object]  # [N, J] rows, or None (dense: row n * J + j - 1)
    every: int  # tokens between boundaries, a multiple of CHUNK
    per_seq: int  # J: boundaries per sequence at most
    rows: int


def _every(checkpoint_every):
    if isinstance(checkpoint_every, (bool, np.bool_)) or not isinstance(checkpoint_every, (int, np.integer)):
        fail("checkpoint_every", f"a positive multiple of {CHUNK} (tokens between boundaries)",
             repr(checkpoint_every), TypeError)
    if checkpoint_every < CHUNK or checkpoint_every % CHUNK:
        fail("checkpoint_every", f"a positive multiple of {CHUNK} (the kernels' chunk)", int(checkpoint_every))
    if checkpoint_every >= 1 << 31:  # the launchers pass it as a 32-bit int, on every backend alike
        fail("checkpoint_every", f"a positive multiple of {CHUNK} below 2^31 (a 32-bit kernel argument)",
             int(checkpoint_every))
    return int(checkpoint_every)


def _destination(checkpoints, problem, dense):
    x = as_array("checkpoints", checkpoints)
    check_place("checkpoints", x, problem.device)
    tail = (problem.HV, problem.K, problem.V) if problem.state_layout == "kv" else (problem.HV, problem.V, problem.K)
    names = "K, V" if problem.state_layout == "kv" else "V, K"
    if dense:
        if x.ndim != 5 or x.shape[0] != problem.N or x.shape[1] < 1 or tuple(x.shape[2:]) != tail:
            fail("checkpoints", f"shape (N = {problem.N}, J >= 1, {', '.join(map(str, tail))}) ([N, J, HV, {names}] "
                 f"for state_layout={problem.state_layout!r}; or rows [R, HV, {names}] with checkpoint_indices)",
                 tuple(x.shape))
    elif x.ndim != 4 or x.shape[0] < 1 or tuple(x.shape[1:]) != tail:
        fail("checkpoints", f"shape (R >= 1, {', '.join(map(str, tail))}) (rows [R, HV, {names}] with "
             f"checkpoint_indices, for state_layout={problem.state_layout!r})", tuple(x.shape))
    check_dtype("checkpoints", x, STATE_DTYPES)
    if not x.flags.c_contiguous:
        fail("checkpoints", "a C-contiguous array (it is written in place)", f"strides {x.strides}")
    ptr = x.data.ptr if problem.device else x.ctypes.data
    if ptr % 16:
        fail("checkpoints", "data on a 16-byte boundary (states are stored in whole sectors)", f"address {ptr:#x}")
    if not problem.device and not x.flags.writeable:
        fail("checkpoints", "a writeable array", "a read-only array")
    return x


def _host_rows(rows, R, pool_slots, same_as_pool):
    """Host rows: < R, distinct; in the pool itself, none of the slots the call reads and writes."""
    if rows.size and rows.max() >= R:
        where = np.unravel_index(int(np.argmax(rows >= R)), rows.shape)
        fail("checkpoint_indices", f"rows < R = {R} of checkpoints (negative: not written)",
             f"checkpoint_indices[{', '.join(map(str, where))}] = {int(rows[where])}")
    w = np.sort(rows[rows >= 0], kind="stable")
    dup = np.flatnonzero(w[1:] == w[:-1])
    if dup.size:
        fail("checkpoint_indices", "distinct rows", f"row {int(w[dup[0]])} given more than once")
    if same_as_pool and pool_slots is not None:
        clash = np.intersect1d(w, pool_slots[pool_slots >= 0])
        if clash.size:
            fail("checkpoint_indices", "rows apart from the state_indices slots (checkpoints is the state pool: "
                 "those slots are read and written by the call)", f"slot {int(clash[0])} in both")


def validate_checkpoints(checkpoint_every, checkpoints, checkpoint_indices, *, problem, arrays):
    """After ``validate`` (and the pool's): the ``Checkpoints`` to write, or None."""
    if checkpoints is None:
        for name, x in (("checkpoint_indices", checkpoint_indices), ("checkpoint_every", checkpoint_every)):
            if x is not None:
                fail(name, "None without checkpoints (the array the boundary states are written to)", repr(x)
                     if not hasattr(x, "shape") else "an array")
        return None
    if checkpoint_every is None:
        fail("checkpoint_every", f"a positive multiple of {CHUNK} with checkpoints", "None", TypeError)
    every = _every(checkpoint_every)
    dense = checkpoint_indices is None
    x = _destination(checkpoints, problem, dense)
    pool = arrays.get("state_pool")
    shares = cupy_module().may_share_memory if problem.device else np.may_share_memory
    same_as_pool = pool is not None and not dense and x.shape == pool.shape and x.dtype == pool.dtype and \
        (x.data.ptr == pool.data.ptr if problem.device else x.ctypes.data == pool.ctypes.data)
    for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "out", "initial_state", "cu_seqlens", "state_pool"):
        y = arrays.get(n)
        if n == "initial_state" and y is pool:  # a pool is the initial states: checked as state_pool
            continue
        if y is not None and not (same_as_pool and y is pool) and shares(x, y):
            fail("checkpoints", f"memory separate from {n}" + (" (or the state pool itself, with checkpoint_indices)"
                                                                if n == "state_pool" else ""),
                 f"an array overlapping {n}")
    if dense:
        J, R, rows = int(x.shape[1]), problem.N * int(x.shape[1]), None
        x = x.reshape((R,) + x.shape[2:])
    else:
        shape = tuple(np.shape(checkpoint_indices)) if isinstance(checkpoint_indices, (list, tuple)) else \
            tuple(getattr(checkpoint_indices, "shape", ()))
        J = shape[1] if len(shape) == 2 and shape[0] == problem.N and shape[1] >= 1 else "J >= 1"
        rows = _index_array("checkpoint_indices", checkpoint_indices, problem.device, ((problem.N, J),))
        J, R = int(rows.shape[1]), int(x.shape[0])
        if not is_device(rows):
            slots = arrays.get("state_indices")
            _host_rows(rows, R, None if slots is None or is_device(slots) else np.asarray(slots), same_as_pool)
        if problem.device:
            cp = cupy_module()
            if capturing(cp) and (not is_device(rows) or not rows.flags.c_contiguous):
                fail("checkpoint_indices", "a C-contiguous device (CuPy) array while the current stream is capturing "
                     "a CUDA graph", "a host array or a strided one")
            rows = cp.ascontiguousarray(cp.asarray(rows))
        else:
            rows = np.ascontiguousarray(rows)
    return Checkpoints(x, rows, every, J, R)

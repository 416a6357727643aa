"""Argument checking for ``kda_decode``'s tree verify and step states (docs/design.md
section 7.1): ``parent_indices``, ``step_states``, ``step_state_indices``, ``update_pool``.

Host (NumPy) values are fully checked: every parent of token t >= 1 in ``[-1, t)``, step rows
``< R`` and distinct, and a step row for every live sequence of a tree (a parent's state is
read back from its step state). Device values are never read by the host: the kernel reads a
parent outside ``[-1, t)`` as -1 (the start state), and a row outside ``[0, R)`` as none (no
step states; the tokens then run as a chain, as SGLang's kernel does).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..numerics.decode_reference import step_problems
from ..numerics.dtypes import STATE_DTYPES
from .arrays import as_array, capturing, check_bool, check_dtype, cupy_module, fail, is_device
from .memory import check_place
from .pool import _index_array


@dataclass(frozen=True)
class Steps:
    """The validated step-state arguments (hashable: part of the decode kernel's launch plan)."""
    rows: int  # R: rows of step_states
    length: int  # S >= T: states per row
    dtype: np.dtype
    tree: bool  # parent_indices given


def step_shape(HV, K, V, layout):
    return (HV, V, K) if layout == "vk" else (HV, K, V)


def check_step_array(step_states, *, problem):
    """[R, S, HV, V, K] ("vk") or [R, S, HV, K, V] ("kv"), S >= T, bf16 or fp32, C-contiguous,
    writeable, on q's kind of memory and device."""
    x = as_array("step_states", step_states)
    check_place("step_states", x, problem.device)
    tail = step_shape(problem.HV, problem.K, problem.V, problem.state_layout)
    if x.ndim != 5 or tuple(x.shape[2:]) != tail or x.shape[0] < 1 or x.shape[1] < problem.T:
        fail("step_states", f"shape (R >= 1, S >= T = {problem.T}, {', '.join(map(str, tail))}) ([R, S, HV, "
             f"{'V, K' if problem.state_layout == 'vk' else 'K, V'}] for state_layout={problem.state_layout!r})",
             tuple(x.shape))
    check_dtype("step_states", x, STATE_DTYPES)
    if not x.flags.c_contiguous:
        fail("step_states", "a C-contiguous array (it is written in place)", f"strides {x.strides}")
    if not problem.device and not x.flags.writeable:
        fail("step_states", "a writeable array", "a read-only array")
    return x


def _device_ready(name, x):
    if x is None:
        return None
    cp = cupy_module()
    if capturing(cp) and (not is_device(x) or not x.flags.c_contiguous):
        fail(name, "a C-contiguous device (CuPy) array while the current stream is capturing a CUDA graph",
             "a host array or a strided one")
    return cp.ascontiguousarray(cp.asarray(x))


def validate_steps(parent_indices, step_states, step_state_indices, update_pool, *, problem, pool, idx, start,
                   arrays):
    """After ``validate_pool``: returns (Steps or None, parents, step array, rows, update_pool).
    ``start`` [N]: each sequence's start slot on the host (None for device indices)."""
    update_pool = check_bool("update_pool", update_pool)
    N, T = problem.N, problem.T
    if step_states is None:
        for name, x in (("step_state_indices", step_state_indices), ("parent_indices", parent_indices)):
            if x is not None:
                fail(name, "None without step_states (the parents' states are read back from the step states)"
                     if name == "parent_indices" else "None without step_states", "an array")
        return None, None, None, None, update_pool
    steps = check_step_array(step_states, problem=problem)
    R = int(steps.shape[0])
    rows = None
    if step_state_indices is None:
        if R < N:
            fail("step_states", f"at least N = {N} rows without step_state_indices (sequence n writes row n)",
                 f"{R} rows")
    else:
        rows = _index_array("step_state_indices", step_state_indices, problem.device, ((N,),))
    parents = None
    if parent_indices is not None:
        parents = _index_array("parent_indices", parent_indices, problem.device, ((N, T),))
        if pool.per_token:
            fail("parent_indices", "[N] state_indices with a tree (every token starts from its parent's state, "
                 "the first from the sequence's slot)", f"state_indices of shape {tuple(idx.shape)}")
    host = lambda x: None if x is None or is_device(x) else x  # noqa: E731  (device values are not read)
    why = step_problems(host(parents), host(rows), start, R, T, tree=parents is not None)
    if why is not None:
        fail(*why)
    shares = cupy_module().may_share_memory if problem.device else np.may_share_memory
    for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "out", "state_pool"):
        x = arrays.get(n)
        if x is not None and shares(steps, x):
            fail("step_states", f"memory separate from {n}", f"an array overlapping {n}")
    if problem.device:
        parents, rows = _device_ready("parent_indices", parents), _device_ready("step_state_indices", rows)
    else:
        parents = None if parents is None else np.ascontiguousarray(parents)
        rows = None if rows is None else np.ascontiguousarray(rows)
    return Steps(R, int(steps.shape[1]), steps.dtype, parents is not None), parents, steps, rows, update_pool

"""Argument checking for the state pool (docs/design.md section 7.1): ``kda_decode``'s
pool, indices and ``num_accepted_tokens``, and the pool keywords of ``kda_forward``.

The per-token arrays and options are checked by ``validate`` (problem.py; the
same rules as ``kda_forward``); this module adds what is particular to a pool. Host (NumPy) indices are fully checked: in range, and no slot written
twice. Device indices are never read by the host: the kernels treat a slot
outside ``[0, P)`` as padding and clamp ``num_accepted_tokens`` to ``[1, T]``;
duplicate device slots are not seen (two CTAs then race on one slot). While the
stream captures a CUDA graph, indices must be C-contiguous device arrays
(``check_capturable``): no per-call copy may end up in a graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..numerics.decode_reference import decode_plan
from ..numerics.dtypes import STATE_DTYPES, dtype_name
from .arrays import as_array, capturing, check_dtype, cupy_module, fail, is_device
from .memory import check_place

INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


@dataclass(frozen=True)
class Pool:
    """The validated pool arguments."""
    P: int
    dtype: np.dtype
    layout: str
    per_token: bool  # state_indices is [N, T]
    accepted: bool  # num_accepted_tokens given
    update: bool = True  # the pool is written (kda_decode's update_pool)
    steps: object = None  # kdacupy.validation.steps.Steps: kda_decode's step states, if any
    null_slot: int = -1  # slots at or below it are padding (kda_decode's null_slot)


def _index_array(name, x, device, dims):
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
        if x.dtype.kind not in "iu":
            fail(name, "integers", f"values of dtype {x.dtype}", TypeError)
        x = x.astype(np.int64)
    x = as_array(name, x)
    if x.dtype not in INDEX_DTYPES:
        fail(name, "dtype int32 or int64", dtype_name(x.dtype), TypeError)
    if is_device(x) and not device:
        fail(name, "a NumPy array like q", "a CuPy (device) array")
    if x.shape not in dims:
        fail(name, "shape " + " or ".join(map(str, dims)), tuple(x.shape))
    return x


def check_pool(state_pool, *, HV, K, V, layout, device, name="state_pool"):
    """The pool array: [P, HV, V, K] ("vk") or [P, HV, K, V] ("kv"), bf16 or fp32,
    C-contiguous and writeable, on the same kind of memory as q."""
    pool = as_array(name, state_pool)
    check_place(name, pool, device)
    want = ("P", HV, V, K) if layout == "vk" else ("P", HV, K, V)
    if pool.ndim != 4 or tuple(pool.shape[1:]) != want[1:] or pool.shape[0] < 1:
        fail(name, f"shape (P >= 1, {', '.join(map(str, want[1:]))}) ([P, HV, "
             f"{'V, K' if layout == 'vk' else 'K, V'}] for state_layout={layout!r})", tuple(pool.shape))
    check_dtype(name, pool, STATE_DTYPES)
    if not pool.flags.c_contiguous:
        fail(name, "a C-contiguous array (it is updated in place)", f"strides {pool.strides}")
    if not device and not pool.flags.writeable:
        fail(name, "a writeable array", "a read-only array")
    return pool


def check_host_plan(write):
    """Host indices: no slot written twice (``write``: -1 for none). (A sequence's
    start slot is among the slots it writes, so this also keeps one sequence from
    reading a slot that another writes.)"""
    w = np.sort(write[write >= 0], kind="stable")
    dup = np.flatnonzero(w[1:] == w[:-1])
    if dup.size:
        fail("state_indices", "distinct slots for the states that are written",
             f"slot {int(w[dup[0]])} written more than once")


def check_null_slot(null_slot):
    """``null_slot``: an int >= -1 (slots at or below it are padding)."""
    if isinstance(null_slot, (bool, np.bool_)) or not isinstance(null_slot, (int, np.integer)):
        fail("null_slot", "an int (slots at or below it are padding)", repr(null_slot), TypeError)
    if not -1 <= null_slot < 1 << 62:
        fail("null_slot", "an int >= -1 (slots at or below it are padding; -1: the negative ones)", int(null_slot))
    return int(null_slot)


def check_decode_offsets(cu_seqlens, *, N, T, device):
    """kda_decode's ``cu_seqlens``: the packed offsets [N + 1] of its N sequences of T tokens, on
    q's kind of memory, int32 / int64 and C-contiguous. Host values must be [0, T, ..., N T]; device
    ones are not read by the host: the kernel checks them (a device-side trap where they differ)."""
    if cu_seqlens is None:
        return None
    cu = _index_array("cu_seqlens", cu_seqlens, device, ((N + 1,),))
    check_place("cu_seqlens", cu, device)
    if not is_device(cu):
        want = np.arange(N + 1, dtype=np.int64) * T
        if not np.array_equal(cu, want):
            bad = int(np.flatnonzero(cu != want)[0])
            fail("cu_seqlens", f"{T} tokens in every one of the N = {N} sequences (offsets 0, {T}, ..., {N * T})",
                 f"cu_seqlens[{bad}] = {int(cu[bad])}")
    elif device and capturing(cupy_module()) and not cu.flags.c_contiguous:
        fail("cu_seqlens", "a C-contiguous device array while the current stream is capturing a CUDA graph",
             f"strides {cu.strides}")
    return cu if cu.flags.c_contiguous else (cupy_module() if is_device(cu) else np).ascontiguousarray(cu)


def check_indices(state_indices, num_accepted_tokens, *, N, T, P, device, allow_per_token=True, null_slot=-1):
    """``state_indices`` [N] (or [N, T]) and ``num_accepted_tokens`` [N]; returns
    them ready for the backends (host indices copied to the device for CuPy q)."""
    if state_indices is None:
        fail("state_indices", "an int32/int64 array of pool slots with state_pool", "None", TypeError)
    dims = ((N,), (N, T)) if allow_per_token else ((N,),)
    idx = _index_array("state_indices", state_indices, device, dims)
    per_token = idx.ndim == 2
    acc = None
    if num_accepted_tokens is not None:
        if not per_token:
            fail("num_accepted_tokens", f"None unless state_indices is [N, T] = ({N}, {T})",
                 f"state_indices of shape {tuple(idx.shape)}")
        acc = _index_array("num_accepted_tokens", num_accepted_tokens, device, ((N,),))
        if not is_device(acc) and acc.size and (acc.min() < 1 or acc.max() > T):
            bad = int(np.flatnonzero((acc < 1) | (acc > T))[0])
            fail("num_accepted_tokens", f"values in [1, T = {T}]", f"num_accepted_tokens[{bad}] = {int(acc[bad])}")
    if device and capturing(cupy_module()):
        check_capturable(idx, acc)
    if not is_device(idx):
        if idx.size and idx.max() >= P:
            where = np.unravel_index(int(np.argmax(idx >= P)), idx.shape)
            fail("state_indices", f"slots < P = {P} ({'negative' if null_slot < 0 else f'<= {null_slot}'} for "
                 f"padding)",
                 f"state_indices[{', '.join(map(str, where))}] = {int(idx[where])}")
        if acc is None or not is_device(acc):
            # [N]: every live slot is written (once per call, whatever T is)
            check_host_plan(np.where(idx > null_slot, idx, -1) if idx.ndim == 1 else
                            decode_plan(idx, acc, N, T, P, null_slot=null_slot)[1])
        if device:
            idx = cupy_module().asarray(idx)  # host -> device copy: no device-to-host sync
    if acc is not None and device and not is_device(acc):
        acc = cupy_module().asarray(acc)
    if device:
        cp = cupy_module()
        idx = cp.ascontiguousarray(idx)
        acc = None if acc is None else cp.ascontiguousarray(acc)
    else:
        idx = np.ascontiguousarray(idx)
        acc = None if acc is None else np.ascontiguousarray(acc)
    return idx, acc


def check_capturable(idx, acc):
    """While the current stream captures a CUDA graph the indices must be usable as they are:
    a host array would need a host-to-device copy a graph cannot hold, and a strided device
    array a per-call contiguous copy that the graph would keep using after it is freed."""
    for name, x in (("state_indices", idx), ("num_accepted_tokens", acc)):
        if x is None:
            continue
        if not is_device(x):
            fail(name, "a device (CuPy) array while the current stream is capturing a CUDA graph (a graph "
                 "cannot hold a copy from host memory)", "a host (NumPy) array or list")
        if not x.flags.c_contiguous:
            fail(name, "a C-contiguous device array while the current stream is capturing a CUDA graph (a "
                 "contiguous copy would be a per-call temporary the graph keeps after it is freed)",
                 f"strides {x.strides}")


def check_pool_overlap(pool, arrays, names):
    """The pool is updated in place: it may not share memory with inputs or out."""
    shares = cupy_module().may_share_memory if is_device(pool) else np.may_share_memory
    for n in names:
        x = arrays.get(n)
        if x is not None and shares(pool, x):
            fail(n, "memory separate from state_pool", "an array overlapping state_pool")


def validate_pool(state_pool, state_indices, num_accepted_tokens, problem, arrays, *, T,
                  allow_per_token=True, null_slot=-1) -> tuple[Pool, np.ndarray, Optional[np.ndarray], object]:
    """Pool checks after ``validate``: returns (Pool, idx, accepted, pool array)."""
    pool = check_pool(state_pool, HV=problem.HV, K=problem.K, V=problem.V, layout=problem.state_layout,
                      device=problem.device)
    if null_slot >= pool.shape[0]:  # every slot would be padding: nothing read, nothing written
        fail("null_slot", f"an int below the pool's P = {pool.shape[0]} slots (slots at or below it are padding)",
             null_slot)
    idx, acc = check_indices(state_indices, num_accepted_tokens, N=problem.N, T=T, P=pool.shape[0],
                             device=problem.device, allow_per_token=allow_per_token, null_slot=null_slot)
    check_pool_overlap(pool, arrays, ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "out"))
    return Pool(int(pool.shape[0]), pool.dtype, problem.state_layout, idx.ndim == 2, acc is not None,
                null_slot=null_slot), idx, acc, pool


def validate_forward_pool(problem, arrays, state_pool, state_indices, *, initial_state, output_final_state,
                          state_dtype):
    """``kda_forward(..., state_pool=, state_indices=)`` (idx [N]): returns the
    Problem with the pool's dtype as the state's, and the arrays with
    ``state_pool`` and ``state_indices`` added."""
    from dataclasses import replace

    if state_pool is None:
        fail("state_pool", "a state pool with state_indices", "None", TypeError)
    if initial_state is not None:
        fail("initial_state", "None with state_pool (initial states come from the pool)", "an array")
    if output_final_state:
        fail("output_final_state", "False with state_pool (final states are written to the pool)", "True")
    if state_dtype is not None:
        fail("state_dtype", "None with state_pool (states keep the pool's dtype)", repr(state_dtype))
    _, idx, _, pool = validate_pool(state_pool, state_indices, None, problem, arrays, T=problem.T,
                                    allow_per_token=False)
    arrays = dict(arrays, state_pool=pool, state_indices=idx, initial_state=pool)  # the kernels read it in place
    if is_device(pool) and arrays.get("cu_seqlens") is not None:
        check_pool_overlap(pool, arrays, ("cu_seqlens",))
    return replace(problem, state_in_dtype=pool.dtype, state_out_dtype=pool.dtype), arrays

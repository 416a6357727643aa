"""The host path of a repeated ``kda_decode`` call, kept to what must be redone.

A decode step costs microseconds on the GPU, so the Python around it matters.
Everything that depends only on the arguments' types, shapes, strides, dtypes,
devices and options (the validated problem, the kernel variant, its compiled
function, grid and stride arguments) is cached under that key after one full
validation (``kdacupy.decode``, ``kdacupy.validation``). A call that hits the cache redoes only what
depends on the arrays' addresses and host values: alignment, overlap of the
pool and ``out`` with the inputs (the same bounds test as ``may_share_memory``),
writeable flags, and host index values. If any of those fails, the call takes
the full path, which raises the error with its message; so the two paths accept
and reject the same calls. Only kernel backends ("cuda", "emulate") with plain
NumPy or CuPy arrays (all of one kind) use it.
"""
from __future__ import annotations

import numpy as np

from ...jit.loaders import loader
from ..alloc import empty
from ...numerics.decode_reference import step_problems
from ...numerics.dtypes import row_alignment
from .kernels import decode_args, launch_plan, scalar_args, stride_args

#: (q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens, out, A_log, dt_bias, then tree verify's
#: parent_indices, step_states, step_state_indices, then cu_seqlens)
NAMES = ("q", "k", "v", "g", "beta", "state_pool", "state_indices", "num_accepted_tokens", "out", "A_log", "dt_bias",
         "parent_indices", "step_states", "step_state_indices", "cu_seqlens")
_INPUTS = (0, 1, 2, 3, 4, 9, 10, 14)  # what neither the pool, out nor the step states may overlap
_WRITTEN = (5, 8, 12)  # the pool, out, the step states: apart from the inputs and from each other
_cache: dict = {}
MAX_ENTRIES = 512


_generation = 0  # bumped by clear(): a call bound before it (DecodeCall.bind) launches no more


def clear():
    global _generation
    _cache.clear()
    _generation += 1


_CUPY: list = []  # (cupy.ndarray, cupy.cuda.runtime) once looked up, or (None, None) without CuPy


def _cupy():
    if not _CUPY:
        try:
            import cupy
            _CUPY.append((cupy.ndarray, cupy.cuda.runtime))
        except Exception:  # noqa: BLE001  (no CuPy, or CuPy without CUDA libraries)
            _CUPY.append((None, None))
    return _CUPY[0]


def call_key(arrays, options):
    """Key of a call (every array's type, shape, strides, dtype and device, the current device,
    the options with their types), or None when the fast path does not apply. One pass per
    array, hashed once by the lookup: a decode step's whole host budget is microseconds.
    Mixed kinds of arrays give keys that no call stored (the full path converts or refuses them)."""
    kind = type(arrays[0])
    try:
        if kind is np.ndarray:
            sig = [None if x is None else (type(x), x.shape, x.strides, x.dtype) for x in arrays]
            dev = -1
        else:
            ndarray, runtime = _cupy()
            if ndarray is None or kind is not ndarray:
                return None
            sig = [None if x is None else (type(x), x.shape, x.strides, x.dtype, x.data.device_id) for x in arrays]
            dev = runtime.getDevice()
    except AttributeError:  # not an array (e.g. a list of slots): the full path converts it
        return None
    # (type, value) per option: 1, 1.0 and True are equal keys but not equal calls
    return dev, tuple(sig), options, tuple(map(type, options))


def _span(x):
    """(lowest, highest + 1) byte offsets from the data pointer."""
    if x is None or x.size == 0:
        return None
    lo = sum((n - 1) * s for n, s in zip(x.shape, x.strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(x.shape, x.strides) if s > 0) + x.dtype.itemsize
    return lo, hi


class DecodeCall:
    """One cached call signature: checks that depend on addresses and host values, then the launch."""

    def __init__(self, problem, pool, arrays, tiles=None):
        self.p, self.pool = problem, pool
        self.device = problem.device
        self.plan = launch_plan(problem, pool, problem.device, tiles)
        self.spans = [_span(x) for x in arrays]
        # alignment the kernels need: 16-byte rows, or what divides a row (beta: its element), as
        # kdacupy.validation's check_kernel_layouts
        self.align = [(i, row_alignment(arrays[i]) if i != 4 else arrays[4].dtype.itemsize) for i in (0, 1, 2, 3, 4, 8)
                      if arrays[i] is not None and arrays[i].size]
        self.host_idx = not self.device
        self.rows = np.arange(problem.N)
        # the pool, out and the step states against the inputs, and each other, where both hold memory
        written = tuple(i for i in _WRITTEN if i < len(arrays))
        # (i, j, a, b): arrays i and j overlap where a < ptr_j - ptr_i < b (bounds, as may_share_memory)
        self.pairs = [(i, j, self.spans[i][0] - self.spans[j][1], self.spans[i][1] - self.spans[j][0])
                      for w, i in enumerate(written) for j in _INPUTS + written[w + 1:]
                      if j < len(arrays) and self.spans[i] is not None and self.spans[j] is not None]
        self.steps = pool.steps if len(arrays) > 11 and arrays[12] is not None else None
        self.cu = len(arrays) > 14 and arrays[14] is not None
        self.cu_want = list(range(0, (problem.N + 1) * problem.T, problem.T)) if problem.T else [0] * (problem.N + 1)
        self.out_shape, self.out_dtype = arrays[2].shape, problem.dtype
        self.strides = stride_args(arrays)
        N, T, HV, V = arrays[2].shape
        # o allocated in launch() is C-contiguous
        self.fresh_out_strides = self.strides[:5] + ((np.int64(T * HV * V), np.int64(HV * V), np.int64(V)),)
        self.scalars = scalar_args(problem, pool, arrays)
        # the argument list made once, pointer slots marked: a call only puts its pointers in
        marks = [_Slot(i) if x is not None or i == 8 else 0 for i, x in enumerate(arrays)]
        self.args = list(decode_args(marks, self.strides, self.scalars))
        self.fresh_args = list(decode_args(marks, self.fresh_out_strides, self.scalars))
        self.slots = [(a.i, at) for at, a in enumerate(self.args) if isinstance(a, _Slot)]
        self._launch = loader("cuda" if self.device else "emulate").launch
        self._xp = None
        if self.device:
            import cupy
            self._xp = cupy

    def _ptr(self, x):
        if x is None:
            return 0
        return x.data.ptr if self.device else x.ctypes.data

    def _host_indices_ok(self, idx, acc) -> bool:
        """The host checks of kdacupy.validation.pool.check_indices, in few NumPy calls."""
        if not idx.size:
            return True
        if idx.max() >= self.pool.P:
            return False
        null = self.pool.null_slot
        if idx.ndim == 1:
            w = idx[idx > null]
        else:
            if acc is not None:
                if acc.min() < 1 or acc.max() > self.p.T:
                    return False
                start = idx[self.rows, acc - 1]
            else:
                start = idx[:, 0]
            w = idx[start > null]
            w = w[w > null]
        return len(set(w.tolist())) == w.size

    def _host_steps_ok(self, arrays):
        """The host checks of kdacupy.validation.steps: writeable step states, parents, step rows."""
        if not arrays[12].flags.writeable:
            return False
        parents, rows, idx, acc = arrays[11], arrays[13], arrays[6], arrays[7]
        if parents is None and rows is None:
            return True
        start = idx if idx.ndim == 1 else idx[self.rows, 0 if acc is None else acc - 1]
        start = np.where(start > self.pool.null_slot, start, -1)
        return step_problems(parents, rows, start, self.steps.rows, self.p.T, parents is not None) is None

    def checked(self, arrays):
        """The data pointers when every per-call check passes, else None."""
        if self.device:
            ptrs = [0 if x is None else x.data.ptr for x in arrays]
        else:
            ptrs = [0 if x is None else x.ctypes.data for x in arrays]
        for i, a in self.align:
            if ptrs[i] % a:
                return None
        for i, j, a, b in self.pairs:
            if a < ptrs[j] - ptrs[i] < b:
                return None
        if self.host_idx:
            pool, out = arrays[5], arrays[8]
            if not pool.flags.writeable or (out is not None and not out.flags.writeable):
                return None
            if not self._host_indices_ok(arrays[6], arrays[7]):
                return None
            if self.steps is not None and not self._host_steps_ok(arrays):
                return None
            if self.cu and arrays[14].tolist() != self.cu_want:
                return None
        return ptrs

    def launch(self, arrays, ptrs):
        """Allocate o unless given, launch, return o."""
        out = arrays[8]
        args = self.args
        if out is None:
            out = empty(self._xp or np, self.out_shape, self.out_dtype)
            args = self.fresh_args
        if self.p.N and self.p.T:
            fn, grid, block = self.plan
            args = args.copy()
            given = (*arrays[:8], out, *arrays[9:])
            if self.device:  # CuPy arrays: the RawKernel passes their data pointers (checked() read them)
                for i, at in self.slots:
                    args[at] = given[i]
            else:  # the emulation: each pointer carries its array's extent (memcheck)
                for i, at in self.slots:
                    args[at] = _emulated_pointer(given[i])
            self._launch(fn, grid, block, tuple(args), 0)
        return out


    def bind(self, ptrs):
        """This call launched from raw data pointers (``NAMES`` order, 0 for none) of which only
        out's (``ptrs[8]``) varies from call to call: for a caller that keys its call on the same
        arrays' own metadata, read once (kdacupy/torch/decode_cache.py), so that neither CuPy views
        nor this call's key are made again. ``checked``'s tests of the fixed pointers are made here,
        once; out's at each ``BoundDecode.launch``. None where a test fails (the caller then takes
        the full path, which raises) and on the emulation (its launch carries arrays, and its host
        indices are read every call)."""
        if not self.device or any(not 0 <= p < 1 << 64 for p in ptrs):
            return None
        ptrs = [int(p) for p in ptrs]
        for i, a in self.align:
            if i != 8 and ptrs[i] % a:
                return None
        windows = []  # out overlaps another array where lo < out's pointer < hi
        for i, j, a, b in self.pairs:
            if i == 8:  # a < ptr_j - out < b
                windows.append((ptrs[j] - b, ptrs[j] - a))
            elif j == 8:  # a < out - ptr_i < b
                windows.append((ptrs[i] + a, ptrs[i] + b))
            elif a < ptrs[j] - ptrs[i] < b:
                return None
        args = list(self.args)
        out_at = None
        for i, at in self.slots:
            if i == 8:
                out_at = at
            else:
                args[at] = np.uint64(ptrs[i])  # decode_args' pointer form
        out_align = dict(self.align).get(8, 1)
        return BoundDecode(self, tuple(args[:out_at]), tuple(args[out_at + 1:]), out_align, tuple(windows))


class BoundDecode:
    """A ``DecodeCall`` whose pointers but out's are fixed (``DecodeCall.bind``)."""

    __slots__ = ("call", "head", "tail", "out_align", "windows", "plan", "_launch", "run", "generation")

    def __init__(self, call, head, tail, out_align, windows):
        self.call, self.head, self.tail, self.out_align, self.windows = call, head, tail, out_align, windows
        self.generation = _generation
        self.plan, self._launch = call.plan, call._launch
        self.run = bool(call.p.N and call.p.T)

    def launch(self, out_ptr) -> bool:
        """Launch with out at ``out_ptr`` (o of the call's out shape, dtype and strides); False,
        launching nothing, where out is misaligned or overlaps another array (``checked``'s tests),
        or where the cache was cleared since the call was bound (its variant may be retuned)."""
        if out_ptr % self.out_align or self.generation != _generation:
            return False
        for lo, hi in self.windows:
            if lo < out_ptr < hi:
                return False
        if self.run:
            fn, grid, block = self.plan
            self._launch(fn, grid, block, self.head + (np.uint64(out_ptr),) + self.tail, 0)
        return True


class _Slot:
    """Where pointer ``i`` (fastpath.NAMES order) goes in the argument list."""

    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


def _emulated_pointer(x):
    if x is None:
        return 0
    from ...emulate import pointer
    return pointer(x)


def lookup(key):
    try:
        return _cache.get(key)
    except TypeError:  # an unhashable option value: the full path says what is wrong with it
        return None


def store(key, call):
    if len(_cache) >= MAX_ENTRIES:
        _cache.clear()
    try:
        _cache[key] = call
    except TypeError:  # as in lookup (the full path accepted it: e.g. a list-valued option it ignores)
        pass

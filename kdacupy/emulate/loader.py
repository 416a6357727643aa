"""Load an emulation .so with ctypes and launch its kernels like cupy.RawKernel.__call__."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Sequence

import numpy as np

from .. import env
from .build import build, stats
from .errors import EmulationError

MAX_SHARED = 227 * 1024  # per-block dynamic shared memory of a Hopper GPU
_loaded: dict[tuple[str, tuple[str, ...]], ctypes.CDLL] = {}
_lock = threading.Lock()
_launch_lock = threading.Lock()  # not _lock: that one is held during compiles
_last_launched: list = [None]  # the library whose launch came last keeps its cached fiber stacks


def _mode() -> int:
    """Bug-exposing modes (default off): KDACUPY_EMULATE_CP_ASYNC=eager makes cp.async land at
    issue instead of at the covering wait; KDACUPY_EMULATE_ORDER=reverse runs threads in reverse."""
    try:
        cp, order = env.get("KDACUPY_EMULATE_CP_ASYNC"), env.get("KDACUPY_EMULATE_ORDER")
    except env.EnvError as e:
        raise EmulationError(str(e)) from None
    return (cp == "eager") | (order == "reverse") << 1


class EmulatedModule:
    """The kernels `names` of a rendered source, compiled for the CPU (built once per process)."""

    def __init__(self, source: str, names: Sequence[str]):
        self.names = tuple(names)
        key = (source, self.names)
        with _lock:
            lib = _loaded.get(key)
            if lib is None:
                lib = ctypes.CDLL(str(build(source, self.names)))
                _loaded[key] = lib
            else:
                stats["memory_hits"] += 1
        self._lib = lib
        self._functions: dict[str, EmulatedFunction] = {}

    def get_function(self, name: str) -> "EmulatedFunction":
        if name not in self.names:
            raise EmulationError(f"kernel {name!r} is not among this module's names {self.names}")
        if name not in self._functions:
            self._functions[name] = EmulatedFunction(self._lib, name)
        return self._functions[name]


def _dims(v, what: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, (int, np.integer)) and x >= 1 for x in t):
        raise EmulationError(f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {v!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))


class EmulatedFunction:
    """fn(grid, block, args, shared_mem=0): args are C-contiguous numpy arrays (passed as their
    data pointer) and numpy scalars (passed by value; np.uint64(0) is a null pointer)."""

    def __init__(self, lib: ctypes.CDLL, name: str):
        self.name = name
        self._lib = lib
        self._launch = getattr(lib, f"kda_emu_launch__{name}")
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                 ctypes.c_char_p, ctypes.c_int]
        self.arity = getattr(lib, f"kda_emu_arity__{name}")()
        sizes, kinds = (ctypes.c_int * max(self.arity, 1))(), (ctypes.c_int * max(self.arity, 1))()
        getattr(lib, f"kda_emu_params__{name}")(sizes, kinds)
        self.param_sizes = tuple(sizes[: self.arity])
        self.param_kinds = tuple(kinds[: self.arity])  # 1 pointer, 2 floating point, 0 other

    def _marshal(self, i: int, a):
        size, kind = self.param_sizes[i], self.param_kinds[i]
        where = f"{self.name}: argument {i}"
        if isinstance(a, np.ndarray):
            if kind != 1:
                raise EmulationError(f"{where}: an array was given for a non-pointer parameter")
            if not a.flags.c_contiguous:
                raise EmulationError(f"{where}: the array is not C-contiguous")
            return ctypes.c_void_p(a.ctypes.data)
        if isinstance(a, np.generic):
            raw = a.tobytes()
            ok = len(raw) == size and (
                (kind == 1 and a.dtype in (np.uint64, np.int64))
                or (kind == 2 and a.dtype.kind == "f")
                or (kind == 0 and a.dtype.kind in "iubV"))  # V: a structured scalar for a struct by value
            if not ok:
                what = "pointer" if kind == 1 else "floating-point" if kind == 2 else "integer"
                raise EmulationError(f"{where}: np.{a.dtype} given for a {size}-byte {what} parameter")
            return ctypes.create_string_buffer(raw, len(raw))
        raise EmulationError(f"{where}: {type(a).__name__} is not supported; pass a numpy array or a numpy "
                             "scalar (np.int32, np.int64, np.uint64, np.float32)")

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        g, b = _dims(grid, "grid"), _dims(block, "block")
        args = tuple(args)
        if len(args) != self.arity:
            raise EmulationError(f"{self.name}: kernel takes {self.arity} argument(s), {len(args)} given")
        if not 0 <= int(shared_mem) <= MAX_SHARED:
            raise EmulationError(f"{self.name}: shared_mem={shared_mem} exceeds 227 KiB, the per-block limit "
                                 "of a Hopper GPU")
        bufs = [self._marshal(i, a) for i, a in enumerate(args)]  # kept alive during the launch
        argv = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(x) for x in bufs])
        threads = env.get("KDACUPY_EMULATE_THREADS") or os.cpu_count() or 1
        stack = env.get("KDACUPY_EMULATE_STACK_KB") * 1024
        cfg = (ctypes.c_longlong * 10)(*g, *b, int(shared_mem), threads, stack, _mode())
        err = ctypes.create_string_buffer(4096)
        with _launch_lock:  # bound the memory mappings: one library's stack cache at a time
            prev, _last_launched[0] = _last_launched[0], self._lib
        if prev is not None and prev is not self._lib:
            prev.kda_emu_release_stacks()
        if self._launch(cfg, argv, len(bufs), err, len(err)):  # ctypes releases the GIL meanwhile
            raise EmulationError(f"{self.name}: {err.value.decode(errors='replace')}")

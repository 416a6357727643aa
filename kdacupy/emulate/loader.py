"""Load an emulation .so with ctypes and launch its kernels like cupy.RawKernel.__call__."""

from __future__ import annotations

import ctypes
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import env
from . import numerics, profile
from .build import build, stats
from .errors import EmulationEnvError, EmulationError
from .sources import source_location

MAX_SHARED = 227 * 1024  # per-block dynamic shared memory of a Hopper GPU
#: blocks a co_resident launch may run at once (each on an OS thread of its own)
MAX_CO_RESIDENT = 256
_loaded: dict[tuple[str, tuple[str, ...], bool], tuple[ctypes.CDLL, Path]] = {}
_lock = threading.Lock()
_launch_lock = threading.Lock()  # not _lock: that one is held during compiles
_last_launched: list = [None]  # the library whose launch came last keeps its cached fiber stacks
_watchers: list[list] = []  # the lists of the open launched() blocks


@contextmanager
def launched():
    """The kernel names of this process's emulated launches inside the block, in launch order: which
    launches a call made, without the counters (counting()) and so without their instrumented builds."""
    names: list[str] = []
    with _launch_lock:
        _watchers.append(names)
    try:
        yield names
    finally:
        with _launch_lock:
            _watchers.remove(names)


def _mode() -> int:
    """Bug-exposing modes (default off): KDACUPY_EMULATE_CP_ASYNC=eager makes cp.async land at
    issue instead of at the covering wait; KDACUPY_EMULATE_ORDER=reverse runs threads in reverse."""
    try:
        cp, order = env.get("KDACUPY_EMULATE_CP_ASYNC"), env.get("KDACUPY_EMULATE_ORDER")
    except env.EnvError as e:
        raise EmulationEnvError(str(e)) from None
    return (cp == "eager") | (order == "reverse") << 1


CHECKS = {"memcheck": 1, "racecheck": 2, "aligncheck": 4}


def checks() -> int:
    """KDACUPY_EMULATE_CHECK (kdacupy/env.py) -> bits; launches then run a checked build (checks.h)."""
    try:
        names = env.get("KDACUPY_EMULATE_CHECK")
    except env.EnvError as e:
        raise EmulationEnvError(str(e)) from None
    return sum(CHECKS[n] for n in names)


#: the byte an emulated launch's scratch and fresh outputs start as under the checks: 0xFFFF_FFFF,
#: 0xFFFF are fp32, bf16 and fp16 NaNs (negative, all payload bits set), which arithmetic keeps
POISON = 0xFF


def empty(shape, dtype=np.uint8) -> np.ndarray:
    """``np.empty`` for a launcher's scratch memory or an output it allocates, on the emulation.
    Under the checks (KDACUPY_EMULATE_CHECK) every byte is POISON: a kernel that reads a byte
    nobody wrote, or leaves one of its outputs unwritten, gives NaN on every checked run, not
    whatever the allocator left there. Unchecked: no fill."""
    a = np.empty(shape, dtype)
    if checks():
        a.reshape(-1).view(np.uint8).fill(POISON)
    return a


def profiling() -> bool:
    """KDACUPY_EMULATE_PROFILE (kdacupy/env.py) or a profile.counting() block: launches count
    into profile.records (profile.h)."""
    if profile.forced():
        return True
    try:
        return env.get("KDACUPY_EMULATE_PROFILE")
    except env.EnvError as e:
        raise EmulationEnvError(str(e)) from None


def instrumented() -> bool:
    """Whether launches run the instrumented build (the checks and the counters share it)."""
    return checks() != 0 or profiling()


class ArrayPointer:
    """A pointer argument that memcheck knows the array of: the address of ``array``'s first
    element, and the bytes its elements span (a strided view spans its base's bytes between)."""

    __slots__ = ("array", "address", "lo", "hi")

    def __init__(self, array: np.ndarray):
        self.array = array
        self.address = array.ctypes.data if array.size else array.__array_interface__["data"][0]
        lo = hi = self.address
        if array.size:
            for n, st in zip(array.shape, array.strides):
                lo, hi = lo + min(0, (n - 1) * st), hi + max(0, (n - 1) * st)
            hi += array.itemsize
        self.lo, self.hi = lo, hi


def allocation(array: np.ndarray) -> tuple[int, int]:
    """(first byte, end) of the memory ``array`` is a view of: its outermost NumPy base (where a
    GPU allocation would start, 256-byte aligned: the profile counts sectors from there)."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    p = ArrayPointer(root)
    return p.lo, p.hi


def pointer(array: np.ndarray) -> ArrayPointer:
    """``array``'s data pointer as a kernel argument, with its extent for memcheck
    (any layout; the kernel gets the strides separately)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"pointer: expected a numpy array, got {type(array).__name__}")
    return ArrayPointer(array)


def _param_names(source: str, name: str) -> list[str]:
    """Parameter names of kernel ``name`` in ``source`` (for messages; [] if not found)."""
    m = re.search(r"__global__\s+void\s+(?:\w+(?:\([^)]*\))?\s+)*" + re.escape(name) + r"\s*\(([^)]*)\)", source)
    if not m:
        return []
    out = []
    for p in m.group(1).split(","):
        ident = re.search(r"(\w+)\s*(?:\[[^\]]*\])?\s*$", p.strip())
        out.append(ident.group(1) if ident else "?")
    return out


class EmulatedModule:
    """The kernels `names` of a rendered source, compiled for the CPU (built once per process,
    and once more, instrumented, when KDACUPY_EMULATE_CHECK or KDACUPY_EMULATE_PROFILE asks)."""

    def __init__(self, source: str, names: Sequence[str]):
        self.names = tuple(names)
        self._source = source
        self._numerics = numerics.mode()  # fixed at construction: a later build of this module agrees
        self._lib(instrumented())
        self._functions: dict[str, EmulatedFunction] = {}

    def _lib(self, checked: bool) -> tuple[ctypes.CDLL, Path]:
        key = (self._source, self.names, checked, self._numerics)
        with _lock:
            hit = _loaded.get(key)
            if hit is None:
                path = build(self._source, self.names, checked, self._numerics)
                hit = _loaded[key] = (ctypes.CDLL(str(path)), path)
            else:
                stats["memory_hits"] += 1
        return hit

    def get_function(self, name: str) -> "EmulatedFunction":
        if name not in self.names:
            raise EmulationError(f"kernel {name!r} is not among this module's names {self.names}")
        if name not in self._functions:
            self._functions[name] = EmulatedFunction(self, name, _param_names(self._source, name))
        return self._functions[name]


def _dims(v, what: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, (int, np.integer)) and x >= 1 for x in t):
        raise EmulationError(f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {v!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))


class EmulatedFunction:
    """fn(grid, block, args, shared_mem=0): args are C-contiguous numpy arrays (passed as their
    data pointer), ``pointer(array)`` (any layout) and numpy scalars (passed by value;
    np.uint64(0) is a null pointer). Arrays give memcheck their extents: under it, memory
    reached only through a raw np.uint64 address is out of bounds."""

    def __init__(self, module: EmulatedModule, name: str, param_names: Sequence[str] = ()):
        self.name = name
        self._module = module
        self._param_names = list(param_names)
        self._launches: dict[bool, tuple] = {}
        lib = module._lib(instrumented())[0]
        self.arity = getattr(lib, f"kda_emu_arity__{name}")()
        sizes, kinds = (ctypes.c_int * max(self.arity, 1))(), (ctypes.c_int * max(self.arity, 1))()
        getattr(lib, f"kda_emu_params__{name}")(sizes, kinds)
        self.param_sizes = tuple(sizes[: self.arity])
        self.param_kinds = tuple(kinds[: self.arity])  # 1 pointer, 2 floating point, 0 other

    def _marshal(self, i: int, a):
        size, kind = self.param_sizes[i], self.param_kinds[i]
        where = f"{self.name}: argument {i}"
        if isinstance(a, ArrayPointer):
            if kind != 1:
                raise EmulationError(f"{where}: a pointer was given for a non-pointer parameter")
            return ctypes.c_void_p(a.address)
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

    def _launcher(self, checked: bool):
        hit = self._launches.get(checked)
        if hit is None:
            lib, path = self._module._lib(checked)
            fn = getattr(lib, f"kda_emu_launch__{self.name}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                           ctypes.POINTER(ctypes.c_longlong), ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
            hit = self._launches[checked] = (lib, path, fn)
        return hit

    def _explain(self, msg: str, path: Path) -> str:
        """Argument names and source locations ({pc:OFFSET} tokens of checked builds) in a message."""
        names = self._param_names

        def arg(m):
            i = int(m.group(1))
            return f"argument {i} ({names[i]})" if i < len(names) else m.group(0)

        msg = re.sub(r"argument (\d+)", arg, msg)
        if "{pc:" not in msg:
            return msg
        src = path.with_suffix(".cpp")
        text = src.read_text(errors="replace").split("\n") if src.is_file() else []
        msg = re.sub(r"\{pc:([0-9a-f]+)\}", lambda m: source_location(path, m.group(1), text), msg)
        return f"{msg} [rendered source: {src}]" if text else msg

    def __call__(self, grid, block, args, shared_mem: int = 0, co_resident: bool = False) -> None:
        """Run the kernel. ``co_resident``: every block on an OS thread of its own, all at once, as a
        launch whose blocks wait on each other (flags in global memory) needs them on a GPU; otherwise
        KDACUPY_EMULATE_THREADS threads take the blocks one at a time each."""
        g, b = _dims(grid, "grid"), _dims(block, "block")
        if co_resident and g[0] * g[1] * g[2] > MAX_CO_RESIDENT:
            raise EmulationError(f"{self.name}: a co-resident launch of {g[0] * g[1] * g[2]} blocks; the emulation "
                                 f"runs at most {MAX_CO_RESIDENT} at once")
        args = tuple(args)
        if len(args) != self.arity:
            raise EmulationError(f"{self.name}: kernel takes {self.arity} argument(s), {len(args)} given")
        if not 0 <= int(shared_mem) <= MAX_SHARED:
            raise EmulationError(f"{self.name}: shared_mem={shared_mem} exceeds 227 KiB, the per-block limit "
                                 "of a Hopper GPU")
        bufs = [self._marshal(i, a) for i, a in enumerate(args)]  # kept alive during the launch
        argv = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(x) for x in bufs])
        threads = g[0] * g[1] * g[2] if co_resident else env.get("KDACUPY_EMULATE_THREADS") or os.cpu_count() or 1
        stack = env.get("KDACUPY_EMULATE_STACK_KB") * 1024
        check, prof = checks(), profiling()
        counters = profile.buffers() if prof else None
        where = (ctypes.addressof(counters[0]), ctypes.addressof(counters[1]), profile.SITES) if prof else (0, 0, 0)
        anchors = (ctypes.addressof(counters[2]), profile.ANCHORS) if prof else (0, 0)
        cfg = (ctypes.c_longlong * 18)(*g, *b, int(shared_mem), threads, stack, _mode(), check, *where, 0, 0, *anchors)
        ext, allocs = [], []  # (first byte, end, argument index) of every array argument; its allocation
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                ext += [a.ctypes.data, a.ctypes.data + a.nbytes, i]
                allocs += allocation(a) if prof else ()
            elif isinstance(a, ArrayPointer):
                ext += [a.lo, a.hi, i]
                allocs += allocation(a.array) if prof else ()
        signed = lambda xs: [x - (1 << 64) if x >= 1 << 63 else x for x in xs]  # noqa: E731
        extv = (ctypes.c_longlong * max(len(ext), 1))(*signed(ext))
        allocv = (ctypes.c_longlong * max(len(allocs), 1))(*signed(allocs))
        argv_dram = (ctypes.c_longlong * max(len(ext), 1))()  # per array: region, DRAM read, written
        if prof and allocs:
            cfg[14], cfg[15] = ctypes.addressof(allocv), ctypes.addressof(argv_dram)
        lib, path, launch = self._launcher(check != 0 or prof)
        err = ctypes.create_string_buffer(4096)
        with _launch_lock:  # bound the memory mappings: one library's stack cache at a time
            prev, _last_launched[0] = _last_launched[0], lib
        if prev is not None and prev is not lib:
            prev.kda_emu_release_stacks()
        if launch(cfg, argv, len(bufs), extv, len(ext) // 3, err, len(err)):  # ctypes releases the GIL meanwhile
            raise EmulationError(f"{self.name}: {self._explain(err.value.decode(errors='replace'), path)}")
        if _watchers:
            with _launch_lock:
                for names in _watchers:
                    names.append(self.name)
        if prof:
            by_arg = [(ext[3 * i + 2], argv_dram[3 * i + 1], argv_dram[3 * i + 2]) for i in range(len(ext) // 3)]
            profile.record(self.name, lib, path, self._module._source, g, b, int(shared_mem), counters,
                           [(self._param_names[i] if i < len(self._param_names) else f"argument {i}", rd, wr)
                            for i, rd, wr in by_arg])

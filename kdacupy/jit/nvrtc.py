"""The NVRTC compile service: a rendered variant to a cubin and ptxas' resource
report, without a GPU or a driver.

NVRTC is called through ctypes, not ``cupy.RawModule`` (which asks the GPU for
its architecture and never targets the "a" variants) and not CuPy's ``nvrtc.getCUBIN`` (CuPy 14.2 returns the cubin
one byte short, which the binary tools reject).
"""
from __future__ import annotations

import ctypes
import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .disk_cache import keep_file
from .render import render

#: NVRTC options of every GPU build; --fmad=false: only explicit fmaf() fuse, as in the emulation
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")
#: what cupy.RawModule adds to every NVRTC compile (cupy/cuda/compiler.py, CuPy 14): -ftz=true
#: (fp32 arithmetic flushes subnormal inputs and results to zero: part of the numerics contract)
#: and --device-as-default-execution-space. The runtime compiles through nvrtc_compile with the
#: same (its loader, jit/loaders.py, then loads the cubin), for the target targets.py picks, so
#: the compile report describes the binary the runtime builds.
CUPY_ADDED_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")


class CompileError(RuntimeError):
    """A kernel variant NVRTC could not compile: the message names the variant and carries NVRTC's log."""


#: the compile report's targets: sm_90a is what the runtime builds on compute capability 9.0,
#: sm_100a on 10.0 for variants with arch-specific instructions (targets.py)
ARCHS = ("sm_80", "sm_90a", "sm_100a")
#: also accepted: sm_100, the runtime's target on 10.0 for the other variants, and sm_90, what
#: CuPy alone would build on an H100 / H200 (no "a": no wgmma)
GENERIC_ARCHS = ("sm_90", "sm_100")
#: shared memory a block may use, per arch (opt-in maximum)
SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024, "sm_100a": 227 * 1024, "sm_90": 227 * 1024,
              "sm_100": 227 * 1024}


@lru_cache(maxsize=None)
def _nvrtc():
    from cuda.pathfinder import load_nvidia_dynamic_lib

    lib = ctypes.CDLL(load_nvidia_dynamic_lib("nvrtc").abs_path)
    for name in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
                 "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram"):
        getattr(lib, name).restype = ctypes.c_int
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


@dataclass
class CompileResult:
    ok: bool
    log: str
    cubin: bytes = b""
    regs: int = -1
    spill_stores: int = -1
    spill_loads: int = -1
    stack: int = -1
    static_smem: int = 0
    sass: dict = field(default_factory=dict)

    @property
    def resources(self) -> str:
        return (f"regs={self.regs} spill_stores={self.spill_stores} spill_loads={self.spill_loads} "
                f"stack={self.stack}")


@lru_cache(maxsize=None)
def nvrtc_version() -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def report_cache_dir() -> Path:
    """Where NVRTC's successful builds are kept (its log and cubin): ``$KDACUPY_CACHE_DIR/nvrtc``, default
    ``~/.cache/kdacupy/nvrtc``. A build is a function of the source, the options, the target and NVRTC's
    version, which the file's name hashes: the compile report, the SASS and the runtime's cubins of an
    unchanged variant then cost a file read, not a ptxas run."""
    from .. import env

    return env.cache_dir("nvrtc")


def nvrtc_compile(source: str, arch: str, options=()) -> CompileResult:
    """NVRTC's build of ``source`` for ``arch`` with ptxas' resource report (successful builds cached on
    disk: report_cache_dir)."""
    opts = (*NVRTC_OPTIONS, *CUPY_ADDED_OPTIONS, f"--gpu-architecture={arch}", "--ptxas-options=-v", *options)
    key = hashlib.sha256("\0".join((nvrtc_version(), *opts, source)).encode()).hexdigest()
    path = report_cache_dir() / f"{key}.bin"
    try:
        blob = path.read_bytes()
        n = int.from_bytes(blob[:8], "little")
        return _result(blob[8:8 + n].decode(), blob[8 + n:])
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    res = _compile(source, opts)
    if res.ok:
        log = res.log.encode()
        keep_file(path, len(log).to_bytes(8, "little") + log + res.cubin)
    return res


def _compile(source: str, opts: tuple) -> CompileResult:
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    check = lambda rc, what: rc == 0 or (_ for _ in ()).throw(  # noqa: E731
        RuntimeError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}"))
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None), "create")
    argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    try:
        rc = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc != 0:
            return CompileResult(False, log)
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(prog, cubin), "getCUBIN")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return _result(log, cubin.raw)


def _result(log: str, cubin: bytes) -> CompileResult:
    """A successful build's result: ptxas' report parsed from its log."""
    res = CompileResult(True, log, cubin)
    m = re.search(r"Used (\d+) registers", log)
    res.regs = int(m.group(1)) if m else -1
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if m:
        res.stack, res.spill_stores, res.spill_loads = map(int, m.groups())
    m = re.search(r"(\d+) bytes smem", log)
    res.static_smem = int(m.group(1)) if m else 0
    return res


def arch_of_device(arch_specific: bool = False) -> str:
    """The target the runtime builds on this device (targets.py): sm_90a on 9.0."""
    from .targets import device_cc, runtime_arch

    return runtime_arch(device_cc(), arch_specific)


def compile_variant(var, arch: str, sass: bool = False) -> CompileResult:
    res = nvrtc_compile(render(var.kernel, var.config()), arch)
    if res.ok and sass:
        from .sass import sass_mix

        res.sass = sass_mix(res.cubin)
    return res

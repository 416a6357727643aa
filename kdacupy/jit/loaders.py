"""Render kernel variants and load them: NVRTC through ``cupy.RawModule`` on the
GPU, the host C++ compiler for the CPU emulation.

A variant is the kernel's ``.cu`` text with every ``#include "..."`` of
``kernels/`` inlined (so a cache keyed on the text sees header changes) and a
block of ``#define NAME <int>`` lines in front. Only validated integers reach
the source: names must be upper-case identifiers, values plain ints.
"""
from __future__ import annotations

import os
import re
import sys
import time
from functools import lru_cache

from ..paths import kernels_dir

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
#: NVRTC options of every GPU build; --fmad=false: only explicit fmaf() fuse, as in the emulation
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")
#: what cupy.RawModule adds to every NVRTC compile (cupy/cuda/compiler.py, CuPy 14): -ftz=true
#: (fp32 arithmetic flushes subnormal inputs and results to zero: part of the numerics contract),
#: --device-as-default-execution-space, and -arch=sm_XY of the device (no "a" suffix: sm_90 on an
#: H100/H200). The compile report (kdacupy.compile) passes the same, so it describes the same binary.
CUPY_ADDED_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")


@lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (kernels_dir() / name).read_text()


def _inline(name: str, seen: set) -> str:
    if name in seen:  # every header is #pragma once
        return ""
    seen.add(name)
    text = _read(name).replace("#pragma once", "")
    return _INCLUDE.sub(lambda m: _inline(m.group(1), seen), text)


def render(kernel: str, config: dict) -> str:
    """Source of one variant of ``kernels/<kernel>.cu``."""
    lines = []
    for name, value in sorted(config.items()):
        if not _NAME.match(name) or not isinstance(value, int):
            raise ValueError(f"config: {name}={value!r} is not an upper-case name with an int value")
        lines.append(f"#define {name} {int(value)}")
    return f"// kdacupy variant of {kernel}.cu\n" + "\n".join(lines) + "\n" + _inline(f"{kernel}.cu", set())


def _verbose() -> bool:
    return os.environ.get("KDACUPY_JIT_VERBOSE", "") not in ("", "0")


class CudaLoader:
    """Compiles each variant once per process and device (CuPy's disk cache
    below that keeps it across processes)."""

    def __init__(self):
        self._cache = {}

    def get(self, kernel: str, config: dict, name: str):
        import cupy

        dev = cupy.cuda.Device().id
        key = (kernel, tuple(sorted(config.items())), dev)
        fn = self._cache.get(key)
        if fn is None:
            source = render(kernel, config)
            t0 = time.perf_counter()
            fn = cupy.RawModule(code=source, options=NVRTC_OPTIONS).get_function(name)
            fn.compile()  # compile now, not at the first launch
            if _verbose():
                from ..cli.compile import arch_of_device, nvrtc_compile
                res = nvrtc_compile(source, arch_of_device())
                print(f"[kdacupy.jit] {kernel} {config_label(config)}: {time.perf_counter() - t0:.2f} s; "
                      f"{res.resources}", file=sys.stderr)
            self._cache[key] = fn
        return fn

    @staticmethod
    def launch(fn, grid, block, args, shared_mem):
        if shared_mem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < shared_mem:
            fn.max_dynamic_shared_size_bytes = shared_mem  # opt in above 48 KiB
        fn(grid, block, args, shared_mem=shared_mem)


class EmulateLoader:
    """The same variants compiled for the CPU (kdacupy.emulate)."""

    def __init__(self):
        self._cache = {}

    def get(self, kernel: str, config: dict, name: str):
        from ..emulate import EmulatedModule
        from ..emulate.numerics import mode

        key = (kernel, tuple(sorted(config.items())), mode())  # KDACUPY_EMULATE_NUMERICS builds differ
        fn = self._cache.get(key)
        if fn is None:
            t0 = time.perf_counter()
            fn = EmulatedModule(render(kernel, config), [name]).get_function(name)
            if _verbose():
                print(f"[kdacupy.jit] emulate {kernel} {config_label(config)}: {time.perf_counter() - t0:.2f} s",
                      file=sys.stderr)
            self._cache[key] = fn
        return fn

    @staticmethod
    def launch(fn, grid, block, args, shared_mem):
        fn(grid, block, args, shared_mem=shared_mem)


def config_label(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()) if k.startswith("KDA_"))


@lru_cache(maxsize=None)
def loader(kind: str):
    return CudaLoader() if kind == "cuda" else EmulateLoader()

"""Load rendered kernel variants (``render.py``): NVRTC through ``cupy.RawModule``
on the GPU, the host C++ compiler for the CPU emulation."""
from __future__ import annotations

import sys
import time
from functools import lru_cache

from .. import env
from .nvrtc import NVRTC_OPTIONS, CompileError
from .render import config_label, render


def _verbose() -> bool:
    return env.get("KDACUPY_JIT_VERBOSE")


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
            try:
                fn = cupy.RawModule(code=source, options=NVRTC_OPTIONS).get_function(name)
                fn.compile()  # compile now, not at the first launch
            except cupy.cuda.compiler.CompileException as e:  # carries NVRTC's log
                raise CompileError(f"{kernel} {config_label(config)}: NVRTC failed:\n{e}") from e
            if _verbose():
                from .nvrtc import arch_of_device, nvrtc_compile
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
        from ..emulate import EmulatedModule, EmulationError
        from ..emulate.numerics import mode

        key = (kernel, tuple(sorted(config.items())), mode())  # KDACUPY_EMULATE_NUMERICS builds differ
        fn = self._cache.get(key)
        if fn is None:
            t0 = time.perf_counter()
            try:
                fn = EmulatedModule(render(kernel, config), [name]).get_function(name)
            except EmulationError as e:  # carries the host compiler's log
                raise EmulationError(f"{kernel} {config_label(config)}: {e}") from e
            if _verbose():
                print(f"[kdacupy.jit] emulate {kernel} {config_label(config)}: {time.perf_counter() - t0:.2f} s",
                      file=sys.stderr)
            self._cache[key] = fn
        return fn

    @staticmethod
    def launch(fn, grid, block, args, shared_mem):
        fn(grid, block, args, shared_mem=shared_mem)


@lru_cache(maxsize=None)
def loader(kind: str):
    return CudaLoader() if kind == "cuda" else EmulateLoader()

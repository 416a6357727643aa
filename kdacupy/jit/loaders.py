"""Load rendered kernel variants (``render.py``): NVRTC for the runtime's target
(``targets.py``), loaded through ``cupy.RawModule``, on the GPU; the host C++ compiler for
the CPU emulation."""
from __future__ import annotations

import sys
import time
from functools import lru_cache

from .. import env
from .nvrtc import CompileError
from .render import config_label, render


def _verbose() -> bool:
    return env.get("KDACUPY_JIT_VERBOSE")


#: kernels whose every block must be resident at once (blocks wait on each other): launched cooperatively
COOPERATIVE = frozenset({"kda_forward_fused"})


def cuda_module(source: str, arch: str, what: str = "kernel", cooperative: bool = False):
    """``source`` compiled by NVRTC for ``arch`` (the cubin cache, cubin_cache.py) and loaded
    as a ``cupy.RawModule`` (``cooperative``: its launches are cooperative, cuLaunchCooperativeKernel,
    which fails rather than run a grid the device cannot hold at once); CompileError with NVRTC's
    log if it does not compile."""
    import cupy

    from .cubin_cache import cubin_path

    path, res = cubin_path(source, arch)
    if path is None:
        raise CompileError(f"{what}: NVRTC failed for {arch}:\n{res.log}")
    return cupy.RawModule(path=str(path), **({"enable_cooperative_groups": True} if cooperative else {})), res


class CudaLoader:
    """Compiles each variant once per process and device, for the target the runtime builds
    on that device (targets.py: sm_90a on compute capability 9.0); the cubin cache on disk
    keeps it across processes."""

    def __init__(self):
        self._cache = {}

    def get(self, kernel: str, config: dict, name: str):
        import cupy

        from .targets import target

        dev = cupy.cuda.Device().id
        key = (kernel, tuple(sorted(config.items())), dev)
        fn = self._cache.get(key)
        if fn is None:
            arch = target(kernel, config)
            t0 = time.perf_counter()
            mod, res = cuda_module(render(kernel, config), arch, f"{kernel} {config_label(config)}",
                                   cooperative=kernel in COOPERATIVE)
            fn = mod.get_function(name)
            fn.compile()  # load now, not at the first launch
            if _verbose():
                how = res.resources if res is not None else "from the cubin cache"
                print(f"[kdacupy.jit] {kernel} {config_label(config)} for {arch}: "
                      f"{time.perf_counter() - t0:.2f} s; {how}", file=sys.stderr)
            self._cache[key] = fn
        return fn

    @staticmethod
    def _opt_in(fn, shared_mem):
        if shared_mem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < shared_mem:
            fn.max_dynamic_shared_size_bytes = shared_mem  # opt in above 48 KiB

    @classmethod
    def launch(cls, fn, grid, block, args, shared_mem, cooperative=False):
        """``cooperative``: the kernel's module was loaded so (COOPERATIVE): every block resident at once."""
        cls._opt_in(fn, shared_mem)
        fn(grid, block, args, shared_mem=shared_mem)

    @classmethod
    def resident_blocks(cls, fn, threads: int, shared_mem: int) -> int:
        """Blocks of ``fn`` the current device holds at once (its SMs x the occupancy calculator's)."""
        import cupy
        from cupy.cuda import driver

        cls._opt_in(fn, shared_mem)
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, shared_mem)
        return per_sm * cupy.cuda.Device().attributes["MultiProcessorCount"]


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
    def launch(fn, grid, block, args, shared_mem, cooperative=False):
        """``cooperative``: every block on an OS thread of its own, all at once (co-resident)."""
        fn(grid, block, args, shared_mem=shared_mem, **({"co_resident": True} if cooperative else {}))


@lru_cache(maxsize=None)
def loader(kind: str):
    return CudaLoader() if kind == "cuda" else EmulateLoader()

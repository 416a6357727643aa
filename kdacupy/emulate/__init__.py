"""Run the CUDA kernel sources on the CPU: g++ build of the same .cu text plus an
emulation of blocks, threads (fibers), warps and the PTX wrappers of kernels/ptx.cuh."""

from .build import find_compiler
from .errors import EmulationEnvError, EmulationError
from .loader import EmulatedModule, pointer

__all__ = ["EmulatedModule", "EmulationEnvError", "EmulationError", "find_compiler", "pointer"]

"""Run the CUDA kernel sources on the CPU: g++ build of the same .cu text plus an
emulation of blocks, threads (fibers), warps and the PTX wrappers of kernels/ptx.cuh."""

from .build import find_compiler
from .errors import EmulationError
from .loader import EmulatedModule, pointer

__all__ = ["EmulatedModule", "EmulationError", "find_compiler", "pointer"]

"""Run the CUDA kernel sources on the CPU: g++ build of the same .cu text plus an
emulation of blocks, threads (fibers), warps and the PTX wrappers of kernels/ptx.cuh;
with KDACUPY_EMULATE_PROFILE=1, hardware counters of every launch (profile_records())."""

from .build import find_compiler
from .errors import EmulationEnvError, EmulationError
from .loader import EmulatedModule, launched, pointer
from .profile import counting, hotspots, profile_records, profile_reset, source_text

__all__ = ["EmulatedModule", "EmulationEnvError", "EmulationError", "counting", "find_compiler", "hotspots", "launched",
           "pointer", "profile_records", "profile_reset", "source_text"]

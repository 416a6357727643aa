"""An early step of benchmarks/device_check.sh: what the machine has, in one
screen. The GPU (name, compute capability, SMs, memory, L2), CuPy, the CUDA
runtime, driver and NVRTC versions, the NVRTC target the runtime builds here
(kdacupy/jit/targets.py: sm_90a on an H100 / H200, whose compile report is
benchmarks/compile-sm_90a.txt), and
which optional pieces are there (torch, triton, fla, JAX,
mpi4py, NCCL, pytest-timeout, compute-sanitizer, a host C++ compiler). Runs
without a GPU too (it says so), as in the CPU rehearsal."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


#: import name -> distribution names that may carry it (versions read without importing: fast)
DISTRIBUTIONS = {"torch": ("torch",), "triton": ("triton",), "jax": ("jax",), "mpi4py": ("mpi4py",),
                 "pytest_timeout": ("pytest-timeout",), "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
                 "fla": ("flash-linear-attention", "fla-core")}


def version(name):
    from importlib import metadata

    if importlib.util.find_spec(name) is None:
        return "not installed"
    for dist in DISTRIBUTIONS.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "installed"


def gpu():
    import cupy

    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        print(f"GPU: none (CuPy: {type(e).__name__}: {str(e)[:100]})")
        return
    from kdacupy.cli.timing import device_info

    info = device_info()
    print(f"GPU: {info['name']} x {n}, compute capability {info['compute_capability']}, {info['sm_count']} SMs, "
          f"{info['memory_bytes'] / 2 ** 30:.0f} GiB, L2 {info['l2_bytes'] / 2 ** 20:.0f} MiB")
    print(f"CUDA runtime {info['cuda_runtime']}, driver {info['cuda_driver']}, NVRTC {cupy.cuda.nvrtc.getVersion()}")
    from kdacupy.jit.nvrtc import arch_of_device

    arch, special = arch_of_device(), arch_of_device(arch_specific=True)
    also = f", {special} for variants with arch-specific instructions" if special != arch else ""
    print(f"the runtime's NVRTC target here: {arch}{also} (compile report: benchmarks/compile-{arch}.txt)")


def main():
    import numpy

    import kdacupy

    print(f"python {sys.version.split()[0]}, numpy {numpy.__version__}, cupy {version('cupy')}, "
          f"kdacupy {kdacupy.__version__}")
    gpu()
    for name in ("torch", "triton", "jax", "mpi4py", "pytest_timeout"):
        print(f"{name}: {version(name)}")
    # which FLA pool-decode call is there needs FLA imported (torch, triton: seconds more than
    # this step's box); step 13's decode benchmark prints it
    print(f"fla: {version('fla')}")
    try:
        import warnings

        with warnings.catch_warnings():  # CuPy warns at length when libnccl is missing: one line here
            warnings.simplefilter("ignore")
            from cupy.cuda import nccl
        print(f"NCCL: {'available' if getattr(nccl, 'available', False) else 'not available'} to CuPy")
    except Exception as e:  # noqa: BLE001
        print(f"NCCL: {type(e).__name__}")
    san = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
    print(f"compute-sanitizer: {san or 'not found (the sanitizer steps skip)'}")
    cxx = next((c for c in (os.environ.get("CXX"), "g++", "clang++", "c++") if c and shutil.which(c)), None)
    print(f"host C++ compiler: {cxx or 'none (the emulation tests skip)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

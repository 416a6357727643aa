"""Whether a CUDA GPU can run kernels here, and if not why, in plain words."""
from __future__ import annotations

#: cudaError_t values getDeviceCount reports on machines without a usable GPU
_NO_DEVICE, _INSUFFICIENT_DRIVER = 100, 35


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def why_no_gpu() -> str | None:
    """None when CuPy sees at least one CUDA device; else a one-line reason, e.g.
    ``no CUDA GPU (no NVIDIA driver found)``."""
    try:
        import cupy
        rt = cupy.cuda.runtime
    except Exception as e:  # noqa: BLE001  (no CuPy, or CuPy without its CUDA libraries)
        return f"no CUDA GPU usable (CuPy cannot be imported: {type(e).__name__}: {e})".splitlines()[0]
    try:
        driver = rt.driverGetVersion()
    except Exception:  # noqa: BLE001
        driver = 0
    if driver == 0:
        return "no CUDA GPU (no NVIDIA driver found)"
    try:
        count = rt.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        status = getattr(e, "status", None)
        if status == _INSUFFICIENT_DRIVER:
            try:
                runtime = _version(rt.runtimeGetVersion())
            except Exception:  # noqa: BLE001
                runtime = "this CuPy's"
            return (f"no usable CUDA GPU (the NVIDIA driver supports CUDA up to {_version(driver)}, "
                    f"older than the CUDA {runtime} runtime)")
        if status == _NO_DEVICE:
            return "no CUDA GPU (the NVIDIA driver sees no device)"
        return f"no usable CUDA GPU ({type(e).__name__}: {e})".splitlines()[0]
    if count < 1:
        return "no CUDA GPU (the NVIDIA driver sees no device)"
    return None

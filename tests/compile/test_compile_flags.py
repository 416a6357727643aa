"""The compile report builds what the runtime builds: CuPy's RawModule adds
-ftz=true and --device-as-default-execution-space to every NVRTC compile, and
the compile service (kdacupy/jit/nvrtc.py) passes the same (plus the runtime's own
NVRTC_OPTIONS)."""
import importlib.util
import re
from pathlib import Path

import pytest

from kdacupy.jit import nvrtc as jit

try:
    from kdacupy.jit.nvrtc import _nvrtc
    _nvrtc()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"NVRTC is not loadable here: {e}", allow_module_level=True)


def test_cupy_adds_what_we_say_it_adds():
    spec = importlib.util.find_spec("cupy")
    if spec is None or spec.origin is None:
        pytest.skip("CuPy is not installed")
    src = (Path(spec.origin).parent / "cuda" / "compiler.py").read_text()
    for opt in jit.CUPY_ADDED_OPTIONS:
        assert re.search(rf"options \+= \(\s*'{re.escape(opt)}',?\s*\)", src), opt
    # and it targets sm_<cc> (cubin) or compute_<cc> (PTX), never an "a" suffix
    assert "f'-arch=sm_{arch}'" in src


def test_report_binary_flushes_subnormals():
    from cuda.pathfinder import find_nvidia_binary_utility

    from kdacupy.jit.nvrtc import nvrtc_compile
    if find_nvidia_binary_utility("nvdisasm") is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    import subprocess
    import tempfile
    src = 'extern "C" __global__ void k(const float* a, float* o) { o[0] = a[0] * a[1] + a[2]; }'
    res = nvrtc_compile(src, "sm_90")
    assert res.ok, res.log
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(res.cubin)
        f.flush()
        text = subprocess.run([find_nvidia_binary_utility("nvdisasm"), f.name], capture_output=True,
                              text=True, check=True).stdout
    assert re.search(r"\bF(MUL|ADD|FMA)\.FTZ\b", text), text  # -ftz=true, as at run time
    assert "FFMA" not in text  # --fmad=false: the product and the sum stay two roundings


def test_the_gpu_conformance_kernels_compile_as_the_runtime_builds_them():
    # tests/gpu/test_gpu_ptx.py runs these on the device through cupy.RawModule: find a compile
    # error here, not in the device's time
    from kdacupy.jit.nvrtc import nvrtc_compile

    from ..emulate.test_ptx_twins import TEST_KERNELS, kernel_source
    for arch in ("sm_90", "sm_100"):
        res = nvrtc_compile(kernel_source(TEST_KERNELS), arch)
        assert res.ok, res.log

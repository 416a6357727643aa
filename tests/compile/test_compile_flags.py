"""The compile report builds what the runtime builds: the runtime compiles through the
compile service (kdacupy/jit/nvrtc.py, for the target kdacupy/jit/targets.py picks:
tests/compile/test_targets.py) with the options CuPy's RawModule would add to every NVRTC
compile, -ftz=true and --device-as-default-execution-space (plus the runtime's own
NVRTC_OPTIONS). On a GPU, tests/gpu/test_gpu_ptx.py shows the flush itself
(1e-20f * 1e-20f == 0 in a RawModule kernel)."""
import re
from pathlib import Path

import pytest

from kdacupy.jit import nvrtc as jit

try:
    from kdacupy.jit.nvrtc import _nvrtc
    _nvrtc()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"NVRTC is not loadable here: {e}", allow_module_level=True)


def cupy_nvrtc_options(arch_digits):
    """The options CuPy's own compile path hands NVRTC for the runtime's source and options, on
    a device of compute capability ``arch_digits`` ("90": H100/H200): CuPy's real code runs,
    with the device query and the NVRTC program replaced by recorders (no GPU or driver here).
    ``cupy.RawModule(code, options).get_function`` reaches ``_compile_module_with_cache``
    once it has asked the device which one it is on."""
    compiler = pytest.importorskip("cupy.cuda.compiler", reason="CuPy is not installed")
    seen = []

    class Stop(Exception):
        pass

    class Program:  # stands in for compiler._NVRTCProgram
        def __init__(self, src, name="", headers=(), include_names=(), name_expressions=None, method="ptx"):
            self.src, self.method = src, method

        def compile(self, options=(), log_stream=None):
            seen.append((self.src, tuple(options), self.method))
            if not self.src:  # CuPy's probe of the compiler version on an empty file
                return b"", None
            raise Stop

    import unittest.mock as mock
    src = 'extern "C" __global__ void k(float* o, const float* a) { o[0] = a[0] * a[1]; }'
    with mock.patch.object(compiler, "_NVRTCProgram", Program), \
            mock.patch.object(compiler, "_get_arch", lambda: arch_digits), \
            mock.patch.object(compiler, "_get_arch_for_options_for_nvrtc",
                              compiler._get_arch_for_options_for_nvrtc.__wrapped__), \
            mock.patch.dict("os.environ", {"CUPY_CACHE_IN_MEMORY": "1"}):
        with pytest.raises(Stop):
            compiler._compile_module_with_cache(src, jit.NVRTC_OPTIONS, backend="nvrtc")
    (opts, method), = [(o, m) for s, o, m in seen if s == src]
    return opts, method


@pytest.mark.parametrize("cc, target", [("90", "sm_90"), ("100", "sm_100")])
def test_cupy_compiles_with_what_the_report_passes(cc, target):
    """CuPy adds -ftz=true and --device-as-default-execution-space to the runtime's NVRTC
    options and targets sm_<cc> (a cubin, never the "a" suffix: why the runtime compiles
    itself): the compile service passes the same options, and accepts those targets too
    (GENERIC_ARCHS)."""
    opts, method = cupy_nvrtc_options(cc)
    assert method == "cubin" and f"-arch={target}" in opts and target in jit.GENERIC_ARCHS
    assert "-ftz=true" in opts
    rest = set(opts) - {f"-arch={target}", "--pch"}  # --pch: a precompiled header, no effect on the code
    assert rest == set(jit.NVRTC_OPTIONS + jit.CUPY_ADDED_OPTIONS), opts


def test_report_binary_flushes_subnormals_without_cupy():
    """The compile report needs no CuPy (it runs where CuPy is absent: a subprocess that cannot
    import it), and its binary flushes subnormals: -ftz=true, as at run time."""
    from cuda.pathfinder import find_nvidia_binary_utility
    if find_nvidia_binary_utility("nvdisasm") is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    import subprocess
    import sys
    code = (
        "import sys; sys.modules['cupy'] = None\n"  # import cupy now raises ImportError
        "from kdacupy.jit.nvrtc import nvrtc_compile\n"
        "from kdacupy.jit.sass import nvdisasm\n"
        "import subprocess, tempfile\n"
        "src = 'extern \"C\" __global__ void k(const float* a, float* o) { o[0] = a[0] * a[1] + a[2]; }'\n"
        "res = nvrtc_compile(src, 'sm_90')\n"
        "assert res.ok, res.log\n"
        "f = tempfile.NamedTemporaryFile(suffix='.cubin'); f.write(res.cubin); f.flush()\n"
        "print(subprocess.run([nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout)\n"
        "assert 'cupy' not in [m.split('.')[0] for m, v in sys.modules.items() if v is not None]\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert re.search(r"\bF(MUL|ADD|FMA)\.FTZ\b", out.stdout), out.stdout  # -ftz=true, as at run time
    assert "FFMA" not in out.stdout  # --fmad=false: the product and the sum stay two roundings


def test_the_gpu_conformance_kernels_compile_as_the_runtime_builds_them():
    # tests/gpu/test_gpu_ptx.py runs these on the device: find a compile error here, not in the
    # device's time (sm_90: what its RawModule builds, sm_90a / sm_100: the runtime's targets)
    from kdacupy.jit.nvrtc import nvrtc_compile

    from ..emulate.test_ptx_twins import TEST_KERNELS, kernel_source
    for arch in ("sm_90", "sm_90a", "sm_100"):
        res = nvrtc_compile(kernel_source(TEST_KERNELS), arch)
        assert res.ok, res.log


def test_the_hopper_conformance_kernels_compile_for_sm_90a_only():
    """tests/gpu/test_gpu_ptx.py's sm_90a probes (wgmma, mbarrier, cp.async.bulk) compile for
    sm_90a, and their SASS holds HGMMA and its WARPGROUP fences / waits, UBLKCP and the SYNCS
    of the mbarriers (the mix `python -m kdacupy.compile --sass` reports); elsewhere the
    wrappers do not exist (kernels/ptx.cuh's guards): wgmma on sm_90 and sm_100a, all on sm_80."""
    from kdacupy.jit.nvrtc import nvrtc_compile
    from kdacupy.jit.sass import nvdisasm, sass_mix

    from ..emulate.test_ptx_twins import kernel_source
    from ..emulate.test_ptx_twins_async import ASYNC_KERNELS
    src = kernel_source(ASYNC_KERNELS)
    res = nvrtc_compile(src, "sm_90a")
    assert res.ok, res.log
    assert res.spill_stores == 0
    if nvdisasm() is not None:
        mix = sass_mix(res.cubin)
        assert mix["HGMMA"] >= 20 and mix["WARPGROUP"] >= mix["HGMMA"] and mix["HMMA"] == 0, mix
        assert mix["UBLKCP"] >= 2 and mix["SYNCS"] >= 10 and mix["UTMALDG"] == 0, mix
    for arch, missing in (("sm_90", "wgmma_bf16"), ("sm_100a", "wgmma_bf16"), ("sm_80", "mbarrier_init")):
        res = nvrtc_compile(src, arch)
        assert not res.ok and re.search(rf'identifier "{missing}" is undefined', res.log), (arch, res.log[-2000:])

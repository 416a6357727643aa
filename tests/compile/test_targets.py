"""The target the runtime builds (kdacupy/jit/targets.py, docs/design.md section 4 item 3):
sm_90a on compute capability 9.0, sm_100a on 10.x only for variants declared to use an
arch-specific instruction; the loader compiles for it through the compile report's own NVRTC
call and keeps the cubin on disk. No GPU: the compute capability is faked where the code asks
the device, and cupy.RawModule is replaced by a recorder."""
import subprocess
import sys

import pytest

from kdacupy.jit import cubin_cache, loaders, registry, targets
from kdacupy.jit.nvrtc import ARCHS, GENERIC_ARCHS

try:
    from kdacupy.jit.nvrtc import _nvrtc
    _nvrtc()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"NVRTC is not loadable here: {e}", allow_module_level=True)


@pytest.mark.parametrize("cc, plain, specific", [
    ("80", "sm_80", "sm_80"), ("86", "sm_86", "sm_86"), ("90", "sm_90a", "sm_90a"),
    ("100", "sm_100", "sm_100a"), ("103", "sm_103", "sm_103a"), ("120", "sm_120", "sm_120")])
def test_runtime_arch_per_compute_capability(cc, plain, specific):
    assert targets.runtime_arch(cc) == plain
    assert targets.runtime_arch(cc, arch_specific=True) == specific


def test_compute_capability_parsing():
    assert targets.cc_digits("9.0") == "90" and targets.cc_digits("10.3") == "103" and targets.cc_digits("90") == "90"
    for bad in ("9", "9.", "x.0", "9.10"):
        with pytest.raises(ValueError, match="compute capability"):
            targets.cc_digits(bad)
    with pytest.raises(ValueError, match="digits"):
        targets.runtime_arch("9.0")


def test_every_report_target_says_which_runtime_builds_it():
    said = {arch: targets.describe(arch) for arch in ARCHS + GENERIC_ARCHS}
    assert said["sm_90a"] == "the runtime's target on compute capability 9.0"
    assert said["sm_90"].startswith("not a runtime target (the runtime builds sm_90a")
    assert "with arch-specific" in said["sm_100a"] and "without arch-specific" in said["sm_100"]


@pytest.fixture
def declared():
    """A made-up family whose ARCH_SPECIFIC=1 variants use an arch-specific instruction."""
    targets.declare_arch_specific("kda_made_up", lambda config: config.get("ARCH_SPECIFIC") == 1)
    yield
    targets.forget_arch_specific("kda_made_up")


def test_a_declared_variant_gets_the_arch_specific_target_on_10x_only(declared, monkeypatch):
    for cc, plain, specific in (("100", "sm_100", "sm_100a"), ("90", "sm_90a", "sm_90a"), ("80", "sm_80", "sm_80")):
        monkeypatch.setattr(targets, "device_cc", lambda cc=cc: cc)
        assert targets.target("kda_made_up", {"ARCH_SPECIFIC": 1}) == specific
        assert targets.target("kda_made_up", {"ARCH_SPECIFIC": 0}) == plain
        assert targets.target("kda_seqpar_scan", {"ARCH_SPECIFIC": 1}) == plain  # another family: its own say


def test_the_tcgen05_recurrences_alone_use_an_arch_specific_instruction():
    """So on 10.x the tcgen05 recurrences build sm_100a (tcgen05 is there alone) and every other variant
    sm_100 (the generic target)."""
    from kdacupy.cli import compile as _cli  # noqa: F401  (registers every family)

    for name in registry.kernels():
        for v in registry.variants(name):
            tc = getattr(getattr(v, "tiles", None), "mma", None) == "tcgen05"
            assert targets.uses_arch_specific(v.kernel, v.config()) == tc, v.label()


class Recorder:
    """Stands in for cupy: the device's id, RawModule(path=...) and its kernel."""

    def __init__(self):
        self.paths = []

    def RawModule(self, path):  # noqa: N802  (cupy's name)
        self.paths.append(path)
        rec = self

        class Module:
            def get_function(self, name):
                class Fn:
                    def compile(self):
                        rec.loaded = (path, name)
                return Fn()
        return Module()


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """Compute capability 9.0, CuPy's kernel cache in tmp_path, every NVRTC target recorded."""
    import cupy

    rec = Recorder()
    rec.compiled = []
    real = cubin_cache.nvrtc_compile
    monkeypatch.setattr(cubin_cache, "nvrtc_compile", lambda src, arch: rec.compiled.append(arch) or real(src, arch))
    monkeypatch.setattr(cupy, "RawModule", rec.RawModule)
    monkeypatch.setattr(cupy.cuda, "Device", lambda *a: type("Dev", (), {"id": 0})())
    monkeypatch.setattr(targets, "device_cc", lambda: "90")
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    return rec


def first_variant(kernel):
    from kdacupy.ops.seqpar import variants as _seqpar  # noqa: F401  (registers the scan kernel)
    return registry.variants(kernel)[0]


def test_the_loader_builds_sm_90a_on_compute_capability_9_and_keeps_the_cubin(fake_gpu, tmp_path):
    var = first_variant("kda_seqpar_scan")
    loaders.CudaLoader().get(var.kernel, var.config(), var.kernel)
    assert fake_gpu.compiled == ["sm_90a"]
    (cubin,) = tmp_path.glob("kdacupy-*.cubin")
    assert fake_gpu.loaded == (str(cubin), var.kernel)
    assert cubin.name == f"kdacupy-{cubin_cache.key(loaders.render(var.kernel, var.config()), 'sm_90a')}.cubin"
    assert cubin.read_bytes()[:4] == b"\x7fELF"
    loaders.CudaLoader().get(var.kernel, var.config(), var.kernel)  # a new process's loader: from the disk
    assert fake_gpu.compiled == ["sm_90a"] and fake_gpu.paths == [str(cubin)] * 2


def test_the_loader_builds_the_generic_target_on_10_0(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(targets, "device_cc", lambda: "100")
    var = first_variant("kda_seqpar_scan")
    loaders.CudaLoader().get(var.kernel, var.config(), var.kernel)
    assert fake_gpu.compiled == ["sm_100"]


def test_a_failed_compile_names_the_target(fake_gpu):
    with pytest.raises(loaders.CompileError, match=r"probe: NVRTC failed for sm_90a:\n.*error"):
        loaders.cuda_module('extern "C" __global__ void k() { undefined_call(); }', "sm_90a", "probe")


def test_the_compile_cli_says_which_target_it_built():
    from kdacupy.ops.seqpar import variants as _seqpar  # noqa: F401
    label = registry.variants("kda_seqpar_scan")[0].label()
    for argv, said in ((["--arch", "sm_90a"], "for sm_90a (the runtime's target on compute capability 9.0)"),
                       (["--cc", "10.0"], "for compute capability 10.0: sm_100 (1: the runtime's target")):
        out = subprocess.run([sys.executable, "-m", "kdacupy.compile", *argv, "--kernel", "seqpar", "--match",
                              label + " ", "--jobs", "1"], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        assert said in out.stderr.splitlines()[0] and said in out.stderr.splitlines()[-1]
        assert ("target=sm_100" in out.stdout) == ("--cc" in argv)

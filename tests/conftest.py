"""Markers and skips for the whole suite, in one place.

Tests are grouped by area (numerics, emulate, compile, gpu, cli, dist).
Every test under tests/gpu/ is marked ``gpu`` and every test under
tests/emulate/ ``emulate``; a test elsewhere that needs one of these resources
carries the marker itself. A marked test is skipped, with the reason, where its
resource is missing; select areas with ``-m``, e.g. ``pytest -m "not emulate"``.

A point of a matrix beyond the sample the default run takes is marked ``sweep`` (tests/sweeps.py) and
deselected unless ``--sweeps`` is given; CI runs the default suite, then ``-m sweep --sweeps``.
"""
from functools import lru_cache
from pathlib import Path

import pytest

from . import isolation
from .isolation import pytest_configure_node, pytest_runtest_protocol  # noqa: F401  (emulated modules forked)

MARKERS = {
    "gpu": "needs a CUDA GPU (benchmarks/device_check.sh runs these on one)",
    "emulate": "needs a host C++17 compiler (g++, clang++ or $CXX) for the CPU emulation of the kernels",
    "nvrtc": "needs NVRTC (pip's cuda-toolkit[nvrtc]); no GPU or driver",
    "torch": "needs PyTorch for kdacupy.torch (pip install 'kdacupy[torch]'; the tests' CPU build: '[test-frameworks]')",
    "jax": "needs JAX with jax.experimental.buffer_callback for kdacupy.jax (pip install 'kdacupy[jax]')",
    "fla": "needs fla-core 0.6.0 (and its Triton) for the kdacupy.compat.fla checks (pip install '.[test-frameworks]')",
}
#: not a resource: a point of a matrix beyond the default run's sample (tests/sweeps.py)
SWEEP = ("a point of a test matrix beyond the sample the default run takes, or a larger form of a default test's "
         "check; run with --sweeps (CI does)")
AREAS = {"gpu": "gpu", "emulate": "emulate"}  # directory -> the marker all its tests carry


@lru_cache(maxsize=None)
def missing(marker: str):
    """Why the resource of ``marker`` is missing here, or None when it is present."""
    try:
        if marker == "gpu":
            from kdacupy.jit.device import why_no_gpu
            return why_no_gpu()  # in plain words, e.g. "no CUDA GPU (no NVIDIA driver found)"
        elif marker == "emulate":
            from kdacupy.emulate import find_compiler
            find_compiler()
        elif marker == "nvrtc":
            from kdacupy.jit.nvrtc import _nvrtc
            _nvrtc()
        elif marker == "torch":
            import torch  # noqa: F401
        elif marker == "jax":
            from jax.experimental.buffer_callback import buffer_callback  # noqa: F401
        elif marker == "fla":
            import importlib.metadata
            if (version := importlib.metadata.version("fla-core")) != "0.6.0":
                return f"fla-core {version} installed"
            import importlib.util
            if importlib.util.find_spec("fla") is None:
                return "fla is not importable"
            # fla.ops.kda itself (seconds of Triton decorators) is imported by the tests that use it,
            # through pytest.importorskip: not here, where every pytest-xdist worker would pay it
    except Exception as e:  # noqa: BLE001  (no CuPy, no driver, no compiler, no library)
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def pytest_addoption(parser):
    isolation.pytest_addoption(parser)
    parser.addoption("--sweeps", action="store_true",
                     help="also run the points of the test matrices marked `sweep` (tests/sweeps.py); the default "
                          "run deselects them, CI runs them with `-m sweep --sweeps`")


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line("markers", f"sweep: {SWEEP}")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--sweeps"):
        swept = [i for i in items if i.get_closest_marker("sweep")]
        if swept:
            config.hook.pytest_deselected(items=swept)
            items[:] = [i for i in items if not i.get_closest_marker("sweep")]
    for item in items:
        area = Path(str(item.fspath)).parent.name
        if area in AREAS:
            item.add_marker(AREAS[area])
        for name, what in MARKERS.items():
            if item.get_closest_marker(name) and (why := missing(name)):
                item.add_marker(pytest.mark.skip(reason=f"{what}; here: {why}"))

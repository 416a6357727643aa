"""A memory error in an emulated kernel fails one test, not the suite (tests/isolation.py):
a planted probe kernel that stores far outside its array (to page zero: a SIGSEGV without
the checks) runs in a small suite between two passing tests; pytest reports it as that
test's failure, names the signal, and runs the tests after it. In the pytest process
(``--emulate-in-process``) the same bug ends the run with no summary."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdacupy.jit.device import why_no_gpu

ROOT = Path(__file__).resolve().parents[2]

PROBE = '''
import numpy as np
from kdacupy.emulate import EmulatedModule

SOURCE = 'extern "C" __global__ void wild_store(float* y, long long off) { y[off + threadIdx.x] = 1.f; }'


def test_before():
    pass


def test_out_of_bounds_store():
    fn = EmulatedModule(SOURCE, ["wild_store"]).get_function("wild_store")
    y = np.zeros(32, np.float32)
    fn((1,), (32,), (y, np.int64(16 // 4 - y.ctypes.data // 4)))  # y + off = address 16


def test_after():
    pass
'''

PIDS = """
import os
import kdacupy.emulate  # noqa: F401  (a module of the emulation's: its tests run in a forked child)


def record():
    with open(os.environ["KDA_TEST_PIDS"], "a") as f:
        f.write(f"{__name__} {os.getpid()} {os.getppid()}\\n")


def test_one():
    record()


def test_two():
    record()


def test_three():
    record()
"""


def run_suite(tmp_path, *flags, modules=("test_probe.py",), others=()):
    """pytest on the probe written as each of ``modules`` and PIDS as each of ``others`` (its log: pids.txt)."""
    for name in modules:
        (tmp_path / name).write_text(PROBE)
    for name in others:
        (tmp_path / name).write_text(PIDS)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.isolation", "-p", "no:cacheprovider",
           "--rootdir", str(tmp_path), *(str(tmp_path / name) for name in (*modules, *others)), *flags]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KDACUPY_EMULATE_CHECK": "", "KDA_TEST_PIDS": str(tmp_path / "pids.txt")})


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.skipif(why_no_gpu() is None, reason="a usable GPU here: emulated modules run in process (CUDA does not "
                                                 "survive a fork; tests/isolation.py)")
def test_a_crashing_emulated_kernel_fails_its_test_and_the_suite_goes_on(tmp_path):
    r = run_suite(tmp_path, "-rf")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 failed, 2 passed" in out, out
    assert "FAILED" in out and "test_out_of_bounds_store" in out and "SIGSEGV" in out, out
    assert "KDACUPY_EMULATE_CHECK=memcheck" in out  # the report says how to see what and where


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.skipif(why_no_gpu() is None, reason="a usable GPU here: emulated modules run in process")
def test_under_xdist_a_crash_fails_one_test_and_the_worker_goes_on(tmp_path):
    """The README's `-n auto --dist loadfile`: without the child, xdist would hand the crashing
    test to a new worker again and again and never run the tests after it. And one child runs a whole
    module: xdist sets each worker's own --dist to "no", and the worker learns the by-file schedule from
    the controller (pytest_configure_node), so a module's tests share one child and what it loaded."""
    pytest.importorskip("xdist", reason="pytest-xdist is in the [test] extra")
    r = run_suite(tmp_path, "-rf", "-n", "2", "--dist", "loadfile", modules=("test_probe.py", "test_probe_2.py"),
                  others=("test_a.py", "test_b.py"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "2 failed, 10 passed" in out and "crashed" not in out, out
    assert out.count("SIGSEGV") >= 2 and "test_probe_2.py::test_out_of_bounds_store" in out, out
    rows = [line.split() for line in (tmp_path / "pids.txt").read_text().splitlines()]
    by_module = {m: {(pid, parent) for mm, pid, parent in rows if mm == m} for m in ("test_a", "test_b")}
    assert len(rows) == 6 and all(len(pids) == 1 for pids in by_module.values()), by_module  # a child a module


def test_in_process_the_same_bug_ends_the_run_without_a_summary(tmp_path):
    r = run_suite(tmp_path, "--emulate-in-process")
    assert r.returncode < 0 or r.returncode >= 128, r.stdout + r.stderr  # killed by a signal
    assert "passed" not in r.stdout

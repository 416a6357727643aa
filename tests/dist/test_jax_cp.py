"""Context parallelism in JAX: kdacupy.jax.kda_cp inside jax.shard_map on a 4-device CPU mesh
(tests/dist/jax_worker.py, in its own process: the device-count flag must be set before JAX
starts, and must not touch the other tests), forward and gradients against the single-process
calls, a 2-D mesh, kdacupy.jax.kda on batch shards under grad, and failures injected on one
device raising in seconds. Killed, as a failure, when it outlasts its time limit; skipped
without JAX's buffer callbacks."""
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MARKERS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.jax


def test_kda_cp_on_a_four_device_mesh():
    if importlib.util.find_spec("jax") is None:  # (the worker imports it; this process need not)
        pytest.skip(MARKERS["jax"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "dist" / "jax_worker.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"jax_worker.py did not finish in 120 s (a hang):\n{out[-4000:]}\n{err[-3000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith(("ok:", "FAIL:"))]
    assert len(lines) == 4 + 4 and all(ln.startswith("ok:") for ln in lines), out[-6000:] + err[-3000:]
    assert proc.returncode == 0, out[-3000:] + err[-3000:]

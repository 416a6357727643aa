"""The torch examples under examples/ run: the KDA layer trains (the loss falls over a few
steps on the CPU backends, gradients through kdacupy.kda_backward), and the serving loop with
FLA's names (prefill into a pool, decode, speculative verify) gives what one chunk_kda pass over
each request's accepted tokens gives. (The JAX layer's test is in test_jax.py, whose module
runs in a forked child.)"""
import importlib.util
from pathlib import Path

import pytest

from tests.conftest import MARKERS
from tests.frameworks.common import one_thread

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def load(name):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.torch
def test_torch_layer_trains():
    pytest.importorskip("torch", reason=MARKERS["torch"])
    losses = load("torch_kda_layer").train(steps=4)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


@pytest.mark.torch
def test_serving_loop_matches_one_pass():
    pytest.importorskip("torch", reason=MARKERS["torch"])
    err_o, err_s = load("serving_loop").run(seed=1)
    assert err_o < 1e-6 and err_s < 1e-6  # float32 results; the pool is float32 between steps


@pytest.mark.torch
def test_context_parallel_training_matches_one_process():
    """examples/torch_cp_training.py: a few Adam steps of the KDA layer on one sequence sharded
    over 3 gloo processes, every step's loss equal to the single-process run's (float64, to
    1e-10). In a process of its own (it forks the three), killed as a failure if it hangs."""
    import os
    import signal
    import subprocess
    import sys

    pytest.importorskip("torch", reason=MARKERS["torch"])
    root = EXAMPLES.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "torch_cp_training.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=root, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torch_cp_training.py did not finish in 120 s:\n{out}\n{err[-3000:]}")
    assert proc.returncode == 0 and out.count(" on 3 processes, ") == 3, out + err[-3000:]
    assert float(out.split("largest relative difference ")[1].split()[0]) < 1e-10, out

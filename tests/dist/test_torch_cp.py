"""Context parallelism on torch.distributed: three gloo processes (tests/dist/gloo_worker.py,
one launch) run kdacupy.distributed's calls on the process group, kdacupy.torch.kda_cp's
autograd against the single-process kdacupy.torch.kda, kdacupy.compat.fla.chunk_kda with FLA's
cp_context (contiguous, and zigzag from FLA's own build_cp_context) against chunk_kda on the whole stream, and fault injection through kda_cp;
uncaught, an injected failure ends every process with the same error. The launch is killed,
as a failure, when it outlasts its time limit. Skipped without torch."""
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MARKERS


ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.torch


def test_kda_cp_on_three_gloo_processes(tmp_path):
    if importlib.util.find_spec("torch") is None:  # (the worker imports it; this process need not)
        pytest.skip(MARKERS["torch"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "dist" / "gloo_worker.py"), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"gloo_worker.py did not finish in 120 s (a hang):\n{out[-4000:]}\n{err[-3000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith(("ok:", "FAIL:"))]
    assert len(lines) == 9 + 4 and all(ln.startswith("ok:") for ln in lines), out[-6000:] + err[-3000:]
    assert "scenarios done on 3 gloo processes" in out and "exit codes [1, 1, 1]" in out, out + err[-3000:]
    assert proc.returncode == 0 and "returned normally" not in out, out
    for r in range(3):
        assert (tmp_path / f"rank{r}.err").read_text() == (
            "ContextParallelError: kda_backward_cp: rank 1 failed computing its state maps and adjoints: "
            "LinAlgError: injected: uncaught\n"), r


def test_fla_cp_context_refuses_what_fla_refuses():
    """chunk_kda with FLA's cp_context: FLA's asserts, with its messages, before any collective:
    no initial state, no final state, cu_seqlens from the context."""
    import types

    torch = pytest.importorskip("torch", reason=MARKERS["torch"])
    from kdacupy.compat.fla import _check_beta, _options
    from kdacupy.compat.fla_cp import cp_call

    ctx = types.SimpleNamespace(group=None, cu_seqlens=torch.tensor([0, 4], dtype=torch.int32), pre_num_ranks=0)
    q = torch.zeros(1, 4, 1, 64)
    mapping = dict(options=_options, check_beta=_check_beta)
    with pytest.raises(AssertionError, match="^Initial state is not supported for CP$"):
        cp_call(ctx, q, torch.zeros(1, 1, 64, 64), False, False, False, **mapping)
    with pytest.raises(AssertionError, match="^Output final state is not supported for CP$"):
        cp_call(ctx, q, None, True, False, False, **mapping)
    with pytest.raises(AssertionError, match="^cu_seqlens is required for CP$"):
        cp_call(types.SimpleNamespace(group=None, cu_seqlens=None), q, None, False, False, False, **mapping)
    cu, forward = cp_call(ctx, q, None, False, False, False, **mapping)
    assert cu is ctx.cu_seqlens and callable(forward)

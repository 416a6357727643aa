"""Context parallelism (kdacupy.distributed): the piece plan, a one-rank call,
and real multi-process runs under ``mpiexec`` (2, 3 and 4 ranks; fixed and
varlen; uneven slices with a one-token and an empty rank; model, emulate and
the float64 reference) against the single-process forward and the reference.
The MPI runs skip when mpi4py or mpiexec is missing (``pip install ".[distributed]"``)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kdacupy
from kdacupy.distributed import kda_forward_cp
from kdacupy.distributed.plan import plan_fixed, plan_varlen, start_state_sources

from ..inputs import make_inputs

ROOT = Path(__file__).resolve().parents[2]


def test_plan_cuts_sequences_at_rank_boundaries():
    cu = np.array([0, 7, 7, 97, 100, 100, 141])  # a zero-length sequence and one spanning ranks
    plans = plan_varlen(cu, [1, 0, 60, 80])
    assert [p.begin for p in plans] == [0, 1, 1, 61] and plans[-1].end == 141
    assert plans[1].pieces == () and plans[1].carry == ()
    (p0,) = plans[0].pieces
    assert (p0.seq, p0.lo, p0.hi, p0.starts, p0.ends) == (0, 0, 1, True, False)
    assert plans[0].carry == (0,)
    assert [(p.seq, p.lo, p.hi, p.starts, p.ends) for p in plans[2].pieces] == [
        (0, 0, 6, False, True), (2, 6, 60, True, False)]
    assert plans[2].carry == (2,)
    assert [(p.seq, p.lo, p.hi, p.starts, p.ends) for p in plans[3].pieces] == [
        (2, 0, 36, False, True), (3, 36, 39, True, True), (5, 39, 80, True, True)]
    assert plans[3].local_cu_seqlens.tolist() == [0, 36, 39, 80]
    # every token of every sequence is in exactly one piece
    for n in range(len(cu) - 1):
        held = sum(p.hi - p.lo for pl in plans for p in pl.pieces if p.seq == n)
        assert held == cu[n + 1] - cu[n]


def test_plan_a_sequence_over_several_whole_ranks():
    plans = plan_varlen(np.array([0, 5, 95]), [10, 30, 30, 25])
    assert [pl.carry for pl in plans] == [(1,), (1,), (1,), ()]
    assert start_state_sources(plans, 3) == {1: [(0, 0), (1, 0), (2, 0)]}
    assert start_state_sources(plans, 0) == {}


def test_plan_fixed_length():
    plans = plan_fixed(2, [0, 5, 9])
    assert plans[0].pieces == () and plans[1].carry == (0, 1) and plans[2].carry == ()
    assert all(p.starts and not p.ends for p in plans[1].pieces)
    assert start_state_sources(plans, 2) == {0: [(1, 0)], 1: [(1, 1)]}


def _mpi():
    return pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed (pip install '.[distributed]')")


def test_one_rank_is_the_plain_forward():
    MPI = _mpi()
    x, opts = make_inputs(cu_seqlens=[20, 0, 35], H=2, K=64, V=64, state=np.float32, seed=5)
    o, s = kda_forward_cp(**x, comm=MPI.COMM_SELF, output_final_state=True, backend="model", **opts)
    o1, s1 = kdacupy.kda_forward(**x, output_final_state=True, backend="model", **opts)
    np.testing.assert_array_equal(o, o1)
    np.testing.assert_array_equal(s, s1)


def test_comm_of_the_wrong_kind_is_refused():
    x, opts = make_inputs(T=16, H=1, K=64, V=64)
    with pytest.raises(TypeError, match="comm: expected an mpi4py communicator"):
        kda_forward_cp(**x, comm=object(), **opts)


def _mpiexec():
    _mpi()
    exe = shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                         os.environ.get("PATH", "")]))
    if exe is None:
        pytest.skip("mpiexec not found (pip install '.[distributed]' brings MPICH)")
    return exe


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_context_parallel_under_mpiexec(ranks):
    exe = _mpiexec()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([exe, "-n", str(ranks), sys.executable, str(ROOT / "tests" / "dist" / "cp_worker.py")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("ok:", "FAIL:"))]
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert len(lines) >= 12 and all(ln.startswith("ok:") for ln in lines), res.stdout


def test_a_state_pool_is_refused():
    MPI = _mpi()
    x, opts = make_inputs(T=16, H=1, K=64, V=64)
    pool = np.zeros((2, 1, 64, 64), np.float32)
    with pytest.raises(TypeError, match="kda_forward_cp: rank 0: state_(indices|pool): not supported by kda_forward_cp"):
        kda_forward_cp(**x, comm=MPI.COMM_SELF, state_pool=pool, state_indices=np.array([0]), **opts)

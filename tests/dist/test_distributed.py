"""Context parallelism (kdacupy.distributed): the piece plan, one-rank calls, and real
multi-process runs under ``mpiexec`` (3 ranks: fixed and varlen; uneven slices with a
one-token and an empty rank, even ones with a rank wholly inside a sequence; model, emulate
and the float64 reference) of the forward and the backward against the single-process calls;
a rank failing with an unexpected exception makes every rank raise, never hang. One mpiexec
launch runs every MPI check (tests/dist/cp_worker.py); the MPI runs skip when mpi4py or
mpiexec is missing (``pip install ".[distributed]"``) and are killed, as a failure, when they
outlast their time limit."""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kdacupy
from kdacupy.distributed import kda_backward_cp, kda_forward_cp
from kdacupy.distributed.plan import end_gradient_sources, plan_fixed, plan_varlen, start_state_sources

from ..inputs import make_inputs
from .cases import BACKWARD_CASES, CASES, RANKS, case_tokens, cuts_for
from .faults import SCENARIOS

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


def test_the_forward_options_pass_to_the_local_forward():
    """kda_forward's keywords that the validation of the slice does not take (sequence_parallel)
    reach the local forward."""
    MPI = _mpi()
    x, opts = make_inputs(T=40, H=1, K=64, V=64)
    o, _ = kda_forward_cp(**x, comm=MPI.COMM_SELF, backend="model", sequence_parallel=2, **opts)
    o1, _ = kdacupy.kda_forward(**x, backend="model", sequence_parallel=2, **opts)
    np.testing.assert_array_equal(o, o1)


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


def run_mpi(ranks, script, timeout, *args):
    """``mpiexec -n ranks python script`` in its own process group, killed whole (every
    rank) when it outlasts ``timeout`` seconds: a hang fails the test instead of CI."""
    exe = _mpiexec()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([exe, "-n", str(ranks), sys.executable, str(ROOT / "tests" / "dist" / script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{script} under mpiexec -n {ranks} did not finish in {timeout} s (a hang):\n"
                    f"{out[-4000:]}\n{err[-3000:]}")
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def mpi_run(tmp_path_factory):
    """One mpiexec launch of every MPI check: (rc, stdout, stderr, the ranks' error files)."""
    out = tmp_path_factory.mktemp("ranks")
    return (*run_mpi(RANKS, "cp_worker.py", 240, str(out)), out)


def _lines(out, prefix=""):
    return [ln for ln in out.splitlines()
            if ln.startswith(("ok:", "FAIL:")) and ln.split(": ", 1)[1].startswith(prefix)]


def test_context_parallel_under_mpiexec(mpi_run):
    """Forward and backward cases, and the collective input errors, on 3 ranks."""
    rc, out, err, _ = mpi_run
    lines = [ln for ln in _lines(out) if not ln.split(": ", 1)[1].startswith("fault:")]
    assert len(lines) == len(CASES) + len(BACKWARD_CASES) + 5 and all(ln.startswith("ok:") for ln in lines), \
        out[-6000:] + err[-3000:]


def test_a_failing_rank_makes_every_rank_raise(mpi_run):
    """Before the first collective, between collectives and after the last one's input, one
    rank (or two) raises an exception no validation expects, in the forward and in the
    backward: every rank raises the same ContextParallelError naming it, and the next call
    works; uncaught, every rank exits with an error."""
    rc, out, err, ranks_dir = mpi_run
    lines = _lines(out, "fault:")
    assert len(lines) == len(SCENARIOS) and all(ln.startswith("ok:") for ln in lines), out + err[-3000:]
    assert "scenarios done on 3 ranks" in out, out + err[-3000:]
    assert rc != 0 and "returned normally" not in out, out
    for r in range(3):
        assert (ranks_dir / f"rank{r}.err").read_text() == (
            "ContextParallelError: kda_forward_cp: rank 1 failed computing its state maps: "
            "LinAlgError: injected: uncaught\n"), r


@pytest.mark.parametrize("cases", [CASES, BACKWARD_CASES], ids=["forward", "backward"])
def test_the_cases_cover_every_edge_case(cases):
    """At RANKS ranks the worker's cases (the forward's, and the backward's on their own) still
    hold every situation of the piece plan that more ranks would: an empty rank and a
    one-token rank; for fixed-length and for varlen input a rank wholly inside a sequence, a
    start state built from two ranks' maps and an end-of-slice gradient from two ranks'
    adjoints; a rank whose first piece ends a sequence and whose last one is carried on."""
    seen = set()
    for _, inputs, _, style, _, _ in cases:
        T, cu = case_tokens(inputs)
        c = cuts_for(T, style, RANKS)
        tokens = np.diff(c).tolist()
        kind = "fixed" if cu is None else "varlen"
        plans = plan_fixed(inputs.get("B", 1), tokens) if cu is None else plan_varlen(cu, tokens)
        for r, pl in enumerate(plans):
            seen |= {"empty rank"} if tokens[r] == 0 else set()
            seen |= {"one-token rank"} if tokens[r] == 1 else set()
            if any(not p.starts and not p.ends for p in pl.pieces):
                seen.add(f"{kind}: a rank inside a sequence")
            if any(len(src) >= 2 for src in start_state_sources(plans, r).values()):
                seen.add(f"{kind}: two ranks' maps")
            if any(len(src) >= 2 for src in end_gradient_sources(plans, r, cu is None).values()):
                seen.add(f"{kind}: two ranks' adjoints")
            if len(pl.pieces) >= 2 and not pl.pieces[0].starts and pl.carry:
                seen.add(f"{kind}: ends one, carries another")
    want = {"empty rank", "one-token rank", "fixed: a rank inside a sequence", "fixed: two ranks' maps",
            "varlen: a rank inside a sequence", "varlen: two ranks' maps", "varlen: ends one, carries another",
            "fixed: two ranks' adjoints", "varlen: two ranks' adjoints"}
    assert want <= seen, want - seen


def test_plan_end_gradient_sources():
    """The gradient at a carried piece's end chains the later ranks' adjoints up to the rank
    holding the sequence's end (rows: the sequence for fixed-length input, else 0)."""
    plans = plan_varlen(np.array([0, 5, 95]), [10, 30, 30, 25])
    assert end_gradient_sources(plans, 0, False) == {1: [(1, 0), (2, 0), (3, 0)]}
    assert end_gradient_sources(plans, 2, False) == {1: [(3, 0)]}
    assert end_gradient_sources(plans, 3, False) == {}
    fixed = plan_fixed(2, [4, 0, 5, 3])
    assert end_gradient_sources(fixed, 0, True) == {0: [(2, 0), (3, 0)], 1: [(2, 1), (3, 1)]}


def test_one_rank_backward_is_the_plain_backward():
    """One rank runs the whole path (plan, adjoints, scan, local backward, shares): it is
    kda_backward, bit for bit, in both shared-gradient modes."""
    MPI = _mpi()
    x, opts = make_inputs(cu_seqlens=[20, 0, 35], H=1, HV=2, K=64, V=64, state=np.float32, seed=5)
    rng = np.random.default_rng(1)
    do = rng.standard_normal(x["v"].shape).astype(x["v"].dtype)
    ds = rng.standard_normal(opts["initial_state"].shape).astype(np.float32)
    ref = kdacupy.kda_backward(do, **x, dfinal_state=ds, backend="model", **opts)
    for mode in ("total", "local"):
        g = kda_backward_cp(do, **x, comm=MPI.COMM_SELF, dfinal_state=ds, backend="model", shared_grads=mode, **opts)
        for a, b in zip(g, ref):
            np.testing.assert_array_equal(a, b)


def test_nccl_with_host_arrays_is_refused_through_the_ranks(monkeypatch):
    """NCCL moves device memory only: NumPy arrays with an NCCL communicator are refused
    after the ranks agree (a rank raising on its own would leave the others waiting)."""
    import pickle

    from kdacupy.distributed import comm as comm_mod

    class NcclCommunicator:  # what kdacupy recognises CuPy's NCCL communicator by
        pass

    NcclCommunicator.__module__ = "cupy.cuda.nccl"

    class OneRank(comm_mod._Engine):  # the engine NCCL would give, on the host, for one rank
        requires_device, rank, size = True, 0, 1
        gathered = []

        def __init__(self, comm):
            pass

        def _allgather_host_bytes(self, buf):
            self.gathered.append(buf.size)
            return buf[None]

    monkeypatch.setattr(comm_mod, "NcclComm", OneRank)
    x, opts = make_inputs(T=16, H=1, K=64, V=64)
    with pytest.raises(TypeError, match=r"kda_forward_cp: rank 0: comm: expected an mpi4py communicator for "
                                        r"NumPy arrays \(NCCL moves device memory only\)"):
        kda_forward_cp(**x, comm=NcclCommunicator(), **opts)
    assert OneRank.gathered == [1 << 16]  # the refusal went through the collective check
    assert pickle.dumps(None)  # (the engine's host path needs nothing else)


def test_a_state_pool_is_refused():
    MPI = _mpi()
    x, opts = make_inputs(T=16, H=1, K=64, V=64)
    pool = np.zeros((2, 1, 64, 64), np.float32)
    with pytest.raises(TypeError, match="kda_forward_cp: rank 0: state_(indices|pool): not supported by kda_forward_cp"):
        kda_forward_cp(**x, comm=MPI.COMM_SELF, state_pool=pool, state_indices=np.array([0]), **opts)


def test_state_dtype_without_output_final_state_is_refused():
    MPI = _mpi()
    x, opts = make_inputs(T=16, H=1, K=64, V=64)
    with pytest.raises(ValueError, match=r"kda_forward_cp: rank 0: state_dtype: expected None without "
                                         r"output_final_state=True"):
        kda_forward_cp(**x, comm=MPI.COMM_SELF, state_dtype=np.float32, **opts)
    o, s = kda_forward_cp(**x, comm=MPI.COMM_SELF, state_dtype=np.float32, output_final_state=True,
                          backend="model", **opts)
    assert s.dtype == np.float32

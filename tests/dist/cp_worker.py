"""Run under ``mpiexec -n R``: every context-parallel case on this rank (the forward's and the
backward's, tests/dist/cases.py), checked against the single-process calls computed here from
the same seeded inputs; the collective input errors; the fault injections of
tests/dist/faults.py. Prints one line per case on rank 0 (failures are gathered, so no rank
hangs). Then, not caught, an injected failure on rank 1 must end every rank with an error
(non-zero exit status; each rank's message also goes to ``<argv[1]>/rank<r>.err``, as the
ranks' stderr streams interleave) instead of waiting for the failed one.

One launch for every check: mpiexec and the ranks' imports are most of the cost."""
import faulthandler
import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from kdacupy.distributed import kda_forward_cp  # noqa: E402
from tests.dist import faults  # noqa: E402
from tests.dist.cases import BACKWARD_CASES, CASES  # noqa: E402
from tests.dist.checks import backward_case, forward_case  # noqa: E402
from tests.dist.gather import run_everywhere  # noqa: E402
from tests.inputs import make_inputs  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, RANKS = COMM.rank, COMM.size


class Ranks:
    rank, size = RANK, RANKS

    @staticmethod
    def allgather(obj):
        return COMM.allgather(obj)


def expect_collective_error(make_call, needle):
    try:
        make_call()
    except (ValueError, TypeError) as e:
        msgs = COMM.allgather(f"{type(e).__name__}: {e}")
        assert all(m == msgs[0] for m in msgs), f"ranks raised different errors: {msgs}"
        assert needle in msgs[0], msgs[0]
        return
    COMM.allgather("no error")
    raise AssertionError("no error raised")


def error_cases():
    x, opts = make_inputs(T=40, H=2, K=64, V=64, seed=3)
    sl = slice(RANK * 40 // RANKS, (RANK + 1) * 40 // RANKS)
    local = {n: a[:, sl] for n, a in x.items()}
    scale = 0.1 if RANK == RANKS - 1 else 0.2
    yield "mismatched scale", lambda: kda_forward_cp(**local, comm=COMM, **opts, scale=scale, backend="model"), \
        "disagree on scale"
    bad = dict(local)
    if RANK == RANKS - 1:
        bad["g"] = bad["g"][..., :32]
    yield "bad g on the last rank", lambda: kda_forward_cp(**bad, comm=COMM, **opts, backend="model"), \
        f"rank {RANKS - 1}: g: expected shape"
    xv, ov = make_inputs(cu_seqlens=[10, 30], H=2, K=64, V=64, seed=4)
    cu = ov.pop("cu_seqlens")
    cu_bad = cu.copy()
    cu_bad[-1] += 1
    lv = {n: a[:, sl] for n, a in xv.items()}
    yield "cu_seqlens longer than the tokens", lambda: kda_forward_cp(
        **lv, comm=COMM, cu_seqlens=cu_bad, **ov, backend="model"), "cu_seqlens: expected last value 40"
    yield "unknown keyword", lambda: kda_forward_cp(**local, comm=COMM, **opts, use_qk_l2norm_in_kernel=True), \
        "unexpected keyword 'use_qk_l2norm_in_kernel'"
    from kdacupy.distributed import kda_backward_cp
    ds = np.zeros((1, 2, 64, 64), np.float32) + (RANK == 1)  # "total": the same on every rank, and it is not
    do = np.ones(local["v"].shape, local["v"].dtype)
    yield "backward: different dfinal_state on the ranks", lambda: kda_backward_cp(
        do, **local, comm=COMM, dfinal_state=ds, **opts, backend="model"), "disagree on dfinal_state"


def main():
    faulthandler.dump_traceback_later(200, exit=True)  # a hang ends every rank with its stack, before the test's kill
    only = set(sys.argv[2:])
    failed = 0
    jobs = [(c[0], lambda c=c: forward_case(Ranks, COMM, *c)) for c in CASES]
    jobs += [(c[0], lambda c=c: backward_case(Ranks, COMM, *c, repeat=c[0].startswith("bwd varlen spanning")))
             for c in BACKWARD_CASES]
    jobs += [(n, lambda f=f, s=s: expect_collective_error(f, s)) for n, f, s in error_cases()]
    for name, job in jobs:
        if not only or any(o in name for o in only):
            failed += run_everywhere(COMM, job, f"{name} ({RANKS} ranks)")
    for name, where, ranks, exc, varlen, backward, needle in faults.SCENARIOS:
        took = [float("nan")]
        fn = "kda_backward_cp" if backward else "kda_forward_cp"
        failed += run_everywhere(COMM, lambda: faults.check_scenario(Ranks, COMM, fn, where, ranks, exc, varlen,
                                                                     backward, needle, took),
                                 lambda: f"fault: {name} ({took[0]:.2f} s)")
    if RANK == 0:
        print(f"scenarios done on {RANKS} ranks", flush=True)
    if failed:
        sys.exit(1)
    uncaught(Path(sys.argv[1]) if len(sys.argv) > 1 else None)


def uncaught(out):
    def hook(kind, value, tb):
        if out is not None:
            (out / f"rank{RANK}.err").write_text(f"{kind.__name__}: {value}\n")
        sys.__excepthook__(kind, value, tb)

    sys.excepthook = hook
    if RANK == 1:
        faults.shard.state_maps = faults.failing(np.linalg.LinAlgError("injected: uncaught"))
    faults.call(Ranks, COMM, True, False)
    print(f"rank {RANK}: returned normally", flush=True)


if __name__ == "__main__":
    main()

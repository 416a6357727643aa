"""Run under ``mpiexec -n 3``: a rank of ``kda_forward_cp`` fails with an
exception no validation expects (injected by replacing one step on that rank
only), before the first collective and between collectives. Every rank must
raise the same error naming the failed rank(s), and a plain call right after
must work (the ranks stayed in step). Prints one line per scenario on rank 0.

The last scenario is not caught: every rank must end with an error (non-zero
exit status, the message on stderr) instead of waiting for the failed one.
"""
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kdacupy.distributed.cp as cp  # noqa: E402
from kdacupy.distributed import ContextParallelError, kda_forward_cp  # noqa: E402
from tests.dist.gather import run_everywhere  # noqa: E402
from tests.inputs import make_inputs  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, RANKS = COMM.rank, COMM.size


def inputs(varlen):
    """Even slices of one input; every rank but the last carries a sequence past its slice."""
    if varlen:
        x, opts = make_inputs(cu_seqlens=[5, 60, 3], H=1, K=64, V=64, seed=3)
    else:
        x, opts = make_inputs(B=2, T=48, H=1, K=64, V=64, seed=3)
    T = x["q"].shape[1]
    sl = slice(RANK * T // RANKS, (RANK + 1) * T // RANKS)
    return {n: a[:, sl] for n, a in x.items()}, opts


def failing(exc):
    def step(*args, **kwargs):
        raise exc
    return step


#: name, where (the module attribute replaced), failing ranks, the exception, varlen, output_final_state, needle
SCENARIOS = [
    ("before the first collective: validation raises MemoryError", "_Local", (1,),
     MemoryError("injected: out of host memory"), False, True, "rank 1 failed validating its input: MemoryError"),
    ("between collectives: the maps raise BufferError", "state_maps", (1,),
     BufferError("injected: buffer in use"), True, True, "rank 1 failed computing its state maps: BufferError"),
    ("between collectives: the local forward raises OSError", "_local_forward", (0,),
     OSError("injected: compile failed"), False, True, "rank 0 failed running its local forward: OSError"),
    ("after the last collective's input: the forward fails, no final state asked", "_local_forward", (2,),
     RuntimeError("injected: out of device memory"), True, False,
     "rank 2 failed running its local forward: RuntimeError"),
    ("two ranks fail", "_local_forward", (0, 2), KeyError("injected"), False, True,
     "rank 0 failed running its local forward: KeyError: 'injected'; rank 2: KeyError"),
]


def scenario(where, ranks, exc, varlen, final):
    local, opts = inputs(varlen)
    real = getattr(cp, where)
    if RANK in ranks:
        setattr(cp, where, failing(exc))
    t0 = time.perf_counter()
    try:
        kda_forward_cp(**local, comm=COMM, backend="model", output_final_state=final, **opts)
    except ContextParallelError as e:
        return f"ContextParallelError: {e}", time.perf_counter() - t0, e.__cause__ is exc
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} (expected ContextParallelError): {e}", time.perf_counter() - t0, False
    finally:
        setattr(cp, where, real)
    return "no error", time.perf_counter() - t0, False


def main():
    failed = 0
    for name, where, ranks, exc, varlen, final, needle in SCENARIOS:
        took = [float("nan")]

        def job():
            msg, took[0], chained = scenario(where, ranks, exc, varlen, final)
            msgs = COMM.allgather(msg)
            assert all(m == msgs[0] for m in msgs), f"ranks raised different errors: {msgs}"
            assert msgs[0].startswith("ContextParallelError: kda_forward_cp: ") and needle in msgs[0], msgs[0]
            assert chained == (RANK in ranks), "the failed rank's error must carry the original as its cause"
            local, opts = inputs(varlen)  # the ranks are still in step: a plain call works
            o, _ = kda_forward_cp(**local, comm=COMM, backend="model", **opts)
            assert o.shape == local["v"].shape

        failed += run_everywhere(COMM, job, lambda: f"{name} ({took[0]:.2f} s)")
    if failed:
        sys.exit(1)
    if RANK == 0:
        print(f"scenarios done on {RANKS} ranks", flush=True)
    # not caught: the injected failure on rank 1 must end every rank with an error; each
    # rank's error also goes to a file of its own (the ranks' stderr streams interleave)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None

    def hook(kind, value, tb):
        if out is not None:
            (out / f"rank{RANK}.err").write_text(f"{kind.__name__}: {value}\n")
        sys.__excepthook__(kind, value, tb)

    sys.excepthook = hook
    local, opts = inputs(True)
    if RANK == 1:
        cp.state_maps = failing(np.linalg.LinAlgError("injected: uncaught"))
    kda_forward_cp(**local, comm=COMM, backend="model", output_final_state=True, **opts)
    print(f"rank {RANK}: returned normally", flush=True)


if __name__ == "__main__":
    main()

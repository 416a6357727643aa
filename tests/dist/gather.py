"""What each mpiexec worker does per case: run it on every rank, gather every rank's
traceback (a failure never leaves a rank waiting in a collective), and print the outcome on
rank 0 with each failed rank's traceback."""
import time
import traceback


def run_everywhere(comm, job, label) -> bool:
    """Runs ``job()`` on this rank; prints ``ok: LABEL`` or ``FAIL: LABEL`` on rank 0 (``label``: the
    text, or a function giving it once the job has run). True when any rank failed."""
    err = None
    t0 = time.perf_counter()
    try:
        job()
    except Exception:  # noqa: BLE001
        err = traceback.format_exc()
    took = time.perf_counter() - t0
    errs = comm.allgather(err)
    bad = [(r, e) for r, e in enumerate(errs) if e]
    if comm.rank == 0:
        print(f"{'FAIL' if bad else 'ok'}: {label() if callable(label) else label} [{took:.2f} s]", flush=True)
        for r, e in bad:
            print(f"--- rank {r}:\n{e}", flush=True)
    return bool(bad)

"""T = 8192 on the GPU over the gate/bias sweep, fixed-length and varlen: the
full run against the float64 reference, and the same tokens cut into segments
started from the model's states, element-wise against the model (tests/longseq.py
says why both). Skipped without a GPU; benchmarks/device_check.sh runs it in a step of its own.
test_long_emulate.py rehearses the same check on the CPU under
KDACUPY_EMULATE_NUMERICS=hardware."""
import os

import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.parity import GPU

from ..longseq import check_long, single_threaded, sweep_expected

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
cp = pytest.importorskip("cupy", reason="CuPy is not installed")


def gpu_run(x, opts):
    dev = {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in {**x, **opts}.items()}
    o, s = kdacupy.kda_forward(**dev)
    return cp.asnumpy(o), cp.asnumpy(s)


LONG_T = 8192
SEQS = [1300, 547, 2048, 963, 271, 3063]


def test_long_sequences_on_the_sweep():
    """Every regime pair of the sweep, fixed-length and varlen, bf16 state; the NumPy model and
    reference of all twelve are computed in parallel (spawned processes: CUDA is initialised
    here) while this process runs the kernels; every failure is reported, not just the first."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from kdacupy.cli.accuracy import BIAS_REGIMES, G_REGIMES, OPTIONS, make_inputs
    jobs = [(gr, br, seqs) for gr, br in zip(G_REGIMES, BIAS_REGIMES) for seqs in (None, SEQS)]
    failures = []
    with ProcessPoolExecutor(min(len(jobs), os.cpu_count() or 1), mp_context=multiprocessing.get_context("spawn"),
                             initializer=single_threaded) as pool:
        futures = [pool.submit(sweep_expected, gr, br, seqs, T=LONG_T) for gr, br, seqs in jobs]
        for (gr, br, seqs), fut in zip(jobs, futures):
            x = make_inputs(LONG_T, 4, 128, 128, gr, br, seed=5)
            what = f"g={gr} bias={br} {'varlen' if seqs else 'fixed'}"
            try:
                m = check_long(gpu_run, x, dict(OPTIONS), GPU, seqs=seqs, exp=fut.result())
                print(f"{what}: {m}", flush=True)
            except AssertionError as e:
                print(f"{what}: FAILED {e}", flush=True)
                failures.append(what)
            cp.get_default_memory_pool().free_all_blocks()
    assert not failures, failures

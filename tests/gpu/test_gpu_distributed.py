"""Context parallelism on the GPU: CuPy arrays through CuPy's NCCL communicator
(one rank still runs the whole code path: plan, collectives, scan, forward)
and through mpi4py when it is installed. Skipped without a GPU."""
import numpy as np
import pytest

import kdacupy
from kdacupy.distributed import kda_forward_cp
from kdacupy.numerics.parity import GPU, mismatch

from ..inputs import make_inputs

cp = pytest.importorskip("cupy", reason="CuPy is not installed")


def _inputs():
    x, opts = make_inputs(cu_seqlens=[40, 0, 300, 17], H=2, K=128, V=128, state=np.float32, seed=7)
    cu = opts.pop("cu_seqlens")
    dev = {n: cp.asarray(a) for n, a in x.items()}
    dopts = {n: (cp.asarray(a) if isinstance(a, np.ndarray) else a) for n, a in opts.items()}
    return x, opts, dev, dopts, cu


def test_nccl_one_rank_matches_the_forward():
    nccl = pytest.importorskip("cupy.cuda.nccl", reason="CuPy was built without NCCL")
    if not getattr(nccl, "available", True):
        pytest.skip("NCCL is not available to CuPy here")
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    x, opts, dev, dopts, cu = _inputs()
    o, s = kda_forward_cp(**dev, comm=comm, cu_seqlens=cu, output_final_state=True, **dopts)
    o1, s1 = kdacupy.kda_forward(**dev, cu_seqlens=cp.asarray(cu), output_final_state=True, **dopts)
    assert isinstance(o, cp.ndarray) and isinstance(s, cp.ndarray)
    cp.testing.assert_array_equal(o, o1)
    cp.testing.assert_array_equal(s, s1)


def test_mpi_one_rank_with_device_arrays():
    MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed")
    x, opts, dev, dopts, cu = _inputs()
    o, s = kda_forward_cp(**dev, comm=MPI.COMM_SELF, cu_seqlens=cu, output_final_state=True, **dopts)
    om, sm = kdacupy.kda_forward(**x, cu_seqlens=cu, output_final_state=True, backend="model", **opts)
    for a, ref in ((o, om), (s, sm)):
        why = mismatch(cp.asnumpy(a), ref, GPU)
        assert why is None, why

"""Context parallelism on the GPU: CuPy arrays through CuPy's NCCL communicator
(one rank still runs the whole code path: plan, collectives, scan, forward, backward)
and through mpi4py when it is installed; the backward's state adjoint kernels; kdacupy.torch.kda_cp
on a one-rank torch.distributed NCCL group. Skipped without a GPU. (A GPU machine with one GPU
holds one NCCL rank: several ranks need several GPUs.)"""
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


def _backward_case():
    """A case of the GPU backward step (tests/gpu/test_gpu_backward.py): its kernels are compiled already."""
    from ..emulate.test_backward_emulate import inputs
    x, opts, do, ds = inputs("gva-sigmoid-l2norm-neg-eigval")
    dev = lambda d: {n: (cp.asarray(a) if isinstance(a, np.ndarray) else a) for n, a in d.items()}  # noqa: E731
    return dev(x), dev(opts), cp.asarray(do), cp.asarray(ds)


def _nccl_one_rank():
    nccl = pytest.importorskip("cupy.cuda.nccl", reason="CuPy was built without NCCL")
    if not getattr(nccl, "available", True):
        pytest.skip("NCCL is not available to CuPy here")
    return nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)


def test_nccl_one_rank_backward_is_the_backward():
    """One rank runs the CP backward's whole path on the GPU (plan, scan, local backward,
    shares): kda_backward's gradients bit for bit, in both shared-gradient modes, twice."""
    from kdacupy.distributed import kda_backward_cp
    comm = _nccl_one_rank()
    x, opts, do, ds = _backward_case()
    ref = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts)
    for mode in ("total", "local", "total"):
        got = kda_backward_cp(do, **x, comm=comm, dfinal_state=ds, shared_grads=mode, **opts)
        for field, a, b in zip(ref._fields, got, ref):
            assert (a is None) == (b is None), field
            if b is not None:
                cp.testing.assert_array_equal(a, b)


def test_state_adjoint_kernels_are_the_backwards_dinitial_state():
    """kda_prepare + kda_bwd_chain alone (the adjoint a rank sends) give what the whole
    backward gives as dinitial_state (fp32, "kv"), bit for bit."""
    from kdacupy.distributed.adjoint import state_adjoint
    x, opts, do, ds = _backward_case()
    assert opts.get("state_layout", "kv") == "kv"  # (the adjoint's states are "kv")
    opts = {n: a for n, a in opts.items() if n not in ("initial_state", "state_layout")}
    got = state_adjoint(do, **x, dfinal_state=ds, cu_seqlens=None, options=opts, xdtype=np.float32)
    want = kdacupy.kda_backward(do, **x, dfinal_state=ds, initial_state=cp.zeros_like(ds), **opts)
    cp.testing.assert_array_equal(got, want.dinitial_state)


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch without CUDA or NCCL")
    return torch


@pytest.fixture
def torch_nccl_group(tmp_path):
    """A one-rank torch.distributed NCCL process group in this process (destroyed after)."""
    torch = _torch_cuda()
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            device_id=torch.device("cuda", torch.cuda.current_device()))
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_torch_nccl_kda_cp_is_kda(torch_nccl_group):
    """kdacupy.torch.kda_cp on a one-rank NCCL group (CUDA tensors, the collectives on the
    group's NCCL, kdacupy on torch's stream): kda's output, final state and every gradient,
    bit for bit."""
    import torch

    import kdacupy.torch as kt
    x, opts, do, ds = _backward_case()
    tens = {n: torch.from_dlpack(a) for n, a in x.items()}
    params = {n: torch.from_dlpack(opts[n]) for n in ("initial_state", "A_log", "dt_bias") if n in opts}
    static = {n: v for n, v in opts.items() if n not in params}
    results = []
    for fn, extra in ((kt.kda, {}), (kt.kda_cp, dict(group=torch_nccl_group))):
        leaves = {n: t.clone().requires_grad_() for n, t in {**tens, **params}.items()}
        o, s = fn(*(leaves[n] for n in ("q", "k", "v", "g", "beta")), output_final_state=True,
                  **{n: leaves[n] for n in params}, **static, **extra)
        ((o.float() * torch.from_dlpack(do).float()).sum() + (s * torch.from_dlpack(ds)).sum()).backward()
        results.append([o.detach(), s.detach()] + [leaves[n].grad for n in leaves])
    for a, b in zip(*results):
        assert torch.equal(a, b)

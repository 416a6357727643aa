"""The framework faces on a GPU (skipped without one; benchmarks/device_check.sh runs them):
torch's current stream and JAX's XLA stream carry kdacupy's kernels, inputs and outputs are
shared, not copied, nothing synchronises the host, a call captures into torch.cuda.graph, the
ops compile with inductor, and kdacupy.compat.fla against fla-core's own Triton kernels."""
import os

import numpy as np
import pytest

from tests.conftest import MARKERS

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX takes memory as it needs it

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="CuPy is not installed")

import kdacupy  # noqa: E402


def _torch():
    torch = pytest.importorskip("torch", reason=MARKERS["torch"])
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA (the CPU build)")
    return torch


def _jax():
    jax = pytest.importorskip("jax", reason=MARKERS["jax"])
    pytest.importorskip("jax.experimental.buffer_callback", reason=MARKERS["jax"])
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax without a GPU backend")
    return jax


def torch_inputs(torch, B=1, T=300, H=2, HV=4, D=128, dtype=None, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = dtype or torch.bfloat16
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q, k = rnd(B, T, H, D).to(dtype), rnd(B, T, H, D).to(dtype)
    v = rnd(B, T, HV, D).to(dtype)
    g = rnd(B, T, HV, D)
    beta = rnd(B, T, HV)
    opts = dict(gate="sigmoid", lower_bound=-5.0, A_log=rnd(HV) * 0.1, dt_bias=rnd(HV * D),
                beta_sigmoid=True, qk_l2norm=True)
    return [q, k, v, g, beta], opts


def spy(monkeypatch, name):
    """Records the current CuPy stream and the arrays of each call of kdacupy.<name>."""
    calls, real = [], getattr(kdacupy, name)

    def wrapper(*args, **kwargs):
        calls.append(dict(stream=cp.cuda.get_current_stream().ptr, args=args, kwargs=kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(kdacupy, name, wrapper)
    return calls


def test_torch_forward_on_torch_stream_zero_copy_no_sync(monkeypatch):
    torch = _torch()
    import cupyx
    import kdacupy.torch as kt
    x, opts = torch_inputs(torch)
    ref, ref_s = kdacupy.kda_forward(*(cp.from_dlpack(t) for t in x), output_final_state=True,
                                     **{n: cp.from_dlpack(v) if isinstance(v, torch.Tensor) else v
                                        for n, v in opts.items()})
    kt.kda(*x, output_final_state=True, **opts)  # warm: compiles the kernels
    calls = spy(monkeypatch, "kda_forward")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side), cupyx.allow_synchronize(False):
            o, s = kt.kda(*x, output_final_state=True, **opts)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side.synchronize()
    call = calls[-1]
    assert call["stream"] == side.cuda_stream  # kdacupy ran on torch's current stream
    assert call["args"][0].data.ptr == x[0].data_ptr()  # q read in place
    assert call["kwargs"]["out"].data.ptr == o.data_ptr()  # o written in place, from torch's allocator
    assert torch.equal(o, torch.from_dlpack(ref)) and torch.equal(s, torch.from_dlpack(ref_s))


def test_torch_forward_captures_into_a_cuda_graph():
    torch = _torch()
    import kdacupy.torch as kt
    x, opts = torch_inputs(torch, B=1, T=200)
    cu = torch.tensor([0, 50, 50, 200], device="cuda", dtype=torch.int32)
    static = [t.clone() for t in x]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kt.kda(*static, cu_seqlens=cu, output_final_state=True, **opts)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):  # the warm-up's stream: its workspace and CuPy's cached blocks
        o, s = kt.kda(*static, cu_seqlens=cu, output_final_state=True, **opts)
    fresh, _ = torch_inputs(torch, B=1, T=200, seed=1)
    for a, b in zip(static, fresh):
        a.copy_(b)
    graph.replay()
    torch.cuda.synchronize()
    ref_o, ref_s = kt.kda(*fresh, cu_seqlens=cu, output_final_state=True, **opts)
    assert torch.equal(o, ref_o) and torch.equal(s, ref_s)


def test_torch_decode_and_compile_with_inductor():
    torch = _torch()
    import kdacupy.torch as kt
    x, opts = torch_inputs(torch, B=8, T=1)
    pool = torch.randn(16, 4, 128, 128, device="cuda")
    ref_pool = cp.from_dlpack(pool.clone())
    idx = torch.arange(8, device="cuda", dtype=torch.int32) * 2
    ref = kdacupy.kda_decode(*(cp.from_dlpack(t) for t in x), state_pool=ref_pool, state_indices=cp.from_dlpack(idx),
                             **{n: cp.from_dlpack(v) if isinstance(v, torch.Tensor) else v for n, v in opts.items()})
    step = torch.compile(lambda p, *a: kt.kda_decode(*a, state_pool=p, state_indices=idx, **opts), fullgraph=True)
    o = step(pool, *x)
    torch.cuda.synchronize()
    assert torch.equal(o, torch.from_dlpack(ref)) and torch.equal(pool, torch.from_dlpack(ref_pool))


def test_torch_autograd_on_the_gpu():
    torch = _torch()
    import kdacupy.torch as kt
    x, opts = torch_inputs(torch, T=100)
    try:
        kdacupy.kda_backward(cp.from_dlpack(x[2]), *(cp.from_dlpack(t) for t in x),
                             **{n: cp.from_dlpack(v) if isinstance(v, torch.Tensor) else v for n, v in opts.items()})
    except NotImplementedError as e:
        pytest.skip(f"kda_backward on CuPy arrays: {e}")
    leaves = [t.clone().requires_grad_() for t in x]
    o, s = kt.kda(*leaves, output_final_state=True, **opts)
    (o.float().square().mean() + s.mean()).backward()
    assert all(t.grad is not None and t.grad.isfinite().all() for t in leaves)


def test_compat_fla_against_fla_triton_kernels():
    """The vLLM decode path (fused_recurrent_kda_fwd, continuous batching into a pool):
    kdacupy's decode kernel and fla-core's Triton kernel (one compile, no autotuning), each
    against fla-core's naive reference in float32, within fla-core's own test tolerance;
    chunk_kda (kdacupy's kernels) against the naive reference. (FLA's own chunk_kda is
    compared with kdacupy's by the benchmark step, which autotunes it once.)"""
    torch = _torch()
    pytest.importorskip("fla.ops.kda", reason=MARKERS["fla"])
    import torch.nn.functional as F
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as fla_decode
    from fla.ops.kda.naive import naive_recurrent_kda

    import kdacupy.compat.fla as compat
    ratio = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
    unit = lambda x: F.normalize(x.float(), dim=-1)  # noqa: E731
    torch.manual_seed(0)
    N, H, D = 16, 16, 128
    pool = torch.randn(3 * N, H, D, D, device="cuda")
    idx = torch.randperm(3 * N, device="cuda")[:N].int()
    q, k, v = (torch.rand(1, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = F.logsigmoid(torch.randn(1, N, H, D, device="cuda"))
    beta = torch.rand(1, N, H, device="cuda").sigmoid().bfloat16()
    ref_o, ref_ht = naive_recurrent_kda(unit(q).transpose(0, 1), unit(k).transpose(0, 1), v.transpose(0, 1),
                                        g.transpose(0, 1), beta.transpose(0, 1), initial_state=pool[idx.long()],
                                        output_final_state=True)
    cu = torch.arange(N + 1, device="cuda", dtype=torch.int32)
    for fn in (compat.fused_recurrent_kda_fwd, fla_decode):
        p = pool.clone()
        o, _ = fn(q, k, v, g, beta, initial_state=p, cu_seqlens=cu, ssm_state_indices=idx,
                  use_qk_l2norm_in_kernel=True)
        assert ratio(o, ref_o.transpose(0, 1)) < 5e-3 and ratio(p[idx.long()], ref_ht) < 5e-3, fn.__module__
    B, T = 2, 1024
    q, k, v = (torch.rand(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, D, device="cuda"))
    beta = torch.rand(B, T, H, device="cuda").sigmoid().bfloat16()
    ref, ref_ht = naive_recurrent_kda(unit(q), unit(k), v, g, beta, initial_state=pool[:B], output_final_state=True)
    o, ht = compat.chunk_kda(q, k, v, g, beta, initial_state=pool[:B], output_final_state=True,
                             use_qk_l2norm_in_kernel=True)
    assert ratio(o, ref) < 5e-3 and ratio(ht, ref_ht) < 5e-3


def test_jax_on_xla_stream_zero_copy(monkeypatch):
    jax = _jax()
    import jax.numpy as jnp

    import kdacupy.jax as kj
    rng = np.random.default_rng(0)
    x = [rng.standard_normal(s).astype(np.float32) for s in ((1, 300, 2, 128), (1, 300, 2, 128), (1, 300, 4, 128),
                                                              (1, 300, 4, 128), (1, 300, 4))]
    x[3] = -np.abs(x[3])
    ref, _ = kdacupy.kda_forward(*map(cp.asarray, x), qk_l2norm=True)
    jx = [jnp.asarray(a) for a in x]
    f = jax.jit(lambda *a: kj.kda(*a, qk_l2norm=True)[0])
    f(*jx).block_until_ready()  # compile
    calls = spy(monkeypatch, "kda_forward")
    o = f(*jx).block_until_ready()
    call = calls[-1]
    assert isinstance(call["args"][0], cp.ndarray) and call["stream"] != 0  # device buffers, XLA's stream
    assert np.array_equal(np.asarray(o), cp.asnumpy(ref))
    o2, pool = kj.kda_decode(*(a[:, :1] for a in jx), state_pool=jnp.zeros((2, 4, 128, 128)),
                             state_indices=jnp.asarray([1], dtype=jnp.int32), qk_l2norm=True)
    assert np.asarray(pool)[1].any() and not np.asarray(pool)[0].any()

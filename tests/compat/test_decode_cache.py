"""The compat decode entry points' repeated call (kdacupy/torch/decode_cache.py) on CPU tensors
standing for CUDA tensors (kdacupy/cli/cuda_standins.py), no GPU: a cached call launches what
the full path launches (variant, grid, every argument; the pointers those of the same tensors,
the gate parameters' float32 copies with the values the full path converts), and a changed
tensor is noticed: a parameter modified in place, another pool, other or changed indices,
cu_seqlens changed in place or unequal."""
import ctypes

import numpy as np
import pytest

from tests.frameworks.common import import_torch

pytestmark = pytest.mark.torch
torch = import_torch()
cupy = pytest.importorskip("cupy", reason="needs CuPy (importable without a GPU) for the stand-ins")

import kdacupy.compat.fla as fla  # noqa: E402
import kdacupy.compat.sglang as sglang  # noqa: E402
import kdacupy.compat.vllm as vllm  # noqa: E402
from kdacupy.cli import cuda_standins as cs  # noqa: E402
from kdacupy.ops.forward.tuning import DEFAULT_SM_COUNT  # noqa: E402
from kdacupy.torch import decode_cache  # noqa: E402

N, H, D, P = 3, 2, 64, 8


@pytest.fixture()
def made():
    with cs.standin_device(name="kdacupy stand-in GPU", sm_count=DEFAULT_SM_COUNT) as kernels, \
            cs.standin_torch_cuda():
        yield kernels


def launch(made):
    """The last launch: (variant, grid, block, args), pointers as ints: CuPy arrays' (the full
    path) and uint64 ones (a null pointer, or a bound call's: kdacupy.prepared_decode)."""
    fns = [fn for fn in made.values() if fn.last is not None]
    assert len(fns) == 1
    grid, block, args, _ = fns[0].last
    fns[0].last = None
    return fns[0].config, grid, block, [a.data.ptr if isinstance(a, cupy.ndarray) else int(a)
                                        if type(a) is np.uint64 else ("value", a.item()) for a in args]


def floats(ptr, n):
    return np.frombuffer(ctypes.string_at(ptr, 4 * n), np.float32)


def inputs(gen=None):
    """One token per sequence, packed [1, N, ...]; bf16 gate parameters, an fp32 pool [P, H, D, D]."""
    gen = gen or torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(1, N, H, D, generator=gen).bfloat16() for _ in range(4))
    b = torch.randn(1, N, H, generator=gen).bfloat16()
    A_log = torch.randn(1, 1, H, 1, generator=gen).bfloat16()
    dt_bias = torch.randn(H * D, generator=gen).bfloat16()
    pool = torch.randn(P, H, D, D, generator=gen)
    return dict(q=q, k=k, v=v, g=g, b=b, A_log=A_log, dt_bias=dt_bias, pool=pool, log_decay=-g.float().exp(),
                beta=b.float().sigmoid(), idx=torch.tensor([5, 2, 7]), cu=torch.arange(N + 1, dtype=torch.int32))


def sglang_call(x, **change):
    x = dict(x, **change)
    return sglang.fused_sigmoid_gating_delta_rule_update(
        x["A_log"], x["g"].reshape(1, N, H * D), x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], x["pool"],
        x["idx"], use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu"], is_kda=True, lower_bound=-5.0)


def fla_call(x, **change):
    x = dict(x, **change)
    return fla.fused_recurrent_kda_fwd(
        *(x[n][0][:, None] for n in ("q", "k", "v", "g")), x["beta"][0][:, None], A_log=x["A_log"].reshape(-1),
        dt_bias=x["dt_bias"], initial_state=x["pool"], state_v_first=True, ssm_state_indices=x["idx"],
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=False, lower_bound=-5.0)[0]


def vllm_call(x, **change):
    x = dict(x, **change)
    return vllm.fused_recurrent_kda(x["q"], x["k"], x["v"], x["log_decay"], x["beta"], initial_state=x["pool"],
                                    cu_seqlens=x["cu"], ssm_state_indices=x["idx"])[0]


@pytest.mark.parametrize("call", [sglang_call, fla_call, vllm_call], ids=["sglang", "fla", "vllm"])
def test_a_cached_call_launches_what_the_full_path_launches(made, call, monkeypatch):
    x = inputs()
    import kdacupy.compat.pool as pool

    full_calls = []
    full = pool.kda_decode
    monkeypatch.setattr(pool, "kda_decode", lambda *a, **kw: full_calls.append(1) or full(*a, **kw))
    decode_cache.clear()
    with torch.inference_mode():
        o1 = call(x)  # the full path (kdacupy.torch.kda_decode), which stores the call
        first = launch(made)
        o2 = call(x)  # the cached one: kdacupy.kda_decode on the kept views, then bound to their pointers
        second = launch(made)
        o3 = call(x)  # the bound one: the prepared launch from raw pointers
        third = launch(made)
    assert len(full_calls) == 1
    # the step's entry bound (the torch face's own entry, under kdacupy.torch.kda_decode's key, is not hit)
    assert sum(bool(e.bound) for e in decode_cache._entries.values()) == 1
    for o, got in ((o2, second), (o3, third)):
        assert o.shape == o1.shape and o.dtype == o1.dtype == torch.bfloat16
        # the same variant, grid, block and scalars; the pointers those of the same tensors (o's its own)
        assert got[:3] == first[:3] and len(got[3]) == len(first[3])
        for a, b in zip(got[3], first[3]):
            if a == o.data_ptr() or b == o1.data_ptr():
                assert (a, b) == (o.data_ptr(), o1.data_ptr())
            else:  # every other tensor the engine's own (vLLM's slots too: no per-step copy), every scalar
                assert a == b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_parameter_changed_in_place_is_converted_again(made, dtype):
    """bf16 and fp16 gate parameters are converted to float32 once per version: changed in place,
    the next call converts them again (each dtype the conversion takes is keyed by version)."""
    x = inputs()
    x["A_log"], x["dt_bias"] = x["A_log"].to(dtype), x["dt_bias"].to(dtype)
    with torch.inference_mode():
        sglang_call(x)
        sglang_call(x)
    before = launch(made)
    A = x["A_log"].reshape(-1).float().numpy()
    assert any(isinstance(p, int) and np.array_equal(floats(p, H), A) for p in before[3])
    x["A_log"].add_(1.0)  # a model's parameter, changed in place: its version moves
    with torch.inference_mode():
        o = sglang_call(x)  # noqa: F841  (held: its memory is not reused under the next launch)
    after = launch(made)
    A2 = x["A_log"].reshape(-1).float().numpy()
    assert not np.array_equal(A, A2)
    assert any(isinstance(p, int) and np.array_equal(floats(p, H), A2) for p in after[3])
    assert not any(isinstance(p, int) and np.array_equal(floats(p, H), A) for p in after[3])
    assert after[:3] == before[:3]


def test_another_pool_and_other_indices_are_launched(made):
    x = inputs()
    with torch.inference_mode():
        sglang_call(x)
        sglang_call(x)
        launch(made)
        pool2, idx2 = x["pool"].clone(), torch.tensor([1, 4, 6])
        o = sglang_call(x, pool=pool2)  # noqa: F841
        got = launch(made)[3]
        assert pool2.data_ptr() in got and x["pool"].data_ptr() not in got
        o = sglang_call(x, idx=idx2)  # noqa: F841
        got = launch(made)[3]
        assert idx2.data_ptr() in got and x["idx"].data_ptr() not in got


def test_vllm_slots_reach_the_kernel_as_they_are(made):
    """vLLM's null block is padding in the kernel (its null_slot argument) and its cu_seqlens are
    checked there: the engine's slot table and offsets themselves are launched, every step, with
    no per-step device work on them, so what the engine rewrites in place is read as it is then."""
    x = inputs()
    with torch.inference_mode():
        vllm_call(x)
        first = launch(made)
        o = vllm_call(x)  # noqa: F841
        second = launch(made)
        o = vllm_call(x)  # noqa: F841  (the bound launch)
        third = launch(made)
    for got in (first, second, third):
        assert x["idx"].data_ptr() in got[3]
        # ..., null_slot, cu_seqlens (the engine's own: the kernel checks its lengths), its int64 flag,
        # then the true head dims K, V
        assert got[3][-5:-2] == [("value", vllm.NULL_BLOCK_ID), x["cu"].data_ptr(), ("value", 0)]


def test_device_cu_seqlens_go_to_the_kernel_every_step(made):
    """Device cu_seqlens (the stand-ins' tensors count as CUDA ones) are not read by the host: every
    step launches them for the kernel to check (its trap: tests/emulate/test_decode_emulate.py), the
    same tensor changed in place as it is then, another tensor as itself."""
    x = inputs()
    with torch.inference_mode():
        for cu in (x["cu"], torch.arange(N + 1, dtype=torch.int32)):
            for _ in range(3):  # the full path, the step's entry, the bound launch
                sglang_call(x, cu=cu)
                assert cu.data_ptr() in launch(made)[3]
        x["cu"][1] = 2  # lengths 2, 0, 1: the kernel traps (no host read, no launch of a check)
        sglang_call(x)
        assert x["cu"].data_ptr() in launch(made)[3]


@pytest.mark.parametrize("inference", [False, True], ids=["versioned", "inference"])
def test_host_cu_seqlens_changed_in_place_or_unequal_raise(made, monkeypatch, inference):
    """Host cu_seqlens with device tensors are checked on the host, by a repeated call as well: a
    tensor with a version counter once per version, an inference tensor (none) every call."""
    x = inputs()
    with torch.inference_mode(inference):
        cu = torch.arange(N + 1, dtype=torch.int32)
    ptr = cu.data_ptr()
    device_of = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda t: -1 if t.data_ptr() == ptr else device_of(t))
    with torch.inference_mode():
        for _ in range(3):
            sglang_call(x, cu=cu)
            assert ptr not in launch(made)[3]  # not launched: checked here
    with torch.inference_mode():
        cu[1] = 2  # lengths 2, 0, 1: not one token each
        with pytest.raises(ValueError, match="cu_seqlens"):
            sglang_call(x, cu=cu)


def test_the_torch_face_caches_its_call_and_never_a_copied_one(made):
    import kdacupy.torch as kt

    x = inputs()
    rows = {n: x[n][0][:, None] for n in ("q", "k", "v")}
    opts = dict(state_pool=x["pool"], state_indices=x["idx"], qk_l2norm=True, beta_sigmoid=True, gate="sigmoid",
                A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0)
    g, b = x["g"][0][:, None], x["b"][0][:, None]
    decode_cache.clear()
    with torch.inference_mode():
        o1 = kt.kda_decode(**rows, g=g, beta=b, **opts)
        first = launch(made)
        for _ in range(2):  # the core call on the kept views, then the bound launch
            o2 = kt.kda_decode(**rows, g=g, beta=b, **opts)
            second = launch(made)
            assert len(decode_cache._entries) == 1
            swap = {o2.data_ptr(): o1.data_ptr()}
            assert second[:3] == first[:3] and [swap.get(a, a) for a in second[3]] == first[3]
        assert next(iter(decode_cache._entries.values())).bound
        decode_cache.clear()
        strided = rows["q"].transpose(-1, -2).contiguous().transpose(-1, -2)  # last dim strided: copied
        for _ in range(2):
            kt.kda_decode(**dict(rows, q=strided), g=g, beta=b, **opts)
            assert strided.data_ptr() not in launch(made)[3]
        assert not decode_cache._entries


def test_a_call_with_autograd_to_record_is_never_served_from_the_cache(made, monkeypatch):
    import kdacupy.compat.pool as pool

    x = inputs()
    with torch.inference_mode():
        sglang_call(x)
    full = []
    real = pool.kda_decode
    monkeypatch.setattr(pool, "kda_decode", lambda *a, **kw: full.append(1) or real(*a, **kw))
    x["dt_bias"].requires_grad_()  # the key is the same: only the grad mode tells
    with torch.enable_grad():
        sglang_call(x)
    assert full == [1]
    with torch.inference_mode():
        sglang_call(x)
    assert full == [1]  # served from the cache again


def test_a_bound_call_refuses_the_out_the_core_call_refuses(made):
    """The bound launch (kdacupy.ops.decode.fastpath.BoundDecode) makes kdacupy.kda_decode's per-call
    tests of out: an out over an input or misaligned launches nothing (the step then takes the core
    call, which raises); the core call refuses the same out."""
    import kdacupy
    import kdacupy.torch as kt

    x = inputs()
    rows = {n: x[n][0][:, None] for n in ("q", "k", "v", "g")}
    opts = dict(state_pool=x["pool"], state_indices=x["idx"], gate="log")
    with torch.inference_mode():
        for _ in range(3):
            o = kt.kda_decode(**rows, beta=None, **opts)
            launch(made)
    entry = next(iter(decode_cache._entries.values()))
    assert entry.bound
    q = rows["q"]  # q's shape and dtype are o's here: only its address makes it a wrong out
    for bad in (q.data_ptr(), q.data_ptr() + 64, o.data_ptr() + 2):
        assert not entry.bound.launch(bad)
        assert all(fn.last is None for fn in made.values())
    assert entry.bound.launch(o.data_ptr())
    assert launch(made)[3].count(o.data_ptr()) == 1
    from kdacupy.ops.decode import fastpath

    fastpath.clear()  # as a retune does: the bound call is kdacupy's old one
    assert not entry.bound.launch(o.data_ptr())
    with torch.inference_mode():
        o = kt.kda_decode(**rows, beta=None, **opts)  # through the core call again, then bound anew
    assert launch(made)[3].count(o.data_ptr()) == 1 and entry.bound and entry.bound.launch(o.data_ptr())
    launch(made)
    views = entry.views
    with pytest.raises(ValueError):
        kdacupy.kda_decode(*views[:4], None, state_pool=views[5], state_indices=views[6], gate="log", out=views[0])


def test_an_engine_call_is_found_by_its_own_key_only_where_its_mapping_is_a_view(made):
    """A call found by its own arguments' key (decode_cache.front) skips mapping them, so only a
    mapping made of views may be skipped: SGLang's default softplus (the kernel's gate, a view of
    the raw gate) is; a softplus_beta of 2 (the gate computed by torch ops, from values) is never,
    so the gate the kernel reads is computed anew from the raw one every call."""
    x = inputs()
    decode_cache.clear()
    with torch.inference_mode():
        for _ in range(3):
            sglang_call(x)
            assert x["g"].data_ptr() in launch(made)[3]
        engine = lambda: [k for k in decode_cache._fronts if k[0] == "fused_sigmoid_gating_delta_rule_update"]  # noqa: E731
        assert len(engine()) == 1
        decode_cache.clear()
        for _ in range(3):
            x["g"].add_(1.0)  # the engine rewrites its raw gate in place
            sglang.fused_sigmoid_gating_delta_rule_update(
                x["A_log"], x["g"].reshape(1, N, H * D), x["dt_bias"], 2.0, 20.0, x["q"], x["k"], x["v"], x["b"],
                x["pool"], x["idx"], use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu"], is_kda=True)
            assert launch(made)[3][3] != x["g"].data_ptr()  # the fourth argument, g: a gate computed anew
        assert not engine()


def test_another_scalar_argument_is_another_call(made):
    """lower_bound is a scalar of the engine's call, in its key: a new value launches its own."""
    x = inputs()
    with torch.inference_mode():
        for lb in (-5.0, -5.0, -3.0, -3.0, -5.0):
            sglang.fused_sigmoid_gating_delta_rule_update(
                x["A_log"], x["g"].reshape(1, N, H * D), x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"],
                x["pool"], x["idx"], use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu"], is_kda=True, lower_bound=lb)
            scalars = [a[1] for a in launch(made)[3] if isinstance(a, tuple) and isinstance(a[1], float)]
            assert pytest.approx(lb / np.log(2.0), rel=1e-6) in scalars  # the bound in base 2 (lb2)

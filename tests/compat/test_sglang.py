"""kdacupy.compat.sglang on SGLang's own call sites (its KDA kernel backend's extend and decode,
with its keywords, shapes and [P, HV, V, K] pool), on CPU torch tensors, against the float64
recurrence of tests/compat/reference.py: bf16 outputs within 2.5e-3 (rmse ratio), float32
pools within 1e-6, slots not named bit for bit untouched, -1 slots padding."""
import sys
import types

import numpy as np
import pytest

from tests.compat.reference import bounded_gate, f64, rmse_ratio, run, sigmoid, softplus_gate, vk
from tests.frameworks.common import import_torch, one_thread

pytestmark = pytest.mark.torch
torch = import_torch()

import kdacupy.compat.sglang as sglang  # noqa: E402

H, D, P = 2, 64, 8
OUT, POOL = 2.5e-3, 1e-6


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def setup(seed, n):
    """n tokens of kernel inputs (q, k, v bf16), the layer's A_log [1, 1, H, 1] and dt_bias [H * D],
    and a float32 pool of random states."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, n, H, D, generator=gen).bfloat16() for _ in range(3))
    A_log = torch.log(torch.empty(1, 1, H, 1).uniform_(1, 16, generator=gen))
    dt_bias = torch.randn(H * D, generator=gen)
    pool = torch.randn(P, H, D, D, generator=gen) * 0.1
    return gen, q, k, v, A_log, dt_bias, pool


def check_pool(pool, before, finals, written):
    """The written slots hold the reference's final states ([V, K]); every other slot is as it was."""
    for i, S in finals.items():
        assert rmse_ratio(pool[i], vk(S)) < POOL
    others = [i for i in range(P) if i not in written]
    assert torch.equal(pool[others], before[others])


@pytest.mark.parametrize("gate", ["softplus", "bounded", "log"])
def test_extend_as_the_kda_backend_calls_it(gate):
    """TritonKDAKernel.extend: chunk_kda(q, k, v, g, beta, initial_state=pool, initial_state_indices=idx,
    use_qk_l2norm_in_kernel=True, cu_seqlens=query_start_loc, A_log=[1, 1, H, 1], dt_bias=[H * D],
    lower_bound=..., output_intermediate_states=False) -> o, the pool updated in place; slot -1 pads.
    gate="log": A_log None, g the log decay."""
    lens = [13, 6, 4]
    gen, q, k, v, A_log, dt_bias, pool = setup(10, sum(lens))
    before = pool.clone()
    idx = torch.tensor([6, -1, 0], dtype=torch.int32)  # slot 0 a live slot (SGLang pads with -1 only)
    cu = torch.tensor(np.cumsum([0] + lens), dtype=torch.int32)
    beta = torch.rand(1, sum(lens), H, generator=gen)
    g = torch.randn(1, sum(lens), H, D, generator=gen).bfloat16()
    lower_bound = -5.0 if gate == "bounded" else None
    if gate == "log":
        g = -torch.rand(1, sum(lens), H, D, generator=gen)
        A_log = dt_bias = None
    o = sglang.chunk_kda(q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, initial_state_indices=idx,
                         use_qk_l2norm_in_kernel=True, cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias,
                         lower_bound=lower_bound, output_intermediate_states=False)
    assert isinstance(o, torch.Tensor) and o.shape == v.shape and o.dtype == torch.bfloat16
    raw = f64(g)[0]
    g_ref = {"softplus": lambda: softplus_gate(raw, f64(A_log), f64(dt_bias)),
             "bounded": lambda: bounded_gate(raw, f64(A_log), f64(dt_bias), -5.0), "log": lambda: raw}[gate]()
    finals, outs = {}, []
    for n in range(3):
        s = slice(cu[n], cu[n + 1])
        start = vk(f64(before[idx[n]])) if idx[n] >= 0 else np.zeros((H, D, D))  # padding: from zeros
        o_n, states = run(f64(q)[0, s], f64(k)[0, s], f64(v)[0, s], g_ref[s], f64(beta)[0, s], start)
        outs.append(o_n)
        if idx[n] >= 0:
            finals[int(idx[n])] = states[-1]
    assert rmse_ratio(o[0], np.concatenate(outs)) < OUT
    check_pool(pool, before, finals, [6, 0])


def decode_call(q, k, v, A_log, dt_bias, pool, idx, a, b, cu, **extra):
    """TritonKDAKernel.decode's call, keywords as SGLang passes them."""
    return sglang.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=idx, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
        softplus_threshold=20.0, is_kda=True, **extra)


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_decode_as_the_kda_backend_calls_it(lower_bound):
    """TritonKDAKernel.decode: the gate passed flat as a [N, H * D], beta logits b [N, H],
    query_start_loc of one token per request; -1 pads (zero output, the pool untouched)."""
    N = 4
    gen, q, k, v, A_log, dt_bias, pool = setup(11, N)
    before = pool.clone()
    idx = torch.tensor([3, -1, 0, 5], dtype=torch.int32)
    a = torch.randn(N, H * D, generator=gen).bfloat16()
    b = torch.randn(N, H, generator=gen).bfloat16()
    extra = {} if lower_bound is None else dict(lower_bound=lower_bound)
    o = decode_call(q, k, v, A_log, dt_bias, pool, idx, a, b, torch.arange(N + 1, dtype=torch.int32), **extra)
    assert o.shape == (1, N, H, D) and o.dtype == torch.bfloat16
    raw = f64(a).reshape(N, H, D)
    g_ref = (softplus_gate(raw, f64(A_log), f64(dt_bias)) if lower_bound is None
             else bounded_gate(raw, f64(A_log), f64(dt_bias), lower_bound))
    finals, live = {}, [0, 2, 3]
    ref = np.zeros((N, H, D))
    for n in live:
        s = slice(n, n + 1)
        ref[n], states = run(f64(q)[0, s], f64(k)[0, s], f64(v)[0, s], g_ref[s], sigmoid(f64(b)[s]),
                             vk(f64(before[idx[n]])))
        finals[int(idx[n])] = states[-1]
    assert rmse_ratio(o[0, live], ref[live]) < OUT
    assert torch.equal(o[0, 1], torch.zeros_like(o[0, 1]))
    check_pool(pool, before, finals, [3, 0, 5])


def test_decode_of_several_tokens_writes_the_state_after_them():
    """Two tokens per request without the verify arguments: each request starts from idx[n] and
    the state after both tokens goes back there (SGLang's kernel with disable_state_update=False)."""
    N, T = 2, 2
    gen, q, k, v, A_log, dt_bias, pool = setup(12, N * T)
    before = pool.clone()
    idx = torch.tensor([7, 1], dtype=torch.int32)
    a = torch.randn(1, N * T, H * D, generator=gen)
    b = torch.randn(1, N * T, H, generator=gen)
    o = decode_call(q, k, v, A_log, dt_bias, pool, idx, a, b, torch.tensor([0, 2, 4]))
    g_ref = softplus_gate(f64(a)[0].reshape(N * T, H, D), f64(A_log), f64(dt_bias))
    finals = {}
    for n in range(N):
        s = slice(n * T, (n + 1) * T)
        o_n, states = run(f64(q)[0, s], f64(k)[0, s], f64(v)[0, s], g_ref[s], sigmoid(f64(b)[0, s]),
                          vk(f64(before[idx[n]])))
        assert rmse_ratio(o[0, s], o_n) < OUT
        finals[int(idx[n])] = states[-1]
    check_pool(pool, before, finals, [7, 1])


@pytest.mark.parametrize("case", ["gdn", "softplus_beta"])
def test_decode_of_gdn_and_of_another_softplus(case):
    """is_kda=False (GDN: one gate per head, a [N, H], dt_bias [H], A_log [H]) runs as KDA with the
    gate repeated over K; softplus_beta = 2 (not SGLang's 1) goes through the torch-computed gate."""
    N = 2
    gen, q, k, v, A_log, dt_bias, pool = setup(13, N)
    before = pool.clone()
    idx = torch.tensor([4, 6], dtype=torch.int32)
    b = torch.randn(N, H, generator=gen)
    if case == "gdn":
        A_log, dt_bias, a = A_log.reshape(H), torch.randn(H, generator=gen), torch.randn(N, H, generator=gen)
        raw = np.repeat(f64(a)[:, :, None], D, axis=2)
        g_ref = softplus_gate(raw, f64(A_log), np.repeat(f64(dt_bias)[:, None], D, axis=1))
        o = sglang.fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, idx,
                                                          use_qk_l2norm_in_kernel=True, cu_seqlens=torch.arange(3))
    else:
        a = torch.randn(N, H * D, generator=gen)
        g_ref = softplus_gate(f64(a).reshape(N, H, D), f64(A_log), f64(dt_bias), beta=2.0)
        o = sglang.fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, 2.0, 20.0, q, k, v, b, pool, idx,
                                                          use_qk_l2norm_in_kernel=True, cu_seqlens=torch.arange(3),
                                                          is_kda=True)
    o_ref, states = zip(*(run(f64(q)[0, n:n + 1], f64(k)[0, n:n + 1], f64(v)[0, n:n + 1], g_ref[n:n + 1],
                              sigmoid(f64(b)[n:n + 1]), vk(f64(before[idx[n]]))) for n in range(N)))
    assert rmse_ratio(o[0], np.concatenate(o_ref)) < OUT
    check_pool(pool, before, {int(idx[n]): states[n][-1] for n in range(N)}, [4, 6])


def test_what_kdacupy_cannot_honour_raises_naming_it():
    N = 2
    gen, q, k, v, A_log, dt_bias, pool = setup(14, N)
    idx, cu = torch.tensor([1, 2]), torch.arange(N + 1)
    a, b = torch.randn(N, H * D), torch.randn(N, H)
    verify = dict(retrieve_parent_token=torch.zeros(N, 1, dtype=torch.int64),
                  intermediate_state_indices=torch.tensor([0, 1]))
    for name, value in verify.items():  # target_verify without the buffer (tests/compat/test_tree_verify.py)
        before = pool.clone()
        with pytest.raises(ValueError, match=f"^{name}: expected None without intermediate_states_buffer"):
            decode_call(q, k, v, A_log, dt_bias, pool, idx, a, b, cu, **{name: value})
        assert torch.equal(pool, before)
    g, beta = torch.randn(1, N, H, D), torch.rand(1, N, H)
    for name in ("dt_bias", "lower_bound"):  # SGLang drops them without A_log: g would be read as the decay
        with pytest.raises(ValueError, match=f"^{name}: chunk_kda\\(\\) applies dt_bias and lower_bound only with "
                                             f"A_log"):
            sglang.chunk_kda(q, k, v, g, beta, initial_state=pool, initial_state_indices=idx, cu_seqlens=cu,
                             **{name: dt_bias if name == "dt_bias" else -5.0})
    with pytest.raises(TypeError, match="'output_final_state'"):
        sglang.chunk_kda(q, k, v, g, beta, initial_state=pool, initial_state_indices=idx, output_final_state=True)
    with pytest.raises(ValueError, match="^initial_state_indices"):
        sglang.chunk_kda(q, k, v, g, beta, initial_state=pool)
    with pytest.raises(ValueError, match="^cu_seqlens: expected 1 tokens in every sequence"):
        decode_call(q, k, v, A_log, dt_bias, pool, idx, a, b, torch.tensor([0, 0, 2]))
    with pytest.raises(ValueError, match="^a: expected the raw gate of the 2 tokens"):  # e.g. a padded gate
        decode_call(q, k, v, A_log, dt_bias, pool, idx, torch.randn(N + 1, H * D), b, cu)


def test_patch_swaps_sglangs_names_and_the_backends_calls_run_on_kdacupy(monkeypatch):
    """SGLang's module names faked in sys.modules: the two op modules and the kernel backend
    module that imported their functions by name."""
    def stand_in(*args, **kwargs):
        raise AssertionError("SGLang's own op ran")
    ops_kda = types.ModuleType("sglang.kernels.ops.attention.fla.kda")
    ops_kda.chunk_kda = stand_in
    ops_dec = types.ModuleType("sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent")
    ops_dec.fused_sigmoid_gating_delta_rule_update = lambda *a, **kw: stand_in()
    backend = types.ModuleType("sglang.srt.layers.attention.linear.kernels.kda_triton")
    backend.chunk_kda = ops_kda.chunk_kda
    backend.fused_sigmoid_gating_delta_rule_update = ops_dec.fused_sigmoid_gating_delta_rule_update
    parents = ["sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
               "sglang.kernels.ops.attention.fla", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.attention",
               "sglang.srt.layers.attention.linear", "sglang.srt.layers.attention.linear.kernels"]
    for name in parents:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for mod in (ops_kda, ops_dec, backend):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    originals = (ops_kda.chunk_kda, ops_dec.fused_sigmoid_gating_delta_rule_update)
    sglang.patch()
    try:
        assert backend.chunk_kda is sglang.chunk_kda is ops_kda.chunk_kda
        assert (backend.fused_sigmoid_gating_delta_rule_update is sglang.fused_sigmoid_gating_delta_rule_update
                is ops_dec.fused_sigmoid_gating_delta_rule_update)
        N = 2
        gen, q, k, v, A_log, dt_bias, pool = setup(15, N)
        before = pool.clone()
        idx = torch.tensor([5, 3], dtype=torch.int32)
        a, b = torch.randn(N, H * D, generator=gen), torch.randn(N, H, generator=gen)
        o = backend.fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
            initial_state_indices=idx, cu_seqlens=torch.arange(N + 1), use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0, softplus_threshold=20.0, is_kda=True)
        g_ref = softplus_gate(f64(a).reshape(N, H, D), f64(A_log), f64(dt_bias))
        o_ref, states = run(f64(q)[0, :1], f64(k)[0, :1], f64(v)[0, :1], g_ref[:1], sigmoid(f64(b)[:1]),
                            vk(f64(before[5])))
        assert rmse_ratio(o[0, :1], o_ref) < OUT and rmse_ratio(pool[5], vk(states[-1])) < POOL
    finally:
        sglang.unpatch()
    assert (backend.chunk_kda, backend.fused_sigmoid_gating_delta_rule_update) == originals
    assert (ops_kda.chunk_kda, ops_dec.fused_sigmoid_gating_delta_rule_update) == originals


def test_packed_decode_as_sglangs_kernel_tests_call_it():
    """fused_recurrent_kda_packed_decode (python/sglang/kernels/ops/attention/fla/fused_recurrent.py at
    047d31af2516212c09b8ce356fae8298ba8526d7): q, k, v packed in one row per request, the raw gate
    a [B, HV * K], beta logits b [B, HV], out [B, 1, HV, V]; -1 skips the request (zero output)."""
    N = 3
    gen, q, k, v, A_log, dt_bias, pool = setup(15, N)
    before = pool.clone()
    mixed = torch.cat([x[0].reshape(N, H * D) for x in (q, k, v)], dim=1)
    a = torch.randn(N, H * D, generator=gen).bfloat16()
    b = torch.randn(N, H, generator=gen).bfloat16()
    idx = torch.tensor([5, -1, 2], dtype=torch.int32)
    out = torch.full((N, 1, H, D), 9.0, dtype=torch.bfloat16)
    res, res_pool = sglang.fused_recurrent_kda_packed_decode(mixed, a, b, A_log.reshape(H), dt_bias, D ** -0.5, pool,
                                                             out, idx, use_qk_l2norm_in_kernel=True,
                                                             lower_bound=-5.0)
    assert res is out and res_pool is pool
    g_ref = bounded_gate(f64(a).reshape(N, H, D), f64(A_log), f64(dt_bias), -5.0)
    finals, ref = {}, np.zeros((N, H, D))
    for n in (0, 2):
        ref[n], states = run(f64(q)[0, n:n + 1], f64(k)[0, n:n + 1], f64(v)[0, n:n + 1], g_ref[n:n + 1],
                             sigmoid(f64(b)[n:n + 1]), vk(f64(before[idx[n]])))
        finals[int(idx[n])] = states[-1]
    assert rmse_ratio(out[[0, 2], 0], ref[[0, 2]]) < OUT and not out[1].any()
    check_pool(pool, before, finals, [5, 2])


def test_packed_decode_refuses_bad_arguments_before_writing():
    N = 2
    gen, q, k, v, A_log, dt_bias, pool = setup(16, N)
    mixed = torch.cat([x[0].reshape(N, H * D) for x in (q, k, v)], dim=1)
    a, b = torch.randn(N, H * D, generator=gen), torch.randn(N, H, generator=gen)
    idx, out = torch.tensor([1, 2]), torch.zeros(N, 1, H, D, dtype=torch.bfloat16)
    good = dict(mixed_qkv=mixed, a=a, b=b, A_log=A_log.reshape(H), dt_bias=dt_bias, scale=0.125,
                initial_state=pool, out=out, ssm_state_indices=idx)
    bad = [("out", dict(out=out[:1]), ValueError), ("out", dict(out=out.float()), TypeError),
           ("out", dict(out=mixed[:, :H * D].view(N, 1, H, D)), ValueError),
           ("mixed_qkv", dict(mixed_qkv=mixed[:, 1:]), ValueError), ("a", dict(a=a[:, :D]), ValueError),
           ("ssm_state_indices", dict(ssm_state_indices=[0.5, 1.5]), TypeError),
           ("ssm_state_indices", dict(ssm_state_indices=idx[:1]), ValueError),
           ("b", dict(b=b.tolist()), TypeError), ("dt_bias", dict(dt_bias=dt_bias[:H]), ValueError)]
    for name, change, error in bad:
        args = dict(good, **change)
        snapshot = {n: x.clone() for n, x in args.items() if isinstance(x, torch.Tensor)}
        with pytest.raises(error, match=f"^{name}"):
            sglang.fused_recurrent_kda_packed_decode(**args)
        for n, x in snapshot.items():
            assert torch.equal(args[n], x), f"{n} written by a call refused for {name}"


def _chunk_cumsum_reference(gate, BT, lens, scale):
    out = np.zeros_like(gate)
    bos = 0
    for n in lens:
        for c in range(0, n, BT):
            s = slice(bos + c, bos + min(c + BT, n))
            out[s] = np.cumsum(gate[s], axis=0)
        bos += n
    return out * (1.0 if scale is None else scale)


@pytest.mark.parametrize("lens,lower_bound,scale", [([100], None, None), ([17, 0, 64, 1, 40], -5.0, 1.4426950216293335),
                                                    ([64, 65], None, 1.4426950216293335)],
                         ids=["one-sequence", "varlen-bounded", "chunk-edges"])
def test_kda_gate_chunk_cumsum_against_float64(lens, lower_bound, scale):
    """The chunked gate cumsum as SGLang's kernel tests call it (FLA's kda_gate_chunk_cumsum: g=,
    A_log=, dt_bias=, scale=RCP_LN2, chunk_size=64, cu_seqlens=, chunk_indices=, lower_bound=)."""
    T, BT = sum(lens), 64
    gen = torch.Generator().manual_seed(17)
    g = torch.randn(1, T, H, D, generator=gen).bfloat16()
    A_log, dt_bias = torch.randn(H, generator=gen), torch.randn(H * D, generator=gen)
    cu = torch.tensor(np.cumsum([0] + lens)) if len(lens) > 1 else None
    out = sglang.kda_gate_chunk_cumsum(g=g, A_log=A_log, dt_bias=dt_bias, scale=scale, chunk_size=BT, cu_seqlens=cu,
                                       chunk_indices=None, lower_bound=lower_bound)
    assert out.dtype == torch.float32 and out.shape == g.shape
    raw = f64(g)[0]
    gate = (softplus_gate(raw, f64(A_log), f64(dt_bias)) if lower_bound is None
            else bounded_gate(raw, f64(A_log), f64(dt_bias), lower_bound))
    ref = _chunk_cumsum_reference(gate, BT, lens, scale)
    assert np.abs(f64(out)[0] - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    with pytest.raises(ValueError, match="^chunk_size: expected a power of 2"):
        sglang.kda_gate_chunk_cumsum(g, A_log, 48)
    with pytest.raises(ValueError, match=f"^A_log: expected {H} elements"):
        sglang.kda_gate_chunk_cumsum(g, A_log[:1], 64)
    with pytest.raises(ValueError, match=f"^dt_bias: expected {H * D} elements"):
        sglang.kda_gate_chunk_cumsum(g, A_log, 64, dt_bias=dt_bias[:D])
    with pytest.raises(TypeError, match="'head_first'"):
        sglang.kda_gate_chunk_cumsum(g, A_log, 64, head_first=True)


def test_intermediate_states_with_bad_slots_refused_before_the_pool_is_read():
    """chunk_kda(output_intermediate_states=True) gathers the slots' states for h: its slots are
    checked first (float slots, a list of floats, the wrong count), naming initial_state_indices."""
    lens = [5, 3]
    gen, q, k, v, A_log, dt_bias, pool = setup(18, sum(lens))
    before = pool.clone()
    g, beta = -torch.rand(1, sum(lens), H, D), torch.rand(1, sum(lens), H)
    cu = torch.tensor([0, 5, 8])
    for idx, error in ((torch.tensor([1.0, 2.0]), TypeError), ([0.5, 1.0], TypeError),
                       (torch.tensor([1, 2, 3]), ValueError), (torch.tensor([1, P + 3]), ValueError)):
        with pytest.raises(error, match="^initial_state_indices"):
            sglang.chunk_kda(q, k, v, g, beta, initial_state=pool, initial_state_indices=idx, cu_seqlens=cu,
                             output_intermediate_states=True)
        assert torch.equal(pool, before)
    o, h = sglang.chunk_kda(q, k, v, g, beta, initial_state=pool, initial_state_indices=[1, 2], cu_seqlens=cu,
                            output_intermediate_states=True)
    assert torch.equal(h[0, 0].float(), before[1].to(h.dtype).float()) and not torch.equal(pool[1], before[1])

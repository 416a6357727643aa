"""kdacupy.compat.vllm on vLLM's own call sites (the KDA layers' keywords, shapes and layouts,
docs in kdacupy/compat/vllm.py), on CPU torch tensors, against the float64 recurrence of
tests/compat/reference.py: bf16 outputs within 2.5e-3 (rmse ratio; the bf16 rounding of the
output is 1.1e-3), float32 pools within 1e-6, slots not named bit for bit untouched, the null
block (slot 0) and -1 slots padding."""
import sys
import types

import numpy as np
import pytest

from tests.compat.reference import bounded_gate, f64, rmse_ratio, run, softplus_gate, vk
from tests.frameworks.common import import_torch, one_thread

pytestmark = pytest.mark.torch
torch = import_torch()

import kdacupy.compat.vllm as vllm  # noqa: E402

H, D, P = 2, 64, 8  # heads (= value heads, as the layer has), head dim, pool slots
OUT, POOL = 2.5e-3, 1e-6


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def tokens(n, gen):
    """A layer's kernel inputs for n tokens, packed [1, n, ...]: q, k, v bf16, beta sigmoided float32."""
    q, k, v = (torch.randn(1, n, H, D, generator=gen).bfloat16() for _ in range(3))
    beta = torch.rand(1, n, H, generator=gen)
    return q, k, v, beta


def params(gen):
    """The layer's gate parameters: A_log [1, 1, H, 1] and dt_bias [H * D], float32."""
    return torch.log(torch.empty(1, 1, H, 1).uniform_(1, 16, generator=gen)), torch.randn(H * D, generator=gen)


def pool_with_sentinels(gen):
    """The recurrent state pool [P, H, V, K] float32: random states."""
    return torch.randn(P, H, D, D, generator=gen) * 0.1


def expected(q, k, v, g, beta, starts, cu, l2=True):
    """Reference outputs and final [K, V] states per sequence; g the float64 log decay [T, H, K]."""
    outs, finals = [], []
    for n in range(len(cu) - 1):
        s = slice(cu[n], cu[n + 1])
        o, states = run(f64(q)[0, s], f64(k)[0, s], f64(v)[0, s], g[s], f64(beta)[0, s], starts[n], l2=l2)
        outs.append(o)
        finals.append(states[-1] if cu[n + 1] > cu[n] else starts[n])
    return np.concatenate(outs), finals


def test_prefill_chunk_kda_as_the_kda_layer_calls_it():
    """vllm/model_executor/layers/kda.py: g1 = fused_kda_gate(g1, A_log, head_dim, g_bias=dt_bias);
    zero the new requests' slots, gather, chunk_kda(..., initial_state=pool[idx]), scatter back."""
    gen = torch.Generator().manual_seed(0)
    A_log, dt_bias = params(gen)
    pool = pool_with_sentinels(gen)
    before = pool.clone()
    idx = torch.tensor([5, 2, 7], dtype=torch.int32)
    has_initial_state = torch.tensor([True, False, True])
    lens = [9, 17, 1]
    cu = torch.tensor(np.cumsum([0] + lens), dtype=torch.int32)
    q, k, v, beta = tokens(sum(lens), gen)
    raw = torch.randn(sum(lens), H * D, generator=gen).bfloat16()
    g1 = vllm.fused_kda_gate(raw, A_log, D, g_bias=dt_bias).unsqueeze(0)
    assert g1.shape == (1, sum(lens), H, D) and g1.dtype == torch.float32

    zero_idx = idx[~has_initial_state]
    pool[zero_idx] = 0
    initial_state = pool[idx].contiguous()
    o, last = vllm.chunk_kda(q=q, k=k, v=v, g=g1, beta=beta, initial_state=initial_state, output_final_state=True,
                             use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    pool[idx] = last

    g_ref = softplus_gate(f64(raw).reshape(-1, H, D), f64(A_log), f64(dt_bias))
    assert rmse_ratio(g1[0], g_ref) < 1e-6
    starts = [vk(f64(before[i])) if h else np.zeros((H, D, D)) for i, h in zip(idx.tolist(), has_initial_state)]
    o_ref, finals = expected(q, k, v, g_ref, beta, starts, cu.tolist())
    assert o.dtype == torch.bfloat16 and last.dtype == torch.float32 and last.shape == (3, H, D, D)
    assert rmse_ratio(o[0], o_ref) < OUT
    for i, S in zip(idx.tolist(), finals):
        assert rmse_ratio(pool[i], vk(S)) < POOL  # [V, K] states in the pool
    others = [i for i in range(P) if i not in idx.tolist()]
    assert torch.equal(pool[others], before[others])


@pytest.mark.parametrize("safe_gate", [False, True])
def test_prefill_chunk_kda_with_fused_gate_as_the_kimi_gdn_layer_calls_it(safe_gate):
    """kimi_gdn_linear_attn.py: chunk_kda_with_fused_gate(q, k, v, raw_g=g1 [1, T, H, D], beta,
    A_log=[1, 1, H, 1], g_bias=dt_bias, initial_state=pool[idx], ...); the bounded gate with safe_gate."""
    gen = torch.Generator().manual_seed(1)
    A_log, dt_bias = params(gen)
    pool = pool_with_sentinels(gen)
    idx = torch.tensor([1, 6], dtype=torch.int32)
    lens = [20, 3]
    cu = torch.tensor(np.cumsum([0] + lens), dtype=torch.int32)
    q, k, v, beta = tokens(sum(lens), gen)
    raw_g = torch.randn(1, sum(lens), H, D, generator=gen).bfloat16()
    extra = dict(safe_gate=True, lower_bound=-5.0) if safe_gate else {}
    o, last = vllm.chunk_kda_with_fused_gate(q=q, k=k, v=v, raw_g=raw_g, beta=beta, A_log=A_log, g_bias=dt_bias,
                                             initial_state=pool[idx].contiguous(), output_final_state=True,
                                             use_qk_l2norm_in_kernel=True, cu_seqlens=cu, **extra)
    raw = f64(raw_g)[0]
    g_ref = (bounded_gate(raw, f64(A_log), f64(dt_bias), -5.0) if safe_gate
             else softplus_gate(raw, f64(A_log), f64(dt_bias)))
    o_ref, finals = expected(q, k, v, g_ref, beta, [vk(f64(pool[i])) for i in idx.tolist()], cu.tolist())
    assert rmse_ratio(o[0], o_ref) < OUT
    assert max(rmse_ratio(last[n], vk(S)) for n, S in enumerate(finals)) < POOL


def test_decode_fused_recurrent_kda_as_the_layer_calls_it():
    """Decode: fused_kda_gate, then fused_recurrent_kda(q, k, v, g, beta, initial_state=pool,
    use_qk_l2norm_in_kernel=True, cu_seqlens=query_start_loc[:N + 1], ssm_state_indices=idx) with
    the pool updated in place; the null block 0 and -1 are padding (zero output, never touched)."""
    gen = torch.Generator().manual_seed(2)
    A_log, dt_bias = params(gen)
    pool = pool_with_sentinels(gen)
    before = pool.clone()
    idx = torch.tensor([3, 0, 6, -1, 1], dtype=torch.int32)
    N = len(idx)
    q, k, v, beta = tokens(N, gen)
    raw = torch.randn(N, H * D, generator=gen).bfloat16()
    g1 = vllm.fused_kda_gate(raw, A_log, D, g_bias=dt_bias).unsqueeze(0)
    o, state = vllm.fused_recurrent_kda(q=q, k=k, v=v, g=g1, beta=beta, initial_state=pool,
                                        use_qk_l2norm_in_kernel=True,
                                        cu_seqlens=torch.arange(N + 1, dtype=torch.int32), ssm_state_indices=idx)
    assert state is pool
    g_ref = softplus_gate(f64(raw).reshape(N, H, D), f64(A_log), f64(dt_bias))
    live = [n for n in range(N) if idx[n] > 0]
    for n in range(N):
        if n not in live:
            assert torch.equal(o[0, n], torch.zeros_like(o[0, n]))
    o_ref, finals = expected(q[:, live], k[:, live], v[:, live], g_ref[live], beta[:, live],
                             [vk(f64(before[idx[n]])) for n in live], list(range(len(live) + 1)))
    assert rmse_ratio(o[0, live], o_ref) < OUT
    for n, S in zip(live, finals):
        assert rmse_ratio(pool[idx[n]], vk(S)) < POOL
    untouched = [i for i in range(P) if i not in idx[live].tolist()]
    assert 0 in untouched and torch.equal(pool[untouched], before[untouched])


def test_decode_with_the_gate_and_beta_in_the_kernel_into_out():
    """The later ops' fused decode: compute_gate=True (the bounded gate from the raw g, a_log,
    g_bias), sigmoid_beta=True (beta logits), out= a caller's buffer."""
    gen = torch.Generator().manual_seed(3)
    A_log, dt_bias = params(gen)
    pool = pool_with_sentinels(gen)
    before = pool.clone()
    idx = torch.tensor([4, 2], dtype=torch.int32)
    q, k, v, _ = tokens(2, gen)
    raw_g = torch.randn(1, 2, H, D, generator=gen).bfloat16()
    logits = torch.randn(1, 2, H, generator=gen).bfloat16()
    out = torch.empty_like(k)
    o, _ = vllm.fused_recurrent_kda(q, k, v, raw_g, logits, initial_state=pool, cu_seqlens=torch.arange(3),
                                    ssm_state_indices=idx, out=out, sigmoid_beta=True, a_log=A_log, g_bias=dt_bias,
                                    compute_gate=True, lower_bound=-5.0)
    assert o is out
    g_ref = bounded_gate(f64(raw_g)[0], f64(A_log), f64(dt_bias), -5.0)
    beta = torch.sigmoid(logits.double())
    o_ref, finals = expected(q, k, v, g_ref, beta, [vk(f64(before[i])) for i in idx.tolist()], [0, 1, 2])
    assert rmse_ratio(out[0], o_ref) < OUT
    assert max(rmse_ratio(pool[i], vk(S)) for i, S in zip(idx.tolist(), finals)) < POOL


def test_a_bad_out_is_refused_before_the_pool_is_touched():
    """An out= of the wrong shape or dtype, or overlapping an input, is refused naming out, and the
    pool keeps its states (the face used to update them, then refuse out)."""
    gen = torch.Generator().manual_seed(7)
    pool = pool_with_sentinels(gen)
    before = pool.clone()
    q, k, v, beta = tokens(2, gen)
    g = -torch.rand(1, 2, H, D, generator=gen)
    idx = torch.tensor([4, 2], dtype=torch.int32)
    for bad, exc, said in ((torch.empty(1, 2, H, D + 1).bfloat16(), ValueError, "out: expected the shape of v"),
                           (torch.empty_like(v, dtype=torch.float32), TypeError, "out: expected v's dtype"),
                           (v, ValueError, "out: expected memory separate from v"),
                           (q, ValueError, "out: expected memory separate from q")):
        with pytest.raises(exc, match=said):
            vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.arange(3),
                                     ssm_state_indices=idx, out=bad)
        assert torch.equal(pool, before)
    # adjacent is not overlapping: v and out side by side in one buffer are taken
    buf = torch.empty(2 * v.numel(), dtype=v.dtype)
    v2, out = buf[:v.numel()].view(v.shape), buf[v.numel():].view(v.shape)
    v2.copy_(v)
    o, _ = vllm.fused_recurrent_kda(q, k, v2, g, beta, initial_state=pool.clone(), cu_seqlens=torch.arange(3),
                                    ssm_state_indices=idx, out=out)
    assert o is out and out.abs().max() > 0


def test_speculative_decode_with_slot_rows_and_accepted_tokens():
    """[N, C] slots and num_accepted_tokens: sequence n starts from idx[n, a_n - 1] and the state
    after token t goes to idx[n, t] (a null-block entry skips that store)."""
    gen = torch.Generator().manual_seed(4)
    pool = pool_with_sentinels(gen)
    before = pool.clone()
    idx = torch.tensor([[1, 2, 3], [4, 5, 0]], dtype=torch.int32)
    acc = torch.tensor([2, 1], dtype=torch.int32)
    T = 3
    q, k, v, beta = tokens(2 * T, gen)
    g = -torch.rand(1, 2 * T, H, D, generator=gen)
    o, _ = vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.arange(0, 7, T),
                                    ssm_state_indices=idx, num_accepted_tokens=acc)
    ref = before.clone()
    for n in range(2):
        s = slice(n * T, (n + 1) * T)
        o_ref, states = run(f64(q)[0, s], f64(k)[0, s], f64(v)[0, s], f64(g)[0, s], f64(beta)[0, s],
                            vk(f64(before[idx[n, acc[n] - 1]])))
        assert rmse_ratio(o[0, s], o_ref) < OUT
        for t in range(T):
            if idx[n, t] > 0:
                ref[idx[n, t]] = torch.from_numpy(vk(states[t])).float()
    assert rmse_ratio(pool, ref.double().numpy()) < POOL
    assert torch.equal(pool[[0, 6, 7]], before[[0, 6, 7]])


def test_slot_0_holds_a_state_with_earlier_vllms_padding(monkeypatch):
    """NULL_BLOCK_ID = -1: earlier vLLM's convention (PAD_SLOT_ID -1 pads, slot 0 is a request's)."""
    monkeypatch.setattr(vllm, "NULL_BLOCK_ID", -1)
    gen = torch.Generator().manual_seed(7)
    pool = pool_with_sentinels(gen)
    before = pool.clone()
    q, k, v, beta = tokens(2, gen)
    g = -torch.rand(1, 2, H, D, generator=gen)
    o, _ = vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.arange(3),
                                    ssm_state_indices=torch.tensor([0, -1]))
    o_ref, (S,) = expected(q[:, :1], k[:, :1], v[:, :1], f64(g)[0, :1], beta[:, :1], [vk(f64(before[0]))], [0, 1])
    assert rmse_ratio(o[0, :1], o_ref) < OUT and rmse_ratio(pool[0], vk(S)) < POOL
    assert torch.equal(o[0, 1], torch.zeros_like(o[0, 1])) and torch.equal(pool[1:], before[1:])


def test_what_kdacupy_cannot_honour_raises_naming_it():
    gen = torch.Generator().manual_seed(5)
    A_log, dt_bias = params(gen)
    pool = pool_with_sentinels(gen)
    before = pool.clone()
    q, k, v, beta = tokens(2, gen)
    g = -torch.rand(1, 2, H, D)
    cu, idx = torch.arange(3), torch.tensor([1, 2])
    with pytest.raises(TypeError, match="'ssm_state_idx'"):
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu, ssm_state_idx=idx)
    with pytest.raises(NotImplementedError, match="^inplace_final_state"):
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx,
                                 inplace_final_state=False)
    with pytest.raises(ValueError, match="^ssm_state_indices"):
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu)
    with pytest.raises(ValueError, match="^a_log: .*compute_gate=True"):  # vLLM would drop it: g read as the decay
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx,
                                 a_log=A_log, g_bias=dt_bias)
    with pytest.raises(ValueError, match="^lower_bound: .*compute_gate=True"):
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx,
                                 lower_bound=-3.0)
    with pytest.raises(ValueError, match="^lower_bound: .*safe_gate=True"):
        vllm.chunk_kda_with_fused_gate(q, k, v, g, beta, A_log, dt_bias, cu_seqlens=cu, lower_bound=-3.0)
    with pytest.raises(ValueError, match="^lower_bound: .*safe_gate=True"):
        vllm.fused_kda_gate(g.reshape(2, H * D), A_log, D, lower_bound=-3.0)
    with pytest.raises(ValueError, match=r"^ssm_state_indices: expected \[N\] = \[1\] slots"):
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.tensor([0, 2]),
                                 ssm_state_indices=idx)
    with pytest.raises(ValueError, match="^num_accepted_tokens: expected None with \\[N\\]"):
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.tensor([0, 2]),
                                 ssm_state_indices=idx[:1], num_accepted_tokens=torch.tensor([1]))
    with pytest.raises(TypeError, match="^ssm_state_indices: expected an integer tensor, a list of ints"):
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=[1.0, 2.0])
    with pytest.raises(TypeError, match="^ssm_state_indices: expected an int32 or int64 tensor"):
        vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx.float())
    assert torch.equal(pool, before)


# vLLM's CPU KDA ops test (tests/kernels/mamba/cpu/test_cpu_kda_ops.py at 1b12080ef628534debf5cd9d173b4235b382142a):
# the recurrent op on unequal lengths, one slot per sequence, slot 0 the null block
SEQ_LENS, SLOTS = [17, 13, 10], [1, 3, 5]


def _unequal_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    T = sum(SEQ_LENS)
    q, k, v = (torch.randn(1, T, H, D, generator=gen) for _ in range(3))
    g, beta = torch.randn(1, T, H, D, generator=gen) * 0.5, torch.randn(1, T, H, generator=gen) * 0.5
    a_log, g_bias = torch.randn(H, generator=gen) * 0.3 - 1.0, torch.randn(H, D, generator=gen) * 0.1
    return q, k, v, g, beta, a_log, g_bias, torch.randn(P, H, D, D, generator=gen) * 0.3


@pytest.mark.parametrize("slots", [SLOTS, [0, 2, 0]], ids=["slots", "null-slots"])
def test_the_recurrent_op_on_unequal_lengths_as_vllms_cpu_ops_test_calls_it(slots):
    q, k, v, g, beta, a_log, g_bias, init = _unequal_inputs(12345)
    cu = torch.tensor([0] + list(np.cumsum(SEQ_LENS)), dtype=torch.int32)
    cache = init.clone()
    o, pool = vllm.fused_recurrent_kda(q.clone(), k.clone(), v.clone(), g.clone(), beta.clone(), initial_state=cache,
                                       use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                       ssm_state_indices=torch.tensor(slots, dtype=torch.int32), sigmoid_beta=True,
                                       a_log=a_log, g_bias=g_bias, compute_gate=True, lower_bound=-5.0)
    assert pool is cache
    gate = bounded_gate(f64(g)[0], f64(a_log), f64(g_bias), -5.0)
    starts = [vk(f64(init[s])) for s in slots]
    o_ref, finals = expected(q, k, v, gate, torch.sigmoid(beta), starts, cu.tolist())
    for n, s in enumerate(slots):
        rows = slice(int(cu[n]), int(cu[n + 1]))
        if s <= vllm.NULL_BLOCK_ID:  # skipped: zero output, the slot untouched
            assert not o[0, rows].any()
            continue
        assert rmse_ratio(o[0, rows], o_ref[rows]) < 1e-5
        assert rmse_ratio(cache[s], vk(finals[n])) < POOL
    untouched = [p for p in range(P) if p not in slots or p <= vllm.NULL_BLOCK_ID]
    assert torch.equal(cache[untouched], init[untouched])


def test_one_sequence_of_several_tokens_and_an_empty_one():
    q, k, v, g, beta, a_log, g_bias, init = _unequal_inputs(7)
    cu = torch.tensor([0, 0, 9])
    cache = init.clone()
    o, _ = vllm.fused_recurrent_kda(q[:, :9], k[:, :9], v[:, :9], -torch.rand(1, 9, H, D), beta[:, :9],
                                    initial_state=cache, cu_seqlens=cu, ssm_state_indices=torch.tensor([4, 6]),
                                    sigmoid_beta=True)
    assert torch.equal(cache[4], init[4]) and not torch.equal(cache[6], init[6])  # the empty one: its state kept
    assert o.shape == (1, 9, H, D) and o.abs().max() > 0


def fake_vllm(monkeypatch):
    """vLLM's module names in sys.modules: the ops module and a KDA layer module that imported
    the ops by name, each holding stand-ins that fail if called."""
    def stand_in(name):
        def engine_op(*args, **kwargs):
            raise AssertionError(f"vLLM's own {name} ran")
        return engine_op
    names = ("chunk_kda", "chunk_kda_with_fused_gate", "fused_recurrent_kda", "fused_kda_gate")
    ops = types.ModuleType("vllm.third_party.flash_linear_attention.ops.kda")
    for n in names:
        setattr(ops, n, stand_in(n))
    layer = types.ModuleType("vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn")
    for n in names:
        setattr(layer, n, getattr(ops, n))
    layer.FusedRMSNormGated = object()  # not a KDA op: left alone
    for name in ("vllm", "vllm.third_party", "vllm.third_party.flash_linear_attention",
                 "vllm.third_party.flash_linear_attention.ops", "vllm.model_executor", "vllm.model_executor.layers",
                 "vllm.model_executor.layers.mamba", "vllm.model_executor.layers.mamba.gdn"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, ops.__name__, ops)
    monkeypatch.setitem(sys.modules, layer.__name__, layer)
    return ops, layer, names


def test_patch_swaps_vllms_names_and_a_layers_decode_runs_on_kdacupy(monkeypatch):
    ops, layer, names = fake_vllm(monkeypatch)
    originals = {n: getattr(ops, n) for n in names}
    norm = layer.FusedRMSNormGated
    vllm.patch()
    try:
        vllm.patch()  # twice: still one patch
        for n in names:
            assert getattr(ops, n) is getattr(vllm, n) and getattr(layer, n) is getattr(vllm, n)
        assert layer.FusedRMSNormGated is norm
        gen = torch.Generator().manual_seed(6)
        A_log, dt_bias = params(gen)
        pool = pool_with_sentinels(gen)
        before = pool.clone()
        q, k, v, beta = tokens(1, gen)
        raw = torch.randn(1, H * D, generator=gen).bfloat16()
        # the layer's decode, through the names it imported
        g1 = layer.fused_kda_gate(raw, A_log, D, g_bias=dt_bias).unsqueeze(0)
        o, _ = layer.fused_recurrent_kda(q=q, k=k, v=v, g=g1, beta=beta, initial_state=pool,
                                         use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor([0, 1]),
                                         ssm_state_indices=torch.tensor([5]))
        g_ref = softplus_gate(f64(raw).reshape(1, H, D), f64(A_log), f64(dt_bias))
        o_ref, (S,) = expected(q, k, v, g_ref, beta, [vk(f64(before[5]))], [0, 1])
        assert rmse_ratio(o[0], o_ref) < OUT and rmse_ratio(pool[5], vk(S)) < POOL
    finally:
        vllm.unpatch()
    for n in names:
        assert getattr(ops, n) is originals[n] and getattr(layer, n) is originals[n]


def test_slots_per_sequence_of_several_tokens_without_cu_seqlens():
    """q [N, T, ...] (no packing), [N] slots, T = 3: each sequence from its slot, its final state back
    there; the null block's sequence gives zeros and its slot is untouched."""
    q, k, v, g, beta, a_log, g_bias, init = _unequal_inputs(21)
    N, T = 3, 3
    shape = lambda x: x[:, :N * T].reshape((N, T) + tuple(x.shape[2:]))  # noqa: E731
    q, k, v, g, beta = (shape(x) for x in (q, k, v, g, beta))
    cache = init.clone()
    slots = torch.tensor([2, vllm.NULL_BLOCK_ID, 6], dtype=torch.int32)
    o, _ = vllm.fused_recurrent_kda(q, k, v, g, beta, initial_state=cache, ssm_state_indices=slots, sigmoid_beta=True,
                                    a_log=a_log, g_bias=g_bias, compute_gate=True, lower_bound=-5.0)
    gate = bounded_gate(f64(g).reshape(N * T, H, D), f64(a_log), f64(g_bias), -5.0)
    starts = [vk(f64(init[int(s)])) for s in slots]
    flat = lambda x: x.reshape((1, N * T) + tuple(x.shape[2:]))  # noqa: E731
    o_ref, finals = expected(flat(q), flat(k), flat(v), gate, flat(torch.sigmoid(beta)), starts, [0, T, 2 * T, 3 * T])
    for n in (0, 2):
        assert rmse_ratio(o[n], o_ref[n * T:(n + 1) * T]) < 1e-5
        assert rmse_ratio(cache[int(slots[n])], vk(finals[n])) < POOL
    assert not o[1].any() and torch.equal(cache[[0, 1, 3, 4, 5, 7]], init[[0, 1, 3, 4, 5, 7]])

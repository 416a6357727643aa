"""The engines' tree verify and chunk states through kdacupy.compat (docs/design.md section 7.1),
on CPU torch tensors, against the float64 recurrence of tests/compat/reference.py run path by
path: SGLang's target_verify (an EAGLE tree of topk 2 and depth 4, retrieve_parent_token as its
conv kernel leaves it, the intermediate-state buffer, disable_state_update), SGLang's extend with
output_intermediate_states, and fla-core's chunk_kda with return_intermediate_states."""
import numpy as np
import pytest

from tests.compat.reference import f64, rmse_ratio, run, sigmoid, softplus_gate, vk
from tests.decode_trees import eagle_tree, path_to
from tests.frameworks.common import import_torch, one_thread

pytestmark = pytest.mark.torch
torch = import_torch()

import kdacupy.compat.fla as fla  # noqa: E402
import kdacupy.compat.sglang as sglang  # noqa: E402

H, D, P = 2, 64, 8
OUT, STATE, BF16_STATE = 2.5e-3, 1e-6, 2.0 ** -8


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def inputs(seed, n):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, n, H, D, generator=gen).bfloat16() for _ in range(3))
    A_log = torch.log(torch.empty(1, 1, H, 1).uniform_(1, 16, generator=gen))
    dt_bias = torch.randn(H * D, generator=gen)
    pool = torch.randn(P, H, D, D, generator=gen) * 0.1
    return gen, q, k, v, A_log, dt_bias, pool


@pytest.mark.parametrize("update", [False, True])
def test_sglang_target_verify_of_an_eagle_tree(update):
    """kda_triton's target_verify: N requests of T = 31 draft tokens packed by query_start_loc, the
    raw gate a [N * T, H * D], beta logits; token t starts from its parent's state; every token's
    state in intermediate_states[rows[n], t] ([HV, V, K], cache_steps = 32 per row); the pool only
    read with disable_state_update=True, else the last token's state written back; -1 pads."""
    parent = eagle_tree(2, 4)
    T, N = len(parent), 3
    gen, q, k, v, A_log, dt_bias, pool = inputs(20, N * T)
    a, b = torch.randn(N * T, H * D, generator=gen), torch.randn(N * T, H, generator=gen)
    idx = torch.tensor([5, -1, 1], dtype=torch.int32)
    parents = torch.tensor(np.stack([parent] * N), dtype=torch.int32)  # the root's entry 0, as SGLang's
    buf = torch.full((4, 32, H, D, D), 7.0)
    rows = torch.tensor([2, 0, 3], dtype=torch.int32)
    before, buf_before = pool.clone(), buf.clone()
    o = sglang.fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, initial_state_source=pool, initial_state_indices=idx,
        use_qk_l2norm_in_kernel=True, cu_seqlens=torch.arange(0, N * T + 1, T, dtype=torch.int32), is_kda=True,
        disable_state_update=not update, intermediate_states_buffer=buf, intermediate_state_indices=rows,
        cache_steps=32, retrieve_parent_token=parents)
    g = softplus_gate(f64(a).reshape(N * T, H, D), f64(A_log), f64(dt_bias))
    beta = sigmoid(f64(b))
    for n in (0, 2):
        s0 = vk(f64(before[idx[n]]))
        want_o, want_s = np.zeros((T, H, D)), np.zeros((T, H, D, D))
        for t in range(T):  # each token on its own root-to-token path, run alone
            path = [n * T + p for p in path_to(parent, t)]
            po, ps = run(f64(q)[0, path], f64(k)[0, path], f64(v)[0, path], g[path], beta[path], s0)
            want_o[t], want_s[t] = po[-1], ps[-1]
        assert rmse_ratio(o[0, n * T:(n + 1) * T], want_o) < OUT
        assert rmse_ratio(buf[rows[n], :T], vk(want_s)) < STATE
        assert torch.equal(buf[rows[n], T:], buf_before[rows[n], T:])
        if update:
            assert rmse_ratio(pool[idx[n]], vk(want_s[-1])) < STATE
    assert not torch.any(o[0, T:2 * T])  # the padded request
    assert torch.equal(buf[[0, 1]], buf_before[[0, 1]])  # row 0 is the padded request's, 1 is not named
    kept = [s for s in range(P) if not update or s not in (1, 5)]
    assert torch.equal(pool[kept], before[kept])


def test_sglang_linear_verify_and_its_checks():
    """topk 1 (no retrieve_parent_token): a chain, each step's state in the buffer; cache_steps
    below T and a non-contiguous buffer raise naming them, writing nothing."""
    T, N = 3, 2
    gen, q, k, v, A_log, dt_bias, pool = inputs(21, N * T)
    a, b = torch.randn(N * T, H * D, generator=gen), torch.randn(N * T, H, generator=gen)
    idx, cu = torch.tensor([3, 4]), torch.arange(0, N * T + 1, T)
    buf = torch.zeros(N, T, H, D, D)
    before = pool.clone()
    kw = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu, is_kda=True, disable_state_update=True,
              intermediate_state_indices=torch.arange(N))
    o = sglang.fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, idx,
                                                      intermediate_states_buffer=buf, cache_steps=T, **kw)
    g = softplus_gate(f64(a).reshape(N * T, H, D), f64(A_log), f64(dt_bias))
    for n in range(N):
        sl = slice(n * T, (n + 1) * T)
        ro, rs = run(f64(q)[0, sl], f64(k)[0, sl], f64(v)[0, sl], g[sl], sigmoid(f64(b)[sl]), vk(f64(pool[idx[n]])))
        assert rmse_ratio(o[0, sl], ro) < OUT and rmse_ratio(buf[n], vk(rs)) < STATE
    assert torch.equal(pool, before)
    for name, extra in (("cache_steps", dict(intermediate_states_buffer=buf, cache_steps=T - 1)),
                        ("intermediate_states_buffer", dict(intermediate_states_buffer=buf.transpose(-1, -2),
                                                            cache_steps=T))):
        with pytest.raises(ValueError, match=f"^{name}: expected"):
            sglang.fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, idx,
                                                          **extra, **kw)
    assert torch.equal(pool, before)


def states_after(q, k, v, g, beta, s0, ends):
    """The float64 states [HV, K, V] after each of ``ends`` tokens of one sequence."""
    _, states = run(q, k, v, g, beta, s0)
    return [states[e - 1] for e in ends]


def test_sglang_extend_with_output_intermediate_states():
    """TritonKDAKernel.extend(..., return_intermediate_states=True): (o, h [1, NT, HV, V, K]), the
    state entering each 64-token chunk of each request, its chunks after the requests before it,
    the first its slot's state (zeros for -1); o and the pool as without h."""
    lens = [130, 64, 5]
    gen, q, k, v, A_log, dt_bias, pool = inputs(22, sum(lens))
    idx = torch.tensor([6, -1, 2], dtype=torch.int32)
    cu = torch.tensor(np.cumsum([0] + lens), dtype=torch.int32)
    g = torch.randn(1, sum(lens), H, D, generator=gen).bfloat16()
    beta = torch.rand(1, sum(lens), H, generator=gen)
    before, plain_pool = pool.clone(), pool.clone()
    kw = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias)
    o, h = sglang.chunk_kda(q, k, v, g, beta, initial_state=pool, initial_state_indices=idx,
                            output_intermediate_states=True, **kw)
    o_plain = sglang.chunk_kda(q, k, v, g, beta, initial_state=plain_pool, initial_state_indices=idx, **kw)
    assert torch.equal(o, o_plain) and torch.equal(pool, plain_pool)
    assert h.shape == (1, 3 + 1 + 1, H, D, D) and h.dtype == q.dtype
    gl = softplus_gate(f64(g)[0], f64(A_log), f64(dt_bias))
    first = [0, 3, 4]
    for n, L in enumerate(lens):
        sl = slice(int(cu[n]), int(cu[n + 1]))
        s0 = np.zeros((H, D, D)) if idx[n] < 0 else vk(f64(before[idx[n]]))
        want = [s0] + states_after(f64(q)[0, sl], f64(k)[0, sl], f64(v)[0, sl], gl[sl], f64(beta)[0, sl], s0,
                                   [64 * j for j in range(1, -(-L // 64))])
        for j, S in enumerate(want):
            if idx[n] < 0 and j == 0:  # the padded request starts from zeros
                assert not torch.any(h[0, first[n]])
            else:
                assert rmse_ratio(h[0, first[n] + j], vk(S)) < BF16_STATE, (n, j)


@pytest.mark.parametrize("chunk_size,varlen", [(64, False), (32, True)])
def test_fla_chunk_kda_return_intermediate_states(chunk_size, varlen):
    """fla-core's chunk_kda(..., return_intermediate_states=True) in inference mode: (o, final_state,
    h [B, NT, HV, K, V] in q's dtype), h[:, i] the state entering chunk i (i = 0: the initial
    state); varlen: B = 1, NT the chunks of all sequences; o and final_state as without h."""
    gen = torch.Generator().manual_seed(23)
    lens = [70, 33] if varlen else [100, 100]
    B, T = (1, sum(lens)) if varlen else (2, 100)
    q, k, v = (torch.randn(B, T, H, D, generator=gen).bfloat16() for _ in range(3))
    g = (-torch.rand(B, T, H, D, generator=gen)).bfloat16()
    beta = torch.rand(B, T, H, generator=gen).bfloat16()
    h0 = torch.randn(len(lens), H, D, D, generator=gen) * 0.1
    cu = torch.tensor(np.cumsum([0] + lens), dtype=torch.int64) if varlen else None
    kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
              chunk_size=chunk_size)
    with torch.inference_mode():
        o, final, h = fla.chunk_kda(q, k, v, g, beta, return_intermediate_states=True, **kw)
        o2, final2 = fla.chunk_kda(q, k, v, g, beta, **kw)
    assert torch.equal(o, o2) and torch.equal(final, final2)
    chunks = [-(-L // chunk_size) for L in lens]
    assert h.shape == ((1, sum(chunks)) if varlen else (2, chunks[0])) + (H, D, D) and h.dtype == q.dtype
    flat = h.reshape(-1, H, D, D)
    at = 0
    for n, L in enumerate(lens):
        x = [f64(a)[0, sum(lens[:n]):sum(lens[:n + 1])] if varlen else f64(a)[n] for a in (q, k, v, g, beta)]
        want = [f64(h0[n])] + states_after(*x, f64(h0[n]), [chunk_size * j for j in range(1, chunks[n])])
        for j, S in enumerate(want):
            assert rmse_ratio(flat[at + j], S) < BF16_STATE, (n, j)
        at += chunks[n]

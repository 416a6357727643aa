"""Serving loops on kdacupy with each caller's own names: fla-core's (``kdacupy.compat.fla``),
vLLM's (``kdacupy.compat.vllm``) and SGLang's (``kdacupy.compat.sglang``), as their KDA layers
call them. Each loop prefills new requests into a state pool, decodes, and commits a
speculative step; at the end every request's accepted token stream is run once from a zero
state, and the loop's outputs and final states must be what that one pass gives.

- ``run`` (fla-core): prefill with ``chunk_kda`` from the pool's gathered states, scattered
  back; decode with ``fused_recurrent_kda_fwd`` and ``ssm_state_indices`` [N]; verify 1 + S
  tokens with ``ssm_state_indices`` [N, 1 + S]: the state after token t goes to slot
  ``idx[n, t]``, so whatever number the sampler accepts, the state after them is in a slot,
  and the next call starts there through ``num_accepted_tokens`` (the commit).
- ``run_vllm``: the KDA layer's prefill, ``chunk_kda_with_fused_gate`` (the raw gate, A_log
  [1, 1, H, 1]) on states gathered from the [P, HV, V, K] pool; its decode, ``fused_kda_gate``
  then ``fused_recurrent_kda`` on the pool; speculative decode as fla-core's, with vLLM's null
  block 0 never used for a request.
- ``run_sglang``: the KDA backend's extend, ``chunk_kda`` on the pool with its slots; its
  decode, ``fused_sigmoid_gating_delta_rule_update`` with the gate flat [N, H * K]; the commit
  of the tokens a sampler accepted out of a draft, run as one decode step of that many tokens
  (their state written back to the request's slot).

    python examples/serving_loop.py               # CPU tensors: the float64 reference
"""
from __future__ import annotations

import torch

import kdacupy.compat.fla as fla
import kdacupy.compat.sglang as sglang
import kdacupy.compat.vllm as vllm

H, HV, D, S = 1, 2, 64, 2  # query/key heads, value heads, head dim, drafts per verify


def tokens(gen, n, device):
    """n token rows of one layer's kernel inputs: q, k, v, g (log decay), beta."""
    q = torch.randn(n, H, D, generator=gen).to(device)
    k = torch.randn(n, H, D, generator=gen).to(device)
    v = torch.randn(n, HV, D, generator=gen).to(device)
    g = torch.nn.functional.logsigmoid(torch.randn(n, HV, D, generator=gen)).to(device)
    beta = torch.rand(n, HV, generator=gen).to(device)
    return [q, k, v, g, beta]


def packed(rows):
    """Concatenated rows as one packed [1, total, ...] batch."""
    return [torch.cat(parts)[None] for parts in zip(*rows)]


def starts(lengths, device):
    """cu_seqlens of packed sequences of these lengths."""
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device=device)


def compare(outputs, history, state_of, **gate):
    """(max |o - o_ref|, max |state - state_ref|): each request's accepted stream in one chunk_kda pass
    (fla-core's names) from a zero state; ``state_of(n)``: request n's state now, [K, V]."""
    err_o = err_s = 0.0
    for n in range(len(history)):
        stream = [torch.cat(parts)[None] for parts in zip(*history[n])]
        o_ref, s_ref = fla.chunk_kda(*stream, output_final_state=True, use_qk_l2norm_in_kernel=True, **gate)
        err_o = max(err_o, (torch.cat(outputs[n])[None] - o_ref).abs().max().item())
        err_s = max(err_s, (state_of(n) - s_ref[0]).abs().max().item())
    return err_o, err_s


def run(seed=0, prompt_lengths=(5, 9, 3), device="cpu"):
    """The fla-core loop; returns (max |o - o_ref|, max |state - state_ref|) against one pass."""
    gen = torch.Generator().manual_seed(seed)
    N = len(prompt_lengths)
    opts = dict(use_qk_l2norm_in_kernel=True)
    pool = torch.zeros(N * (1 + S) + 1, HV, D, D, device=device)  # [P, HV, K, V], fp32
    slots = torch.arange(N * (1 + S), device=device, dtype=torch.int32).reshape(N, 1 + S)
    current = slots[:, 0].clone()  # where each request's state is now
    history = [[] for _ in range(N)]  # each request's accepted token rows
    outputs = [[] for _ in range(N)]  # and the outputs the loop produced for them

    # prefill: packed prompts, states from and back to the pool
    prompts = [tokens(gen, n, device) for n in prompt_lengths]
    cu = starts(prompt_lengths, device)
    o, final = fla.chunk_kda(*packed(prompts), initial_state=pool[current.long()], output_final_state=True,
                             cu_seqlens=cu, **opts)
    pool[current.long()] = final
    for n in range(N):
        history[n].append(prompts[n])
        outputs[n].append(o[0, cu[n]:cu[n + 1]])

    def decode():
        step = [tokens(gen, 1, device) for _ in range(N)]
        o, _ = fla.fused_recurrent_kda_fwd(*packed(step), initial_state=pool,
                                           cu_seqlens=torch.arange(N + 1, device=device), ssm_state_indices=current,
                                           **opts)
        for n in range(N):
            history[n].append(step[n])
            outputs[n].append(o[0, n:n + 1])

    def verify(idx, accepted_before):
        step = [tokens(gen, 1 + S, device) for _ in range(N)]
        o, _ = fla.fused_recurrent_kda_fwd(*packed(step), initial_state=pool,
                                           cu_seqlens=torch.arange(0, N * (1 + S) + 1, 1 + S, device=device),
                                           ssm_state_indices=idx, num_accepted_tokens=accepted_before, **opts)
        accepted = torch.randint(1, 2 + S, (N,), generator=gen).to(device=device, dtype=torch.int32)  # the sampler's
        for n in range(N):
            a = int(accepted[n])
            history[n].append([x[:a] for x in step[n]])
            outputs[n].append(o[0, n * (1 + S):n * (1 + S) + a])
            current[n] = idx[n, a - 1]
        return accepted

    decode()
    # verify: column 0 is where each state is now, the others free slots of the request
    idx = torch.stack([torch.cat([current[n:n + 1], slots[n][slots[n] != current[n]]]) for n in range(N)])
    accepted = verify(idx, None)
    accepted = verify(idx, accepted)  # the same slots: it starts from idx[n, accepted[n] - 1] (the commit)
    decode()
    return compare(outputs, history, lambda n: pool[current[n].long()])


def raw_tokens(gen, n, device):
    """n token rows of a layer's inputs before the gate: q, k, v, the raw gate, beta logits."""
    q, k, v = (torch.randn(n, h, D, generator=gen).to(device) for h in (H, H, HV))
    return [q, k, v, torch.randn(n, HV, D, generator=gen).to(device), torch.randn(n, HV, generator=gen).to(device)]


def gate_params(gen, device):
    """A_log in the layers' parameter shape [1, 1, HV, 1] and dt_bias [HV * D]."""
    A_log = torch.log(torch.empty(1, 1, HV, 1).uniform_(1, 16, generator=gen)).to(device)
    return A_log, torch.randn(HV * D, generator=gen).to(device)


def run_vllm(seed=0, prompt_lengths=(5, 9, 3), device="cpu"):
    """vLLM's loop; returns (max |o - o_ref|, max |state - state_ref|) against one pass."""
    gen = torch.Generator().manual_seed(seed)
    N = len(prompt_lengths)
    A_log, dt_bias = gate_params(gen, device)
    pool = torch.zeros(1 + N * (1 + S), HV, D, D, device=device)  # [P, HV, V, K]; slot 0: vLLM's null block
    slots = torch.arange(1, 1 + N * (1 + S), device=device, dtype=torch.int32).reshape(N, 1 + S)
    current = slots[:, 0].clone()
    history, outputs = [[] for _ in range(N)], [[] for _ in range(N)]

    # prefill (the Kimi layer): zero the new requests' slots, gather, chunk_kda_with_fused_gate, scatter
    prompts = [raw_tokens(gen, n, device) for n in prompt_lengths]
    q, k, v, raw_g, b = packed(prompts)
    cu = starts(prompt_lengths, device).int()
    pool[current.long()] = 0
    o, last = vllm.chunk_kda_with_fused_gate(q=q, k=k, v=v, raw_g=raw_g, beta=b.sigmoid(), A_log=A_log,
                                             g_bias=dt_bias, initial_state=pool[current.long()].contiguous(),
                                             output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    pool[current.long()] = last
    for n in range(N):
        history[n].append(prompts[n])
        outputs[n].append(o[0, cu[n]:cu[n + 1]])

    def step(n_tokens, idx, accepted_before):
        rows = [raw_tokens(gen, n_tokens, device) for _ in range(N)]
        q, k, v, raw_g, b = packed(rows)
        g1 = vllm.fused_kda_gate(raw_g[0].reshape(-1, HV * D), A_log, D, g_bias=dt_bias).unsqueeze(0)
        o, _ = vllm.fused_recurrent_kda(q=q, k=k, v=v, g=g1, beta=b.sigmoid(), initial_state=pool,
                                        use_qk_l2norm_in_kernel=True,
                                        cu_seqlens=torch.arange(0, N * n_tokens + 1, n_tokens, device=device),
                                        ssm_state_indices=idx, num_accepted_tokens=accepted_before)
        return rows, o

    def decode():
        rows, o = step(1, current, None)
        for n in range(N):
            history[n].append(rows[n])
            outputs[n].append(o[0, n:n + 1])

    def verify(idx, accepted_before):
        rows, o = step(1 + S, idx, accepted_before)
        accepted = torch.randint(1, 2 + S, (N,), generator=gen).to(device=device, dtype=torch.int32)
        for n in range(N):
            a = int(accepted[n])
            history[n].append([x[:a] for x in rows[n]])
            outputs[n].append(o[0, n * (1 + S):n * (1 + S) + a])
            current[n] = idx[n, a - 1]
        return accepted

    decode()
    idx = torch.stack([torch.cat([current[n:n + 1], slots[n][slots[n] != current[n]]]) for n in range(N)])
    accepted = verify(idx, None)
    verify(idx, accepted)  # the commit: it starts from idx[n, accepted[n] - 1]
    decode()
    return compare(outputs, history, lambda n: pool[current[n].long()].transpose(-1, -2), use_gate_in_kernel=True,
                   A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)


def run_sglang(seed=0, prompt_lengths=(5, 9, 3), device="cpu"):
    """SGLang's loop; returns (max |o - o_ref|, max |state - state_ref|) against one pass."""
    gen = torch.Generator().manual_seed(seed)
    N = len(prompt_lengths)
    A_log, dt_bias = gate_params(gen, device)
    pool = torch.zeros(N + 1, HV, D, D, device=device)  # [P, HV, V, K]
    idx = torch.arange(N, device=device, dtype=torch.int32)  # one slot per request
    history, outputs = [[] for _ in range(N)], [[] for _ in range(N)]

    # extend: the prompts packed, each request's state from and back to its slot
    prompts = [raw_tokens(gen, n, device) for n in prompt_lengths]
    q, k, v, raw_g, b = packed(prompts)
    cu = starts(prompt_lengths, device).int()
    o = sglang.chunk_kda(q=q, k=k, v=v, g=raw_g, beta=b.sigmoid(), initial_state=pool, initial_state_indices=idx,
                         use_qk_l2norm_in_kernel=True, cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias, lower_bound=None,
                         output_intermediate_states=False)
    for n in range(N):
        history[n].append(prompts[n])
        outputs[n].append(o[0, cu[n]:cu[n + 1]])

    def decode(rows):
        """One decode step of len(rows[n][0]) tokens per request, the gate flat as [N * T, HV * D]."""
        T = rows[0][0].shape[0]
        q, k, v, raw_g, b = packed(rows)
        o = sglang.fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=raw_g[0].reshape(N * T, HV * D), b=b[0],
            initial_state_source=pool, initial_state_indices=idx,
            cu_seqlens=torch.arange(0, N * T + 1, T, device=device), use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0, softplus_threshold=20.0, is_kda=True)
        for n in range(N):
            history[n].append(rows[n])
            outputs[n].append(o[0, n * T:(n + 1) * T])

    decode([raw_tokens(gen, 1, device) for _ in range(N)])
    # the commit: the sampler accepted a tokens of a draft; they run as one step of a tokens per request
    a = int(torch.randint(1, 2 + S, (1,), generator=gen))
    decode([raw_tokens(gen, a, device) for _ in range(N)])
    decode([raw_tokens(gen, 1, device) for _ in range(N)])
    return compare(outputs, history, lambda n: pool[idx[n].long()].transpose(-1, -2), use_gate_in_kernel=True,
                   A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)


if __name__ == "__main__":
    for name, loop in (("fla-core", run), ("vLLM", run_vllm), ("SGLang", run_sglang)):
        err_o, err_s = loop()
        print(f"{name} loop vs one pass: max |o - o_ref| = {err_o:.2e}, max |state - state_ref| = {err_s:.2e}")

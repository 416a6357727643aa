"""A serving loop with FLA's names on kdacupy: prefill into a state pool, decode, and verify
speculative drafts, as a vLLM / SGLang KDA layer calls fla-core 0.6.0
(``from kdacupy.compat.fla import ...`` in place of ``from fla.ops.kda import ...``).

- prefill: the new requests' tokens packed with ``cu_seqlens``; ``chunk_kda`` starts from the
  pool's states (gathered) and returns the final states, which are scattered back;
- decode: one token per request, ``fused_recurrent_kda_fwd`` with ``ssm_state_indices`` [N],
  the pool updated in place;
- verify: 1 + S tokens per request (the last accepted one and S drafts), ``ssm_state_indices``
  [N, 1 + S]: the state after token t goes to slot ``idx[n, t]``, so whatever number of tokens
  the sampler accepts, the state after them is already in a slot; the next call starts there
  through ``num_accepted_tokens``.

At the end every request's accepted token stream is run once through ``chunk_kda`` from a
zero state: the outputs and the final state must be what the loop produced.

    python examples/serving_loop.py               # CPU tensors: the float64 reference
"""
from __future__ import annotations

import torch

from kdacupy.compat.fla import chunk_kda, fused_recurrent_kda_fwd

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


def run(seed=0, prompt_lengths=(5, 9, 3), device="cpu"):
    """The loop; returns (max |o - o_ref|, max |state - state_ref|) against one chunk_kda pass."""
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
    cu = torch.tensor([0] + list(torch.tensor(prompt_lengths).cumsum(0)), device=device)
    o, final = chunk_kda(*packed(prompts), initial_state=pool[current.long()], output_final_state=True,
                         cu_seqlens=cu, **opts)
    pool[current.long()] = final
    for n in range(N):
        history[n].append(prompts[n])
        outputs[n].append(o[0, cu[n]:cu[n + 1]])

    def decode():
        step = [tokens(gen, 1, device) for _ in range(N)]
        o, _ = fused_recurrent_kda_fwd(*packed(step), initial_state=pool, cu_seqlens=torch.arange(N + 1, device=device),
                                       ssm_state_indices=current, **opts)
        for n in range(N):
            history[n].append(step[n])
            outputs[n].append(o[0, n:n + 1])

    def verify(idx, accepted_before):
        step = [tokens(gen, 1 + S, device) for _ in range(N)]
        o, _ = fused_recurrent_kda_fwd(*packed(step), initial_state=pool,
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
    accepted = verify(idx, accepted)  # the same slots: it starts from idx[n, accepted[n] - 1]
    decode()

    err_o = err_s = 0.0
    for n in range(N):
        stream = [torch.cat(parts)[None] for parts in zip(*history[n])]
        o_ref, s_ref = chunk_kda(*stream, output_final_state=True, **opts)
        err_o = max(err_o, (torch.cat(outputs[n])[None] - o_ref).abs().max().item())
        err_s = max(err_s, (pool[current[n].long()] - s_ref[0]).abs().max().item())
    return err_o, err_s


if __name__ == "__main__":
    err_o, err_s = run()
    print(f"loop vs one pass: max |o - o_ref| = {err_o:.2e}, max |state - state_ref| = {err_s:.2e}")

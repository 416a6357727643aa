"""``chunk_kda(..., cp_context=...)``: FLA's context parallelism (fla/ops/cp) on
kdacupy.torch.kda_cp (docs/design.md section 7.3).

FLA's ``FLACPContext`` holds the process group and this rank's slice of the packed stream
as rank-local ``cu_seqlens`` (``build_cp_context`` cuts the global offsets into equal
shares), and ``pre_num_ranks > 0`` when the slice's first sequence began on an earlier rank.
With ``layout="zigzag"`` rank r holds parts r and 2W-1-r of 2W equal parts (``[front; back]``):
two contiguous passes, the back parts swapped between ranks r and W-1-r (``zigzag`` below).
As in FLA: q, k, v, g, beta are this rank's slice (B = 1), ``cu_seqlens`` is taken from the
context, and there is no initial or final state. kda_cp takes the global offsets: they are
rebuilt from every rank's local ones (one small all_gather of Python lists per call).
Gradients: the slice's, and this rank's shares of A_log's and dt_bias's (summed over the
group they are the whole loss's, as FLA's training loops sum replicated parameters').
"""
from __future__ import annotations

import torch

from kdacupy.torch import kda_cp
from kdacupy.torch.cp import fla_cu_seqlens
from kdacupy.torch.tensors import fp32_state_dtype


def cp_call(cp_context, q, initial_state, output_final_state, return_intermediate_states, use_graph, *, options,
            check_beta):
    """FLA's checks of a CP call, with its messages; then (the rank-local cu_seqlens, which
    chunk_kda's own checks read as FLA's do, and the forward to run instead of chunk_kda's).
    ``options``, ``check_beta``: compat.fla's keyword mapping and beta check."""
    # fla-core's AssertionErrors, in its order, raised as such under python -O too
    if initial_state is not None:
        raise AssertionError("Initial state is not supported for CP")
    if output_final_state is not False:
        raise AssertionError("Output final state is not supported for CP")
    if cp_context.cu_seqlens is None:
        raise AssertionError("cu_seqlens is required for CP")
    if return_intermediate_states:
        raise NotImplementedError("return_intermediate_states: not with cp_context (an inference-mode output; "
                                  "context parallelism is for training)")
    if use_graph:
        raise ValueError("use_graph: fla-core does not support cp_context with use_graph")

    def forward(fn, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, **fla):
        if fla["allow_neg_eigval"] and not fla["use_beta_sigmoid_in_kernel"]:
            raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
        check_beta(beta, v)
        if getattr(cp_context, "layout", "contiguous") == "zigzag":
            return zigzag(cp_context, q, k, v, g, beta, options(fn, **fla)), None
        o, _ = kda_cp(q, k, v, g, beta, group=cp_context.group, cu_seqlens=fla_cu_seqlens(cp_context, q.shape[1]),
                      **options(fn, **fla))
        return o, None

    return cp_context.cu_seqlens, forward


# ---------------------------------------------------------------------------
# FLA's zigzag layout: rank r holds parts r and 2W-1-r of the packed stream, [front; back]

def zigzag(cp_context, q, k, v, g, beta, opts):
    """chunk_kda on a zigzag context: two contiguous context-parallel passes. The front parts, in
    rank order, are the stream's first half: one kda_cp over it, which also gives the state where
    a sequence crosses the middle. The back parts are the second half in reverse rank order: each
    rank swaps its back part with rank W-1-r's (one exchange of q, k, v, g, beta), so rank r holds
    part W+r, runs kda_cp over the second half from that state, and the outputs are swapped back.
    Exact (the same maps as one pass); differentiable (the swaps' gradients are the same swaps)."""
    import torch.distributed as dist

    group = cp_context.group
    cu, L, W = zigzag_cu_seqlens(cp_context, q.shape[1])
    mid, rank = W * L, dist.get_rank(group)
    peer = None if W - 1 - rank == rank else dist.get_global_rank(group, W - 1 - rank)
    first, second = _halves(cu, mid)
    crossing = any(a < mid < b for a, b in zip(cu, cu[1:]))
    o1, s1 = kda_cp(*(None if x is None else x[:, :L] for x in (q, k, v, g, beta)), group=group, cu_seqlens=first,
                    output_final_state=crossing, state_dtype=fp32_state_dtype(q) if crossing else None, **opts)
    s2 = None
    if crossing:  # the crossing sequence is the first half's last and the second half's first
        s2 = torch.cat([s1[-1:], s1.new_zeros((len(second) - 2,) + tuple(s1.shape[1:]))])
    o2, _ = kda_cp(*(None if x is None else _Swap.apply(x[:, L:], group, peer) for x in (q, k, v, g, beta)),
                   group=group, cu_seqlens=second, initial_state=s2, **opts)
    return torch.cat([o1, _Swap.apply(o2, group, peer)], dim=1)


def _halves(cu, mid):
    """The global offsets of the stream's first ``mid`` tokens and of the rest (zero-length
    pieces dropped)."""
    def unique(xs):
        return [x for i, x in enumerate(xs) if i == 0 or x != xs[i - 1]]
    return unique([min(c, mid) for c in cu]), unique([max(c, mid) - mid for c in cu])


def zigzag_cu_seqlens(cp_context, tokens):
    """(the global cu_seqlens as a list, part length L, ranks W) of a zigzag FLACPContext: every
    rank's two parts' lengths gathered (one small all_gather of Python objects), put in chain order
    (part p on rank p for p < W, else on rank 2W-1-p), each part's first piece joined to the
    previous part's last where it continues it. A rank whose context does not fit makes every rank
    raise (none waits)."""
    import torch.distributed as dist

    mine, failure = None, None
    try:
        L = int(cp_context.part_len)
        local = cp_context.cu_seqlens_cpu if getattr(cp_context, "cu_seqlens_cpu", None) is not None \
            else cp_context.cu_seqlens
        local = [int(x) for x in local.tolist()]
        f = int(cp_context.front_num_seqs)
        if tokens != 2 * L or local[-1] != 2 * L or local[f] != L:
            raise ValueError(f"expected a zigzag context of two {L}-token parts for the rank's {tokens} tokens, got "
                             f"rank-local cu_seqlens {local} with front_num_seqs {f}")
        lens = lambda c: [b - a for a, b in zip(c, c[1:])]  # noqa: E731
        pre = cp_context.pre_num_ranks_by_part
        mine = (L, lens(local[:f + 1]), bool(pre[0]), lens(local[f:]), bool(pre[1]))
    except Exception as e:  # noqa: BLE001  (the other ranks must hear of it)
        failure = f"{type(e).__name__}: {e}"
    every = [None] * dist.get_world_size(cp_context.group)
    dist.all_gather_object(every, (mine, failure), group=cp_context.group)
    bad = [(r, f) for r, (_, f) in enumerate(every) if f is not None]
    if bad:
        raise ValueError(f"cp_context: rank {bad[0][0]}: {bad[0][1]}")
    W = len(every)
    if len({m[0] for m, _ in every}) != 1:
        raise ValueError(f"cp_context: expected one part length on every rank, got {[m[0] for m, _ in every]}")
    parts = [None] * (2 * W)
    for r, (m, _) in enumerate(every):
        parts[r], parts[2 * W - 1 - r] = (m[1], m[2]), (m[3], m[4])
    lengths = []
    for part_lengths, continues in parts:
        if continues and lengths and part_lengths:
            lengths[-1] += part_lengths[0]
            part_lengths = part_lengths[1:]
        lengths += part_lengths
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu, every[0][0][0], W


class _Swap(torch.autograd.Function):
    """x exchanged with the peer rank's tensor of the same shape (``peer``: its global rank; None:
    this rank's own, a copy); the gradient goes back by the same exchange."""

    @staticmethod
    def forward(ctx, x, group, peer):
        ctx.group, ctx.peer = group, peer
        return _exchange(x, group, peer)

    @staticmethod
    def backward(ctx, dx):
        return _exchange(dx, ctx.group, ctx.peer), None, None


def _exchange(x, group, peer):
    import torch.distributed as dist

    x = x.contiguous()
    if peer is None:
        return x.clone()
    got = torch.empty_like(x)
    sent, received = dist.isend(x, peer, group=group), dist.irecv(got, peer, group=group)
    sent.wait()
    received.wait()
    return got

"""``kdacupy.torch.kda_cp``: context parallelism on a ``torch.distributed`` process group
(docs/design.md sections 7.3 and 10.1).

Two custom ops, ``torch.ops.kdacupy.forward_cp`` and ``backward_cp``, run
``kdacupy.distributed.kda_forward_cp`` / ``kda_backward_cp`` with the group as their
communicator (its own backend: NCCL for CUDA tensors, gloo for CPU tensors), and
``register_autograd`` makes the first differentiable through the second. Custom ops rather
than a ``torch.autograd.Function``: the collectives run inside the ops' implementations, so
``torch.compile`` traces each call as one opaque op (fake implementations give the results'
shapes) with no graph break, as for ``kdacupy.torch.kda``; an op's schema cannot hold a
ProcessGroup, so the ops take the group's name and resolve it as torch's functional
collectives do (``kda_cp`` also keeps a registry of the groups it was given). Every rank
must run the forward and the backward of every call (the backward's collectives need every
rank), as in any context-parallel training step.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from kdacupy.distributed import kda_backward_cp, kda_forward_cp

from .api import _dense, _flag, _gate_params, _index_tensor, _name, _real, _rows, _tensors, _unexpected
from .bridge import empty_like_rows, numpy_dtype, on_torch_stream, to_array, to_tensor
from .ops import _forward_outputs_fake, _nothing

_GROUPS: dict = {}  # group name -> ProcessGroup, for the ops (kda_cp registers each group it is given)


def _group(name):
    """The process group of that name: torch's own resolution (as its functional collectives,
    whose ops also take group names, find theirs inside compiled graphs), else the registry."""
    resolve = getattr(torch.distributed.distributed_c10d, "_resolve_process_group", None)
    if resolve is not None:
        try:
            return resolve(name)
        except Exception:  # noqa: BLE001  (a torch that does not know the name: the registry's)
            pass
    group = _GROUPS.get(name)
    if group is None:
        raise ValueError(f"group: no process group named {name!r} was passed to kdacupy.torch.kda_cp")
    return group


@torch.library.custom_op("kdacupy::forward_cp", mutates_args=(), device_types=("cpu", "cuda"))
def forward_cp(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Optional[Tensor], initial_state: Optional[Tensor],
               cu_seqlens: Optional[Tensor], A_log: Optional[Tensor], dt_bias: Optional[Tensor], group: str,
               scale: Optional[float], output_final_state: bool, qk_l2norm: bool, beta_sigmoid: bool,
               allow_neg_eigval: bool, gate: str, lower_bound: Optional[float], state_layout: str,
               state_dtype: Optional[torch.dtype], state_precision: str,
               backend: Optional[str]) -> tuple[Tensor, Tensor]:
    """``kda_forward_cp`` on this rank's slice: (o, final_state or an empty tensor)."""
    with on_torch_stream(q.device):
        o = empty_like_rows(v)
        _, final = kda_forward_cp(
            to_array(q), to_array(k), to_array(v), to_array(g), to_array(beta), comm=_group(group), scale=scale,
            initial_state=to_array(initial_state), output_final_state=output_final_state,
            cu_seqlens=to_array(cu_seqlens), qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
            allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=to_array(A_log), dt_bias=to_array(dt_bias),
            lower_bound=lower_bound, state_layout=state_layout, state_dtype=numpy_dtype(state_dtype),
            state_precision=state_precision, out=to_array(o), backend=backend)
        return o, (to_tensor(final).contiguous() if final is not None else _nothing(v))


@forward_cp.register_fake
def _forward_cp_fake(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, group, scale, output_final_state,
                     qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_dtype,
                     state_precision, backend):
    return _forward_outputs_fake(q, v, initial_state, cu_seqlens, output_final_state, state_layout, state_dtype)


@torch.library.custom_op("kdacupy::backward_cp", mutates_args=(), device_types=("cpu", "cuda"))
def backward_cp(do: Tensor, dfinal_state: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, g: Tensor,
                beta: Optional[Tensor], initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
                A_log: Optional[Tensor], dt_bias: Optional[Tensor], group: str, scale: Optional[float],
                qk_l2norm: bool, beta_sigmoid: bool, allow_neg_eigval: bool, gate: str, lower_bound: Optional[float],
                state_layout: str, state_precision: str,
                backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``kda_backward_cp(shared_grads="local")``: this rank's slice's gradients and its shares of
    the shared arguments' (summed over the ranks they are the whole loss's, as DDP sums
    replicated parameters' gradients); ``dfinal_state`` is this rank's share of the final
    state's gradient. An empty tensor for an argument not given."""
    inputs = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    with on_torch_stream(q.device):
        grads = kda_backward_cp(
            to_array(do), to_array(q), to_array(k), to_array(v), to_array(g), to_array(beta), comm=_group(group),
            dfinal_state=to_array(dfinal_state), scale=scale, initial_state=to_array(initial_state),
            cu_seqlens=to_array(cu_seqlens), qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
            allow_neg_eigval=allow_neg_eigval, gate=gate, A_log=to_array(A_log), dt_bias=to_array(dt_bias),
            lower_bound=lower_bound, state_layout=state_layout, state_precision=state_precision, backend=backend,
            shared_grads="local")
        out = []
        for x, dx in zip(inputs, tuple(grads)):
            if x is None:
                out.append(_nothing(q))
            elif dx is None:
                out.append(torch.zeros_like(x))
            else:
                out.append(to_tensor(dx).reshape(x.shape).to(x.dtype).contiguous())
        return tuple(out)


@backward_cp.register_fake
def _backward_cp_fake(do, dfinal_state, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, group, scale,
                      qk_l2norm, beta_sigmoid, allow_neg_eigval, gate, lower_bound, state_layout, state_precision,
                      backend):
    return tuple(_nothing(q) if x is None else x.new_empty(x.shape)
                 for x in (q, k, v, g, beta, initial_state, A_log, dt_bias))


_TENSORS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias")
_OPTIONS = ("group", "scale", "output_final_state", "qk_l2norm", "beta_sigmoid", "allow_neg_eigval", "gate",
            "lower_bound", "state_layout", "state_dtype", "state_precision", "backend")
_BACKWARD_OPTIONS = ("group", "scale", "qk_l2norm", "beta_sigmoid", "allow_neg_eigval", "gate", "lower_bound",
                     "state_layout", "state_precision", "backend")


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:len(_TENSORS)])
    ctx.options = dict(zip(_OPTIONS, inputs[len(_TENSORS):]))
    final = output[1]
    ctx.final_like = (tuple(final.shape), final.dtype, final.device)


def _backward(ctx, do, dfinal_state):
    q, k, v, g, beta, h0, cu, A_log, dt_bias = ctx.saved_tensors
    opts = ctx.options
    # every rank takes part in the collectives with the same arguments: an output whose gradient
    # autograd did not materialise counts as zeros
    do = torch.zeros_like(v) if do is None else do.contiguous()
    dfinal = None
    if opts["output_final_state"]:
        shape, dtype, device = ctx.final_like
        dfinal = torch.zeros(shape, dtype=dtype, device=device) if dfinal_state is None else dfinal_state.contiguous()
    grads = torch.ops.kdacupy.backward_cp(do, dfinal, q, k, v, g, beta, h0, cu, A_log, dt_bias,
                                          *(opts[n] for n in _BACKWARD_OPTIONS))
    dq, dk, dv, dg, dbeta, dh0, dA, ddt = (None if x is None else d
                                          for x, d in zip((q, k, v, g, beta, h0, A_log, dt_bias), grads))
    return (dq, dk, dv, dg, dbeta, dh0, None, dA, ddt) + (None,) * len(_OPTIONS)


torch.library.register_autograd("kdacupy::forward_cp", _backward, setup_context=_setup_context)


def _group_name(group):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("kda_cp: torch.distributed is not initialised (call torch.distributed.init_process_group)")
    group = dist.group.WORLD if group is None else group
    name = group.group_name
    _GROUPS[name] = group
    return name


def kda_cp(q, k, v, g, beta=None, *, group=None, scale=None, initial_state=None, output_final_state=False,
           cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None,
           dt_bias=None, lower_bound=None, state_layout="kv", state_dtype=None, state_precision="bf16",
           backend=None, **unknown):
    """Kimi Delta Attention on this rank's contiguous slice of the tokens, across the ranks of
    ``group`` (a ``torch.distributed`` ProcessGroup; None: the default group): ``(o_local,
    final_state)``, as ``kdacupy.distributed.kda_forward_cp``, and differentiable, the backward
    through ``kda_backward_cp``.

    Ranks hold consecutive slices in group order, of any length: ``[B, T_r, ...]`` slices of
    the same B sequences, or with ``cu_seqlens`` (the GLOBAL packed offsets, the same on every
    rank; a host tensor or list spares a device-to-host copy) a slice of the packed stream.
    ``initial_state``, A_log and dt_bias are the same on every rank; ``final_state`` comes back
    the same on every rank. Gradients: q, k, v, g and beta of this rank's slice; for
    initial_state, A_log and dt_bias this rank's share, the whole loss's gradient being the sum
    of the shares over the group (sum them with the other replicated parameters' gradients,
    e.g. ``torch.distributed.all_reduce``, as DDP does); the loss is the sum of the ranks'
    losses, so the final state's gradient is the sum of what each rank's loss gives it. The
    other keywords are ``kdacupy.torch.kda``'s.
    """
    if unknown:
        _unexpected("kda_cp", unknown)
    _tensors(dict(q=q, k=k, v=v, g=g), dict(beta=beta, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias))
    if state_dtype is not None and not isinstance(state_dtype, torch.dtype):
        raise TypeError(f"state_dtype: expected a torch dtype or None, got {state_dtype!r}")
    cu = _index_tensor("cu_seqlens", cu_seqlens)
    q, k, v, g, beta = (_rows(x) for x in (q, k, v, g, beta))
    initial_state = _dense(initial_state)
    A_log, dt_bias = _gate_params(A_log, dt_bias)  # as kda: the parameters as a model holds them
    output_final_state = _flag("output_final_state", output_final_state)
    o, final = forward_cp(q, k, v, g, beta, initial_state, cu, A_log, dt_bias, _group_name(group),
                          _real("scale", scale), output_final_state, _flag("qk_l2norm", qk_l2norm),
                          _flag("beta_sigmoid", beta_sigmoid), _flag("allow_neg_eigval", allow_neg_eigval),
                          _name("gate", gate), _real("lower_bound", lower_bound), _name("state_layout", state_layout),
                          state_dtype, _name("state_precision", state_precision), _name("backend", backend))
    return o, (final if output_final_state else None)


def _local_offsets(cp_context) -> list:
    """A FLACPContext's rank-local cu_seqlens as ints (its host copy where it has one)."""
    local = cp_context.cu_seqlens_cpu if getattr(cp_context, "cu_seqlens_cpu", None) is not None \
        else cp_context.cu_seqlens
    return [int(x) for x in local.tolist()]


def _lengths(cu) -> list:
    return [b - a for a, b in zip(cu, cu[1:])]


def _gathered(cp_context, mine_of) -> list:
    """``mine_of()`` of every rank of the context's group (one small all_gather of Python objects); a
    rank where it raises makes every rank raise the same ValueError naming it (none waits in kda_cp)."""
    import torch.distributed as dist

    mine, failure = None, None
    try:
        mine = mine_of()
    except Exception as e:  # noqa: BLE001  (the other ranks must hear of it)
        failure = f"{type(e).__name__}: {e}"
    every = [None] * dist.get_world_size(cp_context.group)
    dist.all_gather_object(every, (mine, failure), group=cp_context.group)
    bad = [(r, f) for r, (_, f) in enumerate(every) if f is not None]
    if bad:
        raise ValueError(f"cp_context: rank {bad[0][0]}: {bad[0][1]}")
    return [m for m, _ in every]


def _joined(pieces) -> list:
    """The sequence lengths of consecutive pieces of the stream, in order: (the piece's lengths,
    whether its first one continues the previous piece's last)."""
    lengths = []
    for piece, continues in pieces:
        if continues and lengths and piece:
            lengths[-1] += piece[0]
            piece = piece[1:]
        lengths += piece
    return lengths


def fla_cu_seqlens(cp_context, tokens: int):
    """The global ``cu_seqlens`` of FLA's ``FLACPContext`` (fla/ops/cp: rank-local offsets, and
    ``pre_num_ranks > 0`` when the slice's first sequence began on an earlier rank), gathered
    from every rank of its group: each rank's local lengths, its first one joined to the previous
    rank's last when it continues it. A rank whose context does not fit its slice makes every
    rank raise (none waits in kda_cp)."""
    def mine():
        local = _local_offsets(cp_context)
        if local[-1] != tokens:
            raise ValueError(f"expected rank-local cu_seqlens ending at the rank's {tokens} tokens, got {local}")
        return _lengths(local), bool(cp_context.pre_num_ranks)

    lengths = _joined(_gathered(cp_context, mine))
    return torch.tensor([0] + list(torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()), dtype=torch.int64)


# ---------------------------------------------------------------------------
# FLA's zigzag layout: rank r holds parts r and 2W-1-r of the packed stream, [front; back]

def fla_zigzag(cp_context, q, k, v, g, beta, opts):
    """chunk_kda on a zigzag context: two contiguous context-parallel passes. The front parts, in
    rank order, are the stream's first half: one kda_cp over it, which also gives the state where
    a sequence crosses the middle. The back parts are the second half in reverse rank order: each
    rank swaps its back part with rank W-1-r's (one exchange of q, k, v, g, beta), so rank r holds
    part W+r, runs kda_cp over the second half from that state, and the outputs are swapped back.
    Exact (the same maps as one pass); differentiable (the swaps' gradients are the same swaps)."""
    import torch.distributed as dist

    from .tensors import fp32_state_dtype

    group = cp_context.group
    cu, L, W = fla_zigzag_cu_seqlens(cp_context, q.shape[1])
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


def fla_zigzag_cu_seqlens(cp_context, tokens):
    """(the global cu_seqlens as a list, part length L, ranks W) of a zigzag FLACPContext: every
    rank's two parts' lengths gathered, put in chain order (part p on rank p for p < W, else on
    rank 2W-1-p), each part's first piece joined to the previous part's last where it continues it.
    A rank whose context does not fit makes every rank raise (none waits)."""
    def mine():
        L = int(cp_context.part_len)
        local = _local_offsets(cp_context)
        f = int(cp_context.front_num_seqs)
        if tokens != 2 * L or local[-1] != 2 * L or local[f] != L:
            raise ValueError(f"expected a zigzag context of two {L}-token parts for the rank's {tokens} tokens, got "
                             f"rank-local cu_seqlens {local} with front_num_seqs {f}")
        pre = cp_context.pre_num_ranks_by_part
        return L, (_lengths(local[:f + 1]), bool(pre[0])), (_lengths(local[f:]), bool(pre[1]))

    every = _gathered(cp_context, mine)
    W = len(every)
    if len({L for L, _, _ in every}) != 1:
        raise ValueError(f"cp_context: expected one part length on every rank, got {[L for L, _, _ in every]}")
    parts = [None] * (2 * W)
    for r, (_, front, back) in enumerate(every):
        parts[r], parts[2 * W - 1 - r] = front, back
    cu = [0]
    for n in _joined(parts):
        cu.append(cu[-1] + n)
    return cu, every[0][0], W


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

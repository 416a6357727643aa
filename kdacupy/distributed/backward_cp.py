"""Context parallelism's backward: ``kda_backward`` over a sequence split across ranks
(docs/design.md section 7.3).

The state's gradient flows backward through a piece affinely, as the state flows forward:
``dS_start = M^T dS_end + D``, with ``M`` the piece's forward map and ``D`` the gradient of
the piece's own output terms with respect to its start state (which does not depend on that
state). So one allgather of every rank's carried maps ``(M, B)`` and of its first piece's
adjoint gives every rank both the start state of each of its pieces (the forward's scan) and
the gradient at each piece's end (the same scan backward, from the rank that holds the
sequence's end); then each rank runs the single-process ``kda_backward`` on its slice from
those, and the shared arguments' gradients are summed over the ranks in rank order.
"""
from __future__ import annotations

from ..backward import KDAGradients
from .agree import agreed, collective_check
from .call import LocalCall, looks_device
from .comm import wrap
from .shard import Shard, plans_for


def kda_backward_cp(do, q, k, v, g, beta=None, *, comm, dfinal_state=None, cu_seqlens=None, initial_state=None,
                    state_layout="kv", shared_grads="total", **options):
    """``kda_backward`` on this rank's contiguous slice of the tokens: the gradients of the
    loss ``sum over ranks of sum(o_r * do_r) + sum(final_state * dfinal_state)``, where
    ``o_r, final_state`` are what ``kda_forward_cp`` returns for the same arguments.

    Slices, ``cu_seqlens`` (global), ``initial_state`` and ``comm`` as in ``kda_forward_cp``;
    ``do``: this rank's slice of the output's gradient; the other keywords are kda_backward's
    (the options that change the result). Returns ``KDAGradients``: dq, dk, dv, dg and dbeta of
    this rank's slice, and the gradients of the arguments every rank shares (initial_state,
    A_log, dt_bias), each in its argument's dtype and shape (None where not given).

    ``shared_grads="total"`` (the default): ``dfinal_state`` is the whole loss's gradient, the
    same on every rank, and dinitial_state, dA_log and ddt_bias are the whole loss's, the same
    on every rank. ``"local"``: ``dfinal_state`` is this rank's share of it (the shares are
    summed) and the three are this rank's shares, whose sum over the ranks is the whole loss's:
    what a training loop wants that sums the gradients of replicated parameters over the ranks
    (as DDP does, and as kdacupy.torch.kda_cp's autograd does).

    Deterministic: every sum runs in a fixed order (the chains in rank order, the shares summed
    in rank order), so the same ranks give the same bits on every run.

    Communication per rank: one small allgather of the call signatures (64 KiB each), one of
    the maps and adjoints, ``HV x K x (K + 2V)`` values per sequence crossing a rank boundary
    (fixed-length input: every sequence; varlen: at most one per rank), in fp32 (float64 on
    the float64 reference) -- at HV = 32, K = V = 128 that is 6.3 MB per rank; with
    ``"local"`` and a ``dfinal_state`` one allgather of the shares of it, and with ``"total"``
    one allgather of the shared gradients' shares (``N x HV x K x V + HV (K + 1)`` values), and
    two 4 KiB agreements. None of it depends on T. A rank that fails in any way makes every
    rank raise the same error naming it and the step, as ``kda_forward_cp`` does.
    """
    fn = "kda_backward_cp"
    eng = wrap(comm, looks_device(q))
    call, tokens = collective_check(eng, fn, lambda: LocalCall(
        q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, state_layout=state_layout,
        options=options, do=do, dfinal_state=dfinal_state, shared_grads=shared_grads))
    shard = Shard(call, plans_for(call, tokens, fn), eng.rank)
    dfinal = None
    if call.ds is not None:
        dfinal = call.kv(call.ds)
        if shared_grads == "local":  # the shares, summed in rank order
            dfinal = _sum_rows(eng.allgather(dfinal))
    gathered = None
    if shard.carries:
        gathered = eng.allgather(agreed(eng, fn, "computing its state maps and adjoints",
                                        lambda: shard.backward_rows(dfinal)))
    local, shares = agreed(eng, fn, "running its local backward", lambda: shard.backward(gathered, dfinal))
    if shared_grads == "total":
        shares = _summed(eng, shares, shard.xp)
    return KDAGradients(*local, *shard.shared_gradients(shares))


def _sum_rows(rows):
    acc = rows[0].copy()
    for r in range(1, rows.shape[0]):
        acc += rows[r]
    return acc


def _summed(eng, shares, xp):
    """Every rank's shares summed in rank order (one allgather of them packed), the same on every rank."""
    present = [(n, x) for n, x in shares.items() if x is not None]
    if not present:
        return shares
    flat = xp.concatenate([x.reshape(-1) for _, x in present])
    total = _sum_rows(eng.allgather(flat))
    out, at = dict(shares), 0
    for n, x in present:
        out[n] = total[at:at + x.size].reshape(x.shape)
        at += x.size
    return out

"""Context parallelism: ``kda_forward`` over a sequence split across ranks.

A piece of a sequence acts on the state as an affine map,
``S_end = M S_start + B`` (docs/design.md section 7.3). Each rank computes the maps
of the pieces that continue past its slice, one allgather gives every rank
every map, each rank scans them (fp32) into the start states of its own
pieces, and runs the ordinary forward on its slice from those states
(kdacupy/distributed/shard.py holds the local steps).
"""
from __future__ import annotations

from .agree import ContextParallelError, agreed, collective_check
from .call import LocalCall, looks_device
from .comm import wrap
from .shard import Shard, plans_for

__all__ = ["kda_forward_cp", "ContextParallelError"]


def kda_forward_cp(q, k, v, g, beta=None, *, comm, cu_seqlens=None, initial_state=None,
                   output_final_state=False, state_layout="kv", state_dtype=None, out=None, **options):
    """``kda_forward`` on this rank's contiguous slice of the tokens.

    Ranks hold consecutive slices in communicator order, of any length (zero
    included): ``[B, T_r, ...]`` slices of the same B sequences, or with
    ``cu_seqlens`` (the GLOBAL packed offsets, the same on every rank, B = 1)
    a slice of the packed stream, so sequences may span ranks.
    ``initial_state`` (the same on every rank) applies where a sequence starts;
    the returned ``final_state`` is the same on every rank. ``comm``: an mpi4py
    communicator, a ``cupy.cuda.nccl.NcclCommunicator`` for CuPy arrays, or a
    ``torch.distributed`` ProcessGroup. Other keywords are kda_forward's.
    Returns ``(o_local, final_state)``.

    Communication: one small allgather of each rank's call signature (bad or
    mismatched input raises the same error on every rank), one allgather of
    the fp32 maps (ranks x HV x K x (K + V) x 4 bytes per carried sequence),
    and with ``output_final_state`` one allreduce of the final states. After
    each local step (the maps, the local forward) the ranks agree through one
    small allgather (4 KiB per rank): a rank that fails in any way (out of
    memory, a compile failure) makes every rank raise the same
    ``ContextParallelError`` naming it, instead of leaving the others waiting.
    """
    fn = "kda_forward_cp"
    eng = wrap(comm, looks_device(q))
    call, tokens = collective_check(eng, fn, lambda: LocalCall(
        q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
        output_final_state=output_final_state, state_layout=state_layout, state_dtype=state_dtype, out=out,
        options=options))
    shard = Shard(call, plans_for(call, tokens, fn), eng.rank)
    gathered = None
    if shard.carries:  # every rank knows this from the plans: otherwise no collective at all
        gathered = eng.allgather(agreed(eng, fn, "computing its state maps", shard.forward_rows))
    o, share = agreed(eng, fn, "running its local forward", lambda: shard.forward(gathered))
    final = shard.final_state(eng.allreduce_sum(share)) if call.output_final_state else None
    return o, final

"""Every variant of the backward's kernels the library can launch, registered with
``kdacupy.jit.registry`` (what ``python -m kdacupy.compile`` builds). The backward also launches the
forward's prepare and its recurrence with ``store_states`` (registered here too), as does
``kda_forward(save_for_backward=True)`` with its output on."""
from __future__ import annotations

import itertools

from ...jit import registry
from ..forward.kernels import RecurrenceVariant
from ..forward.limits import DIMS
from ..forward.tuning import candidates
from ..inputs import DTYPES, input_option_space
from .kernels import ChainVariant, ChunkVariant, ReduceVariant
from .tiles import chunk_block


def chain_variants(any_dims=False):
    for K, V, dt in itertools.product(DIMS, DIMS, DTYPES):
        for tiles in candidates(V):
            yield ChainVariant(K, V, dt, tiles, any_dims)


def chunk_variants(any_dims=False):
    for K, options in itertools.product(DIMS, input_option_space()):
        yield ChunkVariant(K, *options, any_dims=any_dims)
        if chunk_block(K, 128, "sm_90a"):  # the wide block (ChunkVariant.only_arches: where it fits)
            yield ChunkVariant(K, *options, any_dims=any_dims, bvc=chunk_block(K, 128, "sm_90a"))


def state_store_variants(any_dims=False):
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in candidates(V):
            yield RecurrenceVariant(K, V, dt, fp32, tiles, no_output=True, store_states=True, any_dims=any_dims)


def kept_forward_variants(any_dims=False):
    """kda_forward(save_for_backward=True)'s recurrence: its output and the chunk states (mma.sync)."""
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in candidates(V):
            if tiles.mma == "sync":
                yield RecurrenceVariant(K, V, dt, fp32, tiles, no_output=False, store_states=True, any_dims=any_dims)


def reduce_variants():
    for K in DIMS:
        yield ReduceVariant(K)


registry.register("kda_bwd_chain", chain_variants)
registry.register("kda_bwd_chunk", chunk_variants)
registry.register("kda_bwd_reduce", reduce_variants)
registry.register("kda_recurrence_store", state_store_variants)
registry.register("kda_recurrence_kept", kept_forward_variants)
# the any-size variants (KDA_ANY_DIMS): one per fixed-size variant, shared by every head dim that rounds up
# to its tiles (kdacupy/numerics/tiles.py); kda_bwd_reduce takes the true dim as an argument in every variant
registry.register("kda_bwd_chain_any", lambda: chain_variants(any_dims=True))
registry.register("kda_bwd_chunk_any", lambda: chunk_variants(any_dims=True))
registry.register("kda_recurrence_store_any", lambda: state_store_variants(any_dims=True))
registry.register("kda_recurrence_kept_any", lambda: kept_forward_variants(any_dims=True))

"""Every variant of the backward's kernels the library can launch, registered with
``kdacupy.jit.registry`` (what ``python -m kdacupy.compile`` builds). The backward also launches the
forward's prepare and its recurrence with ``store_states`` (registered here too)."""
from __future__ import annotations

import itertools

from ...jit import registry
from ..forward.kernels import RecurrenceVariant
from ..forward.limits import DIMS
from ..forward.tuning import candidates
from ..inputs import DTYPES, input_option_space
from .kernels import ChainVariant, ChunkVariant, ReduceVariant


def chain_variants():
    for K, V, dt in itertools.product(DIMS, DIMS, DTYPES):
        for tiles in candidates(V):
            yield ChainVariant(K, V, dt, tiles)


def chunk_variants():
    for K, options in itertools.product(DIMS, input_option_space()):
        yield ChunkVariant(K, *options)


def state_store_variants():
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in candidates(V):
            yield RecurrenceVariant(K, V, dt, fp32, tiles, no_output=True, store_states=True)


def reduce_variants():
    for K in DIMS:
        yield ReduceVariant(K)


registry.register("kda_bwd_chain", chain_variants)
registry.register("kda_bwd_chunk", chunk_variants)
registry.register("kda_bwd_reduce", reduce_variants)
registry.register("kda_recurrence_store", state_store_variants)

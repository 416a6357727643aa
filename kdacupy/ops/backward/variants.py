"""Every variant of the backward's kernels the library can launch, registered with
``kdacupy.jit.registry`` (what ``python -m kdacupy.compile`` builds). The backward also launches the
forward's prepare and its recurrence with ``store_states`` (registered here too)."""
from __future__ import annotations

import itertools

from ...jit import registry
from ...numerics.dtypes import BF16, F16, F32
from ..forward.kernels import BETA_CODE, GATE_CODE, RecurrenceVariant
from ..forward.limits import DIMS
from ..forward.tuning import TILE_SPACE
from .kernels import ChainVariant, ChunkVariant, ReduceVariant

DTYPES = (BF16, F16, F32)


def chain_variants():
    for K, V, dt in itertools.product(DIMS, DIMS, DTYPES):
        for tiles in TILE_SPACE:
            if tiles.BV <= V:
                yield ChainVariant(K, V, dt, tiles)


def chunk_variants():
    for K, dt, gate, l2 in itertools.product(DIMS, DTYPES, GATE_CODE, (False, True)):
        for gdt in dict.fromkeys((dt, F32)):
            for beta_mode in BETA_CODE:
                for bdt in ((dt,) if beta_mode == "none" else dict.fromkeys((dt, F32))):
                    yield ChunkVariant(K, dt, gdt, bdt, gate, beta_mode, l2)


def state_store_variants():
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in TILE_SPACE:
            if tiles.BV <= V:
                yield RecurrenceVariant(K, V, dt, fp32, tiles, no_output=True, store_states=True)


def reduce_variants():
    for K in DIMS:
        yield ReduceVariant(K)


registry.register("kda_bwd_chain", chain_variants)
registry.register("kda_bwd_chunk", chunk_variants)
registry.register("kda_bwd_reduce", reduce_variants)
registry.register("kda_recurrence_store", state_store_variants)

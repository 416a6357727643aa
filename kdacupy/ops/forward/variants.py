"""Every variant of the forward's two kernels the library can launch, registered
with ``kdacupy.jit.registry`` (what ``python -m kdacupy.compile`` builds)."""
from __future__ import annotations

import itertools

from ...jit import registry
from ...numerics.dtypes import BF16
from ..inputs import DTYPES, input_option_space
from .limits import DIMS
from .kernels import PrepareVariant, RecurrenceVariant
from .tuning import TileConfig, candidates


def prepare_variants():
    for K, options in itertools.product(DIMS, input_option_space()):
        yield PrepareVariant(K, *options)


def recurrence_variants():
    """Every shape, dtype, state precision and tile; the checkpoints' variant (kda_forward's
    checkpoint_every) at bf16 inputs, every tile at K = V = 128 and the widest elsewhere."""
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in candidates(V):
            yield RecurrenceVariant(K, V, dt, fp32, tiles)
    for K, V, fp32 in itertools.product(DIMS, DIMS, (False, True)):
        for tiles in candidates(V) if (K, V) == (128, 128) else candidates(V)[-1:]:
            yield RecurrenceVariant(K, V, BF16, fp32, tiles, checkpoints=True)


def recurrence_wgmma_variants():
    """The wgmma recurrence's variants (sm_90a only: ``RecurrenceVariant.only_arch``): every shape it
    serves (K <= 128), dtype, state precision and wgmma tile; the checkpoints' at K = V = 128."""
    for K, V, dt, fp32 in itertools.product((64, 128), DIMS, DTYPES, (False, True)):
        for tiles in candidates(V, "sm_90a", K):
            if tiles.mma == "wgmma":
                yield RecurrenceVariant(K, V, dt, fp32, tiles)
    for fp32 in (False, True):
        yield RecurrenceVariant(128, 128, BF16, fp32, TileConfig(64, 3, "wgmma"), checkpoints=True)


def recurrence_tcgen05_variants():
    """The tcgen05 recurrence's variants (sm_100a only: ``RecurrenceVariant.only_arch``): K <= 128,
    V >= 128 (BV = 128), every dtype, state precision and tcgen05 tile; the checkpoints' at K = V = 128."""
    for K, V, dt, fp32 in itertools.product((64, 128), DIMS, DTYPES, (False, True)):
        for tiles in candidates(V, "sm_100a", K):
            if tiles.mma == "tcgen05":
                yield RecurrenceVariant(K, V, dt, fp32, tiles)
    for fp32 in (False, True):
        yield RecurrenceVariant(128, 128, BF16, fp32, TileConfig(128, 3, "tcgen05"), checkpoints=True)


def prepare_core_variants():
    """kda_prepare writing the core-matrix workspace the wgmma and tcgen05 recurrences read (K <= 128)."""
    for K, options in itertools.product((64, 128), input_option_space()):
        yield PrepareVariant(K, *options, ws_core=True)


def prepare_any_variants():
    """kda_prepare's any-size variants (KDA_ANY_DIMS): one per key tile and input options, which every
    head dim in [16, 256] that rounds up to the tile shares (kernels.tiles_of)."""
    for K, options in itertools.product(DIMS, input_option_space()):
        yield PrepareVariant(K, *options, any_dims=True)


def recurrence_any_variants():
    """kda_recurrence's any-size variants: one per key and value tile, dtype, state precision and
    tile (mma.sync), shared as the prepare's are; the checkpoints' at the widest tile."""
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in candidates(V):
            yield RecurrenceVariant(K, V, dt, fp32, tiles, any_dims=True)
    for K, V, fp32 in itertools.product(DIMS, DIMS, (False, True)):
        yield RecurrenceVariant(K, V, BF16, fp32, candidates(V)[-1], checkpoints=True, any_dims=True)


registry.register("kda_prepare", prepare_variants)
registry.register("kda_recurrence", recurrence_variants)
registry.register("kda_recurrence_wgmma", recurrence_wgmma_variants)
registry.register("kda_recurrence_tcgen05", recurrence_tcgen05_variants)
registry.register("kda_prepare_core", prepare_core_variants)
registry.register("kda_prepare_any", prepare_any_variants)
registry.register("kda_recurrence_any", recurrence_any_variants)

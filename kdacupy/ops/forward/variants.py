"""Every variant of the forward's two kernels the library can launch, registered
with ``kdacupy.jit.registry`` (what ``python -m kdacupy.compile`` builds)."""
from __future__ import annotations

import itertools

from ...jit import registry
from ...numerics.dtypes import BF16
from ..inputs import DTYPES, input_option_space
from .limits import DIMS
from . import fused
from .fused import FusedVariant
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


#: the descriptor families' target (``RecurrenceVariant.only_arch``) and their checkpoints' tile
CORE_FAMILY_TARGETS = {"wgmma": ("sm_90a", TileConfig(64, 3, "wgmma")), "tcgen05": ("sm_100a", TileConfig(128, 3, "tcgen05"))}


def recurrence_core_variants(family: str):
    """The wgmma (sm_90a) or tcgen05 (sm_100a) recurrence's variants, built for that target only: every
    shape they serve (K <= 128), dtype, state precision and tile of the family; the checkpoints' at
    K = V = 128."""
    arch, ckpt_tiles = CORE_FAMILY_TARGETS[family]
    for K, V, dt, fp32 in itertools.product((64, 128), DIMS, DTYPES, (False, True)):
        for tiles in candidates(V, arch, K):
            if tiles.mma == family:
                yield RecurrenceVariant(K, V, dt, fp32, tiles)
    for fp32 in (False, True):
        yield RecurrenceVariant(128, 128, BF16, fp32, ckpt_tiles, checkpoints=True)


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


def fused_variants():
    """The fused forward's (ops/forward/fused.py; wgmma's for sm_90a, tcgen05's for sm_100a): every key dim it
    serves, value dim, state precision, stage count and (tcgen05) consumer tile, at each input dtype with
    sigmoid gates and betas and the l2norm; then, at V = 128 and 3 stages, every gate, q / k and g dtype and
    l2norm choice (its prepare build is its own: with the bf16 state KDA_G_PAIRS, and every build at the fused
    kernel's registers, not kda_prepare's 128); and the split forward's final launch (wgmma), every key dim,
    value dim, state precision and stage count at Kimi's input options, and its maps with their prepare (the
    merged maps of K = V, the only ones on one warpgroup) at every key dim and stage count."""
    def variant(K, V, fp32, tiles, options, split=False):
        return FusedVariant(PrepareVariant(K, *options, ws_core=True, g_pairs=fused.g_pairs(fp32)),
                            RecurrenceVariant(K, V, options[0], fp32, tiles), fused.RING_SLOTS, fused.GROUP, split)

    def consumer_tiles(K, V, fp32, stages):
        yield TileConfig(fused.BV, stages, "wgmma")
        for bv in (64, 128):
            if V % bv == 0 and 2 * fused.tcgen05_columns(K, bv, fp32) <= fused.TMEM_COLUMNS:
                yield TileConfig(bv, stages, "tcgen05")

    for K, V, fp32, stages in itertools.product((64, 128), (64, 128, 256), (False, True), (2, 3)):
        for options in input_option_space():
            dt, g_dt, b_dt, gate, beta, l2 = options
            if g_dt == dt and b_dt == dt and gate == "sigmoid" and beta == "sigmoid" and l2:
                for tiles in consumer_tiles(K, V, fp32, stages):
                    yield variant(K, V, fp32, tiles, options)
    for K, fp32 in itertools.product((64, 128), (False, True)):
        for options in input_option_space():
            dt, g_dt, b_dt, gate, beta, l2 = options
            if b_dt == dt and beta == "sigmoid" and not (g_dt == dt and gate == "sigmoid" and l2):
                for tiles in consumer_tiles(K, 128, fp32, 3):
                    yield variant(K, 128, fp32, tiles, options)
    default = next(o for o in input_option_space()  # Kimi's: bf16 inputs, sigmoid gates and betas, l2norm
                   if o[0] == BF16 and o[1:3] == (BF16, BF16) and o[3:] == ("sigmoid", "sigmoid", True))
    for K, V, fp32, stages in itertools.product((64, 128), (64, 128, 256), (False, True), (2, 3)):
        yield variant(K, V, fp32, TileConfig(fused.BV, stages, "wgmma"), default, split=True)
    for K, stages in itertools.product((64, 128), (2, 3)):  # the merged maps' [K, 2 K] fp32 state (K = V)
        yield FusedVariant(PrepareVariant(K, *default, ws_core=True, g_pairs=fused.g_pairs(True)),
                           RecurrenceVariant(K, 2 * K, default[0], True, TileConfig(fused.BV, stages, "wgmma"),
                                             no_output=True), fused.RING_SLOTS, fused.GROUP, maps=True)


registry.register("kda_prepare", prepare_variants)
registry.register("kda_recurrence", recurrence_variants)
registry.register("kda_recurrence_wgmma", lambda: recurrence_core_variants("wgmma"))
registry.register("kda_recurrence_tcgen05", lambda: recurrence_core_variants("tcgen05"))
registry.register("kda_prepare_core", prepare_core_variants)
registry.register("kda_prepare_any", prepare_any_variants)
registry.register("kda_recurrence_any", recurrence_any_variants)
registry.register("kda_forward_fused", fused_variants)

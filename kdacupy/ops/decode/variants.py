"""Every variant of the decode kernel the library can launch, registered with
``kdacupy.jit.registry`` (what ``python -m kdacupy.compile --kernel decode`` builds)."""
from __future__ import annotations

import itertools

from ...jit import registry
from ...numerics.dtypes import BF16, F32
from ..forward.limits import DIMS
from ..inputs import DTYPES, input_option_space
from .kernels import DecodeTiles, DecodeVariant, decode_candidates

#: the key tiles of head dims outside {64, 128, 256}: K rounded up to a multiple of 32
KEY_TILES = tuple(range(32, 257, 32))


def decode_variants():
    """Every shape, dtype, pool and layout at the Kimi options, with every tile
    configuration at K = V = 128 (what the tuner tries) and the heuristic's two
    elsewhere; the any-size variant of every key tile (32, 64, ..., 256: any other K, V in
    [16, 256]) at bf16 inputs, both pools and layouts, the heuristic's two tiles; every gate /
    beta / l2norm / input-dtype option at K = V = 128; step states (tree verify) in the other
    state dtype than the pool's at K = V = 128."""
    for K, V, dt, pool, layout in itertools.product(DIMS, DIMS, DTYPES, (BF16, F32), ("vk", "kv")):
        tried = decode_candidates(K, V) if (K, V) == (128, 128) else [DecodeTiles(16, 4), DecodeTiles(8, 4)]
        for tiles in tried:
            yield DecodeVariant(K, V, dt, dt, dt, "sigmoid", "sigmoid", True, pool, layout, tiles)
    # any other head dims (K, V in [16, 256]): the variant of each key tile, V and K at run time
    for K, pool, layout, tiles in itertools.product(KEY_TILES, (BF16, F32), ("vk", "kv"),
                                                    (DecodeTiles(16, 4), DecodeTiles(8, 4))):
        yield DecodeVariant(K, 0, BF16, BF16, BF16, "sigmoid", "sigmoid", True, pool, layout, tiles)
    for pool, layout, tiles in itertools.product((BF16, F32), ("vk", "kv"), (DecodeTiles(16, 4), DecodeTiles(8, 4))):
        yield DecodeVariant(128, 128, BF16, BF16, BF16, "sigmoid", "sigmoid", True, pool, layout, tiles,
                            F32 if pool == BF16 else BF16)
    for dt, gdt, bdt, gate, beta_mode, l2 in input_option_space():
        if (gate, beta_mode, l2, gdt, bdt) != ("sigmoid", "sigmoid", True, dt, dt):
            yield DecodeVariant(128, 128, dt, gdt, bdt, gate, beta_mode, l2, BF16, "vk", DecodeTiles())


registry.register("kda_decode", decode_variants)

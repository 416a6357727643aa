"""Tile configurations: the space the tuner searches, and the choice at run time."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    BV: int = 64  # value rows per CTA of the recurrence (16 per warp): the value-split factor is V / BV
    stages: int = 2  # cp.async pipeline depth of the recurrence

    def __post_init__(self):
        if self.BV not in (16, 32, 64, 128) or self.stages not in (1, 2, 3):
            raise ValueError(f"tiles: BV in (16, 32, 64, 128) and stages in (1, 2, 3), got {self}")


DEFAULT_SM_COUNT = 132  # an H100 / H200, when no device is at hand (emulation)


def heuristic(p, sm_count=DEFAULT_SM_COUNT) -> TileConfig:
    """Untuned choice: split V until there are at least two recurrence CTAs per
    SM (the recurrence is latency-bound, so idle SMs cost most), but keep two
    warps per CTA at least."""
    for BV in (128, 64, 32):
        if BV <= p.V and p.N * p.HV * (p.V // BV) >= 2 * sm_count:
            return TileConfig(BV, 2)
    return TileConfig(min(32, p.V), 2)


def select_tiles(p) -> TileConfig:
    sm = DEFAULT_SM_COUNT
    if p.device:
        import cupy
        sm = cupy.cuda.Device().attributes["MultiProcessorCount"]
    return heuristic(p, sm)


#: every tile configuration a kernel variant can be built with
TILE_SPACE = tuple(TileConfig(bv, st) for bv in (16, 32, 64, 128) for st in (2, 3))

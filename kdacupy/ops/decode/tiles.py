"""The decode kernel's tile knobs: value rows per CTA and warps per CTA, the
space the tuner searches, and the untuned heuristic."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeTiles:
    BV: int = 16  # value rows per CTA: ceil(V / BV) CTAs per (sequence, head)
    warps: int = 4  # warps per CTA; each owns BV / warps value rows

    def valid_for(self, K: int, V: int) -> bool:
        """Whether the tiles run head dims K, V: BV <= V (the last CTA's rows past V, where BV does not
        divide V, are masked) and the warp's state slice (ceil(K / 32) keys per lane of its rows) in
        registers."""
        rv = self.BV // self.warps
        return self.BV <= V and self.BV % self.warps == 0 and 1 <= rv <= 16 and -(-K // 32) * rv <= 64


#: every decode tile configuration a variant can be built with (the tuner's space)
DECODE_TILE_SPACE = tuple(DecodeTiles(bv, w) for bv in (8, 16, 32, 64) for w in (1, 2, 4, 8) if bv % w == 0
                          and bv // w <= 16)


def decode_candidates(K: int, V: int) -> list[DecodeTiles]:
    return [t for t in DECODE_TILE_SPACE if t.valid_for(K, V)]


def decode_heuristic(K: int, V: int, rows: int, sm_count: int = 132) -> DecodeTiles:
    """Untuned choice: 4 warps of 4 value rows (BV = 16) when the grid (rows =
    N * HV heads, ceil(V / BV) CTAs each) has at least 4 CTAs per SM, else 4 warps of
    2 rows (BV = 8): twice the CTAs, for small batches."""
    wide = DecodeTiles(16, 4)
    if wide.valid_for(K, V) and rows * -(-V // wide.BV) >= 4 * sm_count:
        return wide
    return DecodeTiles(8, 4)

"""The tiles of the backward's two chunk chains: the forward's recurrence storing each chunk's state
(without its output) and kda_bwd_chain. Their own choice, not the forward's (the tuner times the
forward; a tuning file's entry is the forward's): BV = 64 value rows a CTA, three stages.

Why (the issue-aware profile, docs/design.md section 9.4): each chain CTA streams one chunk's
workspace block a step with cp.async, its lanes sharing the copies, so a CTA of four warps (BV = 64)
issues 649 / 870 instructions a warp and chunk (recurrence / chain) at kimi-T8192-H64 where one of
two warps (BV = 32, the forward heuristic's choice there) issues 791 / 1012, and the two BV = 32
CTAs an SM then holds share its schedulers: 0.443 / 0.572 ms on the H200 at BV = 32, two stages;
0.350 / 0.386 ms at BV = 64, three stages, bound by HBM (at H = 96 as well; BV = 128 issues more a
scheduler and moves no fewer bytes). Three stages give a block's copies two chunks' time to land
(351 cycles a chunk on the path, 701 at two). Every value dim's variants take BV = 64: the head dims
run on tiles of 64, 128 or 256 (kdacupy/numerics/tiles.py)."""
from __future__ import annotations

from ..forward.kernels import unfit
from ..forward.tuning import TileConfig

CHAIN_TILES = TileConfig(64, 3)


def backward_tiles(p) -> TileConfig:
    """The chains' tiles for a Problem."""
    why = unfit(p, CHAIN_TILES)
    assert why is None, why
    return CHAIN_TILES

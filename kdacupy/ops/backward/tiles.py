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
#: kda_bwd_chunk's wider value block (K = 128): every one of its 8 warps takes 16 value columns in [B1]-[B3]
WIDE_BLOCK = 128


def chunk_block(K: int, V: int, arch: str | None) -> int:
    """kda_bwd_chunk's value columns a block for key and value tiles K, V on target ``arch``: 0 (the
    backward model's vblock(K), 64 at K <= 128, which sm_80's shared memory holds), or 128 at K = 128 where
    the arch's shared memory holds its tiles (sm_90a, sm_100a: 200 KB) and V is a multiple of 128. One
    block instead of two at V = 128: [B1]-[B3] on all 8 warps rather than 4 twice, one block's copies and
    barriers (the issue-aware profile: the dependent path 8,362 -> 6,663 cycles a CTA at kimi-T8192-H64 on
    the H200 model). The gradients are the same bits: the model's mma sums and fma chains run over the
    value columns in order whatever the block (docs/design.md section 9.4)."""
    from ...jit.nvrtc import SMEM_LIMIT
    from .layouts import chunk_smem

    if arch is None or K != 128 or V % WIDE_BLOCK:
        return 0
    return WIDE_BLOCK if chunk_smem(K, WIDE_BLOCK)["CSM_TOTAL"] <= SMEM_LIMIT.get(arch, 0) else 0


def backward_tiles(p) -> TileConfig:
    """The chains' tiles for a Problem."""
    why = unfit(p, CHAIN_TILES)
    assert why is None, why
    return CHAIN_TILES

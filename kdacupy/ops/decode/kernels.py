"""Launcher of ``kernels/kda_decode.cu``: variant configuration, grid, arguments.

The same code serves the GPU (CuPy arrays, ``kdacupy.jit.CudaLoader``) and the
CPU emulation (NumPy arrays): only the loader and the array module differ.
Nothing here reads device memory or synchronises, so a decode step with device
indices captures into a CUDA graph. What depends only on shapes, dtypes and
options (the variant, its compiled function, the grid) is cached per call key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar
from functools import lru_cache

import numpy as np

from ...jit.enums import DTYPE_CODE
from ...jit.loaders import loader
from ...numerics.dtypes import dtype_name
from ..args import lower_bound_log2, strides
from ..inputs import input_config, input_label, input_options
from .tiles import DECODE_TILE_SPACE, DecodeTiles, decode_candidates, decode_heuristic  # noqa: F401

#: head dims with their own variants (the sizes constants, no masks); any other K, V in
#: [16, 256] runs on the variant of its key tile (``key_tile``) with the sizes as arguments
EXACT_DIMS = (64, 128, 256)


def key_tile(K: int) -> int:
    """The key tile a head dim K runs on: K rounded up to a multiple of 32 (RK keys per lane)."""
    return -(-K // 32) * 32


def exact_sizes(K: int, V: int, tiles: DecodeTiles) -> bool:
    """Whether (K, V) runs on a variant of its own (else on its key tile's, any V)."""
    return K in EXACT_DIMS and V in EXACT_DIMS and V % tiles.BV == 0


@dataclass(frozen=True)
class DecodeVariant:
    kernel: ClassVar[str] = "kda_decode"
    K: int  # the key tile (a multiple of 32)
    V: int  # the value rows, or 0: any V (and K up to the tile), the sizes passed at launch
    dtype: np.dtype
    g_dtype: np.dtype
    beta_dtype: np.dtype  # any valid dtype when beta_mode == "none"
    gate: str
    beta_mode: str
    l2norm: bool
    pool_dtype: np.dtype
    layout: str
    tiles: DecodeTiles
    step_dtype: np.dtype | None = None  # the step states' dtype where it is not the pool's

    def config(self) -> dict:
        extra = {} if self.step_dtype is None else dict(KDA_STEP_DT=DTYPE_CODE[self.step_dtype])
        return dict(KDA_K=self.K, KDA_V=self.V, **input_config(self),
                    KDA_POOL_DT=DTYPE_CODE[self.pool_dtype], KDA_LAYOUT_VK=int(self.layout == "vk"),
                    KDA_BV=self.tiles.BV, KDA_WARPS=self.tiles.warps, **extra)

    @property
    def threads(self) -> int:
        return 32 * self.tiles.warps

    smem = 0

    def label(self) -> str:
        sizes = f"K={self.K} V={self.V}" if self.V else f"K<={self.K} V=any"
        return (f"kda_decode {sizes} {input_label(self)} "
                f"pool={dtype_name(self.pool_dtype)} layout={self.layout} BV={self.tiles.BV} warps={self.tiles.warps}"
                + ("" if self.step_dtype is None else f" steps={dtype_name(self.step_dtype)}"))


def decode_variant(p, pool, tiles: DecodeTiles) -> DecodeVariant:
    steps = pool.steps
    step_dtype = None if steps is None or steps.dtype == pool.dtype else steps.dtype
    K, V = (p.K, p.V) if exact_sizes(p.K, p.V, tiles) else (key_tile(p.K), 0)
    return DecodeVariant(K, V, *input_options(p), pool.dtype, pool.layout, tiles, step_dtype)


def select_decode_tiles(p, pool) -> DecodeTiles:
    """Tuning file for this GPU, else the heuristic (kdacupy/ops/decode/tuning.py)."""
    from .tuning import select
    return select(p, pool.dtype)


@lru_cache(maxsize=256)
def launch_plan(p, pool, device: bool, tiles: DecodeTiles | None = None):
    """(compiled function, grid, block) of a validated problem and pool."""
    tiles = tiles or select_decode_tiles(p, pool)
    var = decode_variant(p, pool, tiles)
    fn = loader("cuda" if device else "emulate").get("kda_decode", var.config(), "kda_decode")
    # grid.z the q / k heads, grid.y the value heads of each (the kernel's hv and h without a division)
    return fn, (p.N * -(-p.V // tiles.BV), p.HV // p.H, p.H), (var.threads,)


def stride_args(arrays):
    """Stride arguments of q, k, v, g, beta and out (``arrays`` in fastpath.NAMES order)."""
    return tuple(tuple(strides(arrays[i])) for i in (0, 1, 2, 3, 4, 8))


def scalar_args(p, pool, arrays):
    """The arguments after the pointers that depend only on the call's key."""
    idx, acc = arrays[6], arrays[7]
    parents, steps, rows = arrays[11:14] if len(arrays) > 11 else (None, None, None)
    cu = arrays[14] if len(arrays) > 14 else None
    return (np.int64(pool.P), np.int32(idx.dtype == np.int64), np.int32(pool.per_token),
            np.int32(acc is not None and acc.dtype == np.int64), np.int32(p.T), np.int32(p.H), np.int32(p.HV),
            np.float32(p.scale), lower_bound_log2(p),
            np.int32(parents is not None and parents.dtype == np.int64),
            np.int64(0 if steps is None else steps.shape[0]), np.int32(0 if steps is None else steps.shape[1]),
            np.int32(rows is not None and rows.dtype == np.int64), np.int32(pool.update), np.int64(pool.null_slot),
            np.int32(cu is not None and cu.dtype == np.int64), np.int32(p.K), np.int32(p.V))


def decode_args(ptrs, strides, scalars):
    """The kernel's argument tuple from the 15 data pointers (``fastpath.NAMES``; ints, 0 for
    none; or, for the emulation, ``kdacupy.emulate.pointer`` objects, which carry their arrays'
    extents)."""
    def u(p):
        return np.uint64(p) if isinstance(p, (int, np.integer)) else p
    ptrs = list(ptrs) + [0] * (15 - len(ptrs))  # callers of the 11-array form pass no tree arrays
    sq, sk, sv, sg, sb, so = strides
    P, idx64, per_token, acc64, T, H, HV, scale, lb2, par64, R, S, rows64, update, null_slot, cu64, K, V = scalars
    return (u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), *sq, *sk, *sv, *sg, *sb,
            u(ptrs[8]), *so, u(ptrs[9]), u(ptrs[10]), u(ptrs[5]), P, u(ptrs[6]), idx64, per_token,
            u(ptrs[7]), acc64, T, H, HV, scale, lb2, u(ptrs[11]), par64, u(ptrs[12]), R, S, u(ptrs[13]), rows64,
            update, null_slot, u(ptrs[14]), cu64, K, V)

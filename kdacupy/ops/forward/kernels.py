"""One Python launcher per .cu kernel: variant configuration, grid, arguments.

The same launch code serves the GPU (CuPy arrays, ``kdacupy.jit.loaders.CudaLoader``)
and the CPU emulation (NumPy arrays, ``EmulateLoader``): only the loader and the
array module differ. Nothing here reads device memory or synchronises.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from . import fused as one_launch
from . import layouts
from ...numerics.tiles import exact_dims, tile_of
from ...numerics.dtypes import dtype_name
from ...jit.enums import DTYPE_CODE, MMA_CODE, STATE_DTYPE_CODE
from ... import env
from ...jit import targets
from ...jit.loaders import loader
from ..alloc import empty
from ..args import cu_args, lower_bound_log2, pool_args, ptr, strides
from ..inputs import InputVariant, input_options
from . import tuning
from .tuning import CORE_FAMILIES, TileConfig
from .workspace import scratch


# tcgen05 exists on sm_100a alone: on 10.x the runtime builds those recurrences for the arch-specific target
targets.declare_arch_specific("kda_recurrence", lambda config: config.get("KDA_MMA") == MMA_CODE["tcgen05"])


@dataclass(frozen=True)
class PrepareVariant(InputVariant):
    kernel: ClassVar[str] = "kda_prepare"
    ws_core: bool = False  # the workspace tiles in the core-matrix layout (the wgmma recurrence's)
    any_dims: bool = False  # K is the key tile, the true head dim a launch argument (KDA_ANY_DIMS)
    g_pairs: bool = False  # the gate sums as 8-byte channel pairs (KDA_G_PAIRS: the fused forward's build)

    def layout_config(self) -> dict:
        return dict(**layouts.workspace(self.K), **self._smem(), **(dict(KDA_WS_CORE=1) if self.ws_core else {}),
                    **(dict(KDA_ANY_DIMS=1) if self.any_dims else {}), **(dict(KDA_G_PAIRS=1) if self.g_pairs else {}))

    def _smem(self) -> dict:
        return layouts.prepare_smem(self.K, np.dtype(self.dtype).itemsize, np.dtype(self.g_dtype).itemsize,
                                    self.g_pairs)

    @property
    def smem(self) -> int:
        return self._smem()["PSM_TOTAL"]

    def label(self) -> str:
        return (super().label().replace(f" K={self.K} ", f" K<={self.K} ") if self.any_dims else super().label()) + (
            " ws_core" if self.ws_core else "") + (" g_pairs" if self.g_pairs else "")

    @property
    def only_arches(self) -> tuple[str, ...] | None:
        """The core-matrix workspace is the wgmma and tcgen05 recurrences': built for sm_90a and sm_100a."""
        return ("sm_90a", "sm_100a") if self.ws_core else None


@dataclass(frozen=True)
class RecurrenceVariant:
    kernel: ClassVar[str] = "kda_recurrence"
    K: int
    V: int
    dtype: np.dtype
    state_fp32: bool
    tiles: TileConfig
    no_output: bool = False  # final state only (segment maps, kdacupy/seqpar.py)
    store_states: bool = False  # the state at each chunk's start to ``states`` (the backward)
    checkpoints: bool = False  # the state at every checkpoint boundary to ``ckpt`` (kda_forward's checkpoints)
    any_dims: bool = False  # K, V are the tiles, the true head dims launch arguments (KDA_ANY_DIMS)

    def config(self) -> dict:
        extra = dict(KDA_NO_OUTPUT=1) if self.no_output else {}
        if self.any_dims:
            extra["KDA_ANY_DIMS"] = 1
        if self.store_states:
            extra["KDA_STORE_STATES"] = 1
        if self.checkpoints:
            extra["KDA_CHECKPOINTS"] = 1
        if self.tiles.mma != "sync":
            extra["KDA_MMA"] = MMA_CODE[self.tiles.mma]
        return dict(KDA_K=self.K, KDA_V=self.V, KDA_DT=DTYPE_CODE[self.dtype], KDA_BV=self.tiles.BV,
                    KDA_STAGES=self.tiles.stages, KDA_STATE_FP32=int(self.state_fp32),
                    **layouts.workspace(self.K), **self._smem(), **extra)

    def _smem(self) -> dict:
        return layouts.recurrence_smem(self.K, self.tiles.BV, self.tiles.stages, np.dtype(self.dtype).itemsize,
                                       self.tiles.mma)

    @property
    def smem(self) -> int:
        return self._smem()["RSM_TOTAL"]

    @property
    def threads(self) -> int:
        """A warp per 16 value rows; tcgen05: a warpgroup (a thread a tensor-memory lane)."""
        return 128 if self.tiles.mma == "tcgen05" else self.tiles.BV // 16 * 32

    @property
    def only_arch(self) -> str | None:
        """The one target a variant builds for (wgmma: sm_90a; tcgen05: sm_100a), or None (every target)."""
        return {"wgmma": "sm_90a", "tcgen05": "sm_100a"}.get(self.tiles.mma)

    def label(self) -> str:
        sizes = f"K<={self.K} V<={self.V}" if self.any_dims else f"K={self.K} V={self.V}"
        return (f"kda_recurrence {sizes} dt={dtype_name(self.dtype)} "
                f"state={'fp32' if self.state_fp32 else 'bf16'} BV={self.tiles.BV} stages={self.tiles.stages}"
                + (" no_output" if self.no_output else "") + (" store_states" if self.store_states else "")
                + (" checkpoints" if self.checkpoints else "") + (f" {self.tiles.mma}" if self.tiles.mma != "sync" else ""))


def select_tiles(p) -> TileConfig:
    """The forward's tiles: the only caller that can take the wgmma recurrence (tuning.heuristic)."""
    return tuning.select_tiles(p, wgmma=True)


def tiles_of(p) -> tuple[int, int, bool]:
    """(key tile, value tile, whether the true sizes differ from them: the any-size variants)."""
    return tile_of(p.K), tile_of(p.V), not exact_dims(p.K, p.V)


def prepare_variant(p, ws_core: bool = False) -> PrepareVariant:
    KT, _, any_dims = tiles_of(p)
    return PrepareVariant(KT, *input_options(p), ws_core=ws_core, any_dims=any_dims)


def wgmma_supported(K: int, V: int, tiles: TileConfig, no_output: bool = False, store_states: bool = False) -> bool:
    """Whether the wgmma recurrence serves this variant: K <= 128 (dS in one m64nKk16 next to the
    state's registers), whole warpgroups (BV = 64 or 128, TileConfig checks); the forward with its
    output and the segment maps (no output) of the split forward. The backward's forward
    (store_states: the backward reads the row-major workspace) keeps mma.sync."""
    return tiles.BV <= V and K <= 128 and not store_states


def unfit(p, tiles: TileConfig) -> str | None:
    """Why ``tiles`` cannot run the recurrence of ``p`` (None: they can): a CTA's BV value rows
    must divide the value dim the variant is built for (V, or V's tile for the any-size variants),
    which the kernel asserts at compile time. (wgmma tiles that cannot serve a variant fall back to
    mma.sync at the same BV: recurrence_mma.)"""
    built = p.V if exact_dims(p.K, p.V) else tile_of(p.V)
    if tiles.BV > built or built % tiles.BV:
        return f"BV={tiles.BV} must divide the value dim of its variant, {built} (V={p.V})"
    return None


def recurrence_mma(p, tiles: TileConfig, no_output: bool = False, store_states: bool = False) -> str:
    """The MMA family a launch gets: the tiles' wgmma or tcgen05 where it serves the variant (the same
    rule: K <= 128, BV <= V, not the backward's forward), else mma.sync (which the any-size variants keep)."""
    if tiles.mma in CORE_FAMILIES and exact_dims(p.K, p.V) and wgmma_supported(p.K, p.V, tiles, no_output, store_states):
        return tiles.mma
    return "sync"


def recurrence_variant(p, tiles: TileConfig, no_output: bool = False, store_states: bool = False,
                       checkpoints: bool = False) -> RecurrenceVariant:
    if tiles.mma != recurrence_mma(p, tiles, no_output, store_states):
        tiles = replace(tiles, mma="sync")
    KT, VT, any_dims = tiles_of(p)
    return RecurrenceVariant(KT, VT, p.dtype, p.state_precision == "fp32", tiles, no_output, store_states,
                             checkpoints, any_dims)


def fused_variant(p, tiles: TileConfig, split: bool = False, maps: bool = False) -> one_launch.FusedVariant:
    """The fused launch's variant (ops/forward/fused.py): the core-matrix prepare and the consumers' chain at
    ``tiles`` (one_launch.tiles_of: the wgmma warpgroup, or tcgen05's 128 threads), at the ring's current
    depth and item size; ``split``: the split forward's final launch, ``maps``: its maps with their prepare
    (``p`` the merged maps' problem; no output): each its own build."""
    prepare = replace(prepare_variant(p, ws_core=True), g_pairs=one_launch.g_pairs(p.state_precision == "fp32"))
    return one_launch.FusedVariant(prepare, recurrence_variant(p, tiles, no_output=maps), one_launch.RING_SLOTS,
                                   one_launch.GROUP, split, maps)


def slots(p) -> tuple[int, int]:
    """(workspace chunk slots, chunks per sequence for fixed-length input)."""
    per_seq = -(-p.T // layouts.CHUNK)
    return (p.N + per_seq if p.varlen else p.B * per_seq), per_seq


def launch_prepare(run, p, a, ws, nslots, per_seq, ws_core=False, skip_last_of=0, slot_end=None):
    """``skip_last_of`` (> 0): the slots of every ``skip_last_of``-th sequence's last are left unwritten (the
    split forward's last segments, which its fused forward makes itself); ``slot_end``: no CTA starts at or
    past that slot (every slot from it on is skipped anyway)."""
    var = prepare_variant(p, ws_core)
    fn = run.get("kda_prepare", var.config(), "kda_prepare")
    spc = layouts.prepare_slots_per_cta(nslots)
    args = [ptr(a["q"]), ptr(a["k"]), ptr(a["g"]), ptr(a["beta"]),
            *strides(a["q"]), *strides(a["k"]), *strides(a["g"]), *strides(a["beta"]),
            ptr(a["A_log"]), ptr(a["dt_bias"]), *cu_args(a["cu_seqlens"]),
            np.int32(p.T), np.int32(p.H), np.int32(p.HV), np.int32(p.N), np.int32(nslots), np.int32(per_seq),
            np.int32(spc), np.float32(p.scale), lower_bound_log2(p), ptr(ws), np.int32(p.K), np.int32(skip_last_of)]
    end = nslots if slot_end is None else min(nslots, slot_end)
    if end > 0:
        run.launch(fn, (-(-end // spc), p.HV), (layouts.PREPARE_THREADS,), tuple(args), var.smem)


def checkpoint_args(ck):
    """The kernel's checkpoint arguments of a validated ``Checkpoints`` (kdacupy/validation/checkpoints.py), or
    none: destination, its precision, row indices and their width, rows, boundaries per sequence, chunks
    between boundaries."""
    if ck is None:
        return [np.uint64(0), np.int32(0), np.uint64(0), np.int32(0), np.int64(0), np.int32(0), np.int32(1)]
    return [ptr(ck.array), np.int32(STATE_DTYPE_CODE[ck.array.dtype]), ptr(ck.indices),
            np.int32(ck.indices is not None and ck.indices.dtype == np.int64), np.int64(ck.rows),
            np.int32(ck.per_seq), np.int32(ck.every // layouts.CHUNK)]


def launch_recurrence(run, p, a, ws, o, s_out, nslots, per_seq, tiles, no_output=False, states=None, ws_core=False,
                      v_zero=False, maps=None):
    """``states``: with it, the variant that stores each chunk's start state there ([HV, slots, V, K]);
    ``v_zero`` (without the output only): ``a["v"]`` is zero (a zero view: its strides are passed and,
    but for the any-size variants, which read it, its pointer as null), so the kernel reads no value rows;
    ``a["checkpoints"]``: with it, the variant that stores the state at each checkpoint boundary.
    ``ws_core``: the prepare wrote the core-matrix workspace, which the wgmma recurrence reads and
    needs (without it the launch is mma.sync whatever the tiles say). ``maps``: (segments a
    sequence or 0, the M map's value tiles) for the sequence-parallel forward's maps (kdacupy/ops/seqpar/split.py): the value tiles below the M map's count read v as zero
    (the merged maps: ``p`` the [K, K + V] state of the M and B maps side by side, v's rows from the
    first B tile on), and with a segment count only the runs its scan reads are launched
    (kernels/kda_recurrence.cu, map_work_item)."""
    ck = a.get("checkpoints")
    if why := unfit(p, tiles):  # before any build: a tile from a file or a caller, never a build failure
        raise ValueError(f"tiles: {tiles} cannot run the recurrence of K={p.K}, V={p.V}: {why}")
    if not ws_core:
        tiles = replace(tiles, mma="sync")
    assert not v_zero or (no_output and states is None), "v = 0 is the maps' (the forwards always read v)"
    var = recurrence_variant(p, tiles, no_output, states is not None, ck is not None)
    assert (var.tiles.mma in CORE_FAMILIES) == ws_core, "the core-matrix workspace is the wgmma / tcgen05 recurrence's"
    fn = run.get("kda_recurrence", var.config(), "kda_recurrence")
    args = [ptr(ws), ptr(None if v_zero and not var.any_dims else a["v"]), *strides(a["v"]), ptr(o), *strides(o),
            ptr(a["initial_state"]), np.int32(STATE_DTYPE_CODE[p.state_in_dtype]),
            ptr(s_out), np.int32(STATE_DTYPE_CODE[p.state_out_dtype]), np.int32(p.state_layout == "vk"),
            *cu_args(a["cu_seqlens"]), np.int32(p.T), np.int32(p.HV), np.int32(nslots), np.int32(per_seq),
            *pool_args(a), ptr(states), *checkpoint_args(ck), np.int32(p.K), np.int32(p.V)]
    vb = -(-p.V // tiles.BV)  # value tiles a sequence
    ctas = p.N * vb
    if maps is None:
        args += [np.int32(0)] * 2
    else:
        seg_n, m_tiles = maps  # seg_n = 0: every sequence's maps
        assert no_output and states is None and 0 <= m_tiles <= vb and (not var.any_dims or m_tiles in (0, vb))
        if seg_n:  # (map_work_item: the M part from segment 1, the B part from 0, neither in the last)
            assert p.N % seg_n == 0
            ctas = p.N // seg_n * ((seg_n - 2) * m_tiles + (seg_n - 1) * (vb - m_tiles))
        args += [np.int32(seg_n), np.int32(m_tiles * tiles.BV)]
        if not ctas:
            return
    run.launch(fn, (ctas, p.HV), (var.threads,), tuple(args), var.smem)


def workspace(p, a, nslots, xp, kept=False):
    """The kernels' scratch memory, and ``a`` with a strided ``cu_seqlens``
    replaced by its copy at the workspace's end (a device copy kernel: capturable,
    and a graph's replay re-reads the caller's array). On the GPU the workspace
    persists per (device, stream) (ops/forward/workspace.py: a captured graph keeps its
    pointer); the CPU emulation takes a fresh one. ``kept``: the prepare writes a kept
    buffer instead (only the copy of cu_seqlens, if any, goes here)."""
    nbytes = 0 if kept else p.HV * nslots * layouts.workspace(tiles_of(p)[0])["WS_STRIDE"]
    return scratch(p, a, nbytes, xp)


def forward(p, a, tiles: TileConfig | None = None, keep: dict | None = None, fused: bool | None = None,
            producers: int | None = None):
    """Both launches of one kda_forward call; returns (o, final_state). ``keep``: views ``ws`` and
    ``states`` of a buffer the backward will read (kdacupy/ops/backward/saved.py): the prepare writes
    its workspace there in the row-major layout and the mma.sync recurrence stores the state entering
    each chunk, as the stateless backward's own launches do. ``fused``: the one launch of
    ops/forward/fused.py instead, at the tiles' stages, with ``producers`` producer blocks (where it
    serves the call: fused.supported); None: as KDACUPY_FORWARD_FUSED says (auto: where fused.pays says so on
    the GPU, never in the emulation)."""
    if p.device:
        import cupy as xp
    else:
        xp = np
    run = loader("cuda" if p.device else "emulate")
    tiles = tiles or select_tiles(p)
    if why := unfit(p, tiles):  # before the prepare runs
        raise ValueError(f"tiles: {tiles} cannot run the recurrence of K={p.K}, V={p.V}: {why}")
    nslots, per_seq = slots(p)
    o = a["out"] if a["out"] is not None else empty(xp, a["v"].shape, p.dtype)
    s_out = a.get("state_pool")  # a pool is read and written in place
    if s_out is None and p.state_out_dtype is not None:
        shape = (p.N, p.HV, p.K, p.V) if p.state_layout == "kv" else (p.N, p.HV, p.V, p.K)
        s_out = empty(xp, shape, p.state_out_dtype)
    ckpt = a.get("checkpoints") is not None
    if fused is None and keep is None:
        mode = env.get("KDACUPY_FORWARD_FUSED")
        sms = tuning.device_facts()[2] if p.device and mode != "off" else None
        if mode == "on":
            fused = one_launch.supported(p, one_launch.tiles_of(tiles, p, sms), ckpt)
        elif mode == "auto":
            fused = bool(p.device) and tiles.mma in CORE_FAMILIES and one_launch.pays(
                p, sms, tuning.current_arch(), ckpt)
        if fused:
            tiles = one_launch.tiles_of(tiles, p, sms)
    if fused and keep is None and p.N:
        if not one_launch.supported(p, tiles, ckpt):
            raise ValueError(f"fused forward: not for tiles {tiles} at K={p.K}, V={p.V} with these options")
        one_launch.forward_fused(run, p, a, o, s_out, nslots, per_seq, fused_variant(p, tiles), producers, xp)
        return o, (None if a.get("state_pool") is not None else s_out)
    ws, a = workspace(p, a, nslots, xp, kept=keep is not None)
    core = keep is None and recurrence_mma(p, tiles) in CORE_FAMILIES  # its workspace layout, written by the prepare
    if keep is not None:
        ws = keep["ws"]
    if nslots:
        launch_prepare(run, p, a, ws, nslots, per_seq, core)
    if p.N:
        launch_recurrence(run, p, a, ws, o, s_out, nslots, per_seq, tiles, ws_core=core,
                          states=None if keep is None else keep["states"])
    return o, (None if a.get("state_pool") is not None else s_out)

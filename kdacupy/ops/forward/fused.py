"""The fused forward's launch (kernels/kda_forward_fused.cu): kda_prepare and the wgmma (sm_90a) or
tcgen05 (sm_100a) recurrence as the two roles of one persistent launch, the workspace a ring of chunk
blocks a value head that stays in L2 (docs/design.md section 5).

The launch holds HV * V / BV consumer blocks (BV: 64 on wgmma, 64 or 128 on tcgen05) and ``producers``
producer blocks, every one resident at once: on the GPU a cooperative launch of at most what the device holds, in the emulation a co-resident
one. Nothing here reads device memory or synchronises; the ring's flags are zeroed on the stream before
each launch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import layouts, workspace
from .tuning import TileConfig
from ..args import cu_args, lower_bound_log2, pool_args, ptr, strides
from ...jit.enums import STATE_DTYPE_CODE
from ...numerics.tiles import exact_dims

#: ring slots a value head: the consumers' STAGES - 1 look-ahead, and by Little's law the chunks in
#: production while one is consumed: a producer's chunk takes ~4x a consumer's chunk step (its warps issue
#: ~3x the instructions and share their schedulers), so ~3 items of GROUP slots in flight a head (1.8 MB at
#: H = 64, 2.7 MB at H = 96, K = 128: well inside L2); the GPU's tuning has the last word
RING_SLOTS = 16
#: chunk slots a producer item: kda_prepare's pipeline runs over them
GROUP = 4
#: value rows a wgmma consumer block: one warpgroup, the prepare's 128 threads (tcgen05's 128 threads take
#: 128 rows, or 64: consumer_bv)
BV = 64
THREADS = layouts.PREPARE_THREADS
#: the consumers' MMA family per target
FAMILY = {"sm_90a": "wgmma", "sm_100a": "tcgen05"}
#: tensor-memory columns an SM has; a tcgen05 consumer allocates tcgen05_columns of them
TMEM_COLUMNS = 512
#: dynamic shared memory of every block of a tcgen05 launch at least: above a third of an sm_100 SM's
#: 228 KB (less 1 KB a block reserved), so at most two blocks share an SM and two consumers' tensor memory
#: always fits (a third consumer's tcgen05.alloc would wait for a consumer that waits, through the ring, for
#: producers that wait for it)
TCGEN05_SMEM_FLOOR = 80 * 1024
#: chunks a sequence on average from which a tcgen05 launch of several sequences pays (``pays``; the B200 model)
TCGEN05_MIN_MEAN_CHUNKS = 80


@dataclass(frozen=True)
class FusedVariant:
    kernel: ClassVar[str] = "kda_forward_fused"
    prepare: object  # kernels.PrepareVariant (ws_core)
    recurrence: object  # kernels.RecurrenceVariant (wgmma, BV = 64)
    ring: int  # slots a head (RING_SLOTS)
    group: int  # slots an item (GROUP)
    split: bool = False  # the split forward's final launch (KDA_FUSED_SPLIT: the last segments from the ring)
    maps: bool = False  # the split forward's maps with their prepare (KDA_FUSED_MAPS; the recurrence's no_output)

    def config(self) -> dict:
        a, b = self.prepare.config(), self.recurrence.config()
        clash = {k for k in a.keys() & b.keys() if a[k] != b[k]}
        assert not clash, f"the prepare and the recurrence disagree on {sorted(clash)}"
        split = {"KDA_FUSED_SPLIT": 1} if self.split else {"KDA_FUSED_MAPS": 1} if self.maps else {}
        return {**a, **b, "KDA_RING": self.ring, "KDA_GROUP": self.group, **split}

    @property
    def smem(self) -> int:
        floor = TCGEN05_SMEM_FLOOR if self.recurrence.tiles.mma == "tcgen05" else 0
        return max(self.prepare.smem, self.recurrence.smem, floor)

    threads: ClassVar[int] = THREADS

    @property
    def only_arch(self) -> str:
        return {"wgmma": "sm_90a", "tcgen05": "sm_100a"}[self.recurrence.tiles.mma]

    def label(self) -> str:
        t = self.recurrence.tiles
        return (f"kda_forward_fused {self.prepare.label().removeprefix('kda_prepare ')} "
                f"V={self.recurrence.V} state={'fp32' if self.recurrence.state_fp32 else 'bf16'} stages={t.stages} "
                f"ring={self.ring} group={self.group}" + ("" if t.mma == "wgmma" else f" {t.mma} BV={t.BV}")
                + (" split" if self.split else "") + (" maps" if self.maps else ""))


def g_pairs(state_fp32: bool) -> bool:
    """Whether the launch's prepare keeps its gate sums as 8-byte channel pairs (KDA_G_PAIRS,
    kernels/kda_prepare.cu): with the bf16 state; the fp32 state's registers leave no room for it (a
    16-byte spill at K = 128 with fp32 gates)."""
    return not state_fp32


def tcgen05_columns(K: int, BV: int, state_fp32: bool) -> int:
    """Tensor-memory columns a tcgen05 recurrence CTA allocates (TC_COLS, kernels/recurrence_tcgen05.cuh):
    the accumulators, the A operands, the fp32 state's own, rounded up to a power of 2 from 256."""
    kh = K // 2 if BV == 64 else K
    used = kh + 48 + K // 2 + 16 + (kh if state_fp32 else 0)
    return 256 if used <= 256 else 512


def supported(p, tiles: TileConfig, checkpoints: bool = False) -> bool:
    """Whether the fused launch serves this call: the wgmma recurrence at one warpgroup (BV = 64), or the
    tcgen05 one at BV = 64 or 128 whose tensor memory two consumers of an SM share (TCGEN05_SMEM_FLOOR: the
    fp32 state at BV = 128 takes all 512 columns), over the tiles' head dims (K <= 128, V a multiple of BV)
    with its output, no checkpoints and no saved workspace."""
    if tiles.mma == "wgmma":
        family_ok = tiles.BV == BV
    elif tiles.mma == "tcgen05":
        family_ok = (tiles.BV in (64, 128) and
                     2 * tcgen05_columns(p.K, tiles.BV, p.state_precision == "fp32") <= TMEM_COLUMNS)
    else:
        family_ok = False
    return (family_ok and exact_dims(p.K, p.V) and p.K <= 128 and p.V % tiles.BV == 0 and not checkpoints)


def consumer_bv(p, mma: str, sm_count: int | None = None) -> int:
    """A consumer's value rows: 64 on wgmma (a warpgroup); on tcgen05 128 (a row a thread: a head's chain
    issues half of what two BV = 64 consumers do) where V allows and the tensor memory fits, unless that
    leaves too few consumers for issue to bind over their chains (``pays``' rule; several sequences and
    fewer than ``sm_count`` / 2 of them), else 64."""
    if mma != "tcgen05" or p.V % 128 or 2 * tcgen05_columns(p.K, 128, p.state_precision == "fp32") > TMEM_COLUMNS:
        return BV
    wide = p.HV * (p.V // 128)
    return 128 if sm_count is None or p.N == 1 or 2 * wide >= sm_count else BV


def tiles_of(tiles: TileConfig, p, sm_count: int | None = None) -> TileConfig:
    """The consumers' tiles for ``p``: the tcgen05 chain at consumer_bv's rows where ``tiles`` are tcgen05's,
    else one warpgroup of the wgmma chain; at ``tiles``' stages where they are the family's."""
    if tiles.mma == "tcgen05":
        return TileConfig(consumer_bv(p, "tcgen05", sm_count), tiles.stages, "tcgen05")
    return TileConfig(BV, tiles.stages if tiles.mma == "wgmma" else 3, "wgmma")


def blocks_per_sm(p, mma: str = "wgmma") -> int:
    """The serial build's minimum-blocks figure (kernels/kda_forward_fused.cu): what its registers allow an SM
    (tcgen05: what its shared memory allows, TCGEN05_SMEM_FLOOR)."""
    if mma == "tcgen05":
        return 2
    return 2 if p.dtype == np.float32 and p.K > 64 else 3


def pays(p, sm_count: int, arch: str | None, checkpoints: bool = False) -> bool:
    """Whether kda_forward's serial call takes the fused launch (docs/design.md section 5), by the issue-aware
    model on the H200 (benchmarks/forward-step3.md, 3d) and the B200 (benchmarks/blackwell.md): where it serves
    the call on sm_90a (wgmma) or sm_100a (tcgen05), with at least half the resident blocks left to the
    producers, and one sequence, or enough consumers that issue, not their chains, binds (each walks every
    sequence of its head in turn: on the H200 a chunk's chain step takes ~480 cycles, a head's chunk ~8.7k
    warp instructions in all, so issue binds from ~SMs / 2 consumers on). On tcgen05 several sequences only
    from TCGEN05_MIN_MEAN_CHUNKS a sequence on average: a consumer starts each of its head's sequences from its
    state in turn (the B200 model at 8 x 1024 tokens: 0.458 ms against 0.450 in two launches at H = 96, 0.996
    against 0.302 on half-row consumers at H = 64; at Kimi's six sequences, 85 chunks each on average, 0.314
    against 0.450 at H = 96 and, half rows, 0.255 against 0.335 at H = 64; benchmarks/blackwell.md)."""
    mma = FAMILY.get(arch)
    if mma is None:
        return False
    bv = consumer_bv(p, mma, sm_count)
    if mma == "tcgen05" and p.N > 1 and p.T * p.B / p.N / layouts.CHUNK < TCGEN05_MIN_MEAN_CHUNKS:
        return False
    if not supported(p, TileConfig(bv, 3, mma), checkpoints):
        return False
    n = consumers(p, bv)
    return 2 * n <= sm_count * blocks_per_sm(p, mma) and (p.N == 1 or 2 * n >= sm_count)


def consumers(p, bv: int = BV) -> int:
    return p.HV * (p.V // bv)


def ring_bytes(p, ring: int, streams: int | None = None) -> tuple[int, int]:
    """(bytes of a ring of ``ring`` blocks a stream, bytes of its flags: ready and consumed per slot, the item
    counter, the error word); ``streams``: a value head's (None, the serial launch) or split_streams'."""
    slots = (p.HV if streams is None else streams) * ring
    return slots * layouts.workspace(p.K)["WS_STRIDE"], (2 * slots + 2) * 4


def launch_fused(run, p, a, ring, flags, o, s_out, nslots, per_seq, var: FusedVariant, producers: int,
                 ws=None, seg_n: int = 0, groups: int = 0):
    """One fused launch; ``ring`` and ``flags`` from ``ring_bytes``, flags zeroed on the stream before. The
    split's (``seg_n`` > 0, ``p`` its segment batch): ``ws`` the prepare launch's workspace (every segment but
    the last), ``groups`` a last segment's items at most (split_groups); its maps' (``var.maps``, ``p`` the
    merged maps' problem, ``ring`` None): ``ws`` the workspace they fill, ``flags`` split_scratch's maps' flags,
    ``groups`` a segment's items at most (split_map_groups)."""
    fn = run.get(var.kernel, var.config(), var.kernel)
    args = [ptr(a["q"]), ptr(a["k"]), ptr(a["g"]), ptr(a["beta"]), ptr(a["v"]), ptr(o),
            *strides(a["q"]), *strides(a["k"]), *strides(a["g"]), *strides(a["beta"]), *strides(a["v"]), *strides(o),
            ptr(a["A_log"]), ptr(a["dt_bias"]), *cu_args(a["cu_seqlens"]),
            np.int32(p.T), np.int32(p.H), np.int32(p.HV), np.int32(p.N), np.int32(nslots), np.int32(per_seq),
            np.float32(p.scale), lower_bound_log2(p),
            ptr(a["initial_state"]), np.int32(STATE_DTYPE_CODE[p.state_in_dtype]),
            ptr(s_out), np.int32(STATE_DTYPE_CODE[p.state_out_dtype]), np.int32(p.state_layout == "vk"),
            *pool_args(a), ptr(ring), ptr(flags)]
    if var.split or var.maps:  # (the serial build has no such arguments)
        args += [ptr(ws), np.int32(seg_n), np.int32(groups)]
    chains = (map_consumers(p, seg_n) if var.maps else
              consumers(p, var.recurrence.tiles.BV) * (p.N if seg_n else 1))
    run.launch(fn, (chains + producers, 1), (THREADS,), tuple(args), var.smem, cooperative=True)


def scratch(p, a, xp, ring: int):
    """The ring of ``ring`` slots a head and its flags (zeroed: an asynchronous fill on the stream), and ``a``
    with a strided ``cu_seqlens`` copied after them (ops/forward/workspace.py)."""
    blocks, flag_bytes = ring_bytes(p, ring)
    ws, a = workspace.scratch(p, a, blocks + flag_bytes, xp)
    flags = ws[blocks:blocks + flag_bytes].view(np.uint32)
    flags.fill(0)
    return ws[:blocks], flags, a


#: producer blocks of an emulated launch when none is asked for (each block an OS thread)
EMULATED_PRODUCERS = 2


def forward_fused(run, p, a, o, s_out, nslots, per_seq, var: FusedVariant, producers: int | None, xp):
    """The fused forward into ``o`` and ``s_out``: ``producers`` producer blocks (None: on the GPU every
    block the device holds beside the consumers, in the emulation EMULATED_PRODUCERS)."""
    n = consumers(p, var.recurrence.tiles.BV)
    if producers is None:
        if p.device:
            fn = run.get(var.kernel, var.config(), var.kernel)
            producers = run.resident_blocks(fn, THREADS, var.smem) - n
        else:
            producers = EMULATED_PRODUCERS
    if producers < 1:
        raise ValueError(f"fused forward: {n} consumer blocks leave no room for a producer "
                         f"({producers} asked or free)")
    if var.ring < var.recurrence.tiles.stages:
        raise ValueError(f"fused forward: a ring of {var.ring} slots under {var.recurrence.tiles.stages} stages")
    ring, flags, a = scratch(p, a, xp, var.ring)
    launch_fused(run, p, a, ring, flags, o, s_out, nslots, per_seq, var, producers)


# ---- the split forward's last segments (kdacupy/ops/seqpar/split.py, docs/design.md section 7.2) ----------------
# Its final launch as this kernel: a consumer a (segment, value head, 64 value rows); a segment but the last reads
# the workspace the prepare launch wrote for the maps, the last segment its head's stream of the ring, made by the
# producers on the SMs the chains leave free, so the prepare launch skips the last segments.

#: the prepare's own launch against the split forward's chains, per chain an SM: on the H200's issue-aware profile
#: at T = 8192, H = 12 and 4 segments, 34.6 us of prepare (132 SMs) against 33.8 us of 96 chains (1.02 at 96 / 132)
PREPARE_PER_CHAIN = 1.41


def split_streams(p, seg_n: int) -> int:
    """The ring's streams of a segment batch ``p`` of ``seg_n`` segments a sequence: a last segment's value head."""
    return p.N // seg_n * p.HV


def segment_chunks(T: int, seg_n: int) -> list[int]:
    """The chunks of each of ``seg_n`` segments of a T-token sequence, as ops/seqpar/split.py cuts it (segment s
    of c chunks: chunks floor(s c / n) to floor((s + 1) c / n))."""
    c = -(-T // layouts.CHUNK)
    return [(s + 1) * c // seg_n - s * c // seg_n for s in range(seg_n)]


def split_groups(T: int, seg_n: int, group: int) -> int:
    """Items of ``group`` chunks a last segment of a T-token sequence takes (the final launch's build)."""
    return -(-segment_chunks(T, seg_n)[-1] // group)


def split_map_groups(T: int, seg_n: int, group: int) -> int:
    """Items of ``group`` chunks the longest segment but the last of a T-token sequence takes (the maps' build)."""
    return -(-max(segment_chunks(T, seg_n)[:-1]) // group)


def split_maps_supported(p, tiles: TileConfig, mma: str) -> bool:
    """Whether the split's maps launch can make their own workspace (the maps build): ``p`` the merged maps'
    problem (a [K, K + V] fp32 state, no output), run on one warpgroup of the wgmma chain (``tiles``; ``mma``
    the family its launch runs, kernels.recurrence_mma's)."""
    return (tiles.mma == "wgmma" and tiles.BV == BV and exact_dims(p.K, p.V) and p.K <= 128 and p.V % BV == 0
            and mma == "wgmma")


def split_supported(p, tiles: TileConfig) -> bool:
    """Whether the split's final launch can be this kernel: its forward on the wgmma recurrence (sm_90a's choice;
    ``p`` the segment batch, ``tiles`` its forward's) at one warpgroup a consumer."""
    return tiles.mma == "wgmma" and supported(p, TileConfig(BV, tiles.stages, "wgmma"))


def split_pays(p, seg_n: int, sm_count: int | None, arch: str | None) -> bool:
    """Whether kda_forward's split of the fixed-length call ``p`` in ``seg_n`` segments a sequence makes its last
    segments in the final launch, by the issue-aware model on the H200: on sm_90a, when the chains leave SMs free
    and those take the last segments' share of the prepare (1 / seg_n of a launch PREPARE_PER_CHAIN times the
    chains' time per chain an SM) within the chains' time. Varlen calls keep the two launches (a last segment's
    length is on the device). Where it pays, the maps' launch makes the other segments too when it can
    (split_maps_supported; then there is no prepare launch): at T = 8192, H = 12 that took 0.091 -> 0.084 ms."""
    if arch != "sm_90a" or sm_count is None or p.varlen:
        return False
    chains = p.B * seg_n * consumers(p)
    free = sm_count - chains
    return free > 0 and PREPARE_PER_CHAIN * chains <= seg_n * free


def split_scratch(p, a, xp, nslots: int, ring: int, seg_n: int, maps: bool = False):
    """(workspace of every slot of the segment batch ``p``, the ring of ``ring`` slots a stream, its flags, the
    maps' flags (``maps``; else None), ``a`` with a strided ``cu_seqlens`` copied after them): one scratch
    buffer, the flags zeroed on the stream."""
    ws_bytes = p.HV * nslots * layouts.workspace(p.K)["WS_STRIDE"]
    blocks, flag_bytes = ring_bytes(p, ring, split_streams(p, seg_n))
    map_bytes = (p.HV * nslots + 2) * 4 if maps else 0
    buf, a = workspace.scratch(p, a, ws_bytes + blocks + flag_bytes + map_bytes, xp)
    flags = buf[ws_bytes + blocks:ws_bytes + blocks + flag_bytes + map_bytes].view(np.uint32)
    flags.fill(0)
    ring_flags, map_flags = flags[:flag_bytes // 4], (flags[flag_bytes // 4:] if maps else None)
    return buf[:ws_bytes], buf[ws_bytes:ws_bytes + blocks], ring_flags, map_flags, a


def map_consumers(p, seg_n: int) -> int:
    """The split's maps' chains (kernels/kda_recurrence.cu, map_work_item) over every value head: ``p`` the merged
    maps' problem (a [K, K + V] state), value rows below K the M part's."""
    mtiles, vb = p.K // BV, p.V // BV
    return p.HV * (p.N // seg_n) * ((seg_n - 2) * mtiles + (seg_n - 1) * (vb - mtiles))


def split_producers(run, p, var: FusedVariant, chains: int) -> int:
    """The split's producer blocks beside ``chains`` consumers: on the GPU every block the device holds beside
    them (as the serial launch), in the emulation EMULATED_PRODUCERS."""
    if not p.device:
        return EMULATED_PRODUCERS
    fn = run.get(var.kernel, var.config(), var.kernel)
    producers = run.resident_blocks(fn, THREADS, var.smem) - chains
    if producers < 1:  # (split_pays leaves SMs free; a caller forcing the launch on may not)
        raise ValueError(f"fused forward: the split's {chains} consumer blocks leave no room for a producer")
    return producers

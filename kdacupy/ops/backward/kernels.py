"""Launchers of the backward: the forward's prepare and recurrence (storing each chunk's start
state), then kda_bwd_chain, kda_bwd_chunk and kda_bwd_reduce (docs/design.md section 9.3).

The same code serves the GPU (CuPy arrays) and the CPU emulation (NumPy arrays), as the
forward's launchers do. Nothing here reads device memory or synchronises; scratch memory is the
forward's persistent per-(device, stream) workspace (ops/forward/workspace.py), so a call can
be captured in a CUDA graph; only the gradients are allocated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...jit.enums import DTYPE_CODE, STATE_DTYPE_CODE
from ...jit.loaders import loader
from ...numerics.dtypes import F32, dtype_name
from ..alloc import empty
from ..args import cu_args, lower_bound_log2, ptr, strides
from ..forward import kernels as fwd
from ..forward import layouts as fwd_layouts
from ..forward.tuning import TileConfig
from ...jit.nvrtc import SMEM_LIMIT
from .tiles import backward_tiles, chunk_block
from ..inputs import InputVariant, input_options
from . import layouts


@dataclass(frozen=True)
class ChainVariant:
    kernel: ClassVar[str] = "kda_bwd_chain"
    K: int
    V: int
    dtype: np.dtype  # do's
    tiles: TileConfig
    any_dims: bool = False  # K, V are the tiles, the true head dims launch arguments (KDA_ANY_DIMS)

    def config(self) -> dict:
        return dict(KDA_K=self.K, KDA_V=self.V, KDA_DT=DTYPE_CODE[self.dtype], KDA_BV=self.tiles.BV,
                    KDA_STAGES=self.tiles.stages, **fwd_layouts.workspace(self.K), **self._smem(),
                    **(dict(KDA_ANY_DIMS=1) if self.any_dims else {}))

    def _smem(self) -> dict:
        return layouts.chain_smem(self.K, self.tiles.BV, self.tiles.stages, np.dtype(self.dtype).itemsize)

    @property
    def smem(self) -> int:
        return self._smem()["BSM_TOTAL"]

    @property
    def threads(self) -> int:
        return self.tiles.BV // 16 * 32

    def label(self) -> str:
        sizes = f"K<={self.K} V<={self.V}" if self.any_dims else f"K={self.K} V={self.V}"
        return (f"kda_bwd_chain {sizes} dt={dtype_name(self.dtype)} BV={self.tiles.BV} "
                f"stages={self.tiles.stages}")


@dataclass(frozen=True)
class ChunkVariant(InputVariant):
    kernel: ClassVar[str] = "kda_bwd_chunk"
    any_dims: bool = False  # K is the key tile, the true head dims launch arguments (KDA_ANY_DIMS)
    bvc: int = 0  # value columns a block (0: the model's vblock(K), which every arch's shared memory holds)

    def layout_config(self) -> dict:
        return (layouts.chunk_smem(self.K, self.bvc) | fwd_layouts.workspace(self.K)  # it reads R1's Mqk
                | (dict(KDA_ANY_DIMS=1) if self.any_dims else {}))

    def label(self) -> str:
        text = super().label().replace(f" K={self.K} ", f" K<={self.K} ") if self.any_dims else super().label()
        return text + (f" BVC={self.bvc}" if self.bvc else "")

    @property
    def smem(self) -> int:
        return layouts.chunk_smem(self.K, self.bvc)["CSM_TOTAL"]

    @property
    def only_arches(self) -> tuple[str, ...] | None:
        """A wider block builds only where its shared memory fits (not sm_80's 163 KB)."""
        return tuple(a for a, limit in SMEM_LIMIT.items() if self.smem <= limit) if self.bvc else None

    @property
    def threads(self) -> int:
        return layouts.chunk_threads(self.K)


@dataclass(frozen=True)
class ReduceVariant:
    kernel: ClassVar[str] = "kda_bwd_reduce"
    K: int
    smem: ClassVar[int] = 0

    def config(self) -> dict:
        return dict(KDA_K=self.K)

    def label(self) -> str:
        return f"kda_bwd_reduce K={self.K}"


def chain_variant(p, tiles: TileConfig) -> ChainVariant:
    KT, VT, any_dims = fwd.tiles_of(p)
    return ChainVariant(KT, VT, p.dtype, tiles, any_dims)


def chunk_variant(p, arch: str | None = None) -> ChunkVariant:
    """kda_bwd_chunk's variant for a Problem on target ``arch`` (None: one every arch builds)."""
    KT, VT, any_dims = fwd.tiles_of(p)
    return ChunkVariant(KT, *input_options(p), any_dims=any_dims, bvc=chunk_block(KT, VT, arch))


def forward_parts(p, nslots: int) -> list[tuple[str, int]]:
    """(name, bytes) of what the forward's prepare and state-storing recurrence write for the backward: the
    workspace and the chunk states (at the key and value tiles: the kernels' own layouts). The backward's
    scratch holds them, or a forward keeps them (ops/backward/saved.py)."""
    KT, VT, _ = fwd.tiles_of(p)
    sb = 4 if p.state_precision == "fp32" else 2
    return [("ws", p.HV * nslots * fwd_layouts.workspace(KT)["WS_STRIDE"]), ("states", p.HV * nslots * VT * KT * sb)]


def place(parts: list[tuple[str, int]]) -> dict:
    """Byte offsets of consecutive parts, each at a multiple of 256, and the total."""
    out, off = {}, 0
    for name, size in parts:
        out[name] = (off, size)
        off = -(-(off + size) // 256) * 256
    out["total"] = off
    return out


def scratch_layout(p, nslots: int, kept: bool = False) -> dict:
    """Byte offsets in the backward's scratch buffer: the forward's parts (not with ``kept``: the
    forward's kept buffer holds them), the chunk gradient states, the partial sums, and room for a
    strided cu_seqlens' copy."""
    KT, VT, _ = fwd.tiles_of(p)
    parts = [] if kept else forward_parts(p, nslots)
    return place(parts + [("dstates", p.HV * nslots * VT * KT * 2), ("ddt", p.HV * nslots * KT * 4),
                          ("dA", p.HV * nslots * 4)])


def _views(buf, lay, a):
    """The scratch buffer's parts as arrays, and ``a`` with a strided cu_seqlens copied in."""
    part = lambda name: buf[lay[name][0]:lay[name][0] + lay[name][1]]  # noqa: E731
    cu = a["cu_seqlens"]
    if cu is not None and not cu.flags.c_contiguous:
        dense = buf[lay["total"]:lay["total"] + cu.nbytes].view(cu.dtype)
        dense[...] = cu
        a = dict(a, cu_seqlens=dense)
    return dict(ws=part("ws") if "ws" in lay else None, states=part("states") if "states" in lay else None,
                dstates=part("dstates"), ddt=part("ddt").view(np.float32), dA=part("dA").view(np.float32)), a


def _out(xp, like, shape=None, dtype=None):
    return None if like is None else empty(xp, like.shape if shape is None else shape, dtype or like.dtype)


def backward(p, a, tiles: TileConfig | None = None, arch: str | None = None, kept: dict | None = None):
    """Every launch of one kda_backward call; returns the eight gradients (None where not asked). ``arch``:
    the target whose kda_bwd_chunk variant runs (on a GPU, its own by default; the emulation: one every arch
    builds, unless named). ``kept``: the views ``ws`` and ``states`` of a forward's kept buffer
    (ops/backward/saved.py): the prepare and the recurrence are not run again."""
    if p.device:
        import cupy as xp
        if arch is None:
            from ..forward.tuning import current_arch
            arch = current_arch()
    else:
        xp = np
    run = loader("cuda" if p.device else "emulate")
    tiles = tiles or backward_tiles(p)
    nslots, per_seq = fwd.slots(p)
    lay = scratch_layout(p, nslots, kept is not None)
    cu = a["cu_seqlens"]
    total = lay["total"] + (cu.nbytes if cu is not None and not cu.flags.c_contiguous else 0)
    if p.device:
        from ..forward.workspace import device_workspace
        buf = device_workspace(total)
    else:
        buf = empty(xp, total, np.uint8)
    sc, a = _views(buf, lay, a)
    if kept is not None:
        sc.update(ws=kept["ws"], states=kept["states"])
    grads = dict(dq=_out(xp, a["q"]), dk=_out(xp, a["k"]), dv=_out(xp, a["v"]), dg=_out(xp, a["g"]),
                 dbeta=_out(xp, a["beta"]), dinitial_state=_out(xp, a["initial_state"]),
                 dA_log=_out(xp, a["A_log"], dtype=F32), ddt_bias=_out(xp, a["dt_bias"], dtype=F32))
    if nslots and kept is None:
        fwd.launch_prepare(run, p, a, sc["ws"], nslots, per_seq)
        fwd.launch_recurrence(run, p, a, sc["ws"], None, None, nslots, per_seq, tiles, no_output=True,
                              states=sc["states"])
    launch_chain(run, p, a, sc, grads["dinitial_state"], nslots, per_seq, tiles)
    if nslots:
        launch_chunk(run, p, a, sc, grads, nslots, per_seq, arch)
    if grads["dA_log"] is not None or grads["ddt_bias"] is not None:
        launch_reduce(run, p, sc, grads, nslots)
    return grads


def launch_chain(run, p, a, sc, dinit, nslots, per_seq, tiles):
    var = chain_variant(p, tiles)
    fn = run.get("kda_bwd_chain", var.config(), "kda_bwd_chain")
    ds = a["dfinal_state"]
    args = [ptr(sc["ws"]), ptr(a["do"]), *strides(a["do"]),
            ptr(ds), np.int32(STATE_DTYPE_CODE[None if ds is None else np.dtype(ds.dtype)]),
            ptr(dinit), np.int32(STATE_DTYPE_CODE[None if dinit is None else np.dtype(dinit.dtype)]),
            np.int32(p.state_layout == "vk"), ptr(sc["dstates"]), *cu_args(a["cu_seqlens"]),
            np.int32(p.T), np.int32(p.HV), np.int32(nslots), np.int32(per_seq), np.int32(p.K), np.int32(p.V)]
    run.launch(fn, (p.N * -(-p.V // tiles.BV), p.HV), (var.threads,), tuple(args), var.smem)


def launch_chunk(run, p, a, sc, grads, nslots, per_seq, arch=None):
    var = chunk_variant(p, arch)
    fn = run.get("kda_bwd_chunk", var.config(), "kda_bwd_chunk")
    lb = np.float32(p.lower_bound) if p.lower_bound is not None else np.float32(0)
    args = [ptr(a[n]) for n in ("q", "k", "v", "g", "beta", "do")]
    for n in ("q", "k", "v", "g", "beta", "do"):
        args += strides(a[n])
    args += [ptr(a["A_log"]), ptr(a["dt_bias"]), *cu_args(a["cu_seqlens"]), np.int32(p.T),
             np.int32(p.H), np.int32(p.HV), np.int32(fwd.tiles_of(p)[1]), np.int32(p.N), np.int32(nslots), np.int32(per_seq),
             np.float32(p.scale), lower_bound_log2(p), lb, ptr(sc["states"]), np.int32(p.state_precision == "fp32"),
             ptr(sc["dstates"]), ptr(sc["ws"])]
    args += [ptr(grads[n]) for n in ("dq", "dk", "dv", "dg", "dbeta")]
    args += [ptr(sc["ddt"] if grads["ddt_bias"] is not None else None),
             ptr(sc["dA"] if grads["dA_log"] is not None else None), np.int32(p.K), np.int32(p.V)]
    run.launch(fn, (nslots, p.H), (var.threads,), tuple(args), var.smem)


def launch_reduce(run, p, sc, grads, nslots):
    var = ReduceVariant(fwd.tiles_of(p)[0])
    fn = run.get("kda_bwd_reduce", var.config(), "kda_bwd_reduce")
    ddt, dA = grads["ddt_bias"], grads["dA_log"]
    args = [ptr(sc["ddt"] if ddt is not None else None), ptr(sc["dA"] if dA is not None else None),
            ptr(ddt), ptr(dA), np.int32(nslots), np.int32(p.K)]
    run.launch(fn, (p.HV,), (layouts.REDUCE_THREADS,), tuple(args), 0)

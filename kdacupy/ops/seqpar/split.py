"""Sequence parallelism's machinery (docs/design.md section 7.2): segment
boundaries, the fp32 scan of the segments' maps, the split forward, and the
kernel launches (one prepare shared by the map launches and the final
forward; the scan kernel). The public face, the choice of the segment count
and ``state_maps`` are in ``kdacupy/seqpar.py``."""
from __future__ import annotations

import dataclasses

import numpy as np

from ...numerics.dtypes import BF16, F32
from ..alloc import empty
from ..forward.layouts import CHUNK
# ---------------------------------------------------------------------------
# segments


def _xp(p):
    if p.device:
        import cupy
        return cupy
    return np


def segment_cu_seqlens(cu, n, xp=np):
    """int64 ``[N * n + 1]`` boundaries of ``n`` segments per sequence of
    ``cu`` (``[N + 1]``): segment s of a sequence of c chunks holds chunks
    ``[floor(s c / n), floor((s + 1) c / n))``, the last one the ragged tail.
    Device arrays stay on the device (no synchronisation)."""
    cu = cu.astype(xp.int64)
    bos, eos = cu[:-1], cu[1:]
    chunks = (xp.maximum(eos - bos, 0) + CHUNK - 1) // CHUNK
    s = xp.arange(n, dtype=xp.int64)
    first = bos[:, None] + CHUNK * (chunks[:, None] * s[None, :] // n)
    first = xp.minimum(first, eos[:, None])
    return xp.concatenate([first.reshape(-1), cu[-1:]])


def _flatten(p, a, n):
    """(Problem, arrays) of the segment batch: B = 1, N * n varlen sequences."""
    xp = _xp(p)
    if p.varlen:
        cu = a["cu_seqlens"]
        b = dict(a)
    else:
        cu = xp.arange(p.B + 1, dtype=xp.int64) * p.T
        b = {name: (None if x is None or name not in ("q", "k", "v", "g", "beta") else
                    x.reshape((1, p.B * p.T) + x.shape[2:])) for name, x in a.items()}
        b.update(initial_state=a["initial_state"], A_log=a["A_log"], dt_bias=a["dt_bias"])
    b["cu_seqlens"] = segment_cu_seqlens(cu, n, xp)
    b["out"] = None
    q = dataclasses.replace(p, B=1, T=p.B * p.T, N=p.N * n, varlen=True)
    return q, b


def scan(M, Bm, S0, n):
    """Start states ``[N * n, HV, K, V]`` of the segments: ``S0`` ([N, HV, K, V],
    kv) for the first, then ``S_start[s + 1] = M_s S_start[s] + B_s`` in M's
    dtype (fp32; float64 on the reference)."""
    xp = _array_module(M)
    N, HV, K, V = S0.shape
    M = M.reshape(N, n, HV, K, K)
    Bm = Bm.reshape(N, n, HV, K, V)
    S = xp.empty((N, n, HV, K, V), dtype=M.dtype)
    S[:, 0] = S0
    for s in range(n - 1):
        S[:, s + 1] = xp.matmul(M[:, s], S[:, s]) + Bm[:, s]
    return S.reshape(N * n, HV, K, V)


def _array_module(x):
    if isinstance(x, np.ndarray):
        return np
    import cupy
    return cupy


def _kv(s):
    return s.swapaxes(-1, -2)


# ---------------------------------------------------------------------------
# the split forward


def forward_split(p, a, n):
    """kda_forward of a validated call with ``n`` segments per sequence."""
    xp = _xp(p)
    ps, b = _flatten(p, a, n)
    if p.backend in ("cuda", "emulate"):
        run = KernelRun(ps, b, segments=n, fused_last=fused_last(p, n))
        M, Bm = run.maps()
        starts = run.scan(M, Bm, a["initial_state"], p.state_in_dtype, n)
        out = a["out"]
        direct = out is not None and (p.varlen or out.flags.c_contiguous)  # a [1, B*T] view of out
        o, s_seg = run.forward(starts, out.reshape(b["v"].shape) if direct else None)
        if direct:
            o = out
    else:
        state_dtype = F32 if p.backend != "reference" else np.float64
        S0 = a["initial_state"]
        if S0 is None:
            S0 = xp.zeros((p.N, p.HV, p.K, p.V), dtype=state_dtype)
        else:
            S0 = (S0 if p.state_layout == "kv" else _kv(S0)).astype(state_dtype)
        M, Bm = numpy_maps(ps, b, first=S0 if a["initial_state"] is not None else None)
        starts = scan(M, Bm, S0, n)
        o, s_seg = _forward_numpy(ps, b, _from_kv(starts, p.state_layout))
    o = o.reshape(a["v"].shape)
    if a["out"] is not None and o is not a["out"]:
        a["out"][...] = o
        o = a["out"]
    final = None
    if s_seg is not None:
        final = xp.ascontiguousarray(s_seg.reshape((p.N, n) + s_seg.shape[1:])[:, -1])
    return o, final


def _from_kv(s, layout):
    if layout == "kv":
        return s
    return _array_module(s).ascontiguousarray(_kv(s))


class KernelRun:
    """The kernel launches of one segment batch on "cuda" or "emulate": one
    prepare, shared by the map launches and the final forward. ``segments``:
    the batch is that many segments a sequence of the split forward, whose
    scan reads only the maps it needs; None (``state_maps``): every map.
    ``fused_last`` (with ``segments``; the call's tokens a sequence): the final
    launch makes the last segments' workspace blocks itself (ops/forward/fused.py's
    split build), so the prepare skips them, and where the maps run merged on one
    warpgroup their launch makes the others (its maps build: no prepare launch)."""

    def __init__(self, p, a, segments=None, fused_last=None):
        from ...jit.loaders import loader
        from ..forward import kernels
        from ..forward.tuning import CORE_FAMILIES

        self.p, self.xp, self.segments = p, _xp(p), segments
        self.run = loader("cuda" if p.device else "emulate")
        self.nslots, self.per_seq = kernels.slots(p)
        # the recurrence launches (the M and B maps, then the forward), their tiles chosen as the
        # forward's (kernels.select_tiles: wgmma on sm_90a where it serves): the prepare writes the
        # core-matrix workspace when every one of them runs wgmma, else the row-major one for mma.sync
        fp32 = dict(state_precision="fp32", state_layout="kv", state_out_dtype=F32)
        # name -> (problem, no output, v = 0: M's run reads no value rows)
        fold = segments is not None and a["initial_state"] is not None  # (maps: B_0 from the initial state)
        self.launches = {"M": (dataclasses.replace(p, V=p.K, state_in_dtype=F32, **fp32), True, True),
                         "B": (dataclasses.replace(p, state_in_dtype=F32 if fold else None, **fp32), True, False),
                         "forward": (dataclasses.replace(p, state_in_dtype=F32), False, False)}
        self.tiles = {n: kernels.select_tiles(q) for n, (q, _, _) in self.launches.items()}
        merged = dataclasses.replace(p, V=p.K + p.V, state_in_dtype=F32, **fp32)
        if _merges(p, merged, self.tiles["B"]):
            # one launch of both maps, side by side in a [K, K + V] state at the B map's tiles
            self.launches = {"maps": (merged, True, False), "forward": self.launches["forward"]}
            self.tiles = {"maps": self.tiles["B"], "forward": self.tiles["forward"]}
        self.ws_core = all(kernels.recurrence_mma(q, self.tiles[n], no_output) in CORE_FAMILIES
                           for n, (q, no_output, _) in self.launches.items())
        self.fused, self.fused_maps = self._fused_builds(fused_last) if fused_last is not None else (None, None)
        # the forward's workspace: on the GPU the stream's persistent buffer (no per-call
        # allocation), a strided cu_seqlens copied to its end; the emulation takes a fresh one
        if self.fused is None:
            self.ws, self.a = kernels.workspace(p, a, self.nslots, self.xp)
        else:
            from ..forward import fused

            self.ws, self.ring, self.flags, self.map_flags, self.a = fused.split_scratch(
                p, a, self.xp, self.nslots, self.fused[0].ring, segments, maps=self.fused_maps is not None)
        if self.nslots and self.fused_maps is None:
            skip = {} if self.fused is None else dict(skip_last_of=segments, slot_end=self._last_first_slot())
            kernels.launch_prepare(self.run, p, self.a, self.ws, self.nslots, self.per_seq, self.ws_core, **skip)

    def _fused_builds(self, tokens):
        """(the final launch's split build, the maps' build), each with its items a stream at most, or None where
        it does not serve (the plain launch, as the serial forward's "on" does): the split build where the final
        launch runs the wgmma chain, the maps' where the maps run merged on one warpgroup too."""
        from ..forward import fused, kernels

        q, tiles = self.launches["forward"][0], self.tiles["forward"]
        if not (self.ws_core and fused.split_supported(q, tiles)):
            return None, None
        last = (kernels.fused_variant(q, fused.tiles_of(tiles, q), split=True),
                fused.split_groups(tokens, self.segments, fused.GROUP))
        maps = self.launches.get("maps", (None,))[0]
        if maps is None or not fused.split_maps_supported(
                maps, self.tiles["maps"], kernels.recurrence_mma(maps, self.tiles["maps"], no_output=True)):
            return last, None
        return last, (kernels.fused_variant(maps, self.tiles["maps"], maps=True),
                      fused.split_map_groups(tokens, self.segments, fused.GROUP))

    def _last_first_slot(self):
        """With one sequence of fixed length, the first slot of its last segment (first_slot: n + bos / 16 of
        segment n; every slot from it on the last segment's, so no prepare CTA starts there), else None."""
        from ..forward.fused import segment_chunks

        n = self.segments
        return n - 1 + sum(segment_chunks(self.p.T, n)[:-1]) if self.p.N == n else None

    def _recurrence(self, name, a, o, s_out, maps=None):
        from ..forward.kernels import launch_recurrence

        q, no_output, v_zero = self.launches[name]
        launch_recurrence(self.run, q, a, self.ws, o, s_out, self.nslots, self.per_seq, self.tiles[name],
                          no_output=no_output, ws_core=self.ws_core, v_zero=v_zero, maps=maps)

    def maps(self):
        """(M [NS, HV, K, K], B [NS, HV, K, V]) of every segment in fp32 (kv); views of one [K, K + V]
        state where the maps run merged. With ``segments``, what the scan does not read is not run (the
        last segment's maps; the first one's M) and the initial state is folded into the first
        segment's maps: its B runs from the initial state and its M is zero, so the scan's
        ``M_0 S_0 + B_0`` is that run's end (one fp32 chain from the initial state, as the serial
        forward's, instead of an M map more to run)."""
        p, a, xp, n = self.p, self.a, self.xp, self.segments
        K = p.K
        fold = n is not None and a["initial_state"] is not None
        first = _kv_f32(a["initial_state"], p.state_layout, xp) if fold else None
        by_seq = lambda x: x.reshape((p.N // n, n) + x.shape[1:])  # noqa: E731  [N, n, HV, K, .]
        if "maps" in self.launches:
            W = K + p.V
            S = xp.zeros((p.N, p.HV, K, W), dtype=F32)
            S.reshape(-1, K * W)[:, ::W + 1] = 1  # [I | 0]: M from the identity, B from zero
            if fold:
                by_seq(S)[:, 0, :, :, :K] = 0
                by_seq(S)[:, 0, :, :, K:] = first
            m_tiles = K // self.tiles["maps"].BV
            work = (0 if n is None else n, m_tiles)  # 0: every map (state_maps)
            if self.fused_maps is None:
                self._recurrence("maps", dict(a, initial_state=S), None, S, maps=work)
            else:  # with the prepare of every segment but the last (fused.py's maps build)
                from ..forward import fused

                var, groups = self.fused_maps
                q = self.launches["maps"][0]
                chains = fused.map_consumers(q, n)
                fused.launch_fused(self.run, q, dict(a, initial_state=S), None, self.map_flags, None, S, self.nslots,
                                   self.per_seq, var, fused.split_producers(self.run, q, var, chains), ws=self.ws,
                                   seg_n=n, groups=groups)
            return S[..., :K], S[..., K:]
        M = xp.zeros((p.N, p.HV, K, K), dtype=F32)
        M.reshape(-1, K * K)[:, ::K + 1] = 1  # the identity in place: no temporary
        # (a segment the scan reads not: never written)
        Bm = xp.zeros((p.N, p.HV, K, p.V), dtype=F32) if fold else empty(xp, (p.N, p.HV, K, p.V), F32)
        if fold:
            by_seq(M)[:, 0] = 0
            by_seq(Bm)[:, 0] = first
        # M: value columns = the K columns of I, v = 0 (a zero-stride view), the state updated in place
        zero_v = xp.broadcast_to(xp.zeros((1, 1, 1, K), dtype=p.dtype), a["v"].shape[:3] + (K,))
        m_work = b_work = None
        if n is not None and work_list(K):
            m_work = (n, -(-K // self.tiles["M"].BV))  # every value tile the M part
            b_work = (n, 0)  # no M part: the B map's tiles alone
        self._recurrence("M", dict(a, v=zero_v, initial_state=M), None, M, maps=m_work)
        self._recurrence("B", dict(a, initial_state=Bm if fold else None), None, Bm, maps=b_work)
        return M, Bm

    def scan(self, M, Bm, s0, s0_dtype, n):
        # step 0's M_0 S_0 is zero: M_0 the identity with no initial state, or zero with it folded
        return scan_kernel(self.run, M, Bm, s0, s0_dtype, self.p.state_layout, n, m_from=int(self.segments is not None))

    def forward(self, starts, o=None):
        """The ordinary forward of the segments from ``starts`` (fp32, the call's
        layout), into ``o`` when given: the fused launch with ``fused_last``."""
        p, a, xp = self.p, self.a, self.xp
        if o is None:
            o = empty(xp, a["v"].shape, p.dtype)
        s_out = None
        if p.state_out_dtype is not None:
            s_out = empty(xp, starts.shape, p.state_out_dtype)
        if self.fused is None:
            self._recurrence("forward", dict(a, initial_state=starts), o, s_out)
            return o, s_out
        from ..forward import fused

        var, groups = self.fused
        q = self.launches["forward"][0]
        chains = fused.consumers(q) * p.N
        fused.launch_fused(self.run, q, dict(a, initial_state=starts), self.ring, self.flags, o, s_out, self.nslots,
                           self.per_seq, var, fused.split_producers(self.run, q, var, chains), ws=self.ws,
                           seg_n=self.segments, groups=groups)
        return o, s_out


def fused_last(p, n):
    """For kda_forward's split of the validated call ``p`` in ``n`` segments: its tokens a sequence when the
    final launch may make the last segments itself (ops/forward/fused.py; the maps' launch the others, where
    they run merged on the wgmma chain), else None. As KDACUPY_FORWARD_FUSED
    says: on, for fixed-length calls (the emulation too); auto, on the GPU where ``fused.split_pays``; off,
    never. KernelRun takes it where the split's tiles serve it (its forward on the wgmma recurrence)."""
    from ... import env
    from ..forward import fused, tuning

    mode = env.get("KDACUPY_FORWARD_FUSED")
    if mode == "off" or p.varlen or p.backend not in ("cuda", "emulate"):
        return None
    if mode == "auto" and not (p.device and fused.split_pays(p, n, tuning.device_facts()[2], tuning.current_arch())):
        return None
    return p.T


#: the scan kernel's tiling: SC value columns per CTA, CPT of them per thread, RG row groups (SC / CPT * RG
#: threads); scan_ti(K) columns of M per staged block
SCAN_SC, SCAN_CPT, SCAN_RG = 16, 4, 32
SCAN_THREADS = SCAN_SC // SCAN_CPT * SCAN_RG


def scan_ti(K) -> int:
    """Keys of M per staged block: 16, or 8 at K = 256 (two blocks in flight stay within 48 KB)."""
    return 16 if K <= 128 else 8


def scan_config(K, V, any_dims=False) -> dict:
    """The scan's defines for tiles K, V (``any_dims``: the true sizes launch arguments)."""
    return dict(KDA_K=int(K), KDA_V=int(V), SCAN_SC=SCAN_SC, SCAN_CPT=SCAN_CPT, SCAN_RG=SCAN_RG, SCAN_TI=scan_ti(K),
                **(dict(KDA_ANY_DIMS=1) if any_dims else {}))


def scan_smem(K) -> int:
    return (K * SCAN_SC + 2 * K * (scan_ti(K) + 4)) * 4  # the slice, and two staged blocks of M in padded rows


@dataclasses.dataclass(frozen=True)
class ScanVariant:
    """One variant of kernels/kda_seqpar_scan.cu (for ``python -m kdacupy.compile``)."""
    K: int
    V: int
    any_dims: bool = False
    kernel = "kda_seqpar_scan"

    def config(self) -> dict:
        return scan_config(self.K, self.V, self.any_dims)

    @property
    def smem(self) -> int:
        return scan_smem(self.K)

    def label(self) -> str:
        return f"kda_seqpar_scan K<={self.K} V<={self.V}" if self.any_dims else f"kda_seqpar_scan K={self.K} V={self.V}"


def scan_kernel(run, M, Bm, s0, s0_dtype, state_layout, n, m_from=0):
    """``scan`` as one kernel launch (kernels/kda_seqpar_scan.cu) through the
    loader ``run``: the start states ``[N * n, HV, K, V]`` (``"vk"``:
    ``[N * n, HV, V, K]``) in fp32, the initial state ``s0`` (None, or
    ``[N, HV, ...]`` in ``s0_dtype`` and ``state_layout``) read as it is. ``M`` and
    ``Bm`` may be views whose rows are further apart than their width (the merged
    maps' ``[..., K, K + V]`` state, sliced), each matrix of them whole rows. ``m_from``: the first
    step whose M is read; the steps before it take ``S_start[s + 1] = B_s`` (the split's first: its
    ``M_0 S_0`` is zero, the initial state folded into ``B_0`` or none)."""
    from ...jit.enums import STATE_DTYPE_CODE
    from ..args import ptr

    from ...numerics.tiles import exact_dims, tile_of

    xp = _array_module(M)
    NS, HV, K, _ = M.shape
    V = Bm.shape[-1]
    KT, VT, any_dims = tile_of(K), tile_of(V), not exact_dims(K, V)
    starts = empty(xp, (NS, HV, K, V) if state_layout == "kv" else (NS, HV, V, K), F32)
    fn = run.get("kda_seqpar_scan", scan_config(KT, VT, any_dims), "kda_seqpar_scan")
    args = (ptr(M), ptr(Bm), ptr(s0), np.int32(STATE_DTYPE_CODE[None if s0 is None else s0_dtype]),
            np.int32(state_layout == "vk"), ptr(starts), np.int32(HV), np.int32(n), np.int32(K), np.int32(V),
            np.int32(_row_floats(M)), np.int32(_row_floats(Bm)), np.int32(m_from))
    run.launch(fn, (NS // n * -(-V // SCAN_SC), HV), (SCAN_THREADS,), args, scan_smem(KT))
    return starts


def _kv_f32(s0, layout, xp):
    """The initial states ``s0`` ([N, HV, ...] in ``layout``, bf16 or fp32) as fp32 [N, HV, K, V], exactly."""
    x = s0 if layout == "kv" else s0.swapaxes(-1, -2)
    if x.dtype == F32:
        return x
    assert x.dtype == BF16, x.dtype
    return (x.view(xp.uint16).astype(xp.uint32) << 16).view(F32)  # bf16 is fp32's high half


def work_list(K) -> bool:
    """Whether the maps' builds of key dim K take a work list (kernels/kda_recurrence.cu, MAP_WORK_LIST:
    key tiles up to 128); at K = 256 every segment's maps run, the unread ones for nothing."""
    from ...numerics.tiles import tile_of

    return tile_of(K) <= 128


def merges_maps(K, V) -> bool:
    """Whether head dims K, V have merged maps: the [K, K + V] state of both a variant of the tiles'
    head dims (K + V one of them)."""
    from ...numerics.tiles import TILES, exact_dims

    return exact_dims(K, V) and K + V in TILES


def _merges(p, merged, tiles) -> bool:
    """Whether the M and B maps run as one launch (merges_maps) at the B map's tiles, whose value
    slices split at K."""
    from ..forward.kernels import unfit

    return merges_maps(p.K, p.V) and p.K % tiles.BV == 0 and unfit(merged, tiles) is None


def _row_floats(x) -> int:
    """The floats between rows of ``x`` ([NS, HV, K, cols] fp32, rows of whole matrices back to back)."""
    NS, HV, K, cols = x.shape
    ld = x.strides[2] // 4
    assert x.dtype == F32 and x.strides[3] == 4 and ld >= cols, "fp32 rows, the last dim contiguous"
    assert x.strides[1] == K * ld * 4 and (NS == 1 or x.strides[0] == HV * K * ld * 4), "whole matrices"
    return ld


def _numpy_options(p, a):
    return dict(scale=p.scale, cu_seqlens=a["cu_seqlens"], qk_l2norm=p.qk_l2norm,
                beta_sigmoid=p.beta_mode in ("sigmoid", "sigmoid2"), allow_neg_eigval=p.beta_mode == "sigmoid2",
                gate=p.gate, A_log=a["A_log"], dt_bias=a["dt_bias"], lower_bound=p.lower_bound)


def numpy_maps(p, a, first=None):
    """The maps on "model" (fp32-state precision model runs) or "reference" (float64). ``first``: the
    split's initial states ([N, HV, K, V], kv, the runs' dtype; p's sequences n segments each): folded
    into the first segments' maps as the kernels' split does (``KernelRun.maps``: B from them, M zero)."""
    K = p.K
    opts = _numpy_options(p, a)
    dt = F32 if p.backend == "model" else np.float64
    eye = np.broadcast_to(np.eye(K, dtype=dt), (p.N, p.HV, K, K))
    zero_v = np.broadcast_to(np.zeros((), dtype=p.dtype), a["v"].shape[:3] + (K,))
    b0 = None
    if first is not None:
        b0 = np.zeros((p.N, p.HV, K, p.V), dtype=dt)
        b0.reshape((first.shape[0], -1) + b0.shape[1:])[:, 0] = first
    args = (a["q"], a["k"])
    tail = (a["g"], a["beta"])
    if p.backend == "model":
        from ...numerics.precision import kda_model

        run = lambda v, s0: kda_model(*args, v, *tail, initial_state=s0, output_final_state=True,  # noqa: E731
                                      state_dtype=F32, state_precision="fp32", **opts)[1]
    else:
        from ...numerics.reference import kda_reference

        run = lambda v, s0: kda_reference(*args, v, *tail, initial_state=s0, output_final_state=True,  # noqa: E731
                                          **opts)[1]
    M, B = run(zero_v, eye), run(a["v"], b0)
    if first is not None:
        M.reshape((first.shape[0], -1) + M.shape[1:])[:, 0] = 0
    return M, B


def _forward_numpy(p, a, starts):
    opts = dict(_numpy_options(p, a), initial_state=starts, state_layout=p.state_layout,
                output_final_state=p.state_out_dtype is not None)
    if p.backend == "model":
        from ...numerics.precision import kda_model

        return kda_model(a["q"], a["k"], a["v"], a["g"], a["beta"], state_dtype=p.state_out_dtype,
                         state_precision=p.state_precision, **opts)
    from ...numerics.reference import kda_reference

    o, s = kda_reference(a["q"], a["k"], a["v"], a["g"], a["beta"], **opts)
    o = o.astype(np.float32).astype(p.dtype)
    if s is not None:
        s = s.astype(np.float32).astype(p.state_out_dtype)
    return o, s

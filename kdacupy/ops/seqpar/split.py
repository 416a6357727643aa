"""Sequence parallelism's machinery (docs/design.md section 7.2): segment
boundaries, the fp32 scan of the segments' maps, the split forward, and the
kernel launches (one prepare shared by the map launches and the final
forward; the scan kernel). The public face, the choice of the segment count
and ``state_maps`` are in ``kdacupy/seqpar.py``."""
from __future__ import annotations

import dataclasses

import numpy as np

from ...numerics.dtypes import F32
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
        run = KernelRun(ps, b)
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
        M, Bm = numpy_maps(ps, b)
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
    prepare, shared by the map launches and the final forward."""

    def __init__(self, p, a):
        from ...jit.loaders import loader
        from ..forward import kernels
        from ..forward.tuning import CORE_FAMILIES

        self.p, self.xp = p, _xp(p)
        self.run = loader("cuda" if p.device else "emulate")
        self.nslots, self.per_seq = kernels.slots(p)
        # the three recurrence launches (the M and B maps, then the forward), their tiles chosen as
        # the forward's (kernels.select_tiles: wgmma on sm_90a where it serves): the prepare writes the
        # core-matrix workspace when every one of them runs wgmma, else the row-major one for mma.sync
        fp32 = dict(state_precision="fp32", state_layout="kv", state_out_dtype=F32)
        # name -> (problem, no output, v = 0: M's run reads no value rows)
        self.launches = {"M": (dataclasses.replace(p, V=p.K, state_in_dtype=F32, **fp32), True, True),
                         "B": (dataclasses.replace(p, state_in_dtype=None, **fp32), True, False),
                         "forward": (dataclasses.replace(p, state_in_dtype=F32), False, False)}
        self.tiles = {n: kernels.select_tiles(q) for n, (q, _, _) in self.launches.items()}
        self.ws_core = all(kernels.recurrence_mma(q, self.tiles[n], no_output) in CORE_FAMILIES
                           for n, (q, no_output, _) in self.launches.items())
        # the forward's workspace: on the GPU the stream's persistent buffer (no per-call
        # allocation), a strided cu_seqlens copied to its end; the emulation takes a fresh one
        self.ws, self.a = kernels.workspace(p, a, self.nslots, self.xp)
        if self.nslots:
            kernels.launch_prepare(self.run, p, self.a, self.ws, self.nslots, self.per_seq, self.ws_core)

    def _recurrence(self, name, a, o, s_out):
        from ..forward.kernels import launch_recurrence

        q, no_output, v_zero = self.launches[name]
        launch_recurrence(self.run, q, a, self.ws, o, s_out, self.nslots, self.per_seq, self.tiles[name],
                          no_output=no_output, ws_core=self.ws_core, v_zero=v_zero)

    def maps(self):
        p, a, xp = self.p, self.a, self.xp
        K = p.K
        M = xp.zeros((p.N, p.HV, K, K), dtype=F32)
        M.reshape(-1, K * K)[:, ::K + 1] = 1  # the identity in place: no temporary
        Bm = empty(xp, (p.N, p.HV, K, p.V), F32)
        # M: value columns = the K columns of I, v = 0 (a zero-stride view), the state updated in place
        zero_v = xp.broadcast_to(xp.zeros((1, 1, 1, K), dtype=p.dtype), a["v"].shape[:3] + (K,))
        self._recurrence("M", dict(a, v=zero_v, initial_state=M), None, M)
        self._recurrence("B", dict(a, initial_state=None), None, Bm)
        return M, Bm

    def scan(self, M, Bm, s0, s0_dtype, n):
        return scan_kernel(self.run, M, Bm, s0, s0_dtype, self.p.state_layout, n)

    def forward(self, starts, o=None):
        """The ordinary forward of the segments from ``starts`` (fp32, the call's
        layout), into ``o`` when given."""
        p, a, xp = self.p, self.a, self.xp
        if o is None:
            o = empty(xp, a["v"].shape, p.dtype)
        s_out = None
        if p.state_out_dtype is not None:
            s_out = empty(xp, starts.shape, p.state_out_dtype)
        self._recurrence("forward", dict(a, initial_state=starts), o, s_out)
        return o, s_out


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


def scan_kernel(run, M, Bm, s0, s0_dtype, state_layout, n):
    """``scan`` as one kernel launch (kernels/kda_seqpar_scan.cu) through the
    loader ``run``: the start states ``[N * n, HV, K, V]`` (``"vk"``:
    ``[N * n, HV, V, K]``) in fp32, the initial state ``s0`` (None, or
    ``[N, HV, ...]`` in ``s0_dtype`` and ``state_layout``) read as it is."""
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
            np.int32(state_layout == "vk"), ptr(starts), np.int32(HV), np.int32(n), np.int32(K), np.int32(V))
    run.launch(fn, (NS // n * -(-V // SCAN_SC), HV), (SCAN_THREADS,), args, scan_smem(KT))
    return starts


def _numpy_options(p, a):
    return dict(scale=p.scale, cu_seqlens=a["cu_seqlens"], qk_l2norm=p.qk_l2norm,
                beta_sigmoid=p.beta_mode in ("sigmoid", "sigmoid2"), allow_neg_eigval=p.beta_mode == "sigmoid2",
                gate=p.gate, A_log=a["A_log"], dt_bias=a["dt_bias"], lower_bound=p.lower_bound)


def numpy_maps(p, a):
    """The maps on "model" (fp32-state precision model runs) or "reference" (float64)."""
    K = p.K
    opts = _numpy_options(p, a)
    eye = np.broadcast_to(np.eye(K), (p.N, p.HV, K, K))
    zero_v = np.broadcast_to(np.zeros((), dtype=p.dtype), a["v"].shape[:3] + (K,))
    args = (a["q"], a["k"])
    tail = (a["g"], a["beta"])
    if p.backend == "model":
        from ...numerics.precision import kda_model

        run = lambda v, s0: kda_model(*args, v, *tail, initial_state=s0, output_final_state=True,  # noqa: E731
                                      state_dtype=F32, state_precision="fp32", **opts)[1]
        return run(zero_v, eye.astype(F32)), run(a["v"], None)
    from ...numerics.reference import kda_reference

    run = lambda v, s0: kda_reference(*args, v, *tail, initial_state=s0, output_final_state=True,  # noqa: E731
                                      **opts)[1]
    return run(zero_v, eye), run(a["v"], None)


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

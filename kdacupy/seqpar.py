"""Sequence parallelism inside one device (DESIGN.md section 7.2).

A segment of a sequence acts on the state affinely: with the state ``S`` in
``[K, V]`` ("kv") orientation, ``S_end = M S_start + B``, ``M: [K, K]``,
``B: [K, V]``. Per token ``S <- (I - beta k k^T) diag(exp g) S + beta k v^T``,
so ``M`` is the product of the tokens' transition matrices (last token on the
left) and ``B`` is the segment run from a zero state. Value columns of the state
evolve independently, so both come out of ordinary recurrence runs over the
segment: ``M`` from the initial state ``I`` with ``v = 0`` (``K`` value
columns), ``B`` from zero with the real ``v``; the two runs keep the state in
fp32 and write no output.

The split forward: cut every sequence into ``n`` segments of whole 16-token
chunks (so the prepare workspace of the segments is the one of the sequence),
compute every segment's ``(M, B)``, scan ``S_start[s + 1] = M_s S_start[s] + B_s``
in fp32 (the M chain never goes through bf16), then run the ordinary forward
over all segments as one varlen batch from those start states. Every backend
runs this same algorithm: "cuda" and "emulate" with the kernels (one prepare
launch serves the two map launches and the final one; the scan is one launch of
kernels/kda_seqpar_scan.cu, fp32 FMA chains, which reads the initial state as
given and writes the starts in the call's layout), "model" with the precision
model and a NumPy fp32 scan, "reference" in float64 (exact: it agrees with the
serial reference to rounding).

Nothing here reads device memory: segment boundaries are computed on the device
from ``cu_seqlens`` with a fixed segment count per sequence (a sequence shorter
than ``n`` chunks gets empty segments, whose map is ``(I, 0)``).
"""
from __future__ import annotations

import dataclasses
import numbers
import os
import sys

import numpy as np

from .dtypes import F32
from .layouts import CHUNK
from .validation import fail, validate

#: the most segments per sequence the forward accepts (the scan walks them in order)
MAX_SEGMENTS = 1024


# ---------------------------------------------------------------------------
# public entry: the maps


def state_maps(q, k, v, g, beta=None, *, scale=None, cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False,
               allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None, lower_bound=None, backend=None):
    """Affine state maps ``(M, B)`` of each sequence (or sequence piece).

    Takes the inputs and options of ``kda_forward`` (no state options: the maps
    do not depend on a state). Returns ``M: [N, HV, K, K]`` and ``B: [N, HV, K, V]``
    such that a sequence run from any state ``S0`` (kv orientation, ``[K, V]``)
    ends in ``M @ S0 + B``; N is B, or the number of sequences with ``cu_seqlens``;
    a zero-length sequence has ``(I, 0)``. float32 (float64 on "reference").

    backend: as ``kda_forward``: "cuda" (CuPy arrays), "emulate", "model"
    (NumPy arrays; the kernels' and the precision model's fp32-state runs) or
    "reference" (float64 definition). For the "vk" layout ``S_end^T = S0^T M^T + B^T``.
    """
    p, a = validate(
        q, k, v, g, beta, scale=scale, initial_state=None, output_final_state=False, cu_seqlens=cu_seqlens,
        qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval, gate=gate,
        A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_layout="kv", state_dtype=None,
        state_precision="fp32", out=None, backend=backend)
    if p.backend in ("cuda", "emulate"):
        return _Kernels(p, a).maps()
    return _maps_numpy(p, a)


# ---------------------------------------------------------------------------
# the choice of n


def check_sequence_parallel(x):
    """None, or an int in [1, MAX_SEGMENTS]; a clear error otherwise."""
    if x is None:
        return None
    if not isinstance(x, numbers.Integral) or isinstance(x, (bool, np.bool_)):
        fail("sequence_parallel", "None or an int >= 1 (segments per sequence)", repr(x), TypeError)
    if not 1 <= int(x) <= MAX_SEGMENTS:
        fail("sequence_parallel", f"None or an int in [1, {MAX_SEGMENTS}]", repr(x))
    return int(x)


def choose_segments(p, requested) -> int:
    """Segments per sequence for a validated call: ``requested`` when given;
    for None, 1 on the CPU backends and ``auto_segments`` on the GPU. With
    ``KDACUPY_JIT_VERBOSE`` set, the GPU choice is printed (``explain`` returns it)."""
    if requested is not None:
        return requested
    if not p.device:
        return 1
    from .tuning import device_facts

    n, why = auto_segments(p, device_facts()[2])
    if os.environ.get("KDACUPY_JIT_VERBOSE", "") not in ("", "0"):
        key = (p.N, p.HV, p.T, p.K, p.V, p.varlen, p.state_precision)
        if key not in _announced:  # once per shape, not per call
            _announced.add(key)
            print(f"[kdacupy.seqpar] N={p.N} HV={p.HV} T={p.T} K={p.K} V={p.V}: {n} segment(s) per sequence; "
                  f"{why}", file=sys.stderr)
    return n


_announced: set = set()


#: the heuristic's constants: guesses from the kernels' resources, not measured on a GPU
#: (``python -m kdacupy.bench --shapes fewhead`` measures serial against split)
AUTO_MAX = 64              # segments per sequence at most
AUTO_MIN_CHUNKS = 1024     # sequences shorter than 16K tokens stay serial until measured otherwise
AUTO_SEG_CHUNKS = 64       # chunks per segment at least (1024 tokens)
WARPS_PER_SM = {"bf16": 12, "fp32": 8}  # recurrence warps an SM runs at the chain's latency (registers)
SCAN_STEP_CHUNKS = 5       # one scan step (a batched matmul and an add) in chunk latencies
AUTO_MIN_GAIN = 1.5        # predicted speedup below which the split stays off


def _predicted_time(p, n, sm_count) -> float:
    """Time in chunk latencies: a run of c chunks over w warps takes
    ``c * max(1, w / capacity)`` (latency-bound until the SMs are full); the
    split adds the two fp32 map runs (K and V value rows) and the scan."""
    chunks = (p.T // max(1, p.N) if p.varlen else p.T) / CHUNK
    rows = p.N * p.HV

    def run(c, warps, precision):
        return c * max(1.0, warps / (WARPS_PER_SM[precision] * sm_count))

    if n == 1:
        return run(chunks, rows * p.V / 16, p.state_precision)
    c = chunks / n
    return (run(c, n * rows * p.K / 16, "fp32") + run(c, n * rows * p.V / 16, "fp32")
            + run(c, n * rows * p.V / 16, p.state_precision) + SCAN_STEP_CHUNKS * n)


def auto_segments(p, sm_count) -> tuple[int, str]:
    """The choice for ``sequence_parallel=None`` on the GPU, and why.

    A cost model in chunk latencies (``_predicted_time``): the recurrence is
    latency-bound, so a run costs its chain length until its warps exceed what
    the SMs hold (``WARPS_PER_SM``), then proportionally more. The candidates are
    n = 2, 4, ..., AUTO_MAX with at least AUTO_SEG_CHUNKS chunks per segment; the
    fastest is taken when it beats the serial run by AUTO_MIN_GAIN, else 1.
    Sequences under AUTO_MIN_CHUNKS chunks always run serially (conservative
    while the model is unmeasured). Shapes only: ``cu_seqlens`` values are never read (a varlen sequence counts
    as T / N tokens)."""
    chunks = (p.T // max(1, p.N) if p.varlen else p.T) // CHUNK
    if chunks < AUTO_MIN_CHUNKS:
        return 1, f"off: {chunks} chunks per sequence (< {AUTO_MIN_CHUNKS})"
    serial = _predicted_time(p, 1, sm_count)
    best, best_t = 1, serial
    n = 2
    while n <= AUTO_MAX and chunks // n >= AUTO_SEG_CHUNKS:
        t = _predicted_time(p, n, sm_count)
        if t < best_t:
            best, best_t = n, t
        n *= 2
    gain = serial / best_t
    if best == 1 or gain < AUTO_MIN_GAIN:
        return 1, f"off: predicted gain {gain:.2f}x ({chunks} chunks per sequence, {p.N * p.HV} chains)"
    return best, f"on: predicted gain {gain:.2f}x ({chunks} chunks per sequence, {p.N * p.HV} chains)"


def explain(q, k, v, g, beta=None, *, sequence_parallel=None, sm_count=None, **options) -> tuple[int, str]:
    """The segment count ``kda_forward`` would use for these arguments, and why
    (a debug aid; nothing runs). ``sm_count`` stands in for the device's (for
    NumPy arrays it makes the GPU's choice visible on the CPU)."""
    requested = check_sequence_parallel(sequence_parallel)
    kw = dict(scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, qk_l2norm=False,
              beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None, lower_bound=None,
              state_layout="kv", state_dtype=None, state_precision="bf16", out=None, backend=None)
    kw.update(options)
    p, _ = validate(q, k, v, g, beta, **kw)
    if requested is not None:
        return requested, "requested"
    if sm_count is None:
        if not p.device:
            return 1, f"off: backend {p.backend!r} runs serially unless sequence_parallel is given"
        from .tuning import device_facts
        sm_count = device_facts()[2]
    return auto_segments(p, sm_count)


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
        run = _Kernels(ps, b)
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
        M, Bm = _maps_numpy(ps, b)
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


class _Kernels:
    """The kernel launches of one segment batch on "cuda" or "emulate": one
    prepare, shared by the map launches and the final forward."""

    def __init__(self, p, a):
        from .jit import loader
        from .kernels import launch_prepare, slots
        from .layouts import workspace

        self.p, self.a, self.xp = p, a, _xp(p)
        self.run = loader("cuda" if p.device else "emulate")
        self.nslots, self.per_seq = slots(p)
        self.ws = self.xp.empty(p.HV * self.nslots * workspace(p.K)["WS_STRIDE"], dtype=np.uint8)
        if self.nslots:
            launch_prepare(self.run, p, a, self.ws, self.nslots, self.per_seq)

    def _recurrence(self, p, a, o, s_out, no_output):
        from .kernels import launch_recurrence
        from .tuning import select_tiles

        launch_recurrence(self.run, p, a, self.ws, o, s_out, self.nslots, self.per_seq, select_tiles(p),
                          no_output=no_output)

    def maps(self):
        p, a, xp = self.p, self.a, self.xp
        K = p.K
        fp32 = dict(state_precision="fp32", state_layout="kv", state_out_dtype=F32)
        M = xp.empty((p.N, p.HV, K, K), dtype=F32)
        M[...] = xp.eye(K, dtype=F32)
        Bm = xp.empty((p.N, p.HV, K, p.V), dtype=F32)
        # M: value columns = the K columns of I, v = 0 (a zero-stride view), the state updated in place
        zero_v = xp.broadcast_to(xp.zeros((1, 1, 1, K), dtype=p.dtype), a["v"].shape[:3] + (K,))
        pm = dataclasses.replace(p, V=K, state_in_dtype=F32, **fp32)
        self._recurrence(pm, dict(a, v=zero_v, initial_state=M), None, M, True)
        pb = dataclasses.replace(p, state_in_dtype=None, **fp32)
        self._recurrence(pb, dict(a, initial_state=None), None, Bm, True)
        return M, Bm

    def scan(self, M, Bm, s0, s0_dtype, n):
        return scan_kernel(self.run, M, Bm, s0, s0_dtype, self.p.state_layout, n)

    def forward(self, starts, o=None):
        """The ordinary forward of the segments from ``starts`` (fp32, the call's
        layout), into ``o`` when given."""
        p, a, xp = self.p, self.a, self.xp
        if o is None:
            o = xp.empty(a["v"].shape, dtype=p.dtype)
        s_out = None
        if p.state_out_dtype is not None:
            s_out = xp.empty(starts.shape, dtype=p.state_out_dtype)
        pf = dataclasses.replace(p, state_in_dtype=F32)
        self._recurrence(pf, dict(a, initial_state=starts), o, s_out, False)
        return o, s_out


#: the scan kernel's tiling: SC value columns per CTA, RG row groups (SC * RG threads), TI columns of M per pass
SCAN_SC, SCAN_RG, SCAN_TI = 16, 16, 16


def scan_config(K, V) -> dict:
    return dict(KDA_K=int(K), KDA_V=int(V), SCAN_SC=SCAN_SC, SCAN_RG=SCAN_RG, SCAN_TI=SCAN_TI)


def scan_smem(K) -> int:
    return (K * SCAN_SC + K * SCAN_TI) * 4


@dataclasses.dataclass(frozen=True)
class ScanVariant:
    """One variant of kernels/kda_seqpar_scan.cu (for ``python -m kdacupy.compile``)."""
    K: int
    V: int
    kernel = "kda_seqpar_scan"

    def config(self) -> dict:
        return scan_config(self.K, self.V)

    @property
    def smem(self) -> int:
        return scan_smem(self.K)


def scan_kernel(run, M, Bm, s0, s0_dtype, state_layout, n):
    """``scan`` as one kernel launch (kernels/kda_seqpar_scan.cu) through the
    loader ``run``: the start states ``[N * n, HV, K, V]`` (``"vk"``:
    ``[N * n, HV, V, K]``) in fp32, the initial state ``s0`` (None, or
    ``[N, HV, ...]`` in ``s0_dtype`` and ``state_layout``) read as it is."""
    from .kernels import STATE_DTYPE_CODE, _ptr

    xp = _array_module(M)
    NS, HV, K, _ = M.shape
    V = Bm.shape[-1]
    starts = xp.empty((NS, HV, K, V) if state_layout == "kv" else (NS, HV, V, K), dtype=F32)
    fn = run.get("kda_seqpar_scan", scan_config(K, V), "kda_seqpar_scan")
    args = (_ptr(M), _ptr(Bm), _ptr(s0), np.int32(STATE_DTYPE_CODE[None if s0 is None else s0_dtype]),
            np.int32(state_layout == "vk"), _ptr(starts), np.int32(HV), np.int32(n))
    run.launch(fn, (NS // n * (V // SCAN_SC), HV), (SCAN_SC * SCAN_RG,), args, scan_smem(K))
    return starts


def _numpy_options(p, a):
    return dict(scale=p.scale, cu_seqlens=a["cu_seqlens"], qk_l2norm=p.qk_l2norm,
                beta_sigmoid=p.beta_mode in ("sigmoid", "sigmoid2"), allow_neg_eigval=p.beta_mode == "sigmoid2",
                gate=p.gate, A_log=a["A_log"], dt_bias=a["dt_bias"], lower_bound=p.lower_bound)


def _maps_numpy(p, a):
    """The maps on "model" (fp32-state precision model runs) or "reference" (float64)."""
    K = p.K
    opts = _numpy_options(p, a)
    eye = np.broadcast_to(np.eye(K), (p.N, p.HV, K, K))
    zero_v = np.broadcast_to(np.zeros((), dtype=p.dtype), a["v"].shape[:3] + (K,))
    args = (a["q"], a["k"])
    tail = (a["g"], a["beta"])
    if p.backend == "model":
        from .precision import kda_model

        run = lambda v, s0: kda_model(*args, v, *tail, initial_state=s0, output_final_state=True,  # noqa: E731
                                      state_dtype=F32, state_precision="fp32", **opts)[1]
        return run(zero_v, eye.astype(F32)), run(a["v"], None)
    from .reference import kda_reference

    run = lambda v, s0: kda_reference(*args, v, *tail, initial_state=s0, output_final_state=True,  # noqa: E731
                                      **opts)[1]
    return run(zero_v, eye), run(a["v"], None)


def _forward_numpy(p, a, starts):
    opts = dict(_numpy_options(p, a), initial_state=starts, state_layout=p.state_layout,
                output_final_state=p.state_out_dtype is not None)
    if p.backend == "model":
        from .precision import kda_model

        return kda_model(a["q"], a["k"], a["v"], a["g"], a["beta"], state_dtype=p.state_out_dtype,
                         state_precision=p.state_precision, **opts)
    from .reference import kda_reference

    o, s = kda_reference(a["q"], a["k"], a["v"], a["g"], a["beta"], **opts)
    o = o.astype(np.float32).astype(p.dtype)
    if s is not None:
        s = s.astype(np.float32).astype(p.state_out_dtype)
    return o, s

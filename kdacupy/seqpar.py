"""Sequence parallelism inside one device (docs/design.md section 7.2).

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
compute the segments' ``(M, B)``, scan ``S_start[s + 1] = M_s S_start[s] + B_s``
in fp32 (the M chain never goes through bf16), then run the ordinary forward
over all segments as one varlen batch from those start states. The scan reads
no map of a sequence's last segment, so none is run, and the first segment's
``B`` runs from the initial state with ``M`` zero (one chain from the initial
state, and no M map there). Every backend runs this same algorithm: "cuda" and
"emulate" with the kernels (one prepare launch serves the maps and the final
forward; the M and B maps are one launch of a ``[K, K + V]`` state where
``K + V`` is a tile's head dim, two otherwise; the scan is one launch of
kernels/kda_seqpar_scan.cu, fp32 FMA chains, which reads the initial state as
given and writes the starts in the call's layout), "model" with the precision
model and a NumPy fp32 scan, "reference" in float64 (exact: it agrees with the
serial reference to rounding).

Nothing here reads device memory: segment boundaries are computed on the device
from ``cu_seqlens`` with a fixed segment count per sequence (a sequence shorter
than ``n`` chunks gets empty segments, whose map is ``(I, 0)``).
"""
from __future__ import annotations

import math
import numbers
import sys
import warnings

import numpy as np

from . import env
from .ops.forward.layouts import CHUNK
from .ops.seqpar.split import KernelRun, _array_module, merges_maps, numpy_maps, work_list
from .validation import check_keywords, fail, validate

#: the most segments per sequence the forward accepts (the scan walks them in order)
MAX_SEGMENTS = 1024


class SegmentWarning(UserWarning):
    """``sequence_parallel`` asks for more segments than a sequence has chunks."""


# ---------------------------------------------------------------------------
# public entry: the maps


def state_maps(q, k, v, g, beta=None, *, scale=None, cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False,
               allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None, lower_bound=None, state_layout="kv",
               state_precision="bf16", backend=None, **unknown):
    """Affine state maps ``(M, B)`` of each sequence (or sequence piece).

    Takes the inputs and options of ``kda_forward`` except its state arguments
    (the maps do not depend on a state). Returns ``M: [N, HV, K, K]`` and
    ``B: [N, HV, K, V]`` such that a sequence run from any state ``S0`` (kv
    orientation, ``[K, V]``) ends in ``M @ S0 + B``; N is B, or the number of
    sequences with ``cu_seqlens``; a zero-length sequence has ``(I, 0)``.
    float32 (float64 on "reference"). With ``state_layout="vk"`` the maps come
    for states stored ``[V, K]``: ``M^T: [N, HV, K, K]`` and ``B^T: [N, HV, V, K]``,
    so a sequence run from ``S0: [V, K]`` ends in ``S0 @ M^T + B^T``.
    ``state_precision`` is accepted so the forward's options pass as they are:
    the maps are fp32-state runs for either (the ones the split forward uses).

    backend: as ``kda_forward``: "cuda" (CuPy arrays), "emulate", "model"
    (NumPy arrays; the kernels' and the precision model's fp32-state runs) or
    "reference" (float64 definition).
    """
    if unknown:
        _refuse_keywords(unknown, "kdacupy.seqpar.state_maps")
    p, a = validate(
        q, k, v, g, beta, scale=scale, initial_state=None, output_final_state=False, cu_seqlens=cu_seqlens,
        qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval, gate=gate,
        A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_layout=state_layout, state_dtype=None,
        state_precision=state_precision, out=None, backend=backend, path="seqpar")
    if p.device and _capturing():
        # the map launches read per-call temporaries (the identity and zero operands) that a
        # captured graph would keep pointing at after CuPy's pool hands their memory out again
        raise ValueError("state_maps: expected a stream that is not capturing a CUDA graph (the maps' per-call "
                         "temporaries cannot live in a graph), got a capturing stream")
    import dataclasses
    p = dataclasses.replace(p, state_layout="kv", state_precision="fp32")  # the runs behind the maps
    M, B = KernelRun(p, a).maps() if p.backend in ("cuda", "emulate") else numpy_maps(p, a)
    if state_layout == "vk":
        M, B = M.swapaxes(-1, -2), B.swapaxes(-1, -2)
    xp = _array_module(M)
    return xp.ascontiguousarray(M), xp.ascontiguousarray(B)  # (the merged maps' are views of one state)


#: kda_forward's arguments that are about a state: the maps take none of them
_STATE_ARGUMENTS = ("initial_state", "output_final_state", "state_dtype", "out", "state_pool", "state_indices",
                    "sequence_parallel")


def _refuse_keywords(unknown, fn):
    name = next(iter(unknown))
    if name in _STATE_ARGUMENTS:
        raise TypeError(f"{fn}() got an unexpected keyword argument {name!r}: the maps do not depend on a state "
                        "(a sequence run from S0 ends in M @ S0 + B), so they take none of kda_forward's state "
                        "arguments")
    check_keywords(unknown, fn)


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
    if p.device and (requested or 0) != 1 and _capturing():
        # the split allocates temporaries per call (workspace, maps, start states) whose
        # memory a captured graph would keep after the pool reuses it: capture runs serially
        if requested is not None:
            fail("sequence_parallel", "None or 1 while the current stream captures a CUDA graph (the split's "
                 "per-call temporaries cannot live in a graph)", repr(requested))
        return 1
    if requested is not None:
        chunks = -(-p.T // CHUNK)  # of the whole (packed) T: no sequence has more
        if requested > 1 and p.T and requested > chunks:
            warnings.warn(f"sequence_parallel={requested} is more than the {chunks} 16-token chunk(s) of T = {p.T}: "
                          f"a segment is whole chunks, so {requested - chunks} or more segments per sequence are "
                          f"empty (correct, but work for nothing)", SegmentWarning, stacklevel=3)
        return requested
    if not p.device:
        return 1
    from .ops.forward.tuning import current_arch, device_facts

    n, why = auto_segments(p, device_facts()[2], current_arch())
    if env.get("KDACUPY_JIT_VERBOSE"):
        key = (p.N, p.HV, p.T, p.K, p.V, p.varlen, p.state_precision)
        if key not in _announced:  # once per shape, not per call
            _announced.add(key)
            print(f"[kdacupy.seqpar] N={p.N} HV={p.HV} T={p.T} K={p.K} V={p.V}: {n} segment(s) per sequence; "
                  f"{why}", file=sys.stderr)
    return n


_announced: set = set()


def _capturing() -> bool:
    from .validation import capturing, cupy_module
    return capturing(cupy_module())


#: the heuristic's constants where the runs are mma.sync's: guesses from the kernels' resources, not
#: measured on a GPU (``python -m kdacupy.bench --shapes fewhead`` measures serial against split)
AUTO_MAX = 64              # segments per sequence at most
AUTO_MIN_CHUNKS = 1024     # sequences shorter than 16K tokens stay serial until measured otherwise
AUTO_SEG_CHUNKS = 64       # chunks per segment at least (1024 tokens)
WARPS_PER_SM = {"bf16": 12, "fp32": 8}  # recurrence warps an SM runs at the chain's latency (registers)
SCAN_STEP_CHUNKS = 5       # one scan step (a batched matmul and an add) in chunk latencies
AUTO_MIN_GAIN = 1.5        # predicted speedup below which the split stays off

#: where the runs are the wgmma recurrence's (sm_90a: the forward and, since they share its core-matrix
#: workspace, the maps): calibrated on the issue-aware profile of T = 8192, H = 12 on the H200
#: (benchmarks/seqpar-auto.md), where a chunk costs one warpgroup its issue, not its latency
WGMMA_MIN_CHUNKS = 512     # 8K tokens
WGMMA_MAP_CHUNK = 0.7      # a map run's chunk against the forward's (no output: 350 against 510 instructions)
WGMMA_SCAN_STEP = 12       # one scan step in forward chunks (0.010, 0.014, 0.023 ms at 4, 5, 8 segments)
WGMMA_MIN_GAIN = 1.2       # predicted speedup of the chains below which the split stays off


def _wgmma_runs(p, sm_count, arch) -> bool:
    """Whether the split's runs take the wgmma recurrence: the forward's untuned tiles on ``arch``."""
    from .ops.forward.tuning import heuristic

    return heuristic(p, sm_count, arch).mma == "wgmma"


def _chunks_per_seq(p) -> float:
    return (p.T // max(1, p.N) if p.varlen else p.T) / CHUNK


def _predicted_time(p, n, sm_count) -> float:
    """Time in chunk latencies (mma.sync's runs): a run of c chunks over w warps takes
    ``c * max(1, w / capacity)`` (latency-bound until the SMs are full); the
    split adds the two fp32 map runs (K and V value rows) and the scan."""
    chunks = _chunks_per_seq(p)
    rows = p.N * p.HV

    def run(c, warps, precision):
        return c * max(1.0, warps / (WARPS_PER_SM[precision] * sm_count))

    if n == 1:
        return run(chunks, rows * p.V / 16, p.state_precision)
    c = chunks / n
    maps = sum(run(c, r / 16, "fp32") for r in _map_launches(p, n) if r)
    return maps + run(c, n * rows * p.V / 16, p.state_precision) + SCAN_STEP_CHUNKS * n


def _map_launches(p, n) -> tuple:
    """The value rows of each map launch at n segments a sequence (ops/seqpar/split.py): the last
    segment's maps and the first one's M never run (an initial state is folded into the first B map;
    at K = 256 every segment's run); M and B one launch where they merge."""
    rows = p.N * p.HV
    m_rows = rows * (n - 2 if work_list(p.K) else n) * p.K
    b_rows = rows * (n - 1 if work_list(p.K) else n) * p.V
    return (m_rows + b_rows,) if merges_maps(p.K, p.V) else (m_rows, b_rows)


def _predicted_time_wgmma(p, n, sm_count) -> float:
    """Time in the forward's chunk times (the wgmma runs'): one warpgroup of 64 value rows issues a
    chunk in about its whole SM's time, so a run of c chunks over g warpgroups takes
    ``c * ceil(g / SMs)``; a map run's chunk costs WGMMA_MAP_CHUNK of one; a scan step
    WGMMA_SCAN_STEP."""
    chunks = _chunks_per_seq(p)
    rows = p.N * p.HV

    def run(c, value_rows):
        return c * math.ceil(value_rows / 64 / sm_count)

    if n == 1:
        return run(chunks, rows * p.V)
    c = chunks / n
    maps = sum(run(c, r) for r in _map_launches(p, n))
    return WGMMA_MAP_CHUNK * maps + run(c, n * rows * p.V) + WGMMA_SCAN_STEP * n


def auto_segments(p, sm_count, arch: str | None = None) -> tuple[int, str]:
    """The choice for ``sequence_parallel=None`` on the GPU, and why.

    A cost model per MMA family. Where the runs are mma.sync's (``arch`` not sm_90a, or sizes the wgmma
    recurrence does not serve), in chunk latencies (``_predicted_time``): the recurrence is latency-bound,
    so a run costs its chain length until its warps exceed what the SMs hold (``WARPS_PER_SM``), then
    proportionally more; sequences under AUTO_MIN_CHUNKS chunks stay serial and a split needs
    AUTO_MIN_GAIN. On sm_90a with the wgmma recurrence (``_predicted_time_wgmma``), calibrated on the
    issue-aware profile: a run costs its chain length in whole waves of one warpgroup an SM; from
    WGMMA_MIN_CHUNKS chunks, a split needs WGMMA_MIN_GAIN. The candidates are n = 2, 4, ..., AUTO_MAX
    (on wgmma every n from 2: the count that fills the SMs in one wave) with at least AUTO_SEG_CHUNKS
    chunks per segment; the fastest is taken when it beats the serial run by the gain, else 1. Shapes
    only: ``cu_seqlens`` values are never read (a varlen sequence counts as T / N tokens)."""
    wgmma = _wgmma_runs(p, sm_count, arch)
    predicted, min_chunks, min_gain = ((_predicted_time_wgmma, WGMMA_MIN_CHUNKS, WGMMA_MIN_GAIN) if wgmma
                                       else (_predicted_time, AUTO_MIN_CHUNKS, AUTO_MIN_GAIN))
    chunks = int(_chunks_per_seq(p))
    if chunks < min_chunks:
        return 1, f"off: {chunks} chunks per sequence (< {min_chunks})"
    serial = predicted(p, 1, sm_count)
    best, best_t = 1, serial
    n = 2
    while n <= AUTO_MAX and chunks // n >= AUTO_SEG_CHUNKS:
        t = predicted(p, n, sm_count)
        if t < best_t:
            best, best_t = n, t
        n = n + 1 if wgmma else 2 * n  # wgmma: any count (the one that fills the SMs in one wave)
    gain = serial / best_t
    family = "wgmma" if wgmma else "mma.sync"
    if best == 1 or gain < min_gain:
        return 1, f"off: predicted gain {gain:.2f}x ({chunks} chunks per sequence, {p.N * p.HV} chains, {family})"
    return best, f"on: predicted gain {gain:.2f}x ({chunks} chunks per sequence, {p.N * p.HV} chains, {family})"


def explain(q, k, v, g, beta=None, *, sequence_parallel=None, sm_count=None, arch=None, **options) -> tuple[int, str]:
    """The segment count ``kda_forward`` would use for these arguments (any of
    ``kda_forward``'s), and why (a debug aid; nothing runs). ``sm_count`` and ``arch`` (the
    runtime's target, e.g. "sm_90a") stand in for the device's (for NumPy arrays they make the
    GPU's choice visible on the CPU)."""
    requested = check_sequence_parallel(sequence_parallel)
    pooled = any([options.pop(n, None) is not None for n in ("state_pool", "state_indices")])
    unknown = {n: x for n, x in options.items() if n not in _VALIDATE_DEFAULTS}
    if unknown:
        check_keywords(unknown, "kdacupy.seqpar.explain")
    kw = dict(_VALIDATE_DEFAULTS, **options)
    if kw["state_layout"] is None:  # kda_forward's default: "vk" with a pool
        kw["state_layout"] = "vk" if pooled else "kv"
    p, _ = validate(q, k, v, g, beta, **kw)
    if pooled:
        return 1, "off: a call with state_pool runs serially (the split does not read or write a pool)"
    if requested is not None:
        return requested, "requested"
    if sm_count is None:
        if not p.device:
            return 1, f"off: backend {p.backend!r} runs serially unless sequence_parallel is given"
        from .ops.forward.tuning import current_arch, device_facts
        sm_count = device_facts()[2]
        arch = arch or current_arch()
    return auto_segments(p, sm_count, arch)


#: kda_forward's defaults of the arguments ``validate`` checks
_VALIDATE_DEFAULTS = dict(scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, qk_l2norm=False,
                          beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
                          lower_bound=None, state_layout=None, state_dtype=None, state_precision="bf16", out=None,
                          backend=None)

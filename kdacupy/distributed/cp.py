"""Context parallelism: ``kda_forward`` over a sequence split across ranks.

A piece of a sequence acts on the state as an affine map,
``S_end = M S_start + B`` (docs/design.md section 7.3). Each rank computes the maps
of the pieces that continue past its slice, one allgather gives every rank
every map, each rank scans them (fp32) into the start states of its own
pieces, and runs the ordinary forward on its slice from those states.
"""
from __future__ import annotations

import hashlib
import inspect

import numpy as np

from .. import api
from ..seqpar import state_maps
from ..numerics.dtypes import F32, STATE_DTYPES, as_dtype, dtype_name
from ..validation import as_array, fail, is_device, validate
from .comm import NCCL_NEEDS_DEVICE, wrap
from .plan import plan_fixed, plan_varlen, start_state_sources

# kda_forward keywords a CP call takes through **options (the rest are CP's own; a state
# pool has no meaning across ranks)
_OWN = ("cu_seqlens", "initial_state", "output_final_state", "state_layout", "state_dtype", "out")
_REFUSED = ("state_pool", "state_indices")
_PASSED = tuple(n for n, p in inspect.signature(api.kda_forward).parameters.items()
                if p.kind is p.KEYWORD_ONLY and n not in _OWN + _REFUSED)
# the options the state maps depend on (kdacupy.seqpar.state_maps)
_MAP_OPTIONS = tuple(n for n, p in inspect.signature(state_maps).parameters.items() if p.kind is p.KEYWORD_ONLY
                     and n != "cu_seqlens")


class _Local:
    """This rank's validated call (raises the usual ValueError / TypeError)."""

    def __init__(self, q, k, v, g, beta, cu_seqlens, initial_state, output_final_state, state_layout,
                 state_dtype, out, options):
        refused = sorted(set(options) & set(_REFUSED))
        if refused:
            raise TypeError(f"{refused[0]}: not supported by kda_forward_cp (each rank's states come from the "
                            f"maps of the ranks before it; use initial_state)")
        unknown = sorted(set(options) - set(_PASSED))
        if unknown:
            raise TypeError(f"unexpected keyword {unknown[0]!r}; kda_forward_cp takes the keywords of "
                            f"kda_forward: {', '.join(_PASSED + _OWN)}")
        self.p, self.a = validate(q, k, v, g, beta, initial_state=None, output_final_state=False,
                                  cu_seqlens=None, state_layout=state_layout, state_dtype=state_dtype, out=out,
                                  **{**dict(scale=None, qk_l2norm=False, beta_sigmoid=False,
                                            allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
                                            lower_bound=None, state_precision="bf16", backend=None), **options})
        p = self.p
        self.options = options
        self.cu = None if cu_seqlens is None else _host_cu_seqlens(cu_seqlens, p.B)
        self.N = p.B if self.cu is None else len(self.cu) - 1
        self.s0 = None
        if initial_state is not None:
            s0 = as_array("initial_state", initial_state)
            if is_device(s0) != p.device:
                fail("initial_state", "an array of the same kind as q (NumPy or CuPy)", type(s0).__name__)
            shape = (self.N, p.HV, p.K, p.V) if p.state_layout == "kv" else (self.N, p.HV, p.V, p.K)
            if tuple(s0.shape) != shape:
                fail("initial_state", f"shape {shape} ([N, HV, ...] for state_layout={p.state_layout!r})",
                     tuple(s0.shape))
            if s0.dtype not in STATE_DTYPES:
                fail("initial_state", "dtype bfloat16 or float32", dtype_name(s0.dtype), TypeError)
            self.s0 = s0
        self.output_final_state = bool(output_final_state)
        if state_dtype is not None and not self.output_final_state:  # as kda_forward
            raise ValueError(f"state_dtype: expected None without output_final_state=True (it is the final "
                             f"state's dtype), got {state_dtype!r}")
        self.state_out = None
        if self.output_final_state:
            self.state_out = (as_dtype(state_dtype) if state_dtype is not None
                              else self.s0.dtype if self.s0 is not None else F32)

    def signature(self) -> dict:
        """What must agree on every rank (the token count need not)."""
        p, a = self.p, self.a
        sig = dict(batch=p.B, heads=(p.H, p.HV), dims=(p.K, p.V), dtypes=(str(p.dtype), str(p.g_dtype),
                   str(p.beta_dtype)), gate=(p.gate, p.lower_bound), beta_mode=p.beta_mode,
                   qk_l2norm=p.qk_l2norm, scale=p.scale, state_layout=p.state_layout,
                   state_precision=p.state_precision, backend=p.backend, device=p.device,
                   output_final_state=(self.output_final_state, str(self.state_out)),
                   initial_state=None if self.s0 is None else (tuple(self.s0.shape), str(self.s0.dtype)),
                   cu_seqlens=None if self.cu is None else _digest(self.cu))
        for n in ("A_log", "dt_bias"):
            x = a[n]
            sig[n] = None if x is None else (tuple(x.shape), None if is_device(x) else _digest(x))
        return sig


class _Values:
    """A host array in a rank's signature: compared by content hash, shown by its values
    (the first and last few of a long one), so a mismatch message says what differs."""

    def __init__(self, x):
        x = np.ascontiguousarray(x)
        self.digest = hashlib.sha256(x.tobytes()).hexdigest()[:16]
        flat = x.ravel()
        if flat.size <= 16:
            self.shown = "[" + ", ".join(map(str, flat.tolist())) + "]"
        else:
            head = ", ".join(map(str, flat[:6].tolist()))
            tail = ", ".join(map(str, flat[-6:].tolist()))
            self.shown = f"[{head}, ..., {tail}] ({flat.size} values)"

    def __eq__(self, other):
        return isinstance(other, _Values) and other.digest == self.digest

    def __repr__(self):
        return self.shown


def _digest(x) -> _Values:
    return _Values(x)


def _host_cu_seqlens(cu, B):
    if hasattr(cu, "get") and not isinstance(cu, np.ndarray):  # CuPy: the plan needs the values on the host
        cu = cu.get()
    cu = np.asarray(cu)
    if cu.dtype.kind not in "iu":
        fail("cu_seqlens", "integers (the global packed offsets)", f"dtype {cu.dtype}", TypeError)
    if cu.ndim != 1 or cu.shape[0] < 2:
        fail("cu_seqlens", "a 1-D array [N + 1] with N >= 1", f"shape {tuple(cu.shape)}")
    if B != 1:
        fail("q", "B == 1 with cu_seqlens (sequences packed in one row)", f"B = {B}")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        fail("cu_seqlens", "first value 0", int(cu[0]))
    if np.any(np.diff(cu) < 0):
        i = int(np.argmax(np.diff(cu) < 0))
        fail("cu_seqlens", "non-decreasing values", f"cu_seqlens[{i}] = {int(cu[i])} > "
             f"cu_seqlens[{i + 1}] = {int(cu[i + 1])}")
    return cu


def _looks_device(x) -> bool:
    try:
        return is_device(as_array("q", x))
    except Exception:  # noqa: BLE001  (validation on every rank reports a bad q)
        return False


class ContextParallelError(RuntimeError):
    """A rank of ``kda_forward_cp`` failed (out of memory, a compile failure, a
    bug): raised on every rank with the same message, naming the rank(s) and
    the step, so no rank waits for a collective the failed one never joins. On
    the failed rank the original exception is the ``__cause__``."""


def _failure(e: BaseException, validating: bool = False):
    """What a rank tells the others of its exception: bad input found by the
    validation keeps its kind (ValueError / TypeError, as kda_forward raises
    it); anything else becomes a ContextParallelError naming the original type."""
    if validating and isinstance(e, (ValueError, TypeError)):
        return ("TypeError" if isinstance(e, TypeError) else "ValueError", str(e))
    return ("ContextParallelError", f"{type(e).__name__}: {e}")


def _raise_collective(what: str | None, statuses, cause):
    """Every rank raises the same error from the gathered statuses."""
    bad = [(r, s) for r, s in enumerate(statuses) if s is not None]
    if not bad:
        return
    r, (kind, msg) = bad[0]
    if what is None:  # validation: the message of the first bad rank, as kda_forward would raise it
        more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
        text = f"kda_forward_cp: rank {r}: {msg}{more}"
    else:
        text = f"kda_forward_cp: rank {r} failed {what}: {msg}" + "".join(
            f"; rank {r2}: {m2}" for r2, (_, m2) in bad[1:4]) + (
            f"; and {len(bad) - 4} more rank(s)" if len(bad) > 4 else "")
    input_error = all(k in ("ValueError", "TypeError") for _, (k, _m) in bad)
    exc = (TypeError if kind == "TypeError" else ValueError) if input_error else ContextParallelError
    raise exc(text) from cause


def _agreed(eng, what: str, fn):
    """This rank's local work between two collectives: run ``fn``, then agree with
    every rank that all went well (one small allgather) before anyone goes on to
    the next collective; on any failure every rank raises the same error."""
    result, failure, cause = None, None, None
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001  (whatever it is, the other ranks must hear of it)
        failure, cause = _failure(e), e
    _raise_collective(what, eng.agree(failure), cause)
    return result


def _collective_check(eng, local_fn):
    """Validate on every rank, then agree: every rank raises the same error
    when any rank's input is bad (or its validation fails in any other way) or
    the ranks disagree."""
    local, failure, cause, sig, tokens = None, None, None, None, None
    try:
        local = local_fn()
        if eng.requires_device and not local.p.device:
            fail("comm", *NCCL_NEEDS_DEVICE, TypeError)
        sig, tokens = local.signature(), local.p.T
    except Exception as e:  # noqa: BLE001
        failure, cause = _failure(e, validating=True), e
    if failure is not None:
        failure = (failure[0], failure[1][:4000])
    infos = eng.allgather_obj(dict(error=failure, sig=sig, tokens=tokens))
    errors = [i["error"] for i in infos]
    unexpected = any(e is not None and e[0] not in ("ValueError", "TypeError") for e in errors)
    _raise_collective("validating its input" if unexpected else None, errors, cause)
    first = infos[0]["sig"]
    for r, i in enumerate(infos[1:], 1):
        for key, val in first.items():
            if i["sig"][key] != val:
                raise ValueError(f"kda_forward_cp: the ranks disagree on {key}: rank 0 has {val!r}, "
                                 f"rank {r} has {i['sig'][key]!r}")
    return local, [i["tokens"] for i in infos]


def kda_forward_cp(q, k, v, g, beta=None, *, comm, cu_seqlens=None, initial_state=None,
                   output_final_state=False, state_layout="kv", state_dtype=None, out=None, **options):
    """``kda_forward`` on this rank's contiguous slice of the tokens.

    Ranks hold consecutive slices in communicator order, of any length (zero
    included): ``[B, T_r, ...]`` slices of the same B sequences, or with
    ``cu_seqlens`` (the GLOBAL packed offsets, the same on every rank, B = 1)
    a slice of the packed stream, so sequences may span ranks.
    ``initial_state`` (the same on every rank) applies where a sequence starts;
    the returned ``final_state`` is the same on every rank. ``comm``: an mpi4py
    communicator, or a ``cupy.cuda.nccl.NcclCommunicator`` for CuPy arrays.
    Other keywords are kda_forward's. Returns ``(o_local, final_state)``.

    Communication: one small allgather of each rank's call signature (bad or
    mismatched input raises the same error on every rank), one allgather of
    the fp32 maps (ranks x HV x K x (K + V) x 4 bytes per carried sequence),
    and with ``output_final_state`` one allreduce of the final states. After
    each local step (the maps, the local forward) the ranks agree through one
    small allgather (4 KiB per rank): a rank that fails in any way (out of
    memory, a compile failure) makes every rank raise the same
    ``ContextParallelError`` naming it, instead of leaving the others waiting.
    """
    eng = wrap(comm, _looks_device(q))
    local, tokens = _collective_check(eng, lambda: _Local(
        q, k, v, g, beta, cu_seqlens, initial_state, output_final_state, state_layout, state_dtype, out, options))
    p = local.p
    if local.cu is not None and int(local.cu[-1]) != sum(tokens):
        raise ValueError(f"kda_forward_cp: cu_seqlens: expected last value {sum(tokens)} (the tokens of all "
                         f"ranks together), got {int(local.cu[-1])}")
    plans = plan_varlen(local.cu, tokens) if local.cu is not None else plan_fixed(p.B, tokens)
    xp = _xp(p.device)

    maps = _gather_maps(eng, local, plans, xp)
    o, contribution = _agreed(eng, "running its local forward",
                              lambda: _local_forward(local, plans, eng.rank, maps, xp))
    final = _final_states(eng, local, plans, contribution, xp) if local.output_final_state else None
    return o, final


def _local_forward(local, plans, rank, maps, xp):
    """This rank's output, and its contribution to the final states (None
    without output_final_state)."""
    starts = _start_states(local, plans, rank, maps, xp)
    mine = plans[rank]
    a = local.a
    o, final_local = None, None
    if mine.pieces:
        o, final_local = api.kda_forward(
            a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=starts,
            cu_seqlens=mine.local_cu_seqlens if local.cu is not None else None,
            output_final_state=local.output_final_state, state_layout="kv", state_dtype=local.state_out,
            out=a["out"], **local.options)
    elif a["out"] is not None:
        o = a["out"]
    else:
        o = xp.empty(a["v"].shape, a["v"].dtype)
    contribution = _final_contribution(local, mine, final_local, xp) if local.output_final_state else None
    return o, contribution


def _xp(device):
    if device:
        import cupy
        return cupy
    return np


def _kv(s, layout):
    return s if layout == "kv" else s.swapaxes(-1, -2)


def _initial_kv(local, n, xp):
    """Sequence n's initial state, [HV, K, V] fp32."""
    p = local.p
    if local.s0 is None:
        return xp.zeros((p.HV, p.K, p.V), F32)
    return xp.asarray(_kv(local.s0[n], p.state_layout), dtype=F32)


def _carry_rows(plan, fixed):
    return plan.carry if fixed else plan.carry[:1]


def _gather_maps(eng, local, plans, xp):
    """Every rank's carried maps, ``[ranks, C, HV, K, K + V]`` fp32 (M | B),
    C = B for fixed-length input, else 1 (only a slice's last piece can
    continue past it). None when no sequence crosses a rank boundary (every
    rank knows this from the plans: then no collective at all)."""
    if not any(pl.carry for pl in plans):
        return None
    buf = _agreed(eng, "computing its state maps", lambda: _local_maps(local, plans[eng.rank], xp))
    return eng.allgather(buf)


def _local_maps(local, mine, xp):
    p = local.p
    fixed = local.cu is None
    C = p.B if fixed else 1
    buf = xp.zeros((C, p.HV, p.K, p.K + p.V), F32)
    if mine.carry:
        if fixed:
            M, Bm = piece_maps(local, 0, p.T)
        else:
            last = mine.pieces[-1]
            M, Bm = piece_maps(local, last.lo, last.hi)
        buf[:, :, :, :p.K] = M
        buf[:, :, :, p.K:] = Bm
    return buf


def piece_maps(local, lo, hi):
    """Maps ``(M [C, HV, K, K], B [C, HV, K, V])`` fp32 of tokens ``[lo, hi)``
    of every batch row (kdacupy.seqpar.state_maps: M is the run from S = I
    with v = 0, B the run from S = 0 with the real v, fp32 state)."""
    a = local.a
    sl = (slice(None), slice(lo, hi))
    x = {n: a[n][sl] for n in ("q", "k", "v", "g")}
    beta = None if a["beta"] is None else a["beta"][sl]
    M, Bm = state_maps(**x, beta=beta, **{n: v for n, v in local.options.items() if n in _MAP_OPTIONS})
    return M.astype(F32, copy=False), Bm.astype(F32, copy=False)


def _start_states(local, plans, rank, maps, xp):
    """Start states of this rank's pieces, ``[pieces, HV, K, V]`` fp32 (kv)."""
    p = local.p
    mine = plans[rank]
    fixed = local.cu is None
    out = xp.empty((len(mine.pieces), p.HV, p.K, p.V), F32)
    sources = start_state_sources(plans, rank)
    for i, piece in enumerate(mine.pieces):
        S = _initial_kv(local, piece.seq, xp)
        for r, j in sources.get(piece.seq, []) if not piece.starts else []:
            row = maps[r, piece.seq if fixed else j]
            S = xp.matmul(row[:, :, :p.K], S) + row[:, :, p.K:]
        out[i] = S
    return out


def _final_contribution(local, mine, final_local, xp):
    """This rank's share of every final state: the states of the sequences that
    end here, zeros elsewhere (fp32, kv)."""
    p = local.p
    acc = xp.zeros((local.N, p.HV, p.K, p.V), F32)
    for i, piece in enumerate(mine.pieces):
        if piece.ends:
            acc[piece.seq] = final_local[i].astype(F32)
    return acc


def _final_states(eng, local, plans, contribution, xp):
    """Every sequence's final state, the same on every rank: the rank that
    holds a sequence's end contributes it, one fp32 allreduce (adding exact
    zeros) shares it; sequences without tokens keep their initial state."""
    p = local.p
    acc = eng.allreduce_sum(contribution)
    held = {piece.seq for plan in plans for piece in plan.pieces}
    for n in range(local.N):
        if n not in held:
            acc[n] = _initial_kv(local, n, xp)
    final = acc if p.state_layout == "kv" else acc.swapaxes(-1, -2)
    return xp.ascontiguousarray(final).astype(local.state_out)

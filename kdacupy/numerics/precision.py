"""NumPy model of the CUDA kernels' rounding, step for step (docs/design.md section 2).

``kda_model`` computes what ``kda_forward(backend="cuda")`` computes, with every
value the kernels hold in bf16 / fp16 / fp32 rounded to that type at the same
point, and everything in between done in float64. Its default contract follows
FlashKDA (chunk 16, base-2 gates, bf16 operands, the intra-chunk system solved
in fp32 by forward substitution, bf16 state updated by one fp32 FMA). Rounding
points, in kernel order (``r32``/``bf``: round to fp32 / bf16; ``ex2`` is 2^x
rounded to fp32 and flushed to zero below 2^-126, as ``ex2.approx.ftz.f32``). FTZ: CuPy compiles every kernel with
``-ftz=true``, so all fp32 arithmetic in the kernels (mul, add, fma, the state
FMA included) flushes subnormal inputs and results to sign-preserving zero; the
model flushes only where it says so. The difference matters only for values
below 2^-126, far under a bf16 unit of any output (docs/design.md section 2):

prepare (token-parallel, per 16-token chunk and value head)
  1. l2norm:  x <- r32(x * r32(rsqrt(r32(r32(sum x^2) + 1e-6f))))
  2. gate (base 2, fp32):
       log       g2 = r32(g * log2e)
       softplus  g2 = -r32(a * sp),  sp = z if x > 15 else r32(lg2(r32(1 + ex2(z)))),
                 z = r32(x * log2e), x = r32(g + dt_bias), a = ex2(r32(A_log * log2e))
       sigmoid   g2 = r32(lb2 * s),  s = r32(rcp(r32(1 + ex2(r32(-y * log2e))))),
                 y = r32(a * x), lb2 = r32(lower_bound * log2e)
     then padded rows of a ragged chunk get g2 = 0 (activation comes first).
  3. beta: logits -> s as for the sigmoid gate (x2 exact for allow_neg_eigval).
  4. gc = fp32 running sum of g2 over the chunk rows; gt = gc of the last row; per channel the
     reference gr = r32(r32(hi + lo) * 0.5), hi / lo the largest / smallest gc of the chunk's rows
     (NaN ignored, as fmaxf / fminf do): the centre of the channel's exponent range.
  5. operands:  q_dec = bf(r32(q * r32(ex2(gc) * scale)))
                k_dec = bf(r32(k * ex2(gc))),   k_res = bf(r32(k * ex2(r32(gt - gc))))
     (the recurrence's, measured from the chunk's start) and the factored form's, measured from gr:
                q_m = bf(r32(q * r32(em * scale))),  k_m = bf(r32(k * em)),  em = ex2(r32(gc - gr))
                k_i = bf(r32(k * ex2(r32(gr - gc))))
     with the low parts of q_m and k_i, q_ml = bf(ftz(r32(q * r32(em * scale)) - q_m)) and k_il alike
     (the fp32 differences are exact).
  6. L = r32(k_m k_i^T), Mf = r32(q_m k_i^T + q_m k_il^T + q_ml k_i^T) (fp32 tensor-core
     accumulate, the three products in that order): k_m,i k_i,j carries 2^(gc_i - gr) 2^(gr - gc_j)
     = 2^(gc_i - gc_j), each factor half the chunk's range at most. Mf is the fp32 operands'
     product to about 2^-16, as the pair form's is; only the output reads it. L stays the bf16
     keys' product: the recurrence's k_dec and k_res are bf16, and an L more exact than they are
     breaks the delta rule's cancellation for repeated keys at beta near 2.
     When some |r32(gc - gr)| > 100 (the channel's range over 200: 2^(gc - gr) * scale * q would
     go subnormal, which the kernels' FTZ flushes, or 2^(gr - gc) overflow with large keys), the
     chunk uses the pair form instead: r32(sum_d k_i k_j ex2(r32(gc_i - gc_j))) (q_i: r32(q_i * scale)).
  7. Lb = r32(L * beta_i) strictly below the diagonal (fp32).
  8. X = (I + Lb)^-1 by forward substitution in fp32, row by row, each row
     accumulated in column order by fp32 FMAs (float64 inside, as in 15):
       X_i = r32(...r32(r32(e_i - Lb_i0 X_0) - Lb_i1 X_1)... - Lb_i,i-1 X_i-1)
     then INV = bf(X), the bf16 operand of 13.
  9. Mqk = bf(Mf) on and below the diagonal; gexp = ex2(gt) (fp32, per channel).
recurrence (sequential over chunks; state H = S^T, [K, V])
  10. state load: bf16 mode H = bf(S0); fp32 mode H = S0 (as fp32).
  11. Hop = bf(H) (the state as a bf16 MMA operand)
  12. W = r32(k_dec Hop);  vsub = bf(r32(beta * r32(v - W)))
  13. U = bf(r32(INV vsub))
  14. o = out_dtype(r32(q_dec Hop + Mqk U))           (one fp32 accumulator)
  15. dS = r32(k_res^T U);  H = fp32(dS + H * gexp)     (fp32 FMA, float64 inside)
      bf16 mode: H = bf(H)
  16. final state: cast to state_dtype; a zero-length sequence returns its
      initial state unchanged (cast only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .dtypes import F32, ftz_f32, round_bf16, round_f32, round_to
from .reference import pack, sequence_bounds, state_from_kv, state_to_kv, unpack

CHUNK = 16
LOG2E_F32 = float(np.float32(1.0 / math.log(2.0)))
EPS_F32 = float(np.float32(1e-6))
#: |gc - gr| bound (base 2) below which the factored chunk form stays in normal fp32 (prepare_steps.cuh)
SAFE_EXPONENT = 100.0

r32, bf = round_f32, round_bf16


def scale_f32(scale, K: int) -> float:
    """The kernels' fp32 scale (K^-0.5 by default)."""
    return float(np.float32(K ** -0.5 if scale is None else scale))


@dataclass(frozen=True)
class Chunks:
    """Sequences (a batch, or packed by cu_seqlens) cut into CHUNK-token chunks, heads first:
    the layout the models compute in. Zero padding is exactly neutral in every step."""
    B: int
    T: int
    bounds: list
    lengths: np.ndarray
    nchunks: int

    @classmethod
    def of(cls, B: int, T: int, cu_seqlens=None) -> "Chunks":
        bounds = sequence_bounds(B, T, cu_seqlens)
        lengths = np.array([eos - bos for bos, eos in bounds])
        return cls(B, T, bounds, lengths, max(1, -(-int(lengths.max(initial=0)) // CHUNK)))

    @property
    def N(self) -> int:
        return len(self.bounds)

    def split(self, x):
        """[B, T, HV, ...] -> [N, HV, chunks, CHUNK, ...], zero-padded."""
        flat = x.reshape((self.B * self.T,) + x.shape[2:])
        packed = pack(flat, self.bounds, self.nchunks * CHUNK)
        return np.moveaxis(packed.reshape((self.N, self.nchunks, CHUNK) + x.shape[2:]), 3, 1)

    def join(self, x):
        """[N, HV, chunks, CHUNK, ...] -> [B, T, HV, ...], the padding dropped."""
        HV = x.shape[1]
        rows = np.moveaxis(x.reshape((self.N, HV, self.nchunks * CHUNK) + x.shape[4:]), 1, 2)
        return unpack(rows, self.bounds, self.B * self.T).reshape((self.B, self.T, HV) + x.shape[4:])


def ex2(x):
    """ex2.approx.ftz.f32 computed exactly: 2^x rounded to fp32, flushed to zero."""
    with np.errstate(over="ignore"):
        return ftz_f32(r32(np.exp2(np.asarray(x, dtype=np.float64))))


def sigmoid_f32(x):
    """rcp(1 + ex2(-x log2e)) with fp32 rounding at each step."""
    with np.errstate(divide="ignore"):
        return r32(1.0 / r32(1.0 + ex2(r32(-x * LOG2E_F32))))


def l2norm_f32(x):
    ss = r32(np.sum(x * x, axis=-1, keepdims=True))
    return r32(x * r32(1.0 / np.sqrt(r32(ss + EPS_F32))))


def gate_f32(g, gate, A_log, dt_bias, lower_bound):
    """Base-2 log decay in fp32, per token and channel ([..., HV, K])."""
    if gate == "log":
        return r32(g * LOG2E_F32)
    HV, K = g.shape[-2:]
    a = np.ones((HV, 1)) if A_log is None else ex2(r32(np.asarray(A_log, np.float64) * LOG2E_F32)).reshape(HV, 1)
    x = g if dt_bias is None else r32(g + np.asarray(dt_bias, np.float64).reshape(HV, K))
    if gate == "softplus":
        z = r32(x * LOG2E_F32)
        with np.errstate(divide="ignore"):
            sp = np.where(x > 15.0, z, r32(np.log2(r32(1.0 + ex2(z)))))
        return -r32(a * sp)
    if gate == "sigmoid":
        return r32(r32(lower_bound * (1.0 / math.log(2.0))) * sigmoid_f32(r32(a * x)))
    raise ValueError(f"gate: unknown mode {gate!r}")


def beta_f32(beta, shape, beta_sigmoid, allow_neg_eigval):
    if beta is None:
        return np.ones(shape)
    b = np.asarray(beta, dtype=np.float64)
    if beta_sigmoid:
        b = sigmoid_f32(b) * (2.0 if allow_neg_eigval else 1.0)
    return b


def _pair_form(a, b, gc, mask):
    diff = ex2(r32(gc[..., :, None, :] - gc[..., None, :, :]))
    return r32(np.where(mask, np.einsum("...id,...jd,...ijd->...ij", a, b, diff), 0.0))


def solve_unit_lower(Lb):
    """(I + Lb)^-1 for strictly lower triangular Lb [..., C, C] by forward
    substitution, fp32 FMAs in the kernel's order (step 8). Unlike a power
    series it never forms powers of Lb, so it neither cancels nor overflows
    when Lb is close to an all-beta lower triangle (repeated keys, no decay)."""
    C = Lb.shape[-1]
    X = np.zeros(Lb.shape)
    for i in range(C):
        acc = np.broadcast_to(np.eye(C)[i], Lb.shape[:-1]).copy()
        for j in range(i):
            acc = r32(acc - Lb[..., i, j, None] * X[..., j, :])
        X[..., i, :] = acc
    return X


def chunk_decay(g2):
    """Step 4 on [..., 16, K] chunks: gc, the fp32 running sum of g2 over the rows; gt, its last
    row; gr, the factored form's reference per channel (the centre of gc's range), [..., 1, K]."""
    gc = np.cumsum(g2.astype(np.float32), axis=-2, dtype=np.float32).astype(np.float64)
    hi = np.fmax.reduce(gc, axis=-2, keepdims=True)
    lo = np.fmin.reduce(gc, axis=-2, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        gr = ftz_f32(r32(ftz_f32(r32(hi + lo)) * 0.5))  # -ftz=true: a subnormal sum or half is 0
    return gc, gc[..., -1:, :], gr


def pair_form_chunks(gc, gr):
    """Step 6's test per chunk ([...]): some channel's |r32(gc - gr)| above SAFE_EXPONENT, as the
    kernels take it: fmaxf(hi - gr, gr - lo) per channel (a NaN side ignored), any channel."""
    with np.errstate(invalid="ignore"):
        hi = np.fmax.reduce(gc, axis=-2, keepdims=True)
        lo = np.fmin.reduce(gc, axis=-2, keepdims=True)
        span = np.fmax(r32(hi - gr), r32(gr - lo))
        return np.any(span > SAFE_EXPONENT, axis=(-1, -2))


def decayed_operands(qn, kn, gc, gt, gr, scale):
    """Step 5: the recurrence's bf16 operands q_dec, k_dec, k_res and the factored form's q_m, k_m,
    k_i with the low parts q_ml, k_il (float64 arrays holding bf16 values), as a dict."""
    e = ex2(gc)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 only in chunks that take the pair form
        em, ei = ex2(r32(gc - gr)), ex2(r32(gr - gc))
        q_mf, k_if = r32(qn * r32(em * scale)), r32(kn * ei)
        q_m, k_i = bf(q_mf), bf(k_if)
        return dict(q_dec=bf(r32(qn * r32(e * scale))), k_dec=bf(r32(kn * e)), k_res=bf(r32(kn * ex2(r32(gt - gc)))),
                    q_m=q_m, k_m=bf(r32(kn * em)), k_i=k_i, q_ml=bf(ftz_f32(q_mf - q_m)),
                    k_il=bf(ftz_f32(k_if - k_i)))


def prepare_chunks(qn, kn, g2, beta, scale):
    """Steps 4-9 on [..., 16, K] chunks (beta [..., 16]). Returns the operands
    the recurrence reads: q_dec, k_dec, k_res, INV, Mqk (float64 arrays holding
    bf16 values) and gexp [..., K] (fp32 values)."""
    C = g2.shape[-2]
    gc, gt, gr = chunk_decay(g2)
    op = decayed_operands(qn, kn, gc, gt, gr, scale)
    i = np.arange(C)
    strict, incl = i[:, None] > i[None, :], i[:, None] >= i[None, :]
    k_iT, k_ilT = np.swapaxes(op["k_i"], -1, -2), np.swapaxes(op["k_il"], -1, -2)
    with np.errstate(all="ignore"):
        L = np.where(strict, r32(op["k_m"] @ k_iT), 0.0)
        Mf = np.where(incl, r32(op["q_m"] @ k_iT + op["q_m"] @ k_ilT + op["q_ml"] @ k_iT), 0.0)
    unsafe = pair_form_chunks(gc, gr)
    if np.any(unsafe):
        L[unsafe] = _pair_form(kn[unsafe], kn[unsafe], gc[unsafe], strict)
        Mf[unsafe] = _pair_form(r32(qn[unsafe] * scale), kn[unsafe], gc[unsafe], incl)
    Lb = np.where(strict, r32(L * beta[..., :, None]), 0.0)
    INV = bf(solve_unit_lower(Lb))
    return dict(q_dec=op["q_dec"], k_dec=op["k_dec"], k_res=op["k_res"], INV=INV, Mqk=bf(Mf),
                gexp=ex2(gt[..., 0, :]))


def recurrence_step(H, ops, v, beta, out_dtype, state_precision):
    """Steps 11-15 for one chunk. H [..., K, V]; v [..., 16, V]; beta [..., 16]."""
    Hop = bf(H)
    W = r32(ops["k_dec"] @ Hop)
    vsub = bf(r32(beta[..., :, None] * r32(v - W)))
    U = bf(r32(ops["INV"] @ vsub))
    o = round_to(ops["q_dec"] @ Hop + ops["Mqk"] @ U, out_dtype)
    dS = r32(np.swapaxes(ops["k_res"], -1, -2) @ U)
    H = r32(dS + H * ops["gexp"][..., :, None])
    return (bf(H) if state_precision == "bf16" else H), o


def kda_model(
    q, k, v, g, beta=None, *, scale=None, initial_state=None, output_final_state=False,
    cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False,
    gate="log", A_log=None, dt_bias=None, lower_bound=None, state_layout="kv",
    state_dtype=None, state_precision="bf16", on_chunk=None,
):
    """The CUDA kernels' result, modelled in NumPy. Inputs in their storage
    dtypes; returns ``(o, final_state)`` in v's dtype and ``state_dtype``. ``on_chunk(end, S)``
    is called after each chunk with the state as held, [N, HV, K, V], after each sequence's
    first ``end`` tokens (checkpoints, kdacupy/numerics/checkpoints.py)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    out_dtype = np.dtype(v.dtype)
    if state_dtype is None:
        state_dtype = initial_state.dtype if initial_state is not None else F32
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    qn, kn = f64(q), f64(k)
    if qk_l2norm:
        qn, kn = l2norm_f32(qn), l2norm_f32(kn)
    G = HV // H
    qn, kn = np.repeat(qn, G, axis=2), np.repeat(kn, G, axis=2)
    g2 = gate_f32(f64(g), gate, A_log, dt_bias, lower_bound)
    b = beta_f32(beta, (B, T, HV), beta_sigmoid, allow_neg_eigval)
    scale32 = scale_f32(scale, K)

    ch = Chunks.of(B, T, cu_seqlens)
    N, nchunks = ch.N, ch.nchunks
    qc, kc, vc, gcn, bc = (ch.split(x) for x in (qn, kn, f64(v), g2, b))

    S0 = np.zeros((N, HV, K, V)) if initial_state is None else state_to_kv(initial_state, state_layout)
    Hs = bf(S0) if state_precision == "bf16" else r32(S0)
    o = np.zeros((N, HV, nchunks, CHUNK, V))
    for c in range(nchunks):
        ops = prepare_chunks(qc[:, :, c], kc[:, :, c], gcn[:, :, c], bc[:, :, c], scale32)
        Hs, o[:, :, c] = recurrence_step(Hs, ops, vc[:, :, c], bc[:, :, c], out_dtype, state_precision)
        if on_chunk is not None:
            on_chunk((c + 1) * CHUNK, Hs)
    o = ch.join(o).astype(out_dtype)
    final = None
    if output_final_state:
        Hs = np.where((ch.lengths == 0)[:, None, None, None], S0, Hs)
        final = state_from_kv(Hs, state_layout).astype(np.float32).astype(state_dtype)
    return o, final

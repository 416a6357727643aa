"""What every rank checks of a context-parallel case, whatever carries the collectives (the
mpiexec worker's MPI communicator, the gloo worker's torch.distributed group): the CP
forward and backward against the single-process kda_forward / kda_backward on the same
seeded inputs, computed on every rank. ``ranks``: ``.rank``, ``.size`` and ``.allgather(obj)``."""
import numpy as np

import kdacupy
from kdacupy.distributed import kda_backward_cp, kda_forward_cp
from kdacupy.numerics.dtypes import F32, F64

from ..inputs import make_inputs, rmse_ratio
from .cases import cuts_for

U = 2.0 ** -9  # the error unit u of tests/numerics/test_precision.py (about one bf16 rounding's RMSE ratio)
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log", "ddt_bias")
SLICED = GRADS[:5]


def local_slice(ranks, x, T, style):
    c = cuts_for(T, style, ranks.size)
    sl = slice(int(c[ranks.rank]), int(c[ranks.rank + 1]))
    return sl, {n: a[:, sl] for n, a in x.items()}


def forward_case(ranks, comm, name, inputs, extra, style, backend, exact=False):
    x, opts = make_inputs(**inputs)
    opts.update(output_final_state=True, **extra)
    sl, local = local_slice(ranks, x, x["q"].shape[1], style)
    o, s = kda_forward_cp(**local, comm=comm, backend=backend, **opts)
    same = ranks.allgather(s.tobytes())  # (before any check that could stop one rank alone)
    o1, s1 = kdacupy.kda_forward(**x, backend=backend, **opts)
    ro, rs = kdacupy.kda_forward(**x, backend="reference", **{**opts, "state_dtype": F32})
    assert o.shape == local["v"].shape and o.dtype == x["v"].dtype, (o.shape, o.dtype)
    assert s.shape == s1.shape and s.dtype == s1.dtype, (s.shape, s.dtype, s1.shape, s1.dtype)
    assert all(b == same[0] for b in same), "final_state differs between ranks"
    if exact:  # float32 inputs on the reference: exact up to the float32 rounding of the results
        assert rmse_ratio(s, s1) < 1e-6, rmse_ratio(s, s1)
        if o.size:
            assert rmse_ratio(o, o1[:, sl]) < 1e-6, rmse_ratio(o, o1[:, sl])
        return
    # pieces are chunked from their own starts, so CP and the single-process run round
    # differently, each within the contract's bound of the reference
    if o.size and np.linalg.norm(ro[:, sl]):
        e_cp, e_one = rmse_ratio(o, ro[:, sl]), rmse_ratio(o1[:, sl], ro[:, sl])
        assert e_cp < 8 * U, f"output vs reference {e_cp:.3g} >= 8u"
        assert rmse_ratio(o, o1[:, sl]) < 2 * max(e_one, U), f"output vs single process {rmse_ratio(o, o1[:, sl]):.3g}"
    assert rmse_ratio(s, rs) < 12 * U, f"state vs reference {rmse_ratio(s, rs):.3g} >= 12u"


def float64(x, opts):
    """The case's inputs and parameters in float64: the float64 reference's own gradient."""
    x64 = {n: a.astype(F64) for n, a in x.items()}
    o64 = {n: a.astype(F64) if n in ("A_log", "dt_bias", "initial_state") else a for n, a in opts.items()}
    return x64, o64


def cotangents(o, s, seed=11):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(o.shape).astype(o.dtype),
            rng.standard_normal(s.shape).astype(np.float32 if s.dtype != F64 else F64))


def backward_case(ranks, comm, name, inputs, extra, style, backend, exact=False, repeat=False):
    """The CP gradients of every argument against the single-process kda_backward: the
    reference in float64 to 1e-10 (relative, per gradient); the model with the CP forward's
    tolerance above: against the float64 gradient and against the single-process model,
    within 2x the single-process model's own error (pieces are chunked from their own starts,
    so the two round differently: the same noise, other draws, about sqrt(2) x apart).
    ``repeat``: a second call gives the same bits, the ranks' shared gradients are the same
    bits, and the "local" shares sum to them. Every rank reaches every collective
    whatever it finds (the findings are raised at the end), so a failed check never hangs."""
    x, opts = make_inputs(**inputs)
    opts.update(extra)
    if exact:  # float64 gate parameters too: nothing is rounded to float32 on either side
        x, opts = float64(x, opts)
    o1, s1 = kdacupy.kda_forward(**x, backend=backend, output_final_state=True, **opts)
    do, ds = cotangents(o1, s1)
    g1 = kdacupy.kda_backward(do, **x, dfinal_state=ds, backend=backend, **opts)
    sl, local = local_slice(ranks, x, x["q"].shape[1], style)
    call = lambda **kw: kda_backward_cp(do[:, sl], **local, comm=comm, **{"dfinal_state": ds, **kw},  # noqa: E731
                                        backend=backend, **opts)
    g = call()
    ref = None
    if not exact:
        x64, o64 = float64(x, opts)
        ref = kdacupy.kda_backward(do.astype(F64), **x64, dfinal_state=ds.astype(F64), backend="reference", **o64)
    problems = [p for n in GRADS if (p := _compare(n, g, g1, ref, sl, exact))]
    if repeat:
        problems += _same_bits(ranks, g, call, ds)
    assert not problems, "; ".join(problems)


def _compare(n, g, g1, ref, sl, exact):
    """What is wrong with CP gradient ``n`` (None: nothing)."""
    got, one = getattr(g, n), getattr(g1, n)
    if one is None:
        return None if got is None else f"{n}: expected None"
    if n in SLICED:
        one = one[:, sl]
    if got.shape != one.shape or got.dtype != one.dtype:
        return f"{n}: {got.shape} {got.dtype}, expected {one.shape} {one.dtype}"
    if not got.size:
        return None
    if exact:
        err = np.abs(got - one).max() / max(np.abs(one).max(), 1e-300)
        return None if err < 1e-10 else f"{n}: {err:.3g} relative to the single-process float64 gradient"
    r = getattr(ref, n)[:, sl] if n in SLICED else getattr(ref, n)
    if not np.linalg.norm(r):
        return None
    e_cp, e_one, e_two = rmse_ratio(got, r), rmse_ratio(one, r), rmse_ratio(got, one)
    if e_cp >= 2 * max(e_one, U) or e_two >= 2 * max(e_one, U):
        return (f"{n}: CP {e_cp:.3g} against the float64 gradient and {e_two:.3g} against the single process, "
                f"whose own error is {e_one:.3g}")
    return None


def _same_bits(ranks, g, call, ds):
    problems = []
    again = call()
    for n in GRADS:
        a, b = getattr(g, n), getattr(again, n)
        if (a is None) != (b is None) or (a is not None and a.tobytes() != b.tobytes()):
            problems.append(f"{n} differs between runs")
    share = ds if ranks.rank == 0 else np.zeros_like(ds)  # the final state's gradient, as shares
    local = call(shared_grads="local", dfinal_state=share)
    shared = [n for n in GRADS[5:] if getattr(g, n) is not None]
    rows = ranks.allgather({n: (getattr(g, n).tobytes(), getattr(local, n)) for n in shared})
    for n in shared:
        if any(r[n][0] != rows[0][n][0] for r in rows):
            problems.append(f"{n} differs between ranks")
        if getattr(g, n).dtype in (F32, F64):
            total = rows[0][n][1].copy()
            for r in rows[1:]:
                total += r[n][1]
            if total.tobytes() != getattr(g, n).tobytes():
                problems.append(f"{n}: the local shares do not sum to the total")
    return problems

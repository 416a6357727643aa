"""Run under ``mpiexec -n R``: every context-parallel case on this rank, checked
against the single-process forward and the float64 reference computed here
from the same seeded inputs. Prints one line per case on rank 0; exits non-zero
when any rank failed any case (failures are gathered, so no rank hangs)."""
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kdacupy  # noqa: E402
from kdacupy.distributed import kda_forward_cp  # noqa: E402
from kdacupy.numerics.dtypes import F32  # noqa: E402
from tests.dist.cases import CASES, cuts_for as _cuts_for  # noqa: E402
from tests.dist.gather import run_everywhere  # noqa: E402
from tests.inputs import make_inputs, rmse_ratio  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, RANKS = COMM.rank, COMM.size
U = 2.0 ** -9  # the error unit u of tests/numerics/test_precision.py (about one bf16 rounding's RMSE ratio)


def cuts_for(T, style):
    return _cuts_for(T, style, RANKS)


def run_case(name, inputs, extra, style, backend, exact=False):
    x, opts = make_inputs(**inputs)
    opts.update(output_final_state=True, **extra)
    T = x["q"].shape[1]
    c = cuts_for(T, style)
    sl = slice(int(c[RANK]), int(c[RANK + 1]))
    local = {n: a[:, sl] for n, a in x.items()}
    o, s = kda_forward_cp(**local, comm=COMM, backend=backend, **opts)
    o1, s1 = kdacupy.kda_forward(**x, backend=backend, **opts)
    ro, rs = _reference(x, opts)
    assert o.shape == local["v"].shape and o.dtype == x["v"].dtype, (o.shape, o.dtype)
    assert s.shape == s1.shape and s.dtype == s1.dtype, (s.shape, s.dtype, s1.shape, s1.dtype)
    same = COMM.allgather(s.tobytes())
    assert all(b == same[0] for b in same), "final_state differs between ranks"
    if exact:  # float64 maps and forward: context parallelism is exact up to the fp32 start states
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


def _reference(x, opts):
    return kdacupy.kda_forward(**x, backend="reference", **{**opts, "state_dtype": F32})


def expect_collective_error(name, make_call, needle):
    try:
        make_call()
    except (ValueError, TypeError) as e:
        msgs = COMM.allgather(f"{type(e).__name__}: {e}")
        assert all(m == msgs[0] for m in msgs), f"ranks raised different errors: {msgs}"
        assert needle in msgs[0], msgs[0]
        return
    COMM.allgather("no error")
    raise AssertionError("no error raised")


def error_cases():
    x, opts = make_inputs(T=40, H=2, K=64, V=64, seed=3)
    sl = slice(RANK * 40 // RANKS, (RANK + 1) * 40 // RANKS)
    local = {n: a[:, sl] for n, a in x.items()}
    scale = 0.1 if RANK == RANKS - 1 else 0.2
    yield "mismatched scale", lambda: kda_forward_cp(**local, comm=COMM, **opts, scale=scale, backend="model"), \
        "disagree on scale"
    bad = dict(local)
    if RANK == RANKS - 1:
        bad["g"] = bad["g"][..., :32]
    yield "bad g on the last rank", lambda: kda_forward_cp(**bad, comm=COMM, **opts, backend="model"), \
        f"rank {RANKS - 1}: g: expected shape"
    xv, ov = make_inputs(cu_seqlens=[10, 30], H=2, K=64, V=64, seed=4)
    cu = ov.pop("cu_seqlens")
    cu_bad = cu.copy()
    cu_bad[-1] += 1
    slv = slice(RANK * 40 // RANKS, (RANK + 1) * 40 // RANKS)
    lv = {n: a[:, slv] for n, a in xv.items()}
    yield "cu_seqlens longer than the tokens", lambda: kda_forward_cp(
        **lv, comm=COMM, cu_seqlens=cu_bad, **ov, backend="model"), "cu_seqlens: expected last value 40"
    yield "unknown keyword", lambda: kda_forward_cp(**local, comm=COMM, **opts, use_qk_l2norm_in_kernel=True), \
        "unexpected keyword 'use_qk_l2norm_in_kernel'"


def main():
    only = set(sys.argv[1:])
    failed = 0
    jobs = [(c[0], lambda c=c: run_case(*c)) for c in CASES]
    jobs += [(n, lambda f=f, s=s: expect_collective_error(n, f, s)) for n, f, s in error_cases()]
    for name, job in jobs:
        if only and not any(o in name for o in only):
            continue
        failed += run_everywhere(COMM, job, f"{name} ({RANKS} ranks)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

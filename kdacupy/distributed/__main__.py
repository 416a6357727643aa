"""Demo: ``.venv/bin/mpiexec -n 4 .venv/bin/python -m kdacupy.distributed [--backend model|emulate|cuda]``.

Every rank makes the same seeded inputs (varlen, one sequence spanning every
rank), keeps its contiguous slice, runs ``kda_forward_cp`` and reports its
error against the float64 reference; rank 0 prints what was communicated.
"""
from __future__ import annotations

import argparse

import numpy as np


def _tokens(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 10, got {text!r}") from None
    if n < 10:
        raise argparse.ArgumentTypeError(f"expected an integer >= 10 (three sequences over every rank), got {n}")
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kdacupy.distributed", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="model", choices=["model", "emulate", "reference", "cuda"])
    ap.add_argument("--T", type=_tokens, default=256, help="total tokens (default 256)")
    args = ap.parse_args(argv)
    try:
        from mpi4py import MPI
    except ImportError as e:
        ap.error(f"mpi4py is not importable ({e}): pip install \".[distributed]\" brings it and MPICH")
    if args.backend == "cuda":
        from ..jit.device import why_no_gpu
        why = why_no_gpu()
        if why:
            ap.error(f"--backend cuda: {why}; the CPU backends (model, emulate, reference) need none")

    import kdacupy
    from kdacupy.distributed import kda_forward_cp
    from kdacupy.numerics.dtypes import BF16

    comm = MPI.COMM_WORLD
    rank, ranks = comm.rank, comm.size
    rng = np.random.default_rng(0)
    T, H, K, V = args.T, 2, 128, 128
    cu = np.array([0, T // 10, T // 10, T], dtype=np.int64)  # a short, an empty and a long sequence

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    x = dict(q=unit(rng.standard_normal((1, T, H, K))).astype(BF16),
             k=unit(rng.standard_normal((1, T, H, K))).astype(BF16),
             v=rng.standard_normal((1, T, H, V)).astype(BF16),
             g=rng.standard_normal((1, T, H, K)).astype(BF16),
             beta=rng.standard_normal((1, T, H)).astype(BF16))
    opts = dict(cu_seqlens=cu, gate="sigmoid", lower_bound=-5.0, A_log=rng.uniform(0, 1, H).astype(np.float32),
                dt_bias=rng.standard_normal((H, K)).astype(np.float32), beta_sigmoid=True, qk_l2norm=True,
                output_final_state=True)
    lo, hi = rank * T // ranks, (rank + 1) * T // ranks
    local = {n: a[:, lo:hi] for n, a in x.items()}
    if args.backend == "cuda":
        import cupy
        local = {n: cupy.asarray(a) for n, a in local.items()}
    o, s = kda_forward_cp(**local, comm=comm, backend=args.backend, **opts)
    ro, rs = kdacupy.kda_forward(**x, backend="reference", **opts)
    o, s = (a.get() if hasattr(a, "get") else a for a in (o, s))

    def err(a, ref):
        a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
        return np.linalg.norm(a - ref) / np.linalg.norm(ref)

    line = (f"rank {rank}: tokens [{lo}, {hi}): output RMSE ratio vs float64 reference "
            f"{err(o, ro[:, lo:hi]):.2e}, final state {err(s, rs):.2e}")
    lines = comm.gather(line)
    if rank == 0:
        print("\n".join(lines))
        print(f"communicated: one allgather of call signatures, one of fp32 maps "
              f"({ranks} x {H} x {K} x {K + V} x 4 = {ranks * H * K * (K + V) * 4} bytes), "
              f"one allreduce of the final states")


if __name__ == "__main__":
    main()

"""``python -m kdacupy.accuracy``: error against the float64 reference, FlashKDA style.

For one backend, over a sweep of gate / bias regimes (docs/design.md section 2), prints max abs
error and RMSE ratio ``||x - ref|| / ||ref||`` of the output and the final
state, next to the bf16 rounding floor of the output (the error of rounding
the exact output to bf16). Inputs follow FlashKDA's tests: l2-normalised bf16
q/k, bf16 v, bf16 gate logits g and beta logits, sigmoid gate with
lower_bound = -5, A_log ~ U(0, 1), no initial state, fp32 final state.
Progress goes to stderr, one line per regime pair; the table to stdout.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import numpy as np

from ..numerics.dtypes import BF16
from .timing import gpu_available

G_REGIMES = ("-8", "-4", "0", "8", "U(-8,8)", "N(0,8)")
BIAS_REGIMES = ("+4", "-4", "+8", "-8", "U(-8,8)", "N(0,8)")
LOWER_BOUND = -5.0


def regime(name, shape, rng):
    if name.startswith("U("):
        return rng.uniform(-8.0, 8.0, shape)
    if name.startswith("N("):
        return rng.normal(0.0, 8.0, shape)
    return np.full(shape, float(name))


def make_inputs(T, H, K, V, g_regime, bias_regime, seed=0):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return dict(
        q=unit(rng.standard_normal((1, T, H, K))).astype(BF16),
        k=unit(rng.standard_normal((1, T, H, K))).astype(BF16),
        v=rng.standard_normal((1, T, H, V)).astype(BF16),
        g=regime(g_regime, (1, T, H, K), rng).astype(BF16),
        beta=rng.standard_normal((1, T, H)).astype(BF16),
        A_log=rng.uniform(0.0, 1.0, H).astype(np.float32),
        dt_bias=regime(bias_regime, (H, K), rng).astype(np.float32),
    )


OPTIONS = dict(qk_l2norm=True, beta_sigmoid=True, gate="sigmoid", lower_bound=LOWER_BOUND,
               output_final_state=True, state_dtype=np.float32)


def errors(x, ref):
    x = np.asarray(x, dtype=np.float64)
    nref = np.linalg.norm(ref)
    return float(np.max(np.abs(x - ref))), float(np.linalg.norm(x - ref) / nref) if nref else 0.0


def run_backend(backend, inputs, state_precision):
    from .. import kda_forward
    if backend == "cuda":
        import cupy as cp
        dev = {n: cp.asarray(x) for n, x in inputs.items()}
        o, s = kda_forward(**dev, backend="cuda", state_precision=state_precision, **OPTIONS)
        return cp.asnumpy(o), cp.asnumpy(s)
    return kda_forward(**inputs, backend=backend, state_precision=state_precision, **OPTIONS)


def sweep(backend="model", T=2048, H=4, K=128, V=128, state_precision="bf16", pairs=None, seed=0,
          progress=None):
    """One row per (g, dt_bias) regime pair; ``progress(i, n, row)`` after each."""
    from ..numerics.reference import kda_reference
    rows = []
    pairs = list(pairs or itertools.product(G_REGIMES, BIAS_REGIMES))
    for gr, br in pairs:
        inputs = make_inputs(T, H, K, V, gr, br, seed)
        ref_opts = {n: x for n, x in OPTIONS.items() if n != "state_dtype"}
        ref_o, ref_s = kda_reference(**inputs, **ref_opts)
        t0 = time.perf_counter()
        o, s = run_backend(backend, inputs, state_precision)
        seconds = time.perf_counter() - t0
        o_max, o_rmse = errors(o, ref_o)
        s_max, s_rmse = errors(s, ref_s)
        _, floor = errors(ref_o.astype(np.float32).astype(BF16), ref_o)
        rows.append(dict(g=gr, dt_bias=br, o_max=o_max, o_rmse=o_rmse, state_max=s_max, state_rmse=s_rmse,
                         o_bf16_floor=floor, finite=bool(np.isfinite(np.asarray(o, np.float64)).all()),
                         seconds=seconds))
        if progress:
            progress(len(rows), len(pairs), rows[-1])
    return rows


def print_progress(i, n, row):
    print(f"[{i}/{n}] g={row['g']} dt_bias={row['dt_bias']}: o ratio {row['o_rmse']:.2e} "
          f"({row['seconds']:.1f} s)", file=sys.stderr, flush=True)


def format_table(rows):
    head = (f"{'g':>8} {'dt_bias':>8} | {'o abs max':>9} {'o ratio':>9} {'bf16 ratio':>10} | {'S abs max':>9} "
            f"{'S ratio':>9}")
    legend = ("abs max: max |x - ref| (absolute); ratio: ||x - ref|| / ||ref|| (relative RMSE); "
              "bf16 ratio: the ratio of the exact output rounded to bf16 (the floor)")
    lines = [legend, head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['g']:>8} {r['dt_bias']:>8} | {r['o_max']:9.2e} {r['o_rmse']:9.2e} {r['o_bf16_floor']:10.2e}"
                     f" | {r['state_max']:9.2e} {r['state_rmse']:9.2e}")
    worst = max(rows, key=lambda r: r["o_rmse"])
    lines.append(f"worst o ratio {worst['o_rmse']:.2e} (g={worst['g']}, dt_bias={worst['dt_bias']}); "
                 f"median {np.median([r['o_rmse'] for r in rows]):.2e}; "
                 f"median bf16 ratio {np.median([r['o_bf16_floor'] for r in rows]):.2e}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kdacupy.accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="model", choices=("model", "emulate", "cuda", "reference"),
                   help="what to measure (default: model, the NumPy precision model of the kernels)")
    p.add_argument("--T", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--H", type=int, default=4, help="heads (default 4)")
    p.add_argument("--K", type=int, default=128, choices=(64, 128, 256))
    p.add_argument("--V", type=int, default=128, choices=(64, 128, 256))
    p.add_argument("--state-precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--quick", action="store_true", help="pair each g regime with one dt_bias regime only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = p.parse_args(argv)
    if args.backend == "cuda" and not gpu_available():
        print("kdacupy.accuracy: --backend cuda needs a CUDA GPU and driver; the other backends run on the CPU",
              file=sys.stderr)
        return 2
    pairs = list(zip(G_REGIMES, BIAS_REGIMES)) if args.quick else None
    print(f"kdacupy accuracy: backend={args.backend} T={args.T} H={args.H} K={args.K} V={args.V} "
          f"state_precision={args.state_precision}; errors against the float64 reference", flush=True)
    rows = sweep(args.backend, args.T, args.H, args.K, args.V, args.state_precision, pairs, args.seed,
                 progress=print_progress)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(backend=args.backend, T=args.T, H=args.H, K=args.K, V=args.V,
                           state_precision=args.state_precision, rows=rows), f, indent=1)
    return 0 if all(r["finite"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

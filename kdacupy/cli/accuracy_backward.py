"""``python -m kdacupy.accuracy --backward``: each gradient's error against the float64 reference.

The forward sweep's inputs (``accuracy.make_inputs``; ``--adversarial``: its cases; accuracy.py
hands over its module as ``inputs``, so this one does not import it), plus what a
loss needs: ``do`` ~ N(0, 1) in bf16, ``dfinal_state`` ~ N(0, 1) in fp32, and an initial state
~ N(0, 0.5^2) in fp32 so that its gradient is measured too. One row per case: the RMSE ratio
``||x - ref|| / ||ref||`` of dq, dk, dv, dg, dbeta, dinitial_state, dA_log and ddt_bias, and the
worst bf16 floor among the bf16 gradients (their exact values rounded to bf16 once). The bounds
are derived in tests/numerics/test_backward_model.py.
"""
from __future__ import annotations

import itertools
import sys
import time

import numpy as np

from ..numerics.dtypes import BF16

FIELDS = ("dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log", "ddt_bias")
SHORT = dict(dq="dq", dk="dk", dv="dv", dg="dg", dbeta="dbeta", dinitial_state="dS0", dA_log="dA_log",
             ddt_bias="ddt_bias")


def loss_inputs(x, opts, seed=0):
    """(args, options) of kda_backward for forward inputs ``x`` and options ``opts``."""
    rng = np.random.default_rng(seed + 1000)
    _, T, H, K = x["q"].shape
    HV, V = x["v"].shape[2:]
    args = dict(x)
    o = {n: v for n, v in opts.items() if n not in ("output_final_state", "state_dtype")}
    for n in ("A_log", "dt_bias"):  # the forward sweep passes these with the inputs
        if n in args:
            o[n] = args.pop(n)
    o["initial_state"] = (0.5 * rng.standard_normal((1, HV, K, V))).astype(np.float32)
    args["do"] = rng.standard_normal((1, T, HV, V)).astype(BF16)
    o["dfinal_state"] = rng.standard_normal((1, HV, K, V)).astype(np.float32)
    return args, o


def run_backend(backend, args, opts, state_precision):
    from .. import kda_backward
    if backend == "cuda":
        import cupy as cp
        dev = lambda d: {n: cp.asarray(x) if isinstance(x, np.ndarray) else x for n, x in d.items()}  # noqa: E731
        grads = kda_backward(**dev(args), **dev(opts), backend="cuda", state_precision=state_precision)
        return [None if g is None else cp.asnumpy(g) for g in grads]
    return list(kda_backward(**args, **opts, backend=backend, state_precision=state_precision))


def _row(key, grads, refs, seconds):
    row = dict(key)
    floors = []
    finite = True
    for f, got, ref in zip(FIELDS, grads, refs):
        if got is None:
            row[f] = None
            continue
        got = np.asarray(got, dtype=np.float64)
        finite &= bool(np.isfinite(got).all())
        n = np.linalg.norm(ref)
        row[f] = float(np.linalg.norm(got - ref) / n) if n else 0.0
        if n and grads[FIELDS.index(f)].dtype == BF16:
            floors.append(float(np.linalg.norm(ref.astype(np.float32).astype(BF16) - ref) / n))
    row.update(bf16_floor=max(floors) if floors else 0.0, finite=finite, seconds=seconds)
    return row


def _measure(backend, args, opts, state_precision, key):
    from ..numerics.backward_reference import kda_backward_reference
    t0 = time.perf_counter()
    refs = kda_backward_reference(**args, **opts)
    grads = run_backend(backend, args, opts, state_precision)
    return _row(key, grads, refs, time.perf_counter() - t0)


def sweep(inputs, backend="model", T=2048, H=4, K=128, V=128, state_precision="bf16", pairs=None, seed=0,
          progress=None):
    """``inputs``: the forward's accuracy module (its regimes, make_inputs and OPTIONS)."""
    rows = []
    pairs = list(pairs or itertools.product(inputs.G_REGIMES, inputs.BIAS_REGIMES))
    for gr, br in pairs:
        args, opts = loss_inputs(inputs.make_inputs(T, H, K, V, gr, br, seed), inputs.OPTIONS, seed)
        rows.append(_measure(backend, args, opts, state_precision, dict(g=gr, dt_bias=br)))
        if progress:
            progress(len(rows), len(pairs), rows[-1])
    return rows


def adversarial_sweep(inputs, backend="model", T=2048, H=4, K=128, V=128, state_precision="bf16", names=None,
                      seed=0, progress=None):
    rows = []
    names = list(names or inputs.ADVERSARIAL)
    for name in names:
        x, opts = inputs.adversarial_inputs(name, T, H, K, V, seed)
        args, o = loss_inputs(x, opts, seed)
        rows.append(_measure(backend, args, o, state_precision, dict(case=name, T=x["q"].shape[1])))
        if progress:
            progress(len(rows), len(names), rows[-1])
    return rows


def print_progress(i, n, row):
    what = f"case={row['case']}" if "case" in row else f"g={row['g']} dt_bias={row['dt_bias']}"
    worst = max(v for f, v in row.items() if f in FIELDS and v is not None)
    print(f"[{i}/{n}] {what}: worst gradient ratio {worst:.2e} ({row['seconds']:.1f} s, reference included)",
          file=sys.stderr, flush=True)


def format_table(rows):
    adv = "case" in rows[0]
    what = (lambda r: f"{r['case']:>28} {r['T']:>5}") if adv else (lambda r: f"{r['g']:>8} {r['dt_bias']:>8}")
    cols = f"{'case':>28} {'T':>5}" if adv else f"{'g':>8} {'dt_bias':>8}"
    head = cols + " | " + " ".join(f"{SHORT[f]:>9}" for f in FIELDS) + f" | {'bf16 floor':>10}"
    legend = ("RMSE ratio ||grad - ref|| / ||ref|| of each gradient against the float64 reference; "
              "bf16 floor: the worst ratio of an exact bf16 gradient rounded to bf16 once")
    fmt = lambda v: f"{'-':>9}" if v is None else f"{v:9.2e}"  # noqa: E731
    lines = [legend, head, "-" * len(head)]
    for r in rows:
        lines.append(f"{what(r)} | " + " ".join(fmt(r[f]) for f in FIELDS) + f" | {r['bf16_floor']:10.2e}"
                     + ("" if r["finite"] else "  NON-FINITE"))
    worst = {f: max((r[f] for r in rows if r[f] is not None), default=None) for f in FIELDS}
    lines.append("worst: " + ", ".join(f"{SHORT[f]} {v:.2e}" for f, v in worst.items() if v is not None))
    return "\n".join(lines)


def main(args, inputs) -> int:
    """The --backward run of ``python -m kdacupy.accuracy``: its parsed arguments and its module."""
    print(f"kdacupy backward accuracy: backend={args.backend} T={args.T} H={args.H} K={args.K} V={args.V} "
          f"state_precision={args.state_precision}{' adversarial' if args.adversarial else ''}; "
          "errors against the float64 reference gradient", flush=True)
    if args.adversarial:
        rows = adversarial_sweep(inputs, args.backend, args.T, args.H, args.K, args.V, args.state_precision, seed=args.seed,
                                 progress=print_progress)
    else:
        pairs = list(zip(inputs.G_REGIMES, inputs.BIAS_REGIMES)) if args.quick else None
        rows = sweep(inputs, args.backend, args.T, args.H, args.K, args.V, args.state_precision, pairs, args.seed,
                     progress=print_progress)
    print(format_table(rows))
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(dict(backward=True, backend=args.backend, T=args.T, H=args.H, K=args.K, V=args.V,
                           state_precision=args.state_precision, adversarial=args.adversarial, rows=rows), f,
                      indent=1)
    return 0 if all(r["finite"] for r in rows) else 1

"""``python -m kdacupy.accuracy``: error against the float64 reference, FlashKDA style.

For one backend, over a sweep of gate / bias regimes (docs/design.md section 2: FlashKDA's regime values,
every g regime crossed with every dt_bias regime; FlashKDA's own sweep takes each alone), prints max abs
error and RMSE ratio ``||x - ref|| / ||ref||`` of the output and the final
state, next to the bf16 rounding floor of the output (the error of rounding
the exact output to bf16). Inputs as in FlashKDA's tests: l2-normalised bf16
q/k, bf16 v, bf16 gate logits g and beta logits, sigmoid gate with
lower_bound = -5, A_log ~ U(0, 1), no initial state, fp32 final state.

``--backward`` measures the gradients of ``kda_backward`` instead (each gradient's RMSE ratio).

``--adversarial`` sweeps the inputs that random keys never produce but real
text does (repeated and near-collinear keys, no or saturated decay, beta at 0,
1 and 2, zero keys, extreme softplus gates, long sequences): see ADVERSARIAL.

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
from . import figures
from .args import at_least, head_dim, writable_file

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


def run_backend(backend, inputs, state_precision, options=OPTIONS, sequence_parallel=None):
    from .. import kda_forward
    opts = dict(options, sequence_parallel=sequence_parallel)
    if backend == "cuda":
        import cupy as cp
        dev = {n: cp.asarray(x) if isinstance(x, np.ndarray) else x for n, x in inputs.items()}
        o, s = kda_forward(**dev, backend="cuda", state_precision=state_precision, **opts)
        return cp.asnumpy(o), cp.asnumpy(s)
    return kda_forward(**inputs, backend=backend, state_precision=state_precision, **opts)


def sweep(backend="model", T=2048, H=4, K=128, V=128, state_precision="bf16", pairs=None, seed=0,
          sequence_parallel=None, progress=None):
    """One row per (g, dt_bias) regime pair; ``progress(i, n, row)`` after each."""
    from ..numerics.reference import kda_reference
    rows = []
    pairs = list(pairs or itertools.product(G_REGIMES, BIAS_REGIMES))
    for gr, br in pairs:
        inputs = make_inputs(T, H, K, V, gr, br, seed)
        ref_opts = {n: x for n, x in OPTIONS.items() if n != "state_dtype"}
        t0 = time.perf_counter()
        ref_o, ref_s = kda_reference(**inputs, **ref_opts)
        t1 = time.perf_counter()
        o, s = run_backend(backend, inputs, state_precision, sequence_parallel=sequence_parallel)
        rows.append(_row(dict(g=gr, dt_bias=br), o, s, ref_o, ref_s, time.perf_counter() - t1, t1 - t0))
        if progress:
            progress(len(rows), len(pairs), rows[-1])
    return rows


def print_progress(i, n, row):
    what = f"case={row['case']}" if "case" in row else f"g={row['g']} dt_bias={row['dt_bias']}"
    print(f"[{i}/{n}] {what}: o ratio {row['o_rmse']:.2e} ({row['seconds']:.1f} s; the float64 reference "
          f"{row['reference_seconds']:.1f} s)", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# adversarial inputs: what real text produces and random keys never do

#: name -> (keys, key noise, gate, beta logit (None: raw beta 0.999), allow_neg_eigval, T (None: the sweep's))
#: keys: "token" repeats one (q, k, v) token; "collinear" one key per head plus a
#: perturbation of relative size ``noise`` per token (0: repeated keys; 1e-3 is below
#: bf16's resolution), q alike, v random; "zeros" is "collinear" with a quarter of the
#: keys and one whole chunk zero. Gates: "g0" no decay (log gate, g = 0); "slow"
#: sigmoid, dt_bias = -8 (decay ~1e-3 per token); "fast" sigmoid saturated at
#: lower_bound = -5 per token; "softplus" softplus with g ~ N(0, 20) (pair form and x > 15).
#: Beta logits +-12 put beta within 1e-5 of 0 or 1; near 2 is 2 sigmoid(4) ~ 1.96: closer
#: to 2 the recurrence along a repeated key stops contracting (|1 - beta| -> 1) and
#: the bf16 rounding of the keys alone moves the exact result by ~10% (docs/guide/numerics.md).
ADVERSARIAL = {
    "repeat-token g=0 beta=.999": ("token", 0.0, "g0", None, False, None),
    "repeat-key g=0": ("collinear", 0.0, "g0", 4.0, False, None),
    "collinear 1e-3 g=0": ("collinear", 1e-3, "g0", 4.0, False, None),
    "collinear 1e-2 g=0": ("collinear", 1e-2, "g0", 4.0, False, None),
    "repeat-key slow": ("collinear", 0.0, "slow", 4.0, False, None),
    "collinear 1e-3 slow": ("collinear", 1e-3, "slow", 4.0, False, None),
    "collinear 1e-2 slow": ("collinear", 1e-2, "slow", 4.0, False, None),
    "collinear 1e-3 fast": ("collinear", 1e-3, "fast", 4.0, False, None),
    "collinear 1e-3 beta~0": ("collinear", 1e-3, "g0", -12.0, False, None),
    "collinear 1e-3 beta~1": ("collinear", 1e-3, "g0", 12.0, False, None),
    "collinear 1e-3 beta~2": ("collinear", 1e-3, "g0", 4.0, True, None),
    "repeat-key slow beta~2": ("collinear", 0.0, "slow", 4.0, True, None),
    "zero-keys slow": ("zeros", 1e-2, "slow", 4.0, False, None),
    "collinear 1e-3 softplus": ("collinear", 1e-3, "softplus", 4.0, False, None),
    "repeat-key g=0 T=8192": ("collinear", 0.0, "g0", 4.0, False, 8192),
    "collinear 1e-3 slow T=8192": ("collinear", 1e-3, "slow", 4.0, False, 8192),
}


def adversarial_inputs(name, T, H, K, V, seed=0):
    """Inputs and options of one ADVERSARIAL case (its own T where it names one)."""
    keys, noise, gate, beta_logit, neg, T_case = ADVERSARIAL[name]
    T = T_case or T
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-30)  # noqa: E731
    near = lambda base: unit(base + noise * unit(rng.standard_normal((1, T, H, K))))  # noqa: E731
    if keys == "token":
        tok = rng.standard_normal((1, 1, H, K + V))
        q = k = np.broadcast_to(unit(tok[..., :K]), (1, T, H, K))
        v = np.broadcast_to(tok[..., K:], (1, T, H, V))
    else:
        base = unit(rng.standard_normal((1, 1, H, K)))
        q, k, v = near(base), near(base), rng.standard_normal((1, T, H, V))
        if keys == "zeros":
            k = np.where(rng.uniform(size=(1, T, H, 1)) < 0.25, 0.0, k)
            k[:, 32:48] = 0.0
    opts = dict(qk_l2norm=True, output_final_state=True, state_dtype=np.float32)
    x = dict(q=q.astype(BF16), k=k.astype(BF16), v=np.ascontiguousarray(v).astype(BF16))
    if gate == "g0":
        x["g"] = np.zeros((1, T, H, K), BF16)
        opts["gate"] = "log"
    elif gate == "softplus":
        x["g"] = rng.normal(0.0, 20.0, (1, T, H, K)).astype(BF16)
        opts.update(gate="softplus", A_log=rng.uniform(0.0, 1.0, H).astype(np.float32))
    else:
        x["g"] = (rng.standard_normal((1, T, H, K)) + (8.0 if gate == "fast" else 0.0)).astype(BF16)
        opts.update(gate="sigmoid", lower_bound=LOWER_BOUND, A_log=rng.uniform(0.0, 1.0, H).astype(np.float32),
                    dt_bias=np.full((H, K), 8.0 if gate == "fast" else -8.0, np.float32))
    if beta_logit is None:
        x["beta"] = np.full((1, T, H), 0.999, np.float32)
    else:
        x["beta"] = (beta_logit + 0.1 * rng.standard_normal((1, T, H))).astype(BF16)
        opts.update(beta_sigmoid=True, allow_neg_eigval=neg)
    x = {n: np.ascontiguousarray(a) for n, a in x.items()}
    return x, opts


def adversarial_sweep(backend="model", T=2048, H=4, K=128, V=128, state_precision="bf16", names=None, seed=0,
                      sequence_parallel=None, progress=None):
    from ..numerics.reference import kda_reference
    rows = []
    for name in names or ADVERSARIAL:
        x, opts = adversarial_inputs(name, T, H, K, V, seed)
        t0 = time.perf_counter()
        ref_o, ref_s = kda_reference(**x, **{n: v for n, v in opts.items() if n != "state_dtype"})
        t1 = time.perf_counter()
        o, s = run_backend(backend, x, state_precision, opts, sequence_parallel)
        rows.append(_row(dict(case=name, T=x["q"].shape[1]), o, s, ref_o, ref_s, time.perf_counter() - t1,
                         t1 - t0))
        if progress:
            progress(len(rows), len(names or ADVERSARIAL), rows[-1])
    return rows


def _row(key, o, s, ref_o, ref_s, seconds, reference_seconds):
    o_max, o_rmse = errors(o, ref_o)
    s_max, s_rmse = errors(s, ref_s)
    _, floor = errors(ref_o.astype(np.float32).astype(BF16), ref_o)
    finite = bool(np.isfinite(np.asarray(o, np.float64)).all() and np.isfinite(np.asarray(s, np.float64)).all())
    return key | dict(o_max=o_max, o_rmse=o_rmse, state_max=s_max, state_rmse=s_rmse, o_bf16_floor=floor,
                      finite=finite, seconds=seconds, reference_seconds=reference_seconds)


def format_table(rows):
    what = (lambda r: f"{r['case']:>28} {r['T']:>5}") if "case" in rows[0] else (
        lambda r: f"{r['g']:>8} {r['dt_bias']:>8}")
    cols = f"{'case':>28} {'T':>5}" if "case" in rows[0] else f"{'g':>8} {'dt_bias':>8}"
    head = (f"{cols} | {'o abs max':>9} {'o ratio':>9} {'bf16 ratio':>10} | {'S abs max':>9} "
            f"{'S ratio':>9}")
    legend = ("abs max: max |x - ref| (absolute); ratio: ||x - ref|| / ||ref|| (relative RMSE); "
              "bf16 ratio: the ratio of the exact output rounded to bf16 (the floor)")
    lines = [legend, head, "-" * len(head)]
    for r in rows:
        lines.append(f"{what(r)} | {r['o_max']:9.2e} {r['o_rmse']:9.2e} {r['o_bf16_floor']:10.2e}"
                     f" | {r['state_max']:9.2e} {r['state_rmse']:9.2e}" + ("" if r["finite"] else "  NON-FINITE"))
    worst = max(rows, key=lambda r: r["o_rmse"] if np.isfinite(r["o_rmse"]) else np.inf)
    where = f"case={worst['case']}" if "case" in worst else f"g={worst['g']}, dt_bias={worst['dt_bias']}"
    lines.append(f"worst o ratio {worst['o_rmse']:.2e} ({where}); "
                 f"median {np.median([r['o_rmse'] for r in rows]):.2e}; "
                 f"median bf16 ratio {np.median([r['o_bf16_floor'] for r in rows]):.2e}")
    return "\n".join(lines)


def segments(text: str) -> int:
    from ..seqpar import MAX_SEGMENTS
    n = at_least(1)(text)
    if n > MAX_SEGMENTS:
        raise argparse.ArgumentTypeError(f"expected an integer in [1, {MAX_SEGMENTS}], got {n}")
    return n


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kdacupy.accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="model", choices=("model", "emulate", "cuda", "reference"),
                   help="what to measure (default: model, the NumPy precision model of the kernels)")
    p.add_argument("--T", type=at_least(1), default=2048, help="sequence length (default 2048)")
    p.add_argument("--H", type=at_least(1), default=4, help="heads (default 4)")
    p.add_argument("--K", type=head_dim, default=128, help="key head dim, 16 to 256 (default 128)")
    p.add_argument("--V", type=head_dim, default=128, help="value head dim, 16 to 256 (default 128)")
    p.add_argument("--state-precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--quick", action="store_true", help="pair each g regime with one dt_bias regime only")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--adversarial", action="store_true",
                   help="sweep the adversarial cases (ADVERSARIAL) instead of the gate/bias regimes")
    p.add_argument("--sequence-parallel", type=segments, default=None, metavar="N",
                   help="segments per sequence (kda_forward's sequence_parallel; default: the library's choice)")
    p.add_argument("--json", metavar="PATH", type=writable_file, help="also write the rows as JSON")
    p.add_argument("--backward", action="store_true",
                   help="the gradients of kda_backward instead of the forward (kdacupy/cli/accuracy_backward.py)")
    p.add_argument("--figure", metavar="PATH", help="draw each case's output error against its bf16 floor to PATH "
                   "(.svg, .png; needs the [docs] extra)")
    p.add_argument("--show", metavar="JSON", help="print (and with --figure draw) a saved --json file instead of "
                   "sweeping")
    args = p.parse_args(argv)
    if args.show:
        try:
            doc = json.loads(open(args.show).read())
        except (OSError, ValueError) as e:
            p.error(f"--show: cannot read {args.show}: {e}")
        print(format_table(doc["rows"]))
        if args.figure:
            figures.accuracy(doc, args.figure)
        return 0
    if args.backend == "cuda":
        from ..jit.device import why_no_gpu
        if why := why_no_gpu():
            p.error(f"--backend cuda: {why}; the other backends run on the CPU")
    if args.backward:
        from .accuracy_backward import main as backward_main
        return backward_main(args, sys.modules[__name__])
    pairs = list(zip(G_REGIMES, BIAS_REGIMES)) if args.quick else None
    print(f"kdacupy accuracy: backend={args.backend} T={args.T} H={args.H} K={args.K} V={args.V} "
          f"state_precision={args.state_precision}{' adversarial' if args.adversarial else ''} "
          f"sequence_parallel={args.sequence_parallel}; "
          "errors against the float64 reference", flush=True)
    if args.adversarial:
        rows = adversarial_sweep(args.backend, args.T, args.H, args.K, args.V, args.state_precision, seed=args.seed,
                                 sequence_parallel=args.sequence_parallel, progress=print_progress)
    else:
        rows = sweep(args.backend, args.T, args.H, args.K, args.V, args.state_precision, pairs, args.seed,
                     args.sequence_parallel, progress=print_progress)
    print(format_table(rows))
    doc = dict(backend=args.backend, T=args.T, H=args.H, K=args.K, V=args.V, state_precision=args.state_precision,
               adversarial=args.adversarial, sequence_parallel=args.sequence_parallel, rows=rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.figure:
        figures.accuracy(doc, args.figure)
    return 0 if all(r["finite"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

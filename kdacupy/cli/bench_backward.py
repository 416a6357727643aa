"""``python -m kdacupy.bench --shapes backward [SPEC ...]``: forward + backward against FLA's
``chunk_kda`` forward + backward (torch autograd), timed with CUDA events. Needs a GPU.

Shapes: the Kimi set (T = 8192, H = 96 and 64, fixed and varlen, K = V = 128, bf16; see
``python -m kdacupy.bench --help``) unless explicit specs follow ``backward``. Inputs and options
are the forward benchmark's (kdacupy/cli/shapes.py: sigmoid gate with lower_bound -5, A_log,
dt_bias, qk_l2norm, beta logits, a bf16 initial state, "vk" layout), plus ``do`` ~ N(0, 1) in
bf16 and ``dfinal_state`` ~ N(0, 1) like the final state.

Per shape: kdacupy's forward, backward and forward + backward (median and min over ``--iters``
after ``--warmup``), the same with kept states (``forward_saving``, ``backward_saved``,
``train_saved``: kda_forward(save_for_backward=True) and kda_backward(saved=...), "kept f+b"),
whether two backward runs agree to the bit (they must: no atomics) and the kept states' gradients
with the stateless ones (they must too), and
with torch and fla importable: FLA's forward + backward on the same arrays (zero-copy through
DLPack, FLA_FLASH_KDA=0; ``torch.autograd.grad`` of (o, final state) with (do, dfinal_state),
FLA's initial state in fp32 as it asserts), the ratio FLA / kdacupy, each gradient's RMS ratio
against FLA's (two independent implementations), and the largest difference between two of
FLA's backward runs (FLA accumulates with atomics). The geometric mean of FLA / kdacupy over
the Kimi shapes closes the table (goal: 1.5). ``--dry-run``: no GPU; per shape the backward's
scratch memory and grids.
"""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

import numpy as np

from . import peers, timing
from .report import fla_cells, geomean, kimi_ratios, table_lines, write_json
from .shapes import Shape, _cast, make_inputs, resolve_shapes, shape_problem

FIELDS = ("dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log", "ddt_bias")
FLA_ARGS = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")  # FLA's names, in FIELDS order


def backward_shapes(items) -> list[Shape]:
    specs = [s for s in items if s != "backward"]
    return resolve_shapes(specs or ["kimi"])


def loss_inputs(shape: Shape, xp, seed=0):
    """(arrays, forward options, backward options) for one shape."""
    arrays, options = make_inputs(shape, xp, seed)
    rs = xp.random.RandomState(seed + 1000) if xp is not np else np.random.default_rng(seed + 1000)
    normal = lambda s: rs.standard_normal(s, dtype=np.float32)  # noqa: E731  (both generators take dtype)
    B, T, HV, V = arrays["v"].shape
    do = _cast(normal((B, T, HV, V)), arrays["v"].dtype)
    ds = _cast(normal(tuple(options["initial_state"].shape)), options["state_dtype"])
    bwd = {n: v for n, v in options.items() if n not in ("output_final_state", "state_dtype")}
    return dict(arrays, do=do), options, dict(bwd, dfinal_state=ds)


def kdacupy_calls(arrays, fwd_opts, bwd_opts):
    from .. import kda_backward, kda_forward
    ins = {n: a for n, a in arrays.items() if n != "do"}
    fwd = lambda: kda_forward(**ins, **fwd_opts, backend="cuda")  # noqa: E731
    bwd = lambda: kda_backward(**arrays, **bwd_opts, backend="cuda")  # noqa: E731
    return fwd, bwd, lambda: (fwd(), bwd())


def kdacupy_saving_calls(arrays, fwd_opts, bwd_opts):
    """The training step with kept states: kda_forward(save_for_backward=True), kda_backward(saved=...), both."""
    from .. import kda_backward, kda_forward
    ins = {n: a for n, a in arrays.items() if n != "do"}
    kept = {}

    def fwd():
        kept["saved"] = kda_forward(**ins, **fwd_opts, backend="cuda", save_for_backward=True)[2]

    def bwd():
        return kda_backward(**arrays, **bwd_opts, backend="cuda", saved=kept["saved"])
    return fwd, bwd, lambda: (fwd(), bwd())


def same_gradients(a, b) -> bool:
    import cupy

    return all(x is None and y is None or bool(cupy.array_equal(x, y)) for x, y in zip(a, b))


def bitwise_repeatable(bwd) -> bool:
    import cupy

    a, b = bwd(), bwd()
    return all(x is None and y is None or bool(cupy.array_equal(x, y)) for x, y in zip(a, b))


class FLABackward:
    """FLA's chunk_kda forward and its autograd backward on kdacupy's inputs (peers.FLA's call)."""

    def __init__(self):
        self.fla = peers.FLA()
        self.torch = self.fla.torch

    def setup(self, arrays, fwd_opts, bwd_opts):
        torch = self.torch
        kw = self.fla.kwargs({n: a for n, a in arrays.items() if n != "do"}, fwd_opts, torch.float32)
        leaves = {}
        for n in FLA_ARGS:
            leaf = kw[n].detach().reshape(kw[n].shape).requires_grad_(True)
            leaves[n] = leaf
            kw[n] = leaf
        dht = peers.to_torch(bwd_opts["dfinal_state"]).float()
        if self.fla.layout_kw is None:
            dht = dht.transpose(-1, -2)
        self.kw, self.leaves = kw, leaves
        self.cot = [peers.to_torch(arrays["do"]), dht.contiguous()]

    def step(self):
        o, ht = self.fla.fn(**self.kw)[:2]
        return self.torch.autograd.grad([o, ht], [self.leaves[n] for n in FLA_ARGS], self.cot, allow_unused=True)

    def state_vk(self, x):
        return self.fla.final_state_vk(x)


def compare(ours, theirs, fla: FLABackward) -> dict:
    """Each gradient's RMS ratio ||ours - FLA's|| / ||FLA's||."""
    out = {}
    for f, a, b in zip(FIELDS, ours, theirs):
        if a is None or b is None:
            out[f] = None
            continue
        if f == "dinitial_state":
            b = fla.state_vk(b)
        out[f] = peers.rms_ratio_torch(peers.to_torch(a).reshape(b.shape), b)
    return out


def fla_run_to_run(fla: FLABackward) -> dict:
    a, b = fla.step(), fla.step()
    return {f: (None if x is None else float((x.float() - y.float()).abs().max())) for f, x, y in zip(FIELDS, a, b)}


def bench_shape(shape: Shape, args, fla: FLABackward | None, on_kdacupy=None) -> dict:
    """One shape: kdacupy's times, then FLA's; ``on_kdacupy(row)`` between the two (FLA's first
    call on a fresh machine compiles and autotunes its Triton kernels, which can outlast a run's
    time limit: what kdacupy measured is kept before it starts)."""
    import cupy

    arrays, fwd_opts, bwd_opts = loss_inputs(shape, cupy)
    fwd, bwd, both = kdacupy_calls(arrays, fwd_opts, bwd_opts)
    grads = bwd()  # compiles the variants
    finite = all(g is None or timing.finite(g) for g in grads)
    row = dict(shape=shape.to_dict(), finite=finite, repeatable=bitwise_repeatable(bwd))
    sfwd, sbwd, sboth = kdacupy_saving_calls(arrays, fwd_opts, bwd_opts)
    sfwd()
    row["saved_same"] = same_gradients(sbwd(), grads)  # the kept states give the stateless gradients, to the bit
    row["kdacupy"] = {name: dict(zip(("median_ms", "min_ms"), timing.time_calls([call], args.warmup, args.iters)))
                      for name, call in (("forward", fwd), ("backward", bwd), ("forward_backward", both),
                                         ("forward_saving", sfwd), ("backward_saved", sbwd), ("train_saved", sboth))}
    row["fla"], row["ratio_fla_over_kdacupy"] = None, None
    if on_kdacupy is not None:
        on_kdacupy(row)
    if fla is not None:
        try:
            fla.setup(arrays, fwd_opts, bwd_opts)
            res = dict(rms_ratio_vs_fla=compare(grads, fla.step(), fla), run_to_run_max_abs=fla_run_to_run(fla))
            res["median_ms"], res["min_ms"] = timing.time_calls([fla.step], args.warmup, args.iters, "torch")
            row["fla"] = res
            row["ratio_fla_over_kdacupy"] = res["median_ms"] / row["kdacupy"]["forward_backward"]["median_ms"]
        except Exception as e:  # noqa: BLE001  (record and go on)
            row["fla"] = dict(error=f"{type(e).__name__}: {e}"[:2000])
        fla.kw = fla.leaves = fla.cot = None
    del grads, arrays
    timing.free_memory()
    return row


def format_table(rows, gm=None) -> str:
    head = (f"{'shape':<24} {'fwd ms':>8} {'bwd ms':>8} {'fwd+bwd':>8} {'kept f+b':>8} {'bitwise':>7} {'FLA ms':>8} "
            f"{'FLA/kda':>7} {'worst rms vs FLA':>22} {'FLA run-to-run':>14}")

    def line(r):
        k, f = r["kdacupy"], r["fla"] or {}
        worst = max(((v, n) for n, v in (f.get("rms_ratio_vs_fla") or {}).items() if v is not None), default=None)
        wtxt = f"{worst[0]:.1e} ({worst[1]})" if worst else "-"
        rtr = max((v for v in (f.get("run_to_run_max_abs") or {}).values() if v is not None), default=None)
        fms, ratio = fla_cells(r)
        kept = f"{k['train_saved']['median_ms']:8.3f}" if "train_saved" in k else f"{'-':>8}"
        bitwise = "yes" if r["repeatable"] and r.get("saved_same", True) else "NO"
        return (f"{r['shape']['name']:<24} {k['forward']['median_ms']:8.3f} {k['backward']['median_ms']:8.3f} "
                f"{k['forward_backward']['median_ms']:8.3f} {kept} {bitwise:>7} {fms} "
                f"{ratio} {wtxt:>22} {('-' if rtr is None else f'{rtr:.1e}'):>14}")

    lines = table_lines(head, rows, line)
    if gm is not None or rows:
        lines.append(f"geometric mean FLA / kdacupy (forward + backward) over the Kimi shapes: "
                     + (f"{gm:.2f} (goal 1.5)" if gm else "- (FLA did not run)"))
    return "\n".join(lines)


def dry_run(shapes) -> int:
    from ..ops.backward.kernels import chunk_variant, scratch_layout
    from ..ops.backward.saved import layout
    from ..ops.forward.kernels import slots
    print(f"{'shape':<24} {'slots':>6} {'scratch GB':>10} {'kept GB':>8} {'chunk grid':>12} {'threads':>7} {'smem KB':>8}")
    for shape in shapes:
        p = shape_problem(shape)
        nslots, _ = slots(p)
        var = chunk_variant(p)
        print(f"{shape.name:<24} {nslots:>6} {scratch_layout(p, nslots)['total'] / 1e9:10.2f} "
              f"{layout(p)['total'] / 1e9:8.2f} {f'{nslots}x{p.H}':>12} {var.threads:>7} {var.smem / 1024:8.1f}")
    print(f"{len(shapes)} shapes; nothing was run (no GPU needed)")
    return 0


def run(args) -> int:
    """The backward run of ``python -m kdacupy.bench`` (its parsed arguments)."""
    shapes = backward_shapes(args.shapes)
    if args.dry_run:
        return dry_run(shapes)
    if not timing.gpu_available():
        print(timing.no_gpu_message("python -m kdacupy.bench --shapes backward"), file=sys.stderr)
        return 2
    now = datetime.datetime.now(datetime.timezone.utc)
    info = timing.device_info()
    fla, fla_status = None, "disabled (--no-fla)"
    if not args.no_fla:
        fla_status = peers.fla_importable()
        if fla_status is None:
            try:
                fla = FLABackward()
                fla_status = f"fla {fla.fla.version}, layout keyword {fla.fla.layout_kw}"
            except Exception as e:  # noqa: BLE001
                fla_status = f"import failed: {type(e).__name__}: {e}"
    print(f"kdacupy backward bench on {info['name']} ({info['sm_count']} SMs); FLA: {fla_status}", flush=True)
    path = Path(args.json) if args.json else Path("benchmarks") / f"{info['model']}_backward_{now:%Y-%m-%dT%H%M%S}.json"
    head = dict(kind="kdacupy.bench.backward", date=now.isoformat(timespec="seconds"), commit=timing.git_commit(),
                dirty=timing.git_dirty(), device=info, iters=args.iters, warmup=args.warmup, fla_status=fla_status)
    rows = []

    def write(done):  # after kdacupy's part of each shape and after FLA's: a run stopped from outside keeps both
        write_json(path, dict(head, complete=len(rows) == len(shapes), shapes=done,
                              geomean_fla_over_kdacupy_kimi=geomean(kimi_ratios(done))))

    def kdacupy_done(row):
        write(rows + [dict(row, fla="pending" if fla is not None else None)])
        print(format_table([row]).splitlines()[2] + ("  (FLA next)" if fla is not None else ""), flush=True)

    for shape in shapes:
        print(f"  {shape.name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(bench_shape(shape, args, fla, kdacupy_done))
        except Exception as e:  # noqa: BLE001  (record it, keep the other shapes' results)
            rows.append(dict(shape=shape.to_dict(), error=f"{type(e).__name__}: {e}"[:2000]))
            timing.free_memory()
        write(rows)
        if fla is not None or rows[-1].get("error"):
            print(format_table(rows[-1:]).splitlines()[2], flush=True)
    print(format_table(rows, geomean(kimi_ratios(rows))))
    print(f"wrote {path}")
    bad = [r["shape"]["name"] for r in rows
           if r.get("error") or not r["finite"] or not r["repeatable"] or not r.get("saved_same", True)]
    if bad:
        print(f"kdacupy failed, gave non-finite gradients, differed between runs or with kept states for "
              f"{', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0

"""``python -m kdacupy.bench``: kdacupy against FLA's ``chunk_kda`` on the same
inputs, timed with CUDA events (docs/design.md section 6). Needs a GPU.

Shapes (K = V = 128, bf16, one value head per query head):
  kimi     T = 8192 with H = 96 and 64, each as one fixed-length sequence
           (B = 1), varlen [1300, 547, 2048, 963, 271, 3063] and varlen 8 x 1024
  kimi96   the H = 96 half of kimi
  fewhead  H = 12 and 16 with T = 16384, 32768, 65536, 131072 (B = 1), and
           varlen 2 and 4 ragged sequences (32768 and 65536 tokens)
  all      both; one shape of a set by its name (``kimi-T8192-H96``) and
           explicit specs like ``T=8192,H=96`` or ``varlen=1300:547,H=64``
           work too (see ``python -m kdacupy.tune --help``).
Options, as in Kimi Linear / FlashKDA's tests: gate="sigmoid" with
lower_bound=-5, A_log [H] ~ U(0,1), dt_bias [H, K] ~ N(0,1) (fp32),
qk_l2norm=True, beta logits (beta_sigmoid=True), random l2-normalised q/k,
a random bf16 initial state and a bf16 final state in the "vk" layout.

Per shape: kdacupy's median and min time over ``--iters`` calls after
``--warmup`` (one CUDA event pair per call; two input sets alternate when the
inputs are small enough to stay in L2), the tile configuration and where it
came from (tuning file or heuristic), the compulsory HBM traffic (every input
read once, every output written once, states included) and the achieved GB/s,
also as a fraction of the device-to-device copy bandwidth measured once at the
start (bytes read + written). With torch and fla importable: FLA's time on the
same arrays (zero-copy through DLPack, FLA_FLASH_KDA=0 so FLA's own Triton path
runs, under torch.inference_mode), the ratio FLA / kdacupy, and before any
timing the RMS ratio ||o - o_fla|| / ||o_fla|| of outputs and final states.
FLA asserts fp32 initial states, so it gets fp32 copies of the same states
(recorded in the JSON). The geometric mean of FLA / kdacupy over the Kimi
shapes closes the table. JSON goes to ``benchmarks/<model>_<date>.json`` unless
``--json`` says otherwise.

Sequence parallelism (kdacupy/cli/bench_seqpar.py): the fewhead shapes (every shape
with ``--split``) also get the serial time, the split time per segment count
(``--split``, default 4 8 16 32), the speedup and the library's own choice, in
the JSON (``seqpar``) and a second table. The kdacupy column is the default
call (``sequence_parallel=None``: the library's choice).
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
from pathlib import Path

from . import bench_seqpar, peers, timing
from .report import fla_cells, geomean, kimi_ratios, table_lines, write_json
from .shapes import LOWER_BOUND, Shape, compulsory_bytes, make_inputs, resolve_shapes, shape_arg, validated


def kdacupy_calls(sets):
    """Closures running ``kda_forward`` on each input set."""
    from ..api import kda_forward

    return [lambda a=a, o=o: kda_forward(**a, **o, backend="cuda") for a, o in sets]


def tuning_config(tiles) -> dict:
    """BV, stages and, when it is not mma.sync, the MMA family (as the tuning files write them)."""
    from ..ops.forward.tuning import config_dict

    return config_dict(tiles)


def tiles_text(t: dict) -> str:
    return f"{t['BV']}/{t['stages']}" + ("/wgmma" if t.get("mma", "sync") == "wgmma" else "")


def make_row(shape: Shape, k_times, tiles, source, fla_res, copy_gbps, ok_finite=True, rotated=False) -> dict:
    traffic = compulsory_bytes(shape)
    med, mn = k_times
    gbps = traffic["total"] / (med * 1e-3) / 1e9
    kda = dict(median_ms=med, min_ms=mn, tiles=tuning_config(tiles), tiles_source=source,
               finite=ok_finite)
    row = dict(shape=shape.to_dict(), kdacupy=kda,
               bytes=traffic, achieved_gbps=gbps, fraction_of_copy_bw=gbps / copy_gbps if copy_gbps else None,
               rotated_inputs=rotated, fla=fla_res, ratio_fla_over_kdacupy=None)
    if fla_res and fla_res.get("median_ms"):
        row["ratio_fla_over_kdacupy"] = fla_res["median_ms"] / med
    return row


def device_inputs(shape: Shape, seed: int):
    import cupy

    return make_inputs(shape, cupy, seed)


def selection(arrays, options):
    """(TileConfig, source) kda_forward will use for these inputs."""
    from ..ops.forward.tuning import describe_selection

    return describe_selection(validated(arrays, options, "cuda")[0], wgmma=True)  # the forward's choice


def bench_shape(shape: Shape, args, fla, copy_gbps, l2_bytes) -> dict:
    rotated = compulsory_bytes(shape)["total"] < 3 * l2_bytes
    sets = [device_inputs(shape, seed) for seed in ((0, 1) if rotated else (0,))]
    tiles, source = selection(*sets[0])
    calls = kdacupy_calls(sets)
    o, s = calls[0]()  # compiles the variants
    ok = timing.finite(o) and timing.finite(s)
    # kdacupy first: FLA's first call on a fresh machine compiles and autotunes its Triton
    # kernels, which can take longer than a run's time limit leaves
    k_times = timing.time_calls(calls, args.warmup, args.iters)
    fla_res = None
    if fla is not None:
        try:
            fla_res = peers.run_fla(fla, sets, o, s, args.warmup, args.iters)
        except Exception as e:  # noqa: BLE001  (record and go on)
            fla_res = dict(error=f"{type(e).__name__}: {e}"[:2000])
    del o, s
    row = make_row(shape, k_times, tiles, source, fla_res, copy_gbps, ok, rotated)
    splits = args.split if args.split is not None else (
        bench_seqpar.DEFAULT_SPLITS if shape.name.startswith("fewhead-") else ())
    if splits and not args.no_split:
        try:
            row["seqpar"] = bench_seqpar.measure(sets, splits, args.warmup, args.iters)
        except Exception as e:  # noqa: BLE001  (record it, keep the serial row)
            row["seqpar"] = dict(error=f"{type(e).__name__}: {e}"[:2000])
    del sets, calls
    timing.free_memory()
    return row


def summarize(rows) -> dict:
    kimi = kimi_ratios(rows)
    return dict(geomean_fla_over_kdacupy_kimi=geomean(kimi),
                kimi_shapes_with_fla=sum(1 for x in kimi if x))


def format_table(rows, summary) -> str:
    head = (f"{'shape':<24} {'kdacupy ms':>10} {'min':>7} {'tiles':>10} {'src':>5} {'GB/s':>7} {'%copy':>6} "
            f"{'FLA ms':>8} {'FLA/kda':>7} {'rms o':>8}")

    def line(r):
        k, f = r["kdacupy"], r["fla"] or {}
        src = "heur" if k["tiles_source"].startswith("heuristic") else "file"
        frac = f"{100 * r['fraction_of_copy_bw']:5.1f}%" if r["fraction_of_copy_bw"] else "    -"
        fms, ratio = fla_cells(r)
        rms = f"{f['rms_ratio_o']:8.1e}" if f.get("rms_ratio_o") is not None else "       -"
        tiles = tiles_text(k["tiles"])
        return (f"{r['shape']['name']:<24} {k['median_ms']:10.3f} {k['min_ms']:7.3f} {tiles:>10} {src:>5} "
                f"{r['achieved_gbps']:7.0f} {frac:>6} {fms} {ratio} {rms}")

    lines = table_lines(head, rows, line)
    if summary is None:  # one row as it is measured
        return "\n".join(lines)
    gm = summary["geomean_fla_over_kdacupy_kimi"]
    lines.append(f"geometric mean FLA / kdacupy over the Kimi shapes: {gm:.2f}" if gm else
                 "geometric mean FLA / kdacupy over the Kimi shapes: - (FLA did not run)")
    return "\n".join(lines)


def default_json_path(model: str, now: datetime.datetime) -> Path:
    return Path("benchmarks") / f"{model}_{now.strftime('%Y-%m-%dT%H%M%S')}.json"


def dry_run(shapes, gpu: str, sm_count: int, fla_on: bool) -> int:
    """No GPU: per shape the tiles kda_forward would use on ``gpu`` and where they come from
    (the tuning files it reads, ``kdacupy.ops.forward.tuning.lookup_paths``, or the heuristic),
    the compulsory traffic and the sequence-parallel choice; and whether FLA could run."""
    from ..ops.forward import tuning
    from ..seqpar import auto_segments
    from .shapes import shape_problem

    print(f"dry run for {gpu} ({sm_count} SMs): tuning files read, in order: "
          + ", ".join(str(p) + ("" if p.exists() else " (missing)") for p in tuning.lookup_paths(gpu)))
    fla_status = "disabled (--no-fla)" if not fla_on else (peers.fla_importable() or "importable")
    print(f"FLA: {fla_status}")
    # Hopper by name: the runtime builds sm_90a there, where the forward may take the wgmma recurrence
    arch = "sm_90a" if re.search(r"\b(G?H100|H200|H800|H20)\b", gpu) else None
    print(f"{'shape':<24} {'tiles':>10} {'source':<40} {'MB':>8} {'split':>6}")
    for shape in shapes:
        p = shape_problem(shape)
        tiles, source = tuning.describe_for(p, gpu, sm_count, arch, wgmma=True)
        n, _ = auto_segments(p, sm_count, arch)
        print(f"{shape.name:<24} {tiles_text(tuning_config(tiles)):>10} {source:<40} "
              f"{compulsory_bytes(shape)['total'] / 1e6:8.1f} {n:>6}")
    print(f"{len(shapes)} shapes; nothing was run (no GPU needed)")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kdacupy.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", type=lambda t: t if t in ("decode", "backward") else shape_arg(t),
                    default=["all"], metavar="SET|SPEC", help="kimi, kimi96, fewhead, all (default) or explicit "
                    "shape specs; decode: the decode kernel on a state pool (kdacupy/cli/bench_decode.py); "
                    "backward [SPEC ...]: forward + backward against FLA's (kdacupy/cli/bench_backward.py; "
                    "default the Kimi shapes)")
    ap.add_argument("--json", metavar="PATH", help="where to write the results "
                    "(default benchmarks/<model>_<date>.json)")
    ap.add_argument("--iters", type=int, default=100, help="timed calls per measurement (default 100)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls first (default 10)")
    ap.add_argument("--no-fla", action="store_true", help="do not run FLA's chunk_kda")
    ap.add_argument("--split", nargs="+", type=int, metavar="N", default=None,
                    help="segment counts to time against serial, on every shape "
                    f"(default: {' '.join(map(str, bench_seqpar.DEFAULT_SPLITS))} on the fewhead shapes only)")
    ap.add_argument("--no-split", action="store_true", help="no serial-vs-split columns")
    ap.add_argument("--decode-n", nargs="+", type=int, metavar="N",
                    help="with --shapes decode: only these sequence counts (default 1 8 64 256 512)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU needed: per shape the tiles (and the tuning file they come from) kda_forward "
                         "would use on --gpu, the traffic, the split choice; with --shapes decode the host "
                         "overhead and what the installed FLA offers")
    ap.add_argument("--gpu", default="NVIDIA H200", help="GPU model of --dry-run (default 'NVIDIA H200')")
    ap.add_argument("--sm-count", type=int, default=132, help="SM count of --dry-run (default 132)")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")
    if args.split is not None and min(args.split) < 1:
        ap.error("--split counts must be >= 1")
    if args.shapes[0] == "backward":
        from .bench_backward import run as run_backward
        return run_backward(args)
    if "decode" in args.shapes:
        if args.shapes != ["decode"]:
            ap.error("--shapes decode runs alone")
        from .bench_decode import run
        return run(args)
    if args.dry_run:
        return dry_run(resolve_shapes(args.shapes), args.gpu, args.sm_count, not args.no_fla)
    if not timing.gpu_available():
        print(timing.no_gpu_message(ap.prog), file=sys.stderr)
        return 2
    shapes = resolve_shapes(args.shapes)
    now = datetime.datetime.now(datetime.timezone.utc)
    info = timing.device_info()
    copy_gbps = timing.copy_bandwidth()
    print(f"kdacupy bench on {info['name']} ({info['sm_count']} SMs), CuPy {info['cupy']}, "
          f"CUDA runtime {info['cuda_runtime']}; copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    fla, fla_status = None, "disabled (--no-fla)"
    if not args.no_fla:
        fla_status = peers.fla_importable()
        if fla_status is None:
            try:
                fla = peers.FLA()
                fla_status = f"fla {fla.version}, layout keyword {fla.layout_kw}"
            except Exception as e:  # noqa: BLE001
                fla_status = f"import failed: {type(e).__name__}: {e}"
    print(f"FLA: {fla_status}", flush=True)
    path = Path(args.json) if args.json else default_json_path(info["model"], now)
    head = dict(kind="kdacupy.bench", date=now.isoformat(timespec="seconds"), commit=timing.git_commit(),
                dirty=timing.git_dirty(), device=info, copy_bandwidth_gbps=copy_gbps, iters=args.iters,
                warmup=args.warmup, fla_status=fla_status, env={"FLA_FLASH_KDA": os.environ.get("FLA_FLASH_KDA")},
                options=dict(gate="sigmoid", lower_bound=LOWER_BOUND, qk_l2norm=True, beta_sigmoid=True,
                             state_layout="vk", initial_state="bfloat16", state_dtype="bfloat16"))
    rows = []
    for shape in shapes:
        print(f"  {shape.name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(bench_shape(shape, args, fla, copy_gbps, info["l2_bytes"]))
        except Exception as e:  # noqa: BLE001  (record it, keep the other shapes' results)
            rows.append(dict(shape=shape.to_dict(), error=f"{type(e).__name__}: {e}"[:2000], kdacupy=None,
                             fla=None, ratio_fla_over_kdacupy=None))
            timing.free_memory()
        # after every shape: a run stopped by a time limit still leaves what it measured
        write_json(path, dict(head, complete=len(rows) == len(shapes), shapes=rows, **summarize(rows)))
        print(format_table(rows[-1:], None).splitlines()[-1], flush=True)
    summary = summarize(rows)
    print(format_table(rows, summary))
    seqpar_table = bench_seqpar.format_table(rows)
    if seqpar_table:
        print(seqpar_table)
    print(f"wrote {path}")
    bad = [r["shape"]["name"] for r in rows if r.get("error") or not r["kdacupy"]["finite"]]
    if bad:
        print(f"kdacupy failed or gave non-finite output for {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

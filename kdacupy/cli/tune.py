"""``python -m kdacupy.tune``: measure every tile configuration per shape bucket
on this GPU and write the tuning file kda_forward reads.

Each shape maps to a bucket (``kdacupy.ops.forward.tuning.bucket_of``: K, V, dtype, state
precision, varlen, parallelism and length classes); each bucket is tuned once,
on the first shape that maps to it. For each candidate (``TILE_SPACE``, BV <= V):
compile (threads), check parity on a small input of the bucket's kind against
the precision model (``kdacupy.numerics.parity.GPU``; a candidate that fails is reported
and never chosen), then time it on the full shape with CUDA events (warm-up,
``--iters`` calls, median; two input sets alternate when the inputs would stay
in L2). The fastest wins; the YAML records its time, the runner-up and the
margin between them (schema: tuning/README.md).

The default output is the user tuning directory (``$KDACUPY_TUNING_DIR``, else
``~/.cache/kdacupy/tuning``) file for this GPU model, which kda_forward reads
before the shipped files: the result takes effect at once. Buckets already in
that file and not tuned in this run are kept. Finished measurements go to a
sidecar file next to the output (``<output>.partial.json``) as they are made,
so an interrupted run resumes where it stopped (``--restart`` ignores it); the
sidecar is removed once the YAML is written.

``--dry-run`` needs no GPU: it lists the buckets and candidates and compiles
every candidate's two kernels through NVRTC for ``--arch``, one line per
candidate with ptxas' resources; exit status 1 if any fails.
Exit status: 0 done; 1 a bucket without a usable candidate, or a failed
dry-run compile; 2 no GPU; 130 interrupted (measurements kept).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import timing
from ..ops.forward import tuning
from .shapes import Shape, compulsory_bytes, make_inputs, resolve_shapes, shape_arg, shape_problem, validated
from ..ops.forward.tuning import TileConfig

# ---------------------------------------------------------------------------
# buckets


@dataclass
class Bucket:
    match: dict
    shape: Shape  # the shape it is tuned on (the first that maps to it)
    shapes: list = field(default_factory=list)
    arch: str | None = None  # the target: sm_90a adds the wgmma candidates

    @property
    def key(self) -> str:
        return json.dumps(self.match, sort_keys=True)

    @property
    def label(self) -> str:
        return tuning.bucket_label(self.match)

    @property
    def candidates(self) -> list[TileConfig]:
        return tuning.candidates(self.match["V"], self.arch, self.match["K"])


def group_buckets(shapes, sm_count, arch=None) -> list[Bucket]:
    out = {}
    for s in shapes:
        match = tuning.bucket_of(shape_problem(s), sm_count)
        b = out.setdefault(tuning.bucket_key(match), Bucket(match, s, arch=arch))
        b.shapes.append(s.name)
    return list(out.values())


def cfg_label(c: TileConfig) -> str:
    return f"BV={c.BV} stages={c.stages}" + ("" if c.mma == "sync" else f" mma={c.mma}")


# ---------------------------------------------------------------------------
# progress on stderr: one line, rewritten in place on a terminal


class Progress:
    def __init__(self, total, stream=None):
        self.total, self.done, self.stream = max(1, total), 0, stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, text, advance=1):
        self.done += advance
        width = 24
        fill = int(width * min(self.done, self.total) / self.total)
        line = f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {text}"
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------
# resumable measurements


def kernels_hash() -> str:
    from ..paths import kernels_dir

    h = hashlib.sha256()
    for f in sorted(kernels_dir().glob("*.cu*")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


class Sidecar:
    """Finished measurements: {bucket key: {"BV=..,stages=..": {"time_ms": x} or {"fail": why}}},
    with a fingerprint (GPU, SM count, kernel sources, kdacupy version): a
    sidecar with another fingerprint is not used."""

    def __init__(self, path: Path, fingerprint: dict, restart: bool = False):
        self.path, self.fingerprint, self.results = Path(path), fingerprint, {}
        self.resumed = 0
        if restart or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            if data.get("fingerprint") == fingerprint and isinstance(data.get("results"), dict):
                self.results = data["results"]
                self.resumed = sum(len(v) for v in self.results.values())
            else:
                print(f"note: {self.path} was made with other kernels or on another GPU; starting afresh",
                      file=sys.stderr)
        except Exception as e:  # noqa: BLE001
            print(f"note: ignoring unreadable {self.path} ({e})", file=sys.stderr)

    def get(self, bucket: Bucket, cfg: TileConfig):
        return self.results.get(bucket.key, {}).get(cfg_label(cfg))

    def put(self, bucket: Bucket, cfg: TileConfig, record: dict):
        self.results.setdefault(bucket.key, {})[cfg_label(cfg)] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(dict(fingerprint=self.fingerprint, results=self.results), indent=1))
        os.replace(tmp, self.path)

    def remove(self):
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------------------
# the GPU steps (module functions, so tests can replace them)


def load_variants(bucket: Bucket, cfgs, jobs: int) -> dict:
    """Compile (and load) the prepare kernel and each candidate's recurrence
    kernel through the JIT, in threads; {cfg: error text} for failures."""
    import cupy

    from ..jit.loaders import loader
    from ..ops.forward.kernels import prepare_variant, recurrence_variant

    p = shape_problem(bucket.shape)
    dev = cupy.cuda.runtime.getDevice()
    run = loader("cuda")

    def build(var, kernel):
        with cupy.cuda.Device(dev):
            try:
                run.get(kernel, var.config(), kernel)
                return None
            except Exception as e:  # noqa: BLE001
                return f"compile failed: {type(e).__name__}: {str(e)[:500]}"

    errors = {}
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        prep = pool.submit(build, prepare_variant(p), "kda_prepare")
        futs = {c: pool.submit(build, recurrence_variant(p, c), "kda_recurrence") for c in cfgs}
        perr = prep.result()
        for c, f in futs.items():
            err = perr or f.result()
            if err:
                errors[c] = err
    return errors


def parity_shape(bucket: Bucket) -> Shape:
    """A small input of the bucket's kind: same K, V, dtype, state precision and
    varlen; ragged last chunks, and a zero-length sequence when varlen."""
    m = bucket.match
    common = dict(H=2, K=m["K"], V=m["V"], dtype=bucket.shape.dtype, state_precision=m["state_precision"])
    if m["varlen"]:
        return Shape("parity-varlen", 103, lens=(37, 0, 50, 16), **common)
    return Shape("parity-fixed", 75, B=2, **common)


def parity_reference(bucket: Bucket, device: bool = True):
    """(inputs, options, model output, model final state) for the bucket's
    parity input; inputs on the GPU unless ``device`` is False (emulation)."""
    from ..numerics.precision import kda_model

    shape = parity_shape(bucket)
    arrays, options = make_inputs(shape, seed=7)
    ref_o, ref_s = kda_model(**arrays, **options)
    if device:
        import cupy

        dev = lambda x: cupy.asarray(x) if isinstance(x, np.ndarray) else x  # noqa: E731
        arrays, options = {n: dev(x) for n, x in arrays.items()}, {n: dev(x) for n, x in options.items()}
    return arrays, options, ref_o, ref_s


def check_parity(ref, bucket: Bucket, cfg: TileConfig, backend: str = "cuda") -> str | None:
    """None when the candidate matches the precision model within
    ``parity.GPU`` (``parity.EMULATE`` for backend="emulate", on the CPU)."""
    from ..ops.forward.kernels import forward
    from ..numerics.parity import EMULATE, GPU, mismatch

    arrays, options, ref_o, ref_s = ref
    try:
        p, a = validated(arrays, options, backend)
        o, s = forward(p, a, cfg)
        if backend == "cuda":
            import cupy

            o, s = cupy.asnumpy(o), cupy.asnumpy(s)
    except Exception as e:  # noqa: BLE001
        return f"parity run failed: {type(e).__name__}: {str(e)[:300]}"
    tol = GPU if backend == "cuda" else EMULATE
    why = mismatch(o, ref_o, tol)
    if why:
        return f"parity: output {why}"
    why = mismatch(s, ref_s, tol)
    return f"parity: final state {why}" if why else None


def timing_inputs(bucket: Bucket, l2_bytes: int):
    """Validated (problem, arrays) for the full shape: one set, two when the
    inputs are small enough to stay in L2 (they then alternate)."""
    import cupy

    shape = bucket.shape
    rotate = compulsory_bytes(shape)["total"] < 3 * l2_bytes
    return [validated(*make_inputs(shape, cupy, seed), "cuda") for seed in ((0, 1) if rotate else (0,))]


def measure(inputs, cfg: TileConfig, warmup: int, iters: int) -> float:
    """Median milliseconds of one forward call with this configuration."""
    from ..ops.forward.kernels import forward

    calls = [lambda p=p, a=a: forward(p, a, cfg) for p, a in inputs]
    return timing.time_calls(calls, warmup, iters)[0]


# ---------------------------------------------------------------------------
# tuning


@dataclass
class BucketResult:
    bucket: Bucket
    times: dict  # cfg -> ms
    failures: dict  # cfg -> why
    entry: tuning.Entry | None


def choose(bucket: Bucket, times: dict) -> tuning.Entry | None:
    ranked = sorted(times.items(), key=lambda kv: (kv[1], kv[0].BV, kv[0].stages, kv[0].mma))
    if not ranked:
        return None
    (best, t), rest = ranked[0], ranked[1:]
    ru = (rest[0][0], rest[0][1]) if rest else None
    return tuning.Entry(dict(bucket.match), best, t, ru, (ru[1] / t - 1.0) if ru else None)


def tune_bucket(bucket: Bucket, sidecar: Sidecar, args, dev: dict, progress: Progress) -> BucketResult:
    cands = bucket.candidates
    todo = [c for c in cands if sidecar.get(bucket, c) is None]
    transient = {}
    skipped = len(cands) - len(todo)
    if skipped:
        progress.step(f"{bucket.label}: {skipped} measured before", skipped)
    if todo:
        progress.step(f"{bucket.label}: compiling {len(todo)} candidates", 0)
        errors = load_variants(bucket, todo, args.jobs)
        ref = inputs = None
        for c in todo:
            why = errors.get(c)
            if why is None:
                if ref is None:
                    ref = parity_reference(bucket)
                why = check_parity(ref, bucket, c)
            if why is not None:
                sidecar.put(bucket, c, dict(fail=why))
                progress.step(f"{bucket.label} {cfg_label(c)}: FAILED")
                continue
            try:
                if inputs is None:
                    inputs = timing_inputs(bucket, dev.get("l2_bytes", 0))
                ms = measure(inputs, c, args.warmup, args.iters)
            except Exception as e:  # noqa: BLE001  (not kept in the sidecar: a rerun tries again)
                transient[c] = f"timing failed: {type(e).__name__}: {str(e)[:300]}"
                progress.step(f"{bucket.label} {cfg_label(c)}: timing FAILED")
                continue
            sidecar.put(bucket, c, dict(time_ms=ms))
            progress.step(f"{bucket.label} {cfg_label(c)}: {ms:.3f} ms")
        del ref, inputs
        timing.free_memory()
    times, failures = {}, {}
    for c in cands:
        rec = sidecar.get(bucket, c) or dict(fail=transient.get(c))
        if "time_ms" in rec:
            times[c] = float(rec["time_ms"])
        else:
            failures[c] = rec.get("fail", "unknown failure")
    return BucketResult(bucket, times, failures, choose(bucket, times))


def merged_entries(output: Path, gpu: str, new_entries) -> list:
    """This run's entries, plus those of an existing valid file for the same GPU
    whose buckets were not tuned now."""
    entries = {tuning.bucket_key(e.match): e for e in new_entries}
    old = tuning.load_table(output)
    if old is not None and old.gpu == gpu:
        for key, e in old.entries.items():
            entries.setdefault(key, e)
    return list(entries.values())


def write_yaml(output: Path, dev: dict, entries) -> None:
    from .. import __version__

    text = tuning.dump_table(dev["name"], dev["sm_count"], dev["cuda_runtime"], __version__,
                             datetime.date.today().isoformat(), entries)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, output)
    tuning.clear_cache()


def report(results, sm_count) -> str:
    lines = []
    for r in results:
        b = r.bucket
        lines.append(f"{b.label}  (tuned on {b.shape.name}; shapes: {', '.join(b.shapes)})")
        for c in b.candidates:
            if c in r.times:
                lines.append(f"    {cfg_label(c):<18} {r.times[c]:9.4f} ms")
            else:
                lines.append(f"    {cfg_label(c):<18} FAILED: {r.failures.get(c)}")
        if r.entry is None:
            lines.append("    -> no usable candidate: this bucket keeps the next source (shipped file or heuristic)")
            continue
        e = r.entry
        ru = f"; runner-up {cfg_label(e.runner_up[0])} {e.runner_up[1]:.4f} ms, margin {100 * e.margin:.1f}%" \
            if e.runner_up else ""
        h = tuning.heuristic(shape_problem(b.shape), sm_count)
        vs = f"; heuristic {cfg_label(h)}" + (f" {r.times[h]:.4f} ms ({r.times[h] / e.time_ms:.2f}x)"
                                               if h in r.times else "")
        lines.append(f"    -> {cfg_label(e.config)} {e.time_ms:.4f} ms{ru}{vs}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# dry run


def dry_run(buckets, arch: str, jobs: int) -> int:
    from ..jit.nvrtc import SMEM_LIMIT, compile_variant
    from ..ops.forward.kernels import prepare_variant, recurrence_variant

    work = {}
    for b in buckets:
        p = shape_problem(b.shape)
        work[b.key] = (prepare_variant(p), [recurrence_variant(p, c) for c in b.candidates])
    variants = list(dict.fromkeys(v for prep, recs in work.values() for v in (prep, *recs)))
    try:
        with ThreadPoolExecutor(max(1, jobs)) as pool:  # NVRTC runs outside the GIL
            results = dict(zip(variants, pool.map(lambda v: compile_variant(v, arch), variants)))
    except Exception as e:  # noqa: BLE001  (no NVRTC library, typically)
        print(f"cannot compile through NVRTC: {type(e).__name__}: {e}\n(pip's cuda-toolkit[nvrtc] provides it)",
              file=sys.stderr)
        return 1
    failed = 0
    for b in buckets:
        prep, recs = work[b.key]
        print(f"# bucket {b.label}: tuned on {b.shape.name}; shapes: {', '.join(b.shapes)}")
        pr = results[prep]
        for c, var in zip(b.candidates, recs):
            rr = results[var]
            smem = var.smem + rr.static_smem
            bad = not pr.ok or not rr.ok or smem > SMEM_LIMIT[arch]
            failed += bad
            prep_txt = pr.resources if pr.ok else "FAILED"
            rec_txt = f"{rr.resources} smem={smem}" if rr.ok else "FAILED"
            if rr.ok and smem > SMEM_LIMIT[arch]:
                rec_txt += " OVER-LIMIT"
            print(f"{b.label} | {cfg_label(c)} | prepare {prep_txt} | recurrence {rec_txt}"
                  f"{' | FAILED' if bad else ''}", flush=True)
            for res in (pr, rr):
                if not res.ok:
                    print("    " + res.log.strip().replace("\n", "\n    ")[:2000])
    n = sum(len(b.candidates) for b in buckets)
    print(f"{len(buckets)} buckets, {n} candidates for {arch}, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


# ---------------------------------------------------------------------------


def main(argv=None):
    from ..jit.nvrtc import ARCHS, GENERIC_ARCHS

    ap = argparse.ArgumentParser(prog="python -m kdacupy.tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", type=shape_arg, default=["all"], metavar="SET|SPEC",
                    help="named sets (kimi, fewhead, all; default all) and/or specs like "
                         "T=8192,H=96,K=128,V=128 or varlen=1300:547:2048,H=64 (also varlen=1024x8; keys "
                         "B, T, H, HV, K, V, varlen, dtype=bf16|fp16|fp32, state=bf16|fp32)")
    ap.add_argument("--output", metavar="PATH", type=Path,
                    help="YAML to write (default: the user tuning directory file for this GPU model)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU needed: list buckets and candidates and compile each through NVRTC")
    ap.add_argument("--arch", default="sm_90a", choices=ARCHS + GENERIC_ARCHS,
                    help="target of --dry-run (default sm_90a, what the runtime builds on an H100 / H200)")
    ap.add_argument("--sm-count", type=int, default=tuning.DEFAULT_SM_COUNT,
                    help=f"SM count for the buckets of --dry-run (default {tuning.DEFAULT_SM_COUNT})")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--resume", dest="restart", action="store_false", default=False,
                   help="skip measurements kept in the sidecar file (default)")
    g.add_argument("--restart", dest="restart", action="store_true", help="ignore the sidecar file")
    ap.add_argument("--iters", type=int, default=30, help="timed calls per candidate (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: CPUs)")
    ap.add_argument("--decode", action="store_true",
                    help="tune the decode kernel's BV and warps on the decode bench shapes instead "
                         "(writes <model>.decode.yaml; see kdacupy/cli/tune_decode.py); --shapes is ignored")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.jobs < 1 or args.sm_count < 1:
        ap.error("--iters, --jobs and --sm-count must be >= 1, --warmup >= 0")
    if args.decode:
        from .tune_decode import tune as tune_decode
        return tune_decode(args)
    shapes = resolve_shapes(args.shapes)

    if args.dry_run:
        return dry_run(group_buckets(shapes, args.sm_count, args.arch), args.arch, args.jobs)
    if not timing.gpu_available():
        print(timing.no_gpu_message(ap.prog, " Use --dry-run to list the buckets and compile every candidate "
                                            "through NVRTC without one."), file=sys.stderr)
        return 2

    dev = timing.device_info()
    from ..jit import targets
    cc = dev.get("compute_capability")  # the wgmma candidates where the runtime builds sm_90a
    buckets = group_buckets(shapes, dev["sm_count"], targets.runtime_arch(targets.cc_digits(cc)) if cc else None)
    output = args.output or tuning.user_dir() / f"{tuning.model_name(dev['name'])}.yaml"
    read = tuning.lookup_paths(dev["name"])
    if output.resolve() not in [p.resolve() for p in read]:
        print(f"note: kda_forward does not read {output}: for {dev['name']} it reads {read[0]}, then {read[1]} "
              f"(omit --output, or copy the file to the first)", file=sys.stderr)
    fingerprint = dict(gpu=dev["name"], sm_count=dev["sm_count"], kernels=kernels_hash(), kdacupy=_version())
    sidecar = Sidecar(output.with_name(output.name + ".partial.json"), fingerprint, args.restart)
    print(f"kdacupy tune on {dev['name']} ({dev['sm_count']} SMs): {len(shapes)} shapes, {len(buckets)} buckets"
          f"{f'; resuming {sidecar.resumed} measurements from {sidecar.path}' if sidecar.resumed else ''}",
          flush=True)
    progress = Progress(sum(len(b.candidates) for b in buckets))
    t0 = time.perf_counter()
    results = []
    try:
        for b in buckets:
            results.append(tune_bucket(b, sidecar, args, dev, progress))
    except KeyboardInterrupt:
        progress.close()
        print(f"interrupted: finished measurements are kept in {sidecar.path}; run again to resume",
              file=sys.stderr)
        return 130
    progress.close()
    print(report(results, dev["sm_count"]))
    entries = [r.entry for r in results if r.entry is not None]
    write_yaml(output, dev, merged_entries(output, dev["name"], entries))
    sidecar.remove()
    used = output.resolve() == read[0].resolve() or (output.resolve() == read[1].resolve() and
                                                      not read[0].exists())
    print(f"wrote {output} ({len(entries)} buckets tuned in {time.perf_counter() - t0:.0f} s); "
          + ("kda_forward reads it" if used else f"kda_forward does not read it (it reads {read[0]} first)"))
    return 0 if len(entries) == len(results) else 1


def _version() -> str:
    from .. import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())

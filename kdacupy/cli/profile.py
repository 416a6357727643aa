"""``python -m kdacupy.profile``: hardware counters of the kernels from the CPU emulation, and a
roofline per GPU (docs/design.md section 11). No GPU needed.

Runs the kernels on the emulation with KDACUPY_EMULATE_PROFILE=1 and prints, per kernel:
requests, shared-memory wavefronts per request against the conflict-free ideal, global sector
efficiency (bytes asked for / 32 x sectors), DRAM bytes with an ideal L2, mma, SFU instructions;
then the roofline of the chosen GPU: the time each resource needs (HBM, shared memory, tensor
cores, SFU, and the dependent path at the GPU's latencies), the one that binds, and the occupancy
that the compile report's registers and shared memory allow (NVRTC for the GPU's arch); then per
kernel the dependent path (cycles of the longest CTA, per chunk for the chunk chains, its steps)
and the bytes of global loads it keeps in flight per SM against Little's law's need; then the
issue term (docs/design.md section 11.4; needs nvdisasm and scipy: pip install ".[profile]"): the
instructions each warp issues from the variant's SASS for the GPU's arch (per chunk for the chunk
chains), the busiest warp and scheduler, the fit's misfit, the top opcodes and source lines.

Workloads: without --shape, a small forward (T=256, H=2, K=V=128, bf16, Kimi's options), a
decode step (N=16, HV=4), the split forward (2 segments) of the same forward and its backward
(the forward's prepare and recurrence again, this time storing each chunk's state, then
kda_bwd_chain, kda_bwd_chunk and kda_bwd_reduce; do and dfinal_state as python -m kdacupy.bench
--shapes backward makes them). --shape kimi (or any spec, as for python -m kdacupy.bench)
profiles at full size by emulating a slice, --heads value heads (default 1) at the full length,
and scaling every count by HV / heads: each value head's CTAs do the same work on their own
data, so counts are additive over heads. Exact where each head's part of an array is whole
32-byte sectors (q, k, v, g, o, do, the gradients of those, states, the workspace and the
backward's chunk states at K, V >= 64); beta [T, HV], A_log [HV], dbeta and the backward's
per-chunk partial sums of dA_log are not: the slice's DRAM bytes for them stay exact (its arrays
are contiguous), its sectors per request for beta are fewer (16 tokens share a sector when
HV = 1); arrays every head reads whole (cu_seqlens) are not scaled. The choice of the pair form
(prepare's and kda_bwd_chunk's) depends on the data, and is sampled on the slice's heads.
--pass forward|backward|both|train says which passes run: default both without --shape, forward with
it (--shape kimi --pass both: the forward, the backward and their sum per shape; train: the forward that
keeps its workspace and chunk states, and the backward that reads them, docs/design.md section 9.5).

--json FILE writes everything; --show FILE prints a saved file's summary without emulating, and
with --measured BENCH_JSON (python -m kdacupy.bench's, same shapes; --shapes backward's for the
backward) the measured medians and measured / predicted beside it: the model's error, once a
GPU has run. Predictions are lower bounds: the binding resource at its peak (HBM at 90% of the
datasheet's), the dependent path and the issue term stated approximations (docs/design.md sections
11.1 and 11.4); launch gaps and cache misses beyond the compulsory ones are not modelled.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..emulate import counting
from ..emulate.profile import MAX_COUNTERS
from . import figures, roofline
from .shapes import (Shape, compulsory_backward_bytes, compulsory_bytes, compulsory_train_bytes, make_inputs,
                     resolve_shapes, shape_arg, shape_problem, validated)
from .timing import git_commit, git_dirty

#: FlashKDA's forward times to set next to the predictions, ms (docs/design.md section 11): on an H200
#: the quoted H = 64, T = 8192, B = 1 figure; its repository's GB200 table next to a GB200, and next to
#: a B200 (the nearest part it has figures for)
_FLASHKDA_GB200 = {"kimi-T8192-H96": 1.0087, "kimi-varlen6-H96": 0.8597, "kimi-varlen8x1024-H96": 0.7064,
                   "kimi-T8192-H64": 0.9247, "kimi-varlen6-H64": 0.6553, "kimi-varlen8x1024-H64": 0.4811}
FLASHKDA_MS = {"h200": {"kimi-T8192-H64": 1.209}, "b200": _FLASHKDA_GB200, "gb200": _FLASHKDA_GB200}
DEFAULT_SHAPE = Shape("T256-H2", 256, 2)  # the small workloads: forward, split forward, backward
DEFAULT_DECODE = dict(N=16, HV=4, T=1)
DEFAULT_SEGMENTS = 2
NOT_COUNTS = ("kernel", "grid", "block", "shared_mem", "source", "sites", "anchors", "library", "dram_by_argument",
              "emulated_ctas", "anchors_dropped", "consumer", "chain_chunks", "consumers")


def log(msg: str) -> None:
    print(f"[kdacupy.profile] {msg}", file=sys.stderr, flush=True)


def counts_of(rec: dict) -> list[str]:
    return [k for k, v in rec.items() if k not in NOT_COUNTS and isinstance(v, (int, float))]


#: kernel parameters every value head reads whole: their DRAM bytes do not grow with the heads
HEAD_SHARED = ("cu_seqlens", "pool_idx")
#: the grid dimension that runs over heads, where it is not y (kda_bwd_reduce: one CTA per value head)
HEAD_AXIS = {"kda_bwd_reduce": 0}
PASSES = ("forward", "backward", "both", "train")


def scaled(rec: dict, factor) -> dict:
    """A record with every count (and the grid's head dimension) times ``factor``, except the
    DRAM bytes of the arrays all heads share (HEAD_SHARED), read once whatever the heads."""
    out = dict(rec)
    out["emulated_ctas"] = rec.get("emulated_ctas", rec["ctas"])  # the anchors' CTAs (kdacupy/cli/issue.py)
    integral = float(factor).is_integer()
    for k in counts_of(rec):
        if k in MAX_COUNTERS:  # a maximum over CTAs: every head's CTAs alike
            continue
        x = rec[k] * factor
        out[k] = int(round(x)) if integral else x
    shared = [v for name, v in rec.get("dram_by_argument", {}).items() if name in HEAD_SHARED]
    rd, wr = sum(v[0] for v in shared), sum(v[1] for v in shared)
    for k, fixed in (("dram_read_bytes", rd), ("dram_write_bytes", wr), ("dram_bytes", max(rd, wr))):
        x = (rec[k] - fixed) * factor + fixed
        out[k] = int(round(x)) if integral else x
    out["dram_by_argument"] = {name: v if name in HEAD_SHARED else [x * factor for x in v]
                               for name, v in rec.get("dram_by_argument", {}).items()}
    axis = HEAD_AXIS.get(rec["kernel"], 1)
    out["grid"] = [int(round(n * factor)) if i == axis else n for i, n in enumerate(rec["grid"])]
    return out


def slice_shape(shape: Shape, heads: int) -> tuple[Shape, int]:
    """The shape with ``heads`` value heads (whole query-head groups, at least one), and its HV."""
    group = shape.hv // shape.H
    h = max(1, min(shape.H, heads // group))
    return dataclasses.replace(shape, name=f"{shape.name}-slice", H=h, HV=h * group if shape.HV else None), h * group


def default_segments(shape: Shape, sms: int, arch: str | None = None) -> int:
    """The segments per sequence kda_forward's default (``sequence_parallel=None``) takes for ``shape``
    on a GPU of ``sms`` SMs and target ``arch`` (kdacupy/seqpar.py, auto_segments)."""
    from ..seqpar import auto_segments

    return auto_segments(shape_problem(shape), sms, arch)[0]


def forward_records(shape: Shape, heads: int | None, sms: int, arch: str | None = None, segments: int | None = None,
                    fused: bool | None = None, **options) -> tuple[list[dict], dict]:
    """Profile records of kda_forward at ``shape`` (``heads``: emulate that many value heads and
    scale; None: all of them), with the tiles the full shape gets on a GPU of ``sms`` SMs and
    target ``arch`` (sm_90a: the wgmma recurrence where the heuristic picks it). ``segments``: the
    split forward with that many segments per sequence (None: what the default call takes there;
    its launches, the maps, the scan and the forward, are additive over heads as the serial ones)."""
    from ..ops.forward import tuning
    from ..ops.forward.kernels import forward, recurrence_mma

    full = shape_problem(shape)
    n = default_segments(shape, sms, arch) if segments is None else segments
    tiles = tuning.heuristic(full, sms, arch)
    tiles = dataclasses.replace(tiles, mma=recurrence_mma(full, tiles))  # what the launch runs (sizes without wgmma: sync)
    part, hv = slice_shape(shape, shape.hv if heads is None else heads)
    arrays, opts = make_inputs(part)
    opts.update(options)
    factor = shape.hv // hv if shape.hv % hv == 0 else shape.hv / hv
    from ..ops.forward import fused as one_launch

    fuse = one_launch.pays(full, sms, arch) if fused is None else fused
    if fuse and n == 1:
        tiles = one_launch.tiles_of(tiles, full, sms)
        p, a = validated(arrays, opts, "emulate")
        with counting() as recs:
            forward(p, a, tiles, fused=True)
        with counting() as chain:  # the consumers' chains, as the two-launch recurrence at their tiles
            forward(p, a, tiles)
        rec = scaled(recs[0], factor)
        rec["consumer"] = scaled(next(r for r in chain if r["kernel"] == "kda_recurrence"), factor)
        lens = shape.lens if shape.lens is not None else (shape.T,) * shape.B
        rec["chain_chunks"] = sum(-(-n // 16) for n in lens)  # a consumer's: every sequence of its head
        rec["consumers"] = one_launch.consumers(full, tiles.BV)
        info = dict(heads_emulated=hv, scale=factor, segments=1, fused=True,
                    tiles=dict(BV=tiles.BV, stages=tiles.stages, mma=tiles.mma))
        return [rec], info
    if n > 1:
        fuse_last = one_launch.split_pays(full, n, sms, arch) if fused is None else fused
        recs = [scaled(r, factor) for r in split_forward_records(arrays, opts, n, sms, arch, fuse_last)]
        info = dict(heads_emulated=hv, scale=factor, segments=n,
                    tiles=dict(BV=tiles.BV, stages=tiles.stages, mma=tiles.mma))
        fused_recs = [r for r in recs if r["kernel"] == FUSED_KERNEL]  # [the maps' (where fused), the final]
        if fused_recs:  # their consumers' chains: the plain split's launches (one segment a chain)
            plain = [r for r in split_forward_records(arrays, opts, n, sms, arch, False) if r["kernel"] == "kda_recurrence"]
            merged = dataclasses.replace(full, V=full.K + full.V, N=shape.B * n)  # the maps' [K, K + V] state
            chains = [one_launch.map_consumers(merged, n), shape.B * n * one_launch.consumers(full)]
            for rec, chain, count in zip(fused_recs, plain[-len(fused_recs):], chains[-len(fused_recs):]):
                rec["consumer"] = scaled(chain, factor)
                rec["chain_chunks"] = -(-chunks_of(shape) // n)  # a consumer's: one segment
                rec["consumers"] = count
            info["fused_last"] = True
            info["fused_maps"] = len(fused_recs) == 2
        return recs, info
    p, a = validated(arrays, opts, "emulate")
    with counting() as recs:
        forward(p, a, tiles)
    info = dict(heads_emulated=hv, scale=factor, segments=n, tiles=dict(BV=tiles.BV, stages=tiles.stages, mma=tiles.mma))
    return [scaled(r, factor) for r in recs], info


def split_forward_records(arrays, opts, n: int, sms: int, arch: str | None, fuse_last: bool) -> list[dict]:
    """The emulated split forward's records at the tiles the GPU's heuristic gives each segment batch, its last
    segments made in the final launch (``fuse_last``, ops/forward/fused.py: where it serves the call) or by the
    prepare: the GPU's choices, made here in the emulation."""
    from ..api import kda_forward
    from ..ops.forward import tuning
    from ..ops.seqpar import split

    select, choose = tuning.select_tiles, split.fused_last
    tuning.select_tiles = lambda p, **kw: tuning.heuristic(p, sms, arch)
    split.fused_last = lambda p, n: p.T if fuse_last and not p.varlen else None
    try:
        with counting() as recs:
            kda_forward(**{**arrays, **opts}, sequence_parallel=n, backend="emulate")
    finally:
        tuning.select_tiles, split.fused_last = select, choose
    return recs


def backward_inputs(shape: Shape):
    """(arrays with do, forward options, backward options with dfinal_state): the backward
    benchmark's inputs (python -m kdacupy.bench --shapes backward)."""
    from .bench_backward import loss_inputs

    return loss_inputs(shape, np)


def backward_records(shape: Shape, heads: int | None, sms: int, arch: str | None = None,
                     **options) -> tuple[list[dict], dict]:
    """Profile records of kda_backward at ``shape``, sliced and scaled as forward_records: the
    forward's prepare and its recurrence storing the chunk states, kda_bwd_chain, kda_bwd_chunk,
    kda_bwd_reduce, with the tiles the full shape gets on a GPU of ``sms`` SMs and target ``arch``."""
    from ..backward import validated as backward_validated
    from ..ops.backward.kernels import backward
    from ..ops.backward.tiles import backward_tiles

    tiles = backward_tiles(shape_problem(shape))
    part, hv = slice_shape(shape, shape.hv if heads is None else heads)
    arrays, _, opts = backward_inputs(part)
    opts.update(options)
    p, a = backward_validated(**arrays, **opts, backend="emulate")
    with counting() as recs:
        backward(p, a, tiles, arch)
    factor = shape.hv // hv if shape.hv % hv == 0 else shape.hv / hv
    info = dict(heads_emulated=hv, scale=factor, tiles=dict(BV=tiles.BV, stages=tiles.stages))
    return [scaled(r, factor) for r in recs], info


def train_records(shape: Shape, heads: int | None, sms: int, arch: str | None = None,
                  **options) -> tuple[list[dict], dict]:
    """Profile records of a training step's KDA at ``shape``, sliced and scaled as forward_records:
    ``kda_forward(save_for_backward=True)`` (the prepare and the mma.sync recurrence with its output
    and the chunk states) and ``kda_backward(saved=...)`` (kda_bwd_chain, kda_bwd_chunk,
    kda_bwd_reduce), with the tiles the full shape gets on a GPU of ``sms`` SMs and target ``arch``."""
    from ..backward import validated as backward_validated
    from ..ops.backward import saved
    from ..ops.backward.kernels import backward
    from ..ops.backward.tiles import backward_tiles
    from ..ops.forward import tuning
    from ..ops.forward.kernels import forward

    full = shape_problem(shape)
    ftiles = dataclasses.replace(tuning.heuristic(full, sms, arch), mma="sync")  # the recurrence that stores states
    btiles = backward_tiles(full)
    part, hv = slice_shape(shape, shape.hv if heads is None else heads)
    arrays, fopts, bopts = backward_inputs(part)
    fopts.update(options)
    bopts.update(options)
    p, a = validated({n: x for n, x in arrays.items() if n != "do"}, fopts, "emulate")
    pb, ab = backward_validated(**arrays, **bopts, backend="emulate")
    with counting() as recs:
        _, views = saved.allocate(p)
        forward(p, a, ftiles, keep=views)
        backward(pb, ab, btiles, arch, kept=views)
    factor = shape.hv // hv if shape.hv % hv == 0 else shape.hv / hv
    info = dict(heads_emulated=hv, scale=factor, tiles=dict(BV=ftiles.BV, stages=ftiles.stages, mma=ftiles.mma),
                saved_bytes=saved.layout(full)["total"])
    return [scaled(r, factor) for r in recs], info


def decode_records() -> tuple[list[dict], dict]:
    from ..decode import kda_decode
    from ..numerics.dtypes import F32
    from .bench_decode import make_case

    s = dict(DEFAULT_DECODE, pool=F32)
    a, o = make_case(s)
    with counting() as recs:
        kda_decode(**a, **o, backend="emulate")
    return recs, dict(N=s["N"], HV=s["HV"], T=s["T"], pool="float32", K=128, V=128)


def split_records(shape: Shape, n: int) -> tuple[list[dict], dict]:
    from ..api import kda_forward

    arrays, opts = make_inputs(shape)
    with counting() as recs:
        kda_forward(**arrays, **opts, sequence_parallel=n, backend="emulate")
    return recs, dict(segments=n)


# ---------------------------------------------------------------------------
# per kernel: counts, derived ratios, roofline, occupancy

_compiled: dict = {}


def compile_report(sha: str, arch: str):
    """NVRTC's report (regs, spills, static smem) for a recorded source, or None without NVRTC."""
    from ..emulate import source_text

    key = (sha, arch)
    if key not in _compiled:
        res = None
        src = source_text(sha)
        if src is not None:
            try:
                from ..jit.sass_cfg import compiled

                res = compiled(src, arch)  # with line tables, for the issue term too: the same code
                res = res if res.ok else None
            except Exception as e:  # noqa: BLE001  (no NVRTC here: occupancy is unknown)
                log(f"no compile report ({type(e).__name__}: {e}); occupancy not computed")
        _compiled[key] = res
    return _compiled[key]


def issue_of(rec: dict, gpu: roofline.Gpu):
    """The instructions each warp of a launch issues on ``gpu`` (kdacupy/cli/issue.py), or None where
    the SASS cannot be had (no NVRTC or nvdisasm, or no scipy): said once."""
    from ..emulate import source_text
    from . import issue

    src = source_text(rec["source"])
    if src is None or not rec.get("anchors"):
        return None
    try:
        return issue.count(rec, gpu.arch, src, rec.get("emulated_ctas"))
    except (ImportError, RuntimeError, OSError, KeyError) as e:
        if not _issue_warned:
            log(f"no issue term ({type(e).__name__}: {e})")
            _issue_warned.add(gpu.arch)
        return None


_issue_warned: set = set()  # said once a process


def _merge_issue(row: dict, ic, ctas: float) -> None:
    """Adds one launch's issue to its row: per warp a CTA-weighted mean; opcodes and lines summed over
    the launches' CTAs; the misfit and weight summed."""
    got = row.get("issue")
    if got is None:
        got = row["issue"] = dict(arch=ic.arch, static=ic.static, warps=[0.0] * len(ic.warps), ctas=0.0, weight=0.0,
                                  misfit=0.0, unmatched=0.0, opcodes={}, lines={})
    n = got["ctas"] + ctas
    got["warps"] = [(a * got["ctas"] + b * ctas) / n for a, b in zip(got["warps"], ic.warps)]
    got["ctas"] = n
    for k in ("weight", "misfit", "unmatched"):
        got[k] += getattr(ic, k) * ctas
    for op, x in ic.opcodes.items():
        got["opcodes"][op] = got["opcodes"].get(op, 0.0) + x * ctas
    for ln, x in ic.lines:
        got["lines"][ln] = got["lines"].get(ln, 0.0) + x * ctas


def issue_summary(row: dict, source: str | None, chunks_mean: float, top: int = 5, shown: int = 3) -> dict:
    """What a row's report shows of its issue: per warp of a CTA (per chunk for the chains), the
    busiest warp and its excess over the mean, the schedulers' share, the fit, the top opcodes and
    source lines (instructions issued per CTA; ``shown``: how many of those the report prints)."""
    from .issue import where

    got = row["issue"]
    warps, n = got["warps"], max(got["ctas"], 1e-9)
    per = chunks_mean if row["kernel"] in roofline.CHAIN_KERNELS and chunks_mean else 1.0
    busiest = max(range(len(warps)), key=lambda w: warps[w]) if warps else 0
    mean = sum(warps) / len(warps) if warps else 0.0
    sched = roofline.schedulers(warps)
    lines = sorted(got["lines"].items(), key=lambda kv: -kv[1])[:max(top, shown)]
    return dict(arch=got["arch"], static=got["static"], per="chunk" if per != 1.0 else "CTA",
                warps=[x / per for x in warps], warps_per_cta=list(warps), busiest=busiest, busiest_excess=warps[busiest] / mean - 1 if mean else 0.0,
                scheduler_max=max(sched) / per, misfit=got["misfit"] / got["weight"] if got["weight"] else 0.0,
                unmatched=got["unmatched"] / got["weight"] if got["weight"] else 0.0,
                opcodes={k: v / n / per for k, v in sorted(got["opcodes"].items(), key=lambda kv: -kv[1])[:top]},
                lines=[(where(source, int(ln)) if source else f"rendered line {ln}", x / n / per) for ln, x in lines],
                shown_lines=shown)


FUSED_KERNEL = "kda_forward_fused"
FUSED_CHOICE = {"auto": None, "on": True, "off": False}


def consumer_chain_s(rec: dict, gpu: roofline.Gpu, consumers: int, chain_chunks: int, chunks: int,
                     mean_chunks: float) -> float:
    """The fused launch's chains from the two-launch recurrence at the consumers' tiles (its record, emulated
    beside the fused launch; ``chunks`` its longest CTA's, ``mean_chunks`` its mean): a consumer walks every
    sequence of its head (``chain_chunks``), each chunk step at least the record's dependent path a chunk and
    its busiest scheduler's issue a chunk times the consumers an SM holds (``consumers`` over the SMs)."""
    path = roofline.path_cycles(rec, gpu, "max") / max(1, chunks)
    ic = issue_of(rec, gpu)
    busiest = max(roofline.schedulers(ic.warps, gpu.schedulers)) / max(mean_chunks, 1e-9) if ic else 0.0
    per_sm = -(-consumers // gpu.sms)
    return chain_chunks * max(path, per_sm * busiest) / (gpu.clock_ghz * 1e9)


def kernel_rows(recs: list[dict], gpu: roofline.Gpu, chunks: int, hot: int = 3, mean_chunks: float = 0.0) -> list[dict]:
    """One row per kernel variant (launches summed; the per-CTA maxima their maximum): counts,
    ratios, roofline, occupancy, the dependent path with the bytes in flight, and the instructions
    each warp issues (``chunks``: the longest chain's chunks, ``mean_chunks`` a CTA's mean)."""
    from ..emulate import hotspots, source_text

    rows: dict = {}
    for r in recs:
        key = (r["kernel"], r["source"])
        row = rows.get(key)
        if row is None:
            row = rows[key] = dict(kernel=r["kernel"], source=r["source"], launches=0, block=r["block"],
                                   shared_mem=r["shared_mem"], counts={k: 0 for k in counts_of(r)},
                                   times={}, hotspots=hotspots(r, hot))
            rep = compile_report(r["source"], gpu.arch)
            if rep is not None:
                row["compile"] = dict(arch=gpu.arch, regs=rep.regs, spill_stores=rep.spill_stores,
                                      spill_loads=rep.spill_loads, static_smem=rep.static_smem)
                row["occupancy"] = roofline.occupancy(gpu, int(np.prod(r["block"])), rep.regs,
                                                      r["shared_mem"] + rep.static_smem, roofline.tmem_cols_per_cta(r))
        # resident CTAs per SM: the compile report's occupancy, else threads and shared memory alone
        resident = row["occupancy"]["ctas_per_sm"] if "occupancy" in row else roofline.default_ctas_per_sm(r, gpu)
        row["launches"] += 1
        for k in row["counts"]:
            row["counts"][k] = max(row["counts"][k], r[k]) if k in MAX_COUNTERS else row["counts"][k] + r[k]
        ic = issue_of(r, gpu)
        if ic is not None:
            _merge_issue(row, ic, r["ctas"])
        if r["kernel"] == FUSED_KERNEL:
            chain = consumer_chain_s(r["consumer"], gpu, r["consumers"], r["chain_chunks"], chunks, mean_chunks)
            t = roofline.fused_times(r, gpu, ic.warps if ic else None, chain)
        else:
            t = roofline.times(r, gpu, resident, ic.warps if ic else None, chunks, mean_chunks)
        for k, v in t.items():
            row["times"][k] = row["times"].get(k, 0.0) + v
        row["resident"] = resident
    out = []
    for row in rows.values():
        c = row["counts"]
        row["wavefronts_per_request"] = c["smem_wavefronts"] / c["smem_requests"] if c["smem_requests"] else 0.0
        row["ideal_per_request"] = c["smem_wavefronts_ideal"] / c["smem_requests"] if c["smem_requests"] else 0.0
        row["conflict_excess"] = (c["smem_wavefronts"] / c["smem_wavefronts_ideal"] - 1) if c["smem_wavefronts_ideal"] else 0.0
        row["sector_efficiency"] = c["gmem_bytes"] / (32 * c["gmem_sectors"]) if c["gmem_sectors"] else 1.0
        row["bound"], row["time_s"] = roofline.bound(row["times"])
        resident = row.pop("resident")
        if roofline.has_path(c):
            row["latency"] = roofline.path_info(dict(c, kernel=row["kernel"]), gpu, resident, chunks)
        if "issue" in row:
            row["issue"] = issue_summary(row, source_text(row["source"]), mean_chunks, shown=hot)
        out.append(row)
    return out


def chunks_of(shape: Shape | None) -> int:
    if shape is None:
        return 0
    lens = shape.lens if shape.lens is not None else (shape.T,)
    return -(-max(lens) // 16) if lens else 0


def mean_chunks_of(shape: Shape | None) -> float:
    """The chunks a chain CTA walks on average (one sequence each)."""
    if shape is None:
        return 0.0
    lens = shape.lens if shape.lens is not None else (shape.T,)
    return sum(-(-n // 16) for n in lens) / len(lens) if lens else 0.0


def run_entry(name, shape, recs, info, gpu, hot, kind="forward") -> dict:
    """One workload's rows and totals; ``kind`` "forward" or "backward" (whose floor is the
    backward's compulsory traffic: its inputs read once, the gradients written once)."""
    seg = info.get("segments", 1) if shape is not None else 1  # a split's chains walk one segment each
    rows = kernel_rows(recs, gpu, -(-chunks_of(shape) // seg), hot, mean_chunks_of(shape) / seg)
    entry = dict(name=name, kind=kind, shape=shape.to_dict() if shape else None, **info, kernels=rows,
                 predicted_s=sum(r["time_s"] for r in rows))
    if shape is not None:
        floor = {"backward": compulsory_backward_bytes, "train": compulsory_train_bytes}.get(
            kind, compulsory_bytes)(shape)["total"]
        entry["hbm_floor_bytes"] = floor
        entry["hbm_floor_s"] = floor / gpu.hbm_bytes_per_s
        entry["flashkda_ms"] = FLASHKDA_MS.get(gpu.key, {}).get(shape.name) if kind == "forward" else None
    return entry


# ---------------------------------------------------------------------------
# output


def _us(s: float) -> str:
    return f"{s * 1e6:.1f}"


STEP_NAMES = dict(issue="issue", dram="dram", smem="smem", ldmatrix="ldsm", mma="mma", sfu="sfu", shuffle="shfl",
                  barrier="bar")


def in_flight_text(lat: dict) -> str:
    """Bytes in flight per SM against the need, in KB, and the verdict."""
    kb = lambda b: f"{b / 1024:.1f}"  # noqa: E731
    text = f"{kb(lat['mean_bytes'])} KB (peak {kb(lat['peak_bytes'])}) vs need {kb(lat['need_bytes'])}"
    return text + (": latency-bound on loads" if lat["latency_bound_on_loads"] else "")


def print_paths(e: dict, gpu: roofline.Gpu, p) -> None:
    """Per kernel: the dependent path and the bytes in flight per SM (docs/design.md section 11.1)."""
    rows = [r for r in e["kernels"] if "latency" in r]
    if not rows:
        return
    p(f"{'path ' + gpu.key:16} {'cycles':>9} {'/chunk':>7} {'mean':>9} {'rounds':>7}  steps of the longest CTA path"
      f"  | global loads in flight per SM, {gpu.cycles('dram')}-cycle DRAM latency")
    for r in rows:
        lat = r["latency"]
        steps = ", ".join(f"{STEP_NAMES[k]} {n}" for k, n in lat["steps"].items() if n)
        chunk = f"{lat['cycles_per_chunk']:.0f}" if "cycles_per_chunk" in lat else "-"
        p(f"{r['kernel']:16} {lat['path_cycles']:>9.0f} {chunk:>7} {lat['mean_path_cycles']:>9.0f} {lat['rounds']:>7.2f}  "
          f"{steps or '-'}  | {lat['resident']} resident: {in_flight_text(lat)}")


def print_issue(e: dict, p) -> None:
    """Per kernel: the instructions each warp issues (per chunk for the chunk chains, else per CTA),
    the busiest warp and its excess over the mean, the busiest scheduler, the fit's misfit, the top
    opcodes and the source lines that issue the most (docs/design.md section 11.4)."""
    rows = [r for r in e["kernels"] if "issue" in r]
    if not rows:
        return
    p(f"{'issue (SASS ' + rows[0]['issue']['arch'] + ')':16} {'static':>7} {'per':>6}  instructions per warp; busiest warp "
      f"(excess over the mean), busiest scheduler; anchors misfit / unmatched; top opcodes")
    for r in rows:
        i = r["issue"]
        warps = " ".join(f"{x:.0f}" for x in i["warps"])
        ops = ", ".join(f"{k} {v:.0f}" for k, v in i["opcodes"].items())
        p(f"{r['kernel']:16} {i['static']:>7} {i['per']:>6}  [{warps}]; warp {i['busiest']} (+{100 * i['busiest_excess']:.0f}%), "
          f"scheduler {i['scheduler_max']:.0f}; misfit {100 * i['misfit']:.1f}% / {100 * i['unmatched']:.1f}%; {ops}")
        for where, x in i["lines"][:i.get("shown_lines", 3)]:
            p(f"  {r['kernel']} issues {x:.0f} per {i['per']} at {where}")


def print_run(e: dict, gpu: roofline.Gpu, file=None) -> None:
    p = lambda *a: print(*a, file=file or sys.stdout)  # noqa: E731
    sl = f", {e['heads_emulated']} value head(s) emulated, counts x {e['scale']:g}" if "scale" in e else ""
    sl += f", {e['segments']} segments a sequence (the split forward)" if e.get("segments", 1) > 1 and "scale" in e else ""
    p(f"\n== {e['name']}{sl}" + (f", tiles BV={e['tiles']['BV']} stages={e['tiles']['stages']}"
                             + (f" mma={e['tiles']['mma']}" if e["tiles"].get("mma", "sync") != "sync" else "")
                             if "tiles" in e else ""))
    p(f"{'kernel':16} {'CTAs':>7} {'smem req':>10} {'wf/req':>6} {'ideal':>5} {'excess':>7} {'gmem req':>9} "
      f"{'sect.eff':>8} {'dram MB':>8} {'mma':>9} {'sfu':>9} {'bar':>7}")
    for r in e["kernels"]:
        c = r["counts"]
        p(f"{r['kernel']:16} {c['ctas']:>7.0f} {c['smem_requests']:>10.0f} {r['wavefronts_per_request']:>6.2f} "
          f"{r['ideal_per_request']:>5.2f} {100 * r['conflict_excess']:>6.1f}% {c['gmem_requests']:>9.0f} "
          f"{100 * r['sector_efficiency']:>7.1f}% {(c['dram_read_bytes'] + c['dram_write_bytes']) / 1e6:>8.2f} "
          f"{c['mma']:>9.0f} {c['sfu']:>9.0f} {c['barriers']:>7.0f}")
    p(f"{'roofline ' + gpu.key:16} {'hbm us':>8} {'smem us':>8} {'tensor us':>9} {'sfu us':>8} {'issue us':>8} "
      f"{'lat. us':>8} {'bound':>7} {'time us':>8}  occupancy (regs, spills, smem)")
    for r in e["kernels"]:
        t = r["times"]
        occ = r.get("occupancy")
        cp = r.get("compile")
        o = (f"{occ['ctas_per_sm']} CTAs/SM, {occ['warps_per_sm']} warps ({occ['limited_by']}); "
             f"{cp['regs']} regs, {cp['spill_stores']}/{cp['spill_loads']} spills, "
             f"{r['shared_mem'] + cp['static_smem']} B") if occ else "n/a (no NVRTC)"
        p(f"{r['kernel']:16} {_us(t['hbm']):>8} {_us(t['smem']):>8} {_us(t['tensor']):>9} {_us(t['sfu']):>8} "
          f"{_us(t['issue']) if 'issue' in t else '-':>8} {_us(t['latency']) if 'latency' in t else '-':>8} "
          f"{r['bound']:>7} {_us(r['time_s']):>8}  {o}")
    print_paths(e, gpu, p)
    print_issue(e, p)
    line = f"predicted {e['predicted_s'] * 1e3:.3f} ms (sum of the kernels' bounds)"
    if "hbm_floor_s" in e:
        line += f"; HBM floor {e['hbm_floor_s'] * 1e3:.3f} ms ({e['hbm_floor_bytes'] / 1e9:.3f} GB compulsory)"
    if e.get("flashkda_ms"):
        line += f"; FlashKDA published {e['flashkda_ms']:.3f} ms"
    p(line)
    for r in e["kernels"]:
        for h in r["hotspots"]:
            what = (f"{h['wavefronts']} wavefronts for ideal {h['ideal']}" if h["space"] == "shared"
                    else f"{h['sectors']} sectors for {h['bytes']} bytes")
            p(f"  {r['kernel']} {h['space']} {'store' if h['write'] else 'load'} {h['requests']} req, {what}: "
              f"{h['where']}")


def measured_times(bench: dict | None) -> dict:
    """{shape name: {pass: median ms}} of a python -m kdacupy.bench JSON: "forward" from the
    forward benchmark's rows; "forward", "backward" and "forward_backward" from --shapes backward's."""
    out = {}
    for row in (bench or {}).get("shapes", []):
        k = row.get("kdacupy") or {}
        got = {"forward": k["median_ms"]} if k.get("median_ms") is not None else {}
        got.update({n: v["median_ms"] for n, v in k.items() if isinstance(v, dict) and v.get("median_ms") is not None})
        if got:
            out.setdefault(row["shape"]["name"], {}).update(got)
    return out


def _ratio(m, predicted_s) -> str:
    return f" {m:>11.3f} {m / (predicted_s * 1e3):>9.2f}" if m else f" {'-':>11} {'-':>9}"


def latency_ms(e: dict) -> str:
    """A run's latency terms summed over its kernels, ms ("-": a file written before them)."""
    ts = [r["times"].get("latency") for r in e["kernels"]]
    return "-" if not ts or None in ts else f"{sum(ts) * 1e3:.3f}"


def kernel_part(r: dict) -> str:
    """A kernel's predicted ms and bound, with its latency term, its path per chunk (the chunk
    chains) and its bytes in flight per SM against the need, where the file has them."""
    text = f"{r['kernel']} {r['time_s'] * 1e3:.3f} ({r['bound']}"
    if "issue" in r["times"] and r["bound"] != "issue":
        text += f"; issue {r['times']['issue'] * 1e3:.3f}"
    if "issue" in r:
        text += f"; {r['issue']['scheduler_max']:.0f} instr/{r['issue']['per']}"
    lat = r.get("latency")
    if lat is not None:
        if r["bound"] != "latency":
            text += f"; latency {r['times']['latency'] * 1e3:.3f}"
        if "cycles_per_chunk" in lat:
            text += f"; {lat['cycles_per_chunk']:.0f} cycles/chunk"
        text += (f"; in flight {lat['mean_bytes'] / 1024:.1f} of {lat['need_bytes'] / 1024:.1f} KB/SM"
                 + (" LOW" if lat["latency_bound_on_loads"] else ""))
    return text + ")"


def print_summary(doc: dict, file=None, bench: dict | None = None) -> None:
    """The predictions per shape, forward and backward; with ``bench`` (a kdacupy.bench JSON of
    the same shapes) the measured medians and measured / predicted next to them; the kernels'
    latency terms summed, and per kernel its latency term, path per chunk and bytes in flight
    (docs/design.md section 11.1: what a device run calibrates)."""
    file = file or sys.stdout
    gpu = doc["gpu"]
    measured = measured_times(bench)
    runs = [e for e in doc["runs"] if "hbm_floor_s" in e]
    fwd = [e for e in runs if e.get("kind", "forward") == "forward"]
    bwd = [e for e in runs if e.get("kind") == "backward"]
    head = (f"(lower bounds; kdacupy.profile, commit {doc['commit']}, gate lower bound {doc.get('lower_bound', -5.0):g})")
    extra = f" {'measured ms':>11} {'meas/pred':>9}" if bench is not None else ""
    train = [e for e in runs if e.get("kind") == "train"]
    if fwd or not (bwd or train):
        print(f"\nPredicted forward times on {gpu['name']} {head}:", file=file)
        print(f"{'shape':26} {'predicted ms':>12} {'HBM floor ms':>12} {'FlashKDA ms':>11}{extra} {'latency ms':>10}  "
              f"per kernel (bound; latency ms, path per chunk, KB in flight per SM of the need, LOW below it)", file=file)
    for e in fwd:
        parts = ", ".join(kernel_part(r) for r in e["kernels"])
        fk = f"{e['flashkda_ms']:.3f}" if e.get("flashkda_ms") else "-"
        m = _ratio(measured.get(e["shape"]["name"], {}).get("forward"), e["predicted_s"]) if bench is not None else ""
        print(f"{e['name']:26} {e['predicted_s'] * 1e3:>12.3f} {e['hbm_floor_s'] * 1e3:>12.3f} {fk:>11}{m} "
              f"{latency_ms(e):>10}  {parts}", file=file)
    if train:
        print_train(train, gpu, head, file, measured if bench is not None else None)
    if not bwd:
        return
    forward_of = {e["shape"]["name"]: e for e in fwd}
    print(f"\nPredicted backward and forward + backward times on {gpu['name']} {head}:", file=file)
    extra = (f" {'meas bwd':>9} {'meas/pred':>9} {'meas f+b':>9} {'meas/pred':>9}" if bench is not None else "")
    print(f"{'shape':26} {'backward ms':>11} {'HBM floor':>9} {'fwd+bwd ms':>10} {'HBM floor':>9}{extra} {'latency ms':>10}  "
          f"per backward kernel (bound; latency ms, path per chunk, KB in flight per SM of the need, LOW below it)", file=file)
    for e in bwd:
        name = e["shape"]["name"]
        f = forward_of.get(name)
        both = f"{(e['predicted_s'] + f['predicted_s']) * 1e3:>10.3f} {(e['hbm_floor_s'] + f['hbm_floor_s']) * 1e3:>9.3f}" \
            if f else f"{'-':>10} {'-':>9}"
        m = ""
        if bench is not None:
            got = measured.get(name, {})
            m = f" {got['backward']:>9.3f} {got['backward'] / (e['predicted_s'] * 1e3):>9.2f}" if got.get("backward") \
                else f" {'-':>9} {'-':>9}"
            fb = got.get("forward_backward")
            m += (f" {fb:>9.3f} {fb / ((e['predicted_s'] + f['predicted_s']) * 1e3):>9.2f}" if fb and f
                  else f" {'-':>9} {'-':>9}")
        parts = ", ".join(kernel_part(r) for r in e["kernels"])
        print(f"{name:26} {e['predicted_s'] * 1e3:>11.3f} {e['hbm_floor_s'] * 1e3:>9.3f} {both}{m} {latency_ms(e):>10}  "
              f"{parts}", file=file)


def print_train(runs: list[dict], gpu: dict, head: str, file, measured: dict | None = None) -> None:
    """The training step with kept states: its forward (the launches up to the recurrence), its backward
    and their sum, against the HBM floor of both passes, and the memory kept between them; with
    ``measured`` (measured_times of a --shapes backward bench) the measured step and measured / predicted."""
    print(f"\nPredicted training step, kda_forward(save_for_backward=True) then kda_backward(saved=...), on "
          f"{gpu['name']} {head}:", file=file)
    extra = f" {'measured ms':>11} {'meas/pred':>9}" if measured is not None else ""
    print(f"{'shape':26} {'fwd+bwd ms':>10} {'forward':>8} {'backward':>8} {'HBM floor':>9} {'kept GB':>8}{extra}  "
          f"per kernel (bound; latency ms, path per chunk, KB in flight per SM of the need, LOW below it)", file=file)
    for e in runs:
        split = next((i + 1 for i, r in enumerate(e["kernels"]) if r["kernel"] == "kda_recurrence"), 0)
        f = sum(r["time_s"] for r in e["kernels"][:split])
        parts = ", ".join(kernel_part(r) for r in e["kernels"])
        m = (_ratio(measured.get(e["shape"]["name"], {}).get("train_saved"), e["predicted_s"])
             if measured is not None else "")
        print(f"{e['shape']['name']:26} {e['predicted_s'] * 1e3:>10.3f} {f * 1e3:>8.3f} "
              f"{(e['predicted_s'] - f) * 1e3:>8.3f} {e['hbm_floor_s'] * 1e3:>9.3f} {e.get('saved_bytes', 0) / 1e9:>8.2f}"
              f"{m}  {parts}", file=file)


# ---------------------------------------------------------------------------


def workloads(args, gpu):
    """(name, shape or None, records, info, kind) per workload, emulated one after the other."""
    passes = args.passes or ("forward" if args.shape else "both")
    fwd, bwd = passes in ("forward", "both"), passes in ("backward", "both")
    jobs = []
    if not args.shape:
        if fwd:
            jobs += [("forward", lambda: forward_records(DEFAULT_SHAPE, None, gpu.sms, gpu.arch), DEFAULT_SHAPE, "forward"),
                     ("decode", decode_records, None, "decode"),
                     ("split forward", lambda: split_records(DEFAULT_SHAPE, DEFAULT_SEGMENTS), None, "split")]
        if bwd:
            jobs.append(("backward", lambda: backward_records(DEFAULT_SHAPE, None, gpu.sms, gpu.arch), DEFAULT_SHAPE,
                         "backward"))
        if passes == "train":
            jobs.append(("train", lambda: train_records(DEFAULT_SHAPE, None, gpu.sms, gpu.arch), DEFAULT_SHAPE, "train"))
    else:
        opts = {} if args.lower_bound is None else dict(lower_bound=args.lower_bound)
        for s in resolve_shapes(args.shape):
            if fwd:
                jobs.append((s.name, (lambda s=s: forward_records(s, args.heads, gpu.sms, gpu.arch, args.segments,
                                                                  FUSED_CHOICE[args.fused], **opts)), s, "forward"))
            if bwd:
                jobs.append((f"{s.name} backward", (lambda s=s: backward_records(s, args.heads, gpu.sms, gpu.arch, **opts)), s,
                             "backward"))
            if passes == "train":
                jobs.append((f"{s.name} train", (lambda s=s: train_records(s, args.heads, gpu.sms, gpu.arch, **opts)), s,
                             "train"))
    for i, (name, job, shape, kind) in enumerate(jobs):
        t0 = time.perf_counter()
        log(f"{i + 1}/{len(jobs)} {name}: emulating" + (f" {min(args.heads, shape.hv) if args.shape else shape.hv} "
                                                       f"of {shape.hv} value heads, T={shape.T}" if shape else ""))
        recs, info = job()
        log(f"{i + 1}/{len(jobs)} {name}: {len(recs)} launches in {time.perf_counter() - t0:.1f} s")
        yield name, shape, recs, info, kind


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kdacupy.profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", type=shape_arg, metavar="SHAPE",
                    help="kimi, fewhead, all, or a spec like T=8192,H=96 (may repeat); default: the small workloads")
    ap.add_argument("--gpu", choices=sorted(roofline.GPUS), default="h200")
    ap.add_argument("--pass", dest="passes", choices=PASSES, default=None,
                    help="the passes profiled: forward, backward, both, or train (a training step with kept states: "
                         "kda_forward(save_for_backward=True), then kda_backward(saved=...)); default: both without "
                         "--shape, forward with it")
    ap.add_argument("--heads", type=int, default=1, help="value heads emulated per --shape (default 1)")
    ap.add_argument("--segments", type=int, default=None, metavar="N",
                    help="--shape forwards split in N segments a sequence (1: serial); default: what kda_forward's "
                         "default call takes on the GPU (sequence_parallel=None)")
    ap.add_argument("--fused", choices=sorted(FUSED_CHOICE), default="auto",
                    help="--shape forwards as the fused launch (on), the two launches (off) or what kda_forward's "
                         "default call takes on the GPU (auto, the default)")
    ap.add_argument("--lower-bound", type=float, default=None, metavar="X",
                    help="the sigmoid gate's lower bound for --shape inputs (default -5, as Kimi and the benchmark); "
                         "the pair form runs in chunks whose 16-token decay exceeds 2^-100, so -1 shows the factored path")
    ap.add_argument("--hotspots", type=int, default=3, help="source lines per kernel that waste most, and that issue most (default 3)")
    ap.add_argument("--json", metavar="FILE", help="write every number to FILE")
    ap.add_argument("--show", metavar="FILE", help="print the summary of a saved --json file and exit")
    ap.add_argument("--measured", metavar="BENCH_JSON",
                    help="with --show: a python -m kdacupy.bench JSON of the same shapes, set next to the predictions")
    ap.add_argument("--figure", metavar="FILE", help="draw one run's roofline (each kernel's terms, the bound "
                    "marked) to FILE (.svg, .png; needs the [docs] extra)")
    ap.add_argument("--figure-run", metavar="NAME", help="the run --figure draws (default: the first)")
    args = ap.parse_args(argv)
    if args.measured and not args.show:
        ap.error("--measured needs --show")
    if args.show:
        try:
            doc = json.loads(Path(args.show).read_text())
        except (OSError, ValueError) as e:
            print(f"{ap.prog}: cannot read {args.show}: {e}", file=sys.stderr)
            return 2
        bench = None
        if args.measured:  # a failed device run leaves no file: the predictions still print
            try:
                bench = json.loads(Path(args.measured).read_text())
            except (OSError, ValueError) as e:
                print(f"measured: none ({args.measured}: {type(e).__name__}: {e})")
        print_summary(doc, bench=bench)
        if args.figure:
            figures.roofline(doc, args.figure, args.figure_run)
        return 0
    if args.heads < 1:
        ap.error(f"--heads must be >= 1, got {args.heads}")
    if args.segments is not None and args.segments < 1:
        ap.error(f"--segments must be >= 1, got {args.segments}")
    gpu = roofline.GPUS[args.gpu]
    print(gpu.label())
    doc = dict(gpu=dataclasses.asdict(gpu), commit=git_commit(), dirty=git_dirty(), date=datetime.date.today().isoformat(),
               lower_bound=-5.0 if args.lower_bound is None else args.lower_bound,
               runs=[])
    for name, shape, recs, info, kind in workloads(args, gpu):
        e = run_entry(name, shape, recs, info, gpu, args.hotspots, kind if kind in ("backward", "train") else "forward")
        doc["runs"].append(e)
        print_run(e, gpu)
    print_summary(doc)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        log(f"wrote {args.json}")
    if args.figure:
        figures.roofline(doc, args.figure, args.figure_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m kdacupy.compile --arch ARCH``: every kernel variant the library can
launch, through NVRTC, without a GPU.

One line per variant: ``regs=N spill_stores=N spill_loads=N smem=N`` (shared
memory = the variant's dynamic shared memory plus any static), from ptxas'
``-v`` report, built with exactly the options the runtime uses (``jit.NVRTC_OPTIONS``
plus what CuPy adds, ``jit.CUPY_ADDED_OPTIONS``: ``-ftz=true`` among them), for
``--arch`` or, with ``--cc MAJOR.MINOR``, for the target the runtime builds each
variant on that compute capability (``jit/targets.py``: sm_90a on 9.0; on 10.x
sm_100a for variants with arch-specific instructions, sm_100 for the others). The
first and last lines (stderr) name the target and which runtime builds it. With
``--sass`` the cubin is disassembled (pip's nvidia-cuda-nvdisasm) and the
instruction mix that matters is added: tensor-core MMAs (HMMA; Hopper's warpgroup
HGMMA and its WARPGROUP fences / waits), LDSM, local memory (LDL/STL), global
loads/stores (LDG/STG), cp.async (LDGSTS), bulk copies (UBLKCP, UTMALDG) and
mbarrier operations (SYNCS), Blackwell's tcgen05 MMAs and tensor-memory loads / stores (UTCHMMA, LDTM,
STTM). The recurrence's wgmma variants (label ``wgmma``) are sm_90a's alone, its tcgen05 ones
(``tcgen05``) sm_100a's, and the prepare's core-matrix ones (``ws_core``), which both read, are built
for those two: listed for those targets only.
Exit status 1 if any variant fails to compile, 2 if ``--match`` selects nothing
or ``--sass`` finds no disassembler.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ..jit import registry
from ..jit import targets
from ..jit.nvrtc import ARCHS, GENERIC_ARCHS, SMEM_LIMIT, compile_variant
from ..jit.sass import NVDISASM_HINT, nvdisasm
from ..ops.backward import variants as _backward  # noqa: F401  (registers the backward's kernels)
from ..ops.decode import variants as _decode  # noqa: F401  (registers the decode kernel)
from ..ops.forward import variants as _forward  # noqa: F401  (registers the forward's kernels)
from ..ops.seqpar import variants as _seqpar  # noqa: F401  (registers the split's map and scan kernels)
from .args import at_least

KERNELS = {"prepare": ("kda_prepare", "kda_prepare_core", "kda_prepare_any"),
           "recurrence": ("kda_recurrence", "kda_recurrence_wgmma", "kda_recurrence_tcgen05", "kda_recurrence_any"),
           "fused": ("kda_forward_fused",),
           "decode": ("kda_decode",),
           "seqpar": ("kda_seqpar_maps", "kda_seqpar_scan", "kda_seqpar_maps_any", "kda_seqpar_scan_any"),
           "backward": ("kda_recurrence_store", "kda_recurrence_kept", "kda_bwd_chain", "kda_bwd_chunk",
                        "kda_bwd_reduce", "kda_recurrence_store_any", "kda_recurrence_kept_any", "kda_bwd_chain_any",
                        "kda_bwd_chunk_any")}


def _builds_for(v, target: str) -> bool:
    """Whether a variant is built for ``target``: the wgmma recurrence for sm_90a only, the tcgen05 one
    for sm_100a only (``only_arch``), kda_bwd_chunk's wide block where its shared memory fits and the
    prepare's core-matrix workspace for sm_90a and sm_100a (``only_arches``)."""
    arches = getattr(v, "only_arches", None)
    return getattr(v, "only_arch", None) in (None, target) and (arches is None or target in arches)


def select(kernel: str, match: list) -> list:
    """The registered variants of ``kernel`` ("all": every kernel) whose label contains every TEXT."""
    names = registry.kernels() if kernel == "all" else KERNELS[kernel]
    found = [v for name in names for v in registry.variants(name)]
    return [v for v in found if all(m in v.label() + " " for m in match)]


def _cc(text: str) -> str:
    try:
        return targets.cc_digits(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _target(var, args) -> str:
    if args.cc:
        return targets.runtime_arch(args.cc, targets.uses_arch_specific(var.kernel, var.config()))
    return args.arch or "sm_90a"


def _targets_line(variants, arch_of, cc) -> str:
    """'sm_90a (the runtime's target on compute capability 9.0)', or per target with --cc."""
    counts = {}
    for v in variants:
        counts[arch_of[id(v)]] = counts.get(arch_of[id(v)], 0) + 1
    if not cc:
        (arch,) = counts
        return f"{arch} ({targets.describe(arch)})"
    parts = [f"{arch} ({n}: {targets.describe(arch)})" for arch, n in sorted(counts.items())]
    return f"compute capability {cc[:-1]}.{cc[-1]}: " + ", ".join(parts)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kdacupy.compile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--arch", choices=ARCHS + GENERIC_ARCHS, help="the target (default sm_90a)")
    where.add_argument("--cc", metavar="MAJOR.MINOR", type=_cc,
                       help="each variant for the target the runtime builds it on this compute capability")
    ap.add_argument("--sass", action="store_true", help="disassemble and count HMMA/HGMMA/LDSM/LDL/STL/LDG/STG/...")
    ap.add_argument("--kernel", choices=(*KERNELS, "all"), default="all")
    ap.add_argument("--match", metavar="TEXT", action="append", default=[],
                    help="only variants whose line contains TEXT (e.g. 'K=128'); may repeat")
    ap.add_argument("--jobs", type=at_least(0), default=0, help="parallel compiles (default 0: the CPU count)")
    args = ap.parse_args(argv)
    if args.sass and nvdisasm() is None:
        print(f"{ap.prog}: {NVDISASM_HINT}", file=sys.stderr)
        return 2
    # a variant that builds for one target only (the wgmma recurrence: sm_90a) is left out elsewhere
    variants = [v for v in select(args.kernel, args.match) if _builds_for(v, _target(v, args))]
    if not variants:
        print(f"{ap.prog}: no variant matches {' and '.join(map(repr, args.match))} (--kernel {args.kernel})",
              file=sys.stderr)
        return 2
    jobs = args.jobs or os.cpu_count() or 1
    failed = 0
    arch_of = {id(v): _target(v, args) for v in variants}
    where = _targets_line(variants, arch_of, args.cc)
    print(f"{len(variants)} variant(s) for {where}, {jobs} parallel compile(s); an estimate follows the first",
          file=sys.stderr, flush=True)

    def timed(v):
        t0 = time.perf_counter()
        return compile_variant(v, arch_of[id(v)], args.sass), time.perf_counter() - t0

    with ThreadPoolExecutor(jobs) as pool:  # NVRTC releases the GIL inside ctypes calls
        for i, (var, (res, seconds)) in enumerate(zip(variants, pool.map(timed, variants))):
            if i == 0 and len(variants) > 1:
                left = seconds * (len(variants) - 1) / jobs
                print(f"  the first took {seconds:.1f} s: about {_duration(left)} for the other "
                      f"{len(variants) - 1}", file=sys.stderr, flush=True)
            smem = var.smem + res.static_smem
            if not res.ok:
                failed += 1
                print(f"{var.label()}  FAILED\n{res.log}", flush=True)
                continue
            over = smem > SMEM_LIMIT.get(arch_of[id(var)], SMEM_LIMIT["sm_90a"])
            failed += over
            mix = " ".join(f"{k}={v}" for k, v in res.sass.items())
            on = f" target={arch_of[id(var)]}" if args.cc else ""
            print(f"{var.label()}  {res.resources} smem={smem}{' OVER-LIMIT' if over else ''}{on} {mix}".rstrip(),
                  flush=True)
    print(f"{len(variants)} variants for {where}, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m kdacupy.compile --arch ARCH``: every kernel variant the library can
launch, through NVRTC, without a GPU.

One line per variant: ``regs=N spill_stores=N spill_loads=N smem=N`` (shared
memory = the variant's dynamic shared memory plus any static), from ptxas'
``-v`` report, built with exactly the options the runtime uses (``jit.NVRTC_OPTIONS``
plus what CuPy adds, ``jit.CUPY_ADDED_OPTIONS``: ``-ftz=true`` among them; CuPy
targets ``sm_90`` / ``sm_100`` on Hopper / Blackwell, also accepted here); with ``--sass`` the cubin is disassembled (pip's
nvidia-cuda-nvdisasm) and the instruction mix that matters is added: tensor-core
MMAs (HMMA), LDSM, local memory (LDL/STL), global loads/stores (LDG/STG).
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
from ..jit.nvrtc import ARCHS, RUNTIME_ARCHS, SMEM_LIMIT, compile_variant
from ..jit.sass import NVDISASM_HINT, nvdisasm
from ..ops.backward import variants as _backward  # noqa: F401  (registers the backward's kernels)
from ..ops.decode import variants as _decode  # noqa: F401  (registers the decode kernel)
from ..ops.forward import variants as _forward  # noqa: F401  (registers the forward's kernels)
from ..ops.seqpar import variants as _seqpar  # noqa: F401  (registers the split's map and scan kernels)
from .args import at_least

KERNELS = {"prepare": ("kda_prepare",), "recurrence": ("kda_recurrence",), "decode": ("kda_decode",),
           "seqpar": ("kda_seqpar_maps", "kda_seqpar_scan"),
           "backward": ("kda_recurrence_store", "kda_bwd_chain", "kda_bwd_chunk", "kda_bwd_reduce")}


def select(kernel: str, match: list) -> list:
    """The registered variants of ``kernel`` ("all": every kernel) whose label contains every TEXT."""
    names = registry.kernels() if kernel == "all" else KERNELS[kernel]
    found = [v for name in names for v in registry.variants(name)]
    return [v for v in found if all(m in v.label() + " " for m in match)]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kdacupy.compile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90a", choices=ARCHS + RUNTIME_ARCHS)
    ap.add_argument("--sass", action="store_true", help="disassemble and count HMMA/LDSM/LDL/STL/LDG/STG")
    ap.add_argument("--kernel", choices=(*KERNELS, "all"), default="all")
    ap.add_argument("--match", metavar="TEXT", action="append", default=[],
                    help="only variants whose line contains TEXT (e.g. 'K=128'); may repeat")
    ap.add_argument("--jobs", type=at_least(0), default=0, help="parallel compiles (default 0: the CPU count)")
    args = ap.parse_args(argv)
    if args.sass and nvdisasm() is None:
        print(f"{ap.prog}: {NVDISASM_HINT}", file=sys.stderr)
        return 2
    variants = select(args.kernel, args.match)
    if not variants:
        print(f"{ap.prog}: no variant matches {' and '.join(map(repr, args.match))} (--kernel {args.kernel})",
              file=sys.stderr)
        return 2
    jobs = args.jobs or os.cpu_count() or 1
    failed = 0
    print(f"{len(variants)} variant(s) for {args.arch}, {jobs} parallel compile(s); an estimate follows the first",
          file=sys.stderr, flush=True)

    def timed(v):
        t0 = time.perf_counter()
        return compile_variant(v, args.arch, args.sass), time.perf_counter() - t0

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
            over = smem > SMEM_LIMIT[args.arch]
            failed += over
            mix = " ".join(f"{k}={v}" for k, v in res.sass.items())
            print(f"{var.label()}  {res.resources} smem={smem}{' OVER-LIMIT' if over else ''} {mix}".rstrip(),
                  flush=True)
    print(f"{len(variants)} variants for {args.arch}, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

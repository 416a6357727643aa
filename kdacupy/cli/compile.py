"""``python -m kdacupy.compile --arch ARCH``: every kernel variant the library can
launch, through NVRTC, without a GPU.

One line per variant: ``regs=N spill_stores=N spill_loads=N smem=N`` (shared
memory = the variant's dynamic shared memory plus any static), from ptxas'
``-v`` report, built with exactly the options the runtime uses (``jit.NVRTC_OPTIONS``
plus what CuPy adds, ``jit.CUPY_ADDED_OPTIONS``: ``-ftz=true`` among them; CuPy
targets ``sm_90`` / ``sm_100`` on Hopper / Blackwell, also accepted here); with ``--sass`` the cubin is disassembled (pip's
nvidia-cuda-nvdisasm) and the instruction mix that matters is added: tensor-core
MMAs (HMMA), LDSM, local memory (LDL/STL), global loads/stores (LDG/STG).
Exit status 1 if any variant fails to compile.

NVRTC is called through ctypes, not ``cupy.RawModule`` (which asks the GPU for
its architecture) and not CuPy's ``nvrtc.getCUBIN`` (CuPy 14.2 returns the cubin
one byte short, which the binary tools reject).
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

from ..jit import loaders as jit
from ..numerics.dtypes import BF16, F16, F32, dtype_name
from ..ops.decode.kernels import DecodeTiles, DecodeVariant, decode_candidates
from ..ops.forward.kernels import BETA_CODE, GATE_CODE, PrepareVariant, RecurrenceVariant
from ..ops.forward.tuning import TILE_SPACE

ARCHS = ("sm_80", "sm_90a", "sm_100a")
#: the targets CuPy itself builds for on Hopper / Blackwell (it never adds the "a" suffix)
RUNTIME_ARCHS = ("sm_90", "sm_100")
#: shared memory a block may use, per arch (opt-in maximum)
SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024, "sm_100a": 227 * 1024, "sm_90": 227 * 1024,
              "sm_100": 227 * 1024}
DIMS = (64, 128, 256)
DTYPES = (BF16, F16, F32)


@lru_cache(maxsize=None)
def _nvrtc():
    from cuda.pathfinder import load_nvidia_dynamic_lib

    lib = ctypes.CDLL(load_nvidia_dynamic_lib("nvrtc").abs_path)
    for name in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
                 "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram"):
        getattr(lib, name).restype = ctypes.c_int
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


@dataclass
class CompileResult:
    ok: bool
    log: str
    cubin: bytes = b""
    regs: int = -1
    spill_stores: int = -1
    spill_loads: int = -1
    stack: int = -1
    static_smem: int = 0
    sass: dict = field(default_factory=dict)

    @property
    def resources(self) -> str:
        return (f"regs={self.regs} spill_stores={self.spill_stores} spill_loads={self.spill_loads} "
                f"stack={self.stack}")


def nvrtc_compile(source: str, arch: str, options=()) -> CompileResult:
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    check = lambda rc, what: rc == 0 or (_ for _ in ()).throw(  # noqa: E731
        RuntimeError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}"))
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None), "create")
    opts = [*jit.NVRTC_OPTIONS, *jit.CUPY_ADDED_OPTIONS, f"--gpu-architecture={arch}", "--ptxas-options=-v",
            *options]
    argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    try:
        rc = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc != 0:
            return CompileResult(False, log)
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(prog, cubin), "getCUBIN")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    res = CompileResult(True, log, cubin.raw)
    m = re.search(r"Used (\d+) registers", log)
    res.regs = int(m.group(1)) if m else -1
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if m:
        res.stack, res.spill_stores, res.spill_loads = map(int, m.groups())
    m = re.search(r"(\d+) bytes smem", log)
    res.static_smem = int(m.group(1)) if m else 0
    return res


SASS_OPS = ("HMMA", "LDSM", "LDL", "STL", "LDG", "STG", "LDGSTS", "MUFU")


def sass_mix(cubin: bytes) -> dict:
    """Instruction counts of a cubin (static, as disassembled)."""
    from cuda.pathfinder import find_nvidia_binary_utility

    tool = find_nvidia_binary_utility("nvdisasm")
    if tool is None:
        raise RuntimeError("--sass needs nvdisasm: pip install nvidia-cuda-nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, f.name], capture_output=True, text=True, check=True).stdout
    ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", text, re.M)
    return {op: sum(1 for x in ops if x == op) for op in SASS_OPS}


def arch_of_device() -> str:
    """The target cupy.RawModule compiles for on this device: sm_<cc>, no "a" suffix."""
    import cupy

    return f"sm_{cupy.cuda.Device().compute_capability}"


# ---------------------------------------------------------------------------
# every variant the library can launch


def prepare_variants():
    for K, dt, gate, l2 in itertools.product(DIMS, DTYPES, GATE_CODE, (False, True)):
        for gdt in dict.fromkeys((dt, F32)):
            for beta_mode in BETA_CODE:
                for bdt in ((dt,) if beta_mode == "none" else dict.fromkeys((dt, F32))):
                    yield PrepareVariant(K, dt, gdt, bdt, gate, beta_mode, l2)


def recurrence_variants():
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in TILE_SPACE:
            if tiles.BV <= V:
                yield RecurrenceVariant(K, V, dt, fp32, tiles)


def decode_variants():
    """Decode: every shape, dtype, pool and layout at the Kimi options, with every
    tile configuration at K = V = 128 (what the tuner tries) and the heuristic's
    two elsewhere; every gate / beta / l2norm / input-dtype option at K = V = 128."""
    for K, V, dt, pool, layout in itertools.product(DIMS, DIMS, DTYPES, (BF16, F32), ("vk", "kv")):
        tried = decode_candidates(K, V) if (K, V) == (128, 128) else [DecodeTiles(16, 4), DecodeTiles(8, 4)]
        for tiles in tried:
            yield DecodeVariant(K, V, dt, dt, dt, "sigmoid", "sigmoid", True, pool, layout, tiles)
    for dt, gate, l2 in itertools.product(DTYPES, GATE_CODE, (False, True)):
        for gdt in dict.fromkeys((dt, F32)):
            for beta_mode in BETA_CODE:
                for bdt in ((dt,) if beta_mode == "none" else dict.fromkeys((dt, F32))):
                    if (gate, beta_mode, l2, gdt, bdt) != ("sigmoid", "sigmoid", True, dt, dt):
                        yield DecodeVariant(128, 128, dt, gdt, bdt, gate, beta_mode, l2, BF16, "vk",
                                            DecodeTiles())



def seqpar_variants():
    """Sequence parallelism: the recurrence's map variants (fp32 state, no
    output) and the scan kernel."""
    from ..ops.seqpar.split import ScanVariant

    for K, V, dt in itertools.product(DIMS, DIMS, DTYPES):
        for tiles in TILE_SPACE:
            if tiles.BV <= V:
                yield RecurrenceVariant(K, V, dt, True, tiles, no_output=True)
    for K, V in itertools.product(DIMS, DIMS):
        yield ScanVariant(K, V)


def label(var) -> str:
    if isinstance(var, DecodeVariant):
        return (f"kda_decode K={var.K} V={var.V} dt={dtype_name(var.dtype)} g={dtype_name(var.g_dtype)} "
                f"beta={var.beta_mode}:{dtype_name(var.beta_dtype)} gate={var.gate} l2norm={int(var.l2norm)} "
                f"pool={dtype_name(var.pool_dtype)} layout={var.layout} BV={var.tiles.BV} warps={var.tiles.warps}")
    if getattr(var, "kernel", None) == "kda_seqpar_scan":
        return f"kda_seqpar_scan K={var.K} V={var.V}"
    if isinstance(var, PrepareVariant):
        return (f"kda_prepare K={var.K} dt={dtype_name(var.dtype)} g={dtype_name(var.g_dtype)} "
                f"beta={var.beta_mode}:{dtype_name(var.beta_dtype)} gate={var.gate} l2norm={int(var.l2norm)}")
    return (f"kda_recurrence K={var.K} V={var.V} dt={dtype_name(var.dtype)} "
            f"state={'fp32' if var.state_fp32 else 'bf16'} BV={var.tiles.BV} stages={var.tiles.stages}"
            + (" no_output" if var.no_output else ""))


def compile_variant(var, arch: str, sass: bool = False) -> CompileResult:
    kernel = getattr(var, "kernel", None) or ("kda_prepare" if isinstance(var, PrepareVariant) else
                                             "kda_decode" if isinstance(var, DecodeVariant) else "kda_recurrence")
    res = nvrtc_compile(jit.render(kernel, var.config()), arch)
    if res.ok and sass:
        res.sass = sass_mix(res.cubin)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kdacupy.compile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90a", choices=ARCHS + RUNTIME_ARCHS)
    ap.add_argument("--sass", action="store_true", help="disassemble and count HMMA/LDSM/LDL/STL/LDG/STG")
    ap.add_argument("--kernel", choices=("prepare", "recurrence", "decode", "seqpar", "all"), default="all")
    ap.add_argument("--match", metavar="TEXT", action="append", default=[],
                    help="only variants whose line contains TEXT (e.g. 'K=128'); may repeat")
    ap.add_argument("--jobs", type=int, default=0, help="parallel compiles (default: CPU count)")
    args = ap.parse_args(argv)
    variants = []
    if args.kernel in ("prepare", "all"):
        variants += list(prepare_variants())
    if args.kernel in ("recurrence", "all"):
        variants += list(recurrence_variants())
    if args.kernel in ("decode", "all"):
        variants += list(decode_variants())
    if args.kernel in ("seqpar", "all"):
        variants += list(seqpar_variants())
    variants = [v for v in variants if all(m in label(v) + " " for m in args.match)]
    import os
    jobs = args.jobs or os.cpu_count() or 1
    failed = 0
    with ThreadPoolExecutor(jobs) as pool:  # NVRTC releases the GIL inside ctypes calls
        for var, res in zip(variants, pool.map(lambda v: compile_variant(v, args.arch, args.sass), variants)):
            smem = var.smem + res.static_smem
            if not res.ok:
                failed += 1
                print(f"{label(var)}  FAILED\n{res.log}", flush=True)
                continue
            over = smem > SMEM_LIMIT[args.arch]
            failed += over
            mix = " ".join(f"{k}={v}" for k, v in res.sass.items())
            print(f"{label(var)}  {res.resources} smem={smem}{' OVER-LIMIT' if over else ''} {mix}".rstrip(),
                  flush=True)
    print(f"{len(variants)} variants for {args.arch}, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

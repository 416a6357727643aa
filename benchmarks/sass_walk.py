"""An independent count of the instructions each warp issues per chunk in the Kimi forward's two
kernels on sm_90a: a walk through the SASS that says, block by block, how often each warp runs it
per chunk, derived by hand from the source's conditions (not from the emulation, not from the
profile's fit). The script checks that the walk is a path of the SASS's control-flow graph (every
block it runs has a predecessor it runs, or is the loop's head; every branch it runs goes on
somewhere it runs), then sums the block sizes. docs/design.md section 11.4 compares it with
``python -m kdacupy.profile --shape T=8192,H=64`` (benchmarks/issue-validation.md).

    PYTHONPATH=. python benchmarks/sass_walk.py

The walks name blocks by index in this NVRTC's SASS of these variants (printed with their source
lines, so a reader can follow each decision); another NVRTC or a kernel change needs a new walk
(the check above then fails first).
"""
from __future__ import annotations

import sys

from kdacupy.cli.profile import forward_records
from kdacupy.cli.shapes import Shape
from kdacupy.emulate import source_text
from kdacupy.jit import sass_cfg
from kdacupy.jit.render import line_origins

ARCH = "sm_90a"

# kda_recurrence, wgmma, K = V = 128, BV = 64, 3 stages: the chunk loop, head block 93.
# 93 loop head (a copy to issue for chunk c + 2) -> 94; 94 `if (warp == 0)` -> 101 for warps 1-3;
# warp 0: 95 `if (lane == 0)` -> 96, 97 (the barrier's arm and the block's one bulk copy: ptxas
# loops over the lanes, one lane), 98 `if (lane < rows)` -> 99, 100 x 16 (a bulk copy per value
# row, one lane per trip); 101 reconverges; 102 the ragged tail's zeroing loop (full chunks: none)
# -> 110; 111 the mbarrier wait (passes: no retry); 112 the wgmma and the state update; 113 the
# output's rows; 114, 115 the state's fp32 FMA and the loop's end.
RECURRENCE_ALL = {93: 1, 94: 1, 101: 1, 102: 1, 110: 1, 111: 1, 112: 1, 113: 1, 114: 1, 115: 1}
RECURRENCE_WARP0 = {95: 1, 96: 1, 97: 1, 98: 1, 99: 1, 100: 16}
RECURRENCE = ("kda_recurrence", 93, {0: {**RECURRENCE_ALL, **RECURRENCE_WARP0}, 1: RECURRENCE_ALL,
                                     2: RECURRENCE_ALL, 3: RECURRENCE_ALL})

# kda_prepare (core-layout workspace, bf16, Kimi's options), the slot loop, head block 18; a CTA
# walks 8 slots (4096 CTAs over 512 chunks x 64 heads), the Kimi inputs take the factored form.
# 18 locate(slot), cu_seqlens null -> 27 (not the bisection 19-26); 28 first_slot -> 30; 31 a used
# slot -> 32; 33 rows > 0 -> 34; 34-39 q, k rows of live threads (every row is live); 40 the gate,
# dt_bias 16-byte aligned -> 42 (vector loads); 43 `tid < CHUNK` (warp 0) -> 44, 45 (beta), 46, 47;
# 48, 49 locate(slot + 1): the CTA's last slot (1 in 8) skips 50-64 and the stage's copies 66;
# 50 -> 59, 60 -> 62, 63 -> 64 as for 18-32; 65, 66 the copies; 67-70 the cumulative gate (one
# channel a thread: one trip of 69); 71-76 the decayed operands, twice (PPS = 2), factored -> 72,
# 75; 77 `if (unsafe)` -> 79; 80 `if (!unsafe)` -> 81; 81 `warp == 0` -> 82 (bf16_abt<1>); 83
# `warp == 1` -> 84, 85 x 3 (bf16_abt<3>'s passes), 86; 101 [7] and [9], p = tid, tid + 128: the
# loop unrolled by two, even trips -> 104, 105 -> 106 once; 108 `tid < CHUNK` (warp 0) -> 109 (the
# inverse's column); 129, 130 the loop's end.
LAST = 1 / 8  # the CTA's last slot: no next chunk to locate or copy
PREPARE_ALL = {18: 1, 27: 1, 28: 1, 30: 1, 31: 1, 32: 1, 33: 1, 34: 1, 35: 1, 36: 1, 37: 1, 38: 1, 39: 1, 40: 1, 42: 1,
               43: 1, 48: 1, 49: 1, 50: 1 - LAST, 59: 1 - LAST, 60: 1 - LAST, 62: 1 - LAST, 63: 1 - LAST, 64: 1 - LAST,
               65: 1, 66: 1 - LAST, 67: 1, 68: 1, 69: 1, 70: 1, 71: 1, 72: 1, 73: 1, 74: 1, 75: 1, 76: 1, 77: 1, 79: 1,
               80: 1, 81: 1, 83: 1, 101: 1, 102: 1, 104: 1, 105: 1, 106: 1, 107: 1, 108: 1, 129: 1, 130: 1}
PREPARE = ("kda_prepare", 18, {0: {**PREPARE_ALL, 44: 1, 45: 1, 46: 1, 47: 1, 82: 1, 109: 1},
                               1: {**PREPARE_ALL, 84: 1, 85: 3, 86: 1}, 2: PREPARE_ALL, 3: PREPARE_ALL})


def sources() -> dict:
    """{kernel: rendered source} of the Kimi forward's variants on sm_90a (a short emulated run: the
    variants do not depend on T)."""
    recs, _ = forward_records(Shape("kimi-variants", 64, 64), 1, 132, ARCH)
    return {r["kernel"]: source_text(r["source"]) for r in recs}


def check(fn, head: int, walk: dict, warp: int) -> None:
    """The walk is a path: each block it runs (but the head) has a predecessor it runs; each block it
    runs has a successor it runs, or goes back to the head."""
    preds: dict = {}
    for b, blk in enumerate(fn.blocks):
        for s in blk.succ:
            preds.setdefault(s, set()).add(b)
    for b in walk:
        if b != head and not preds.get(b, set()) & set(walk):
            sys.exit(f"warp {warp}: block {b} runs, but none of its predecessors {sorted(preds.get(b, ()))} does")
        if not set(fn.blocks[b].succ) & (set(walk) | {head}):
            sys.exit(f"warp {warp}: block {b} runs, but none of its successors {fn.blocks[b].succ} does")


def main() -> None:
    srcs = sources()
    for kernel, head, walks in (RECURRENCE, PREPARE):
        src = srcs[kernel]
        fn = sass_cfg.kernel_sass(src, ARCH)[kernel]
        origins = line_origins(src)
        print(f"== {kernel} ({ARCH}): {len(fn.instrs)} instructions; per chunk, per warp")
        for warp, walk in walks.items():
            check(fn, head, walk, warp)
            total = sum(n * fn.blocks[b].size for b, n in walk.items())
            print(f"warp {warp}: {total:.0f}")
        print("blocks (size, runs per chunk by warps 0-3, source line of their last instruction):")
        for b in sorted({b for w in walks.values() for b in w}):
            last = fn.instrs[fn.blocks[b].end - 1]
            o = origins[last.lines[0] - 1] if last.lines else None
            runs = " ".join(f"{walks[w].get(b, 0):g}" for w in sorted(walks))
            print(f"  {b:4d} {fn.blocks[b].size:4d}  [{runs}]  {(last.guard or '') + ' ' + last.op:24} "
                  f"{f'kernels/{o[0]}:{o[1]}' if o else '-'}")


if __name__ == "__main__":
    main()

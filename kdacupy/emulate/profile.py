"""The counters of emulated launches (KDACUPY_EMULATE_PROFILE=1; profile.h computes them):
one record per launch, in launch order, kept in this process until profile_reset().

A record is a dict: "kernel" (its name), "grid", "block", "shared_mem", "source" (the sha256
of the rendered source; ``source_text`` gives it back, e.g. for NVRTC), the counters
(profile.h's names: smem_requests, smem_wavefronts, smem_wavefronts_ideal, gmem_requests,
gmem_sectors, gmem_bytes, dram_bytes, mma, ldmatrix, cp_async_bytes, barriers, ctas, warps,
...; the dependent path's steps per kind, path_max_<kind> of the CTA with the longest path and
path_sum_<kind> over all CTAs, and inflight_peak_bytes, the most bytes of global loads one CTA
had in flight: docs/design.md section 11.1; Hopper's wgmma, wgmma_smem_bytes, bulk_copy_bytes and
mbarrier_waits; Blackwell's tcgen05_flop, tcgen05_smem_bytes (tcgen05.mma's A and B, each read once),
tmem_ld_bytes (tcgen05.ld, per thread) and tmem_cols (tensor-memory columns allocated, summed over CTAs)), "dram_by_argument" ({kernel parameter name: [bytes read, bytes written]} of the DRAM
sectors of each array argument; arrays sharing an allocation are counted under the first; what
only raw addresses reach is in the totals alone) and "sites": per code address of the instrumented library [offset, kind (1 shared,
2 global), requests, wavefronts or sectors, ideal wavefronts or bytes, write], which
``hotspots`` turns into source lines; "anchors": the issue anchors (profile.h), per warp of the CTA,
code address and calling context [offset, class name, warp, warp executions, lane executions,
bytes per lane (loads, stores, atomics), (caller offsets, outermost first)], summed over the CTAs, which kdacupy/cli/issue.py fits the
SASS's block counts to.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .sources import source_location

SLOTS = 64  # profile.h's PR_OUT: the counters, the last slot the number of sites
#: kinds of dependent step on a path (profile.h's PK_*, in its order)
PATH_KINDS = ("issue", "dram", "smem", "ldmatrix", "mma", "sfu", "shuffle", "barrier")
#: counters that are a maximum over a launch's CTAs, not a sum: launches and head slices do not add them
MAX_COUNTERS = tuple(f"path_max_{k}" for k in PATH_KINDS) + ("inflight_peak_bytes",)
SITES = 4096  # code addresses kept per launch
FIELDS = 6
ANCHORS = 16384  # issue anchor rows kept per launch (per worker thread: each appends its own)
CALLERS = 16  # cuda_emu.h's KDA_EMU_CALLERS
ANCHOR_FIELDS = 7 + CALLERS
_records: list[dict] = []
_names: dict[int, list[str]] = {}  # per library handle
_sources: dict[str, str] = {}  # sha256 -> rendered source, of the sources recorded
_lock = threading.Lock()
_forced = [0]  # open counting() blocks


@contextmanager
def counting():
    """Count every emulated launch of this process inside the block, as KDACUPY_EMULATE_PROFILE=1
    does, starting from no records; yields the list that receives the block's records at its end."""
    out: list[dict] = []
    with _lock:
        _forced[0] += 1
        _records.clear()
    try:
        yield out
    finally:
        with _lock:
            _forced[0] -= 1
            out.extend(_records)
            _records.clear()


def forced() -> bool:
    return _forced[0] > 0


def buffers():
    """Zeroed output arrays of one launch: (counters, sites, anchors)."""
    return ((ctypes.c_longlong * SLOTS)(), (ctypes.c_longlong * (SITES * FIELDS))(),
            (ctypes.c_longlong * (ANCHORS * ANCHOR_FIELDS))())


def anchor_classes(lib: ctypes.CDLL) -> list[str]:
    """The issue anchors' class names, in the library's order (kda_emu_anchor_classes)."""
    key = ("anchors", lib._handle)
    if key not in _names:
        fn = lib.kda_emu_anchor_classes
        fn.restype = ctypes.c_char_p
        _names[key] = [n for n in fn().decode().split(",") if n]
    return _names[key]


def _anchor_rows(lib: ctypes.CDLL, counters, anchors) -> list[list]:
    """The anchors of a launch, equal (offset, class, warp, callers) rows of its worker threads added up."""
    classes = anchor_classes(lib)
    out: dict = {}
    n = int(counters[SLOTS - 2])
    for r in np.frombuffer(anchors, dtype=np.int64, count=n * ANCHOR_FIELDS).reshape(n, ANCHOR_FIELDS).tolist():
        key = (r[0], r[1], r[2], tuple(r[7:7 + r[6]]))
        got = out.get(key)
        if got is None:
            out[key] = [key[0], classes[key[1]], key[2], r[3], r[4], r[5], list(key[3])]
        else:
            got[3] += r[3]
            got[4] += r[4]
            got[5] = max(got[5], r[5])
    return list(out.values())


def counter_names(lib: ctypes.CDLL) -> list[str]:
    """The counters' names, in the library's order (kda_emu_profile_names)."""
    key = lib._handle
    if key not in _names:
        fn = lib.kda_emu_profile_names
        fn.restype = ctypes.c_char_p
        _names[key] = [n for n in fn().decode().split(",") if n]
    return _names[key]


def record(kernel: str, lib: ctypes.CDLL, path: Path, source: str, grid, block, shared_mem: int, out,
           by_argument=()) -> dict:
    counters, sites, anchors = out
    names = counter_names(lib)
    sha = hashlib.sha256(source.encode()).hexdigest()
    rec = {"kernel": kernel, "grid": list(grid), "block": list(block), "shared_mem": shared_mem, "source": sha}
    rec.update({n: int(counters[i]) for i, n in enumerate(names)})
    n = int(counters[SLOTS - 1])
    rec["sites"] = [[int(sites[i * FIELDS + f]) for f in range(FIELDS)] for i in range(n)]
    rec["anchors"] = _anchor_rows(lib, counters, anchors)
    rec["anchors_dropped"] = int(counters[SLOTS - 3])  # rows past ANCHORS: the issue term refuses the record
    rec["dram_by_argument"] = {name: [int(rd), int(wr)] for name, rd, wr in by_argument if rd or wr}
    rec["library"] = str(path)
    with _lock:
        _records.append(rec)
        _sources.setdefault(sha, source)
    return rec


def source_text(sha: str) -> str | None:
    """The rendered source a record's "source" names (of a launch of this process), or None."""
    return _sources.get(sha)


def profile_records() -> list[dict]:
    """The records of the launches since the last profile_reset(), oldest first (copies)."""
    with _lock:
        return [dict(r) for r in _records]


def profile_reset() -> None:
    """Forget every record."""
    with _lock:
        _records.clear()


def hotspots(rec: dict, n: int = 5) -> list[dict]:
    """The ``n`` source lines of a record that waste most: shared-memory instructions by
    wavefronts over the ideal, global ones by sectors over what their bytes need; each as
    {"where", "space", "requests", "wavefronts"/"sectors", "ideal"/"bytes", "excess", "write"}."""
    rows = []
    for off, kind, req, a, b, write in rec.get("sites", []):
        if kind == 1:
            rows.append(dict(space="shared", offset=off, requests=req, wavefronts=a, ideal=b, excess=a - b,
                             write=bool(write)))
        elif kind == 2:
            rows.append(dict(space="global", offset=off, requests=req, sectors=a, bytes=b,
                             excess=a - -(-b // 32), write=bool(write)))
    rows = sorted((r for r in rows if r["excess"] > 0), key=lambda r: -r["excess"])[:n]
    lib = Path(rec["library"])
    src = lib.with_suffix(".cpp")
    text = src.read_text(errors="replace").split("\n") if src.is_file() else []
    for r in rows:
        r["where"] = source_location(lib, f"{r.pop('offset'):x}", text)
    return rows

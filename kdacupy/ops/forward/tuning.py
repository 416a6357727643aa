"""Tile configurations: the space the tuner searches, and the choice at run time.

Where the choice comes from, for a problem on the GPU (``select_tiles``):

1. the user's tuning file ``$KDACUPY_TUNING_DIR/<model>.yaml`` (else
   ``~/.cache/kdacupy/tuning/<model>.yaml``): what ``python -m kdacupy.tune``
   writes by default. It comes first on purpose, so a fresh tuning run takes
   effect at once even for a GPU model the package ships a file for;
2. the shipped file ``kdacupy.paths.tuning_dir()/<model>.yaml``;
3. the heuristic below (``heuristic``), marked "heuristic (untuned)".

``<model>`` is the CUDA device name with every character that is not a letter
or digit replaced by ``-`` (``NVIDIA H200`` -> ``NVIDIA-H200``). A file is
searched for the problem's shape bucket (``bucket_of``) by exact match; a
bucket missing from a file falls through to the next source. A file that cannot
be read, is not valid YAML, does not follow schema 1 exactly, or was tuned on
another GPU model gives one ``warnings.warn`` (per file, per process) and is
ignored as a whole: never a crash, never a configuration outside ``TILE_SPACE``.
CPU problems (the emulation) use the heuristic with ``DEFAULT_SM_COUNT``.

Cost per call: files are parsed once per process; the choice is cached per
(device, user directory, bucket), so a call computes the bucket (a few integer
operations) and does one dict lookup. No device memory is read (``cu_seqlens``
values never are), nothing synchronises, and CuPy is imported only when a
device problem first asks for the device's name and SM count.

Schema 1 (see tuning/README.md)::

    schema: 1
    gpu: NVIDIA H200            # cudaDeviceProp.name; must equal the device's
    sm_count: 132
    cuda: 13000                 # CUDA runtime version the tuner ran with
    kdacupy: 0.1.0
    date: '2025-01-31'
    buckets:
    - match: {K: 128, V: 128, dtype: bfloat16, state_precision: bf16, varlen: false,
              parallelism: '<1', seqlen: '<=8192'}
      config: {BV: 32, stages: 2}   # optional mma: wgmma (sm_90a; default sync)
      time_ms: 0.812
      runner_up: {config: {BV: 32, stages: 3}, time_ms: 0.830}    # or null
      margin: 0.022             # runner_up.time_ms / time_ms - 1; null without a runner-up
"""
from __future__ import annotations

import datetime
import math
import os
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from ... import env


MMA_FAMILIES = ("sync", "wgmma", "tcgen05")
#: the families that read the core-matrix workspace through descriptors (the prepare's KDA_WS_CORE)
CORE_FAMILIES = ("wgmma", "tcgen05")


@dataclass(frozen=True)
class TileConfig:
    BV: int = 64  # value rows per CTA of the recurrence (16 per warp): the value-split factor is V / BV
    stages: int = 2  # cp.async pipeline depth of the recurrence
    mma: str = "sync"  # the recurrence's MMA family: mma.sync, wgmma or tcgen05 (sm_90a / sm_100a, BV = 64 or 128)

    def __post_init__(self):
        if self.BV not in (16, 32, 64, 128) or self.stages not in (1, 2, 3):
            raise ValueError(f"tiles: BV in (16, 32, 64, 128) and stages in (1, 2, 3), got {self}")
        if self.mma not in MMA_FAMILIES or (self.mma != "sync" and (self.BV < 64 or self.stages < 2)):
            raise ValueError(f"tiles: mma in {MMA_FAMILIES}, wgmma and tcgen05 with BV in (64, 128) and 2 or 3 "
                             f"stages, got {self}")


DEFAULT_SM_COUNT = 132  # an H100 / H200, when no device is at hand (emulation)

#: every tile configuration a kernel variant can be built with (mma.sync)
TILE_SPACE = tuple(TileConfig(bv, st) for bv in (16, 32, 64, 128) for st in (2, 3))
#: the wgmma recurrence's (sm_90a; K <= 128): one or two warpgroups a CTA
WGMMA_SPACE = tuple(TileConfig(bv, st, "wgmma") for bv in (64, 128) for st in (2, 3))
#: the tcgen05 recurrence's (sm_100a; K <= 128): M = 128, a value row a thread, or M = 64, two threads a row
TCGEN05_SPACE = tuple(TileConfig(bv, st, "tcgen05") for bv in (64, 128) for st in (2, 3))

SCHEMA = 1
HEURISTIC_SOURCE = "heuristic (untuned)"


def candidates(V: int, arch: str | None = None, K: int | None = None) -> list[TileConfig]:
    """The configurations the tuner tries for value head dim V (BV <= V); on ``arch`` sm_90a
    also the wgmma ones for key dim K <= 128, on sm_100a the tcgen05 ones (the tuner times both
    families there)."""
    out = [t for t in TILE_SPACE if t.BV <= V]
    if arch == "sm_90a" and (K is None or K <= 128):
        out += [t for t in WGMMA_SPACE if t.BV <= V]
    if arch == "sm_100a" and (K is None or K <= 128):
        out += [t for t in TCGEN05_SPACE if t.BV <= V]
    return out


def heuristic(p, sm_count=DEFAULT_SM_COUNT, arch: str | None = None) -> TileConfig:
    """Untuned choice: split V until there are at least two recurrence CTAs per
    SM (the recurrence is latency-bound, so idle SMs cost most), but keep two
    warps per CTA at least.

    With CTAs = N * HV * (V / BV): the largest BV in (128, 64, 32), BV <= V,
    with CTAs >= 2 * sm_count, else BV = 32 (16 for V <= 16); always 2 stages. It never
    picks BV = 16 or 3 stages (the tuner tries them).

    On ``arch`` sm_90a, for the forward (``select_tiles(p, wgmma=True)``), the wgmma recurrence
    where it serves the problem (K <= 128, V >= 64; ``kernels.wgmma_supported``): BV = 128 (two
    warpgroups sharing one copy of each chunk block) once that gives half a CTA per SM or more,
    else 64 (one warpgroup; below, more SMs at work beat the shared copy), and 3 stages (a chunk's
    copies then have two chunks' time to land, which the DRAM latency needs). The profiler's
    Kimi prediction (benchmarks/forward-step2.md) puts it ahead of mma.sync at every BV there: each
    warpgroup reads a chunk's B tiles from shared memory once and the bulk copies move the block
    without the threads, so the shared-memory term, which bound mma.sync, falls below the HBM
    one. sm_80 and sm_100a (no wgmma) keep mma.sync, as do head dims off the tiles (their any-size
    variants are mma.sync's: kernels.recurrence_mma).

    On ``arch`` sm_100a (mma.sync) the forward takes the issue-aware profile's choice on the B200
    (benchmarks/issue-term.md): the chains' CTAs fill the SMs once, each streaming its chunk blocks
    with its lanes' cp.async, so four warps a CTA (BV = 64) issue the fewest instructions a chunk on
    their schedulers, and a second CTA on an SM shares them: BV = 64 where N * HV * V / 64 CTAs are
    fewer than the SMs (a bucket's bound: parallelism_class), else BV = 128 (one CTA a chain, V >= 128), 3 stages (kimi-T8192-H64 0.476 -> 0.368 ms,
    H96 0.713 -> 0.629 ms against BV = 32, 2 stages). With K <= 128 the tcgen05 recurrence runs those
    tiles (the products on the tensor cores from tensor memory; BV = 128: a value row a thread, BV = 64:
    two threads a row): the B200 model's recurrence at kimi-T8192-H96 0.402 -> 0.243 ms, at H64 0.217
    -> 0.188 (forwards 0.629 -> 0.469, 0.368 -> 0.338; benchmarks/blackwell.md). At BV = 64 only where
    the chains fill the SMs once, as mma.sync's rule has it: beyond, two such CTAs an SM share their
    schedulers and BV = 128 wins (H96: 0.375 against 0.243 ms). sm_80 keeps the rule above (no A100
    model)."""
    from ...numerics.tiles import exact_dims

    if arch == "sm_90a" and exact_dims(p.K, p.V) and p.K <= 128 and p.V >= 64:
        BV = 128 if p.V >= 128 and 2 * p.N * p.HV * (p.V // 128) >= sm_count else 64
        return TileConfig(BV, 3, "wgmma")
    if arch == "sm_100a" and exact_dims(p.K, p.V):
        BV = 64 if p.V < 128 or p.N * p.HV * (p.V // 64) < sm_count else 128
        return TileConfig(BV, 3, "tcgen05" if p.K <= 128 else "sync")
    for BV in (128, 64, 32):
        if BV <= p.V and p.N * p.HV * (p.V // BV) >= 2 * sm_count:
            return TileConfig(BV, 2)
    return TileConfig(16 if p.V <= 16 else 32, 2)  # (V in (16, 32): one CTA of 32 rows, the rest masked)


# ---------------------------------------------------------------------------
# shape buckets

#: parallelism classes: N * HV recurrence rows per SM, upper bounds (the last has none)
PARALLELISM = (("<0.25", 0.25), ("<0.5", 0.5), ("<1", 1.0), ("<2", 2.0), (">=2", math.inf))
#: length classes: tokens per sequence (T; T / N with cu_seqlens), inclusive upper bounds
SEQLEN = (("<=1024", 1024), ("<=8192", 8192), (">8192", math.inf))
DIMS = (64, 128, 256)
DTYPE_NAMES = ("bfloat16", "float16", "float32")
STATE_PRECISIONS = ("bf16", "fp32")
BUCKET_FIELDS = ("K", "V", "dtype", "state_precision", "varlen", "parallelism", "seqlen")


def parallelism_class(rows: int, sm_count: int) -> str:
    load = rows / max(1, sm_count)
    return next(name for name, bound in PARALLELISM if load < bound)


def seqlen_class(length: float) -> str:
    return next(name for name, bound in SEQLEN if length <= bound)


def bucket_of(p, sm_count: int = DEFAULT_SM_COUNT) -> dict:
    """The tuning bucket of a Problem: K, V (their tiles), dtype name, state precision,
    varlen, the parallelism class of N * HV against ``sm_count`` and the length
    class of one sequence (T; T / N for varlen, from shapes only)."""
    from ...numerics.dtypes import dtype_name

    from ...numerics.tiles import tile_of

    length = p.T / max(1, p.N) if p.varlen else p.T
    # a head dim without variants of its own runs on its tiles' (kdacupy/numerics/tiles.py): their bucket
    return dict(K=tile_of(int(p.K)), V=tile_of(int(p.V)), dtype=dtype_name(p.dtype), state_precision=str(p.state_precision),
                varlen=bool(p.varlen), parallelism=parallelism_class(p.N * p.HV, sm_count),
                seqlen=seqlen_class(length))


def bucket_key(bucket: dict) -> tuple:
    return tuple(bucket[f] for f in BUCKET_FIELDS)


def bucket_label(bucket: dict) -> str:
    return (f"K={bucket['K']} V={bucket['V']} {bucket['dtype']} state={bucket['state_precision']} "
            f"{'varlen' if bucket['varlen'] else 'fixed'} par{bucket['parallelism']} len{bucket['seqlen']}")


# ---------------------------------------------------------------------------
# files

def model_name(device_name: str) -> str:
    """File stem for a GPU model: non-alphanumerics replaced by '-'."""
    return re.sub(r"[^A-Za-z0-9]", "-", device_name.strip())


def user_dir() -> Path:
    d = env.get("KDACUPY_TUNING_DIR")
    return Path(d) if d else Path(os.path.expanduser("~/.cache/kdacupy/tuning"))


def shipped_dir() -> Path:
    from ...paths import tuning_dir

    return tuning_dir()


class TuningFileError(ValueError):
    """A tuning file's content does not follow the schema."""


def config_dict(c: TileConfig) -> dict:
    """A config as the file writes it: ``mma`` only when it is not the default mma.sync."""
    return dict(BV=c.BV, stages=c.stages, **({} if c.mma == "sync" else dict(mma=c.mma)))


@dataclass(frozen=True)
class Entry:
    match: dict
    config: TileConfig
    time_ms: float
    runner_up: tuple | None  # (TileConfig, time_ms)
    margin: float | None

    def to_dict(self) -> dict:
        ru = None
        if self.runner_up is not None:
            ru = dict(config=config_dict(self.runner_up[0]), time_ms=round(float(self.runner_up[1]), 6))
        return dict(match=dict(self.match), config=config_dict(self.config),
                    time_ms=round(float(self.time_ms), 6), runner_up=ru,
                    margin=None if self.margin is None else round(float(self.margin), 6))


@dataclass(frozen=True)
class Table:
    path: str
    gpu: str
    sm_count: int
    cuda: object
    kdacupy: str
    date: str
    entries: dict  # bucket_key -> Entry


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


def _keys(where, d, required, optional=()):
    if not isinstance(d, dict):
        raise TuningFileError(f"{where}: expected a mapping, got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    extra = [k for k in d if k not in required and k not in optional]
    if missing:
        raise TuningFileError(f"{where}: missing {', '.join(map(str, missing))}")
    if extra:
        raise TuningFileError(f"{where}: unknown key(s) {', '.join(map(repr, extra))}")


def _config(where, d, V, K=None) -> TileConfig:
    _keys(where, d, ("BV", "stages"), ("mma",))
    if not (_is_int(d["BV"]) and _is_int(d["stages"])):
        raise TuningFileError(f"{where}: BV and stages must be integers, got {d!r}")
    mma = d.get("mma", "sync")
    if mma not in MMA_FAMILIES:
        raise TuningFileError(f"{where}: mma must be one of {MMA_FAMILIES}, got {mma!r}")
    space = {"sync": TILE_SPACE, "wgmma": WGMMA_SPACE, "tcgen05": TCGEN05_SPACE}[mma]
    if not any(t.BV == d["BV"] and t.stages == d["stages"] for t in space):
        raise TuningFileError(f"{where}: {d!r} is not in the tile space "
                              + {"sync": "(BV in 16, 32, 64, 128; stages in 2, 3)",
                                 "wgmma": "(wgmma: BV in 64, 128; stages in 2, 3)",
                                 "tcgen05": "(tcgen05: BV in 64, 128; stages in 2, 3)"}[mma])
    if d["BV"] > V:
        raise TuningFileError(f"{where}: BV={d['BV']} exceeds V={V}")
    if mma != "sync" and K is not None and K > 128:
        raise TuningFileError(f"{where}: {mma} serves K <= 128, the bucket has K={K}")
    return TileConfig(d["BV"], d["stages"], mma)


def _match(where, d) -> dict:
    _keys(where, d, BUCKET_FIELDS)
    for f in ("K", "V"):
        if not _is_int(d[f]) or d[f] not in DIMS:
            raise TuningFileError(f"{where}: {f} must be one of {DIMS}, got {d[f]!r}")
    checks = (("dtype", DTYPE_NAMES), ("state_precision", STATE_PRECISIONS),
              ("parallelism", tuple(n for n, _ in PARALLELISM)), ("seqlen", tuple(n for n, _ in SEQLEN)))
    for f, allowed in checks:
        if not isinstance(d[f], str) or d[f] not in allowed:
            raise TuningFileError(f"{where}: {f} must be one of {allowed}, got {d[f]!r}")
    if not isinstance(d["varlen"], bool):
        raise TuningFileError(f"{where}: varlen must be true or false, got {d['varlen']!r}")
    return {f: d[f] for f in BUCKET_FIELDS}


def parse_table(data, path="<data>") -> Table:
    """Validate loaded YAML content against schema 1; raise TuningFileError."""
    _keys("file", data, ("schema", "gpu", "sm_count", "cuda", "kdacupy", "date", "buckets"))
    if not _is_int(data["schema"]) or data["schema"] != SCHEMA:
        raise TuningFileError(f"schema: expected {SCHEMA}, got {data['schema']!r}")
    if not isinstance(data["gpu"], str) or not data["gpu"].strip():
        raise TuningFileError(f"gpu: expected the device name, got {data['gpu']!r}")
    if not _is_int(data["sm_count"]) or data["sm_count"] < 1:
        raise TuningFileError(f"sm_count: expected a positive integer, got {data['sm_count']!r}")
    if not (_is_int(data["cuda"]) or isinstance(data["cuda"], str)):
        raise TuningFileError(f"cuda: expected the runtime version, got {data['cuda']!r}")
    if not isinstance(data["kdacupy"], str):
        raise TuningFileError(f"kdacupy: expected a version string, got {data['kdacupy']!r}")
    date = data["date"]
    if isinstance(date, (datetime.date, datetime.datetime)):
        date = date.isoformat()
    if not isinstance(date, str):
        raise TuningFileError(f"date: expected an ISO date, got {data['date']!r}")
    if not isinstance(data["buckets"], list):
        raise TuningFileError(f"buckets: expected a list, got {type(data['buckets']).__name__}")
    entries = {}
    for i, b in enumerate(data["buckets"]):
        where = f"buckets[{i}]"
        _keys(where, b, ("match", "config", "time_ms", "runner_up", "margin"))
        match = _match(f"{where}.match", b["match"])
        cfg = _config(f"{where}.config", b["config"], match["V"], match["K"])
        if not _is_num(b["time_ms"]) or b["time_ms"] <= 0:
            raise TuningFileError(f"{where}.time_ms: expected a positive number, got {b['time_ms']!r}")
        ru = b["runner_up"]
        if ru is None:
            if b["margin"] is not None:
                raise TuningFileError(f"{where}.margin: expected null without a runner-up, got {b['margin']!r}")
            runner_up, margin = None, None
        else:
            _keys(f"{where}.runner_up", ru, ("config", "time_ms"))
            rcfg = _config(f"{where}.runner_up.config", ru["config"], match["V"], match["K"])
            if not _is_num(ru["time_ms"]) or ru["time_ms"] <= 0:
                raise TuningFileError(f"{where}.runner_up.time_ms: expected a positive number, "
                                      f"got {ru['time_ms']!r}")
            if not _is_num(b["margin"]) or b["margin"] < 0:
                raise TuningFileError(f"{where}.margin: expected a number >= 0, got {b['margin']!r}")
            runner_up, margin = (rcfg, float(ru["time_ms"])), float(b["margin"])
        key = bucket_key(match)
        if key in entries:
            raise TuningFileError(f"{where}.match: bucket {bucket_label(match)} appears twice")
        entries[key] = Entry(match, cfg, float(b["time_ms"]), runner_up, margin)
    return Table(str(path), data["gpu"], data["sm_count"], data["cuda"], data["kdacupy"], date, entries)


def dump_table(gpu: str, sm_count: int, cuda, version: str, date: str, entries) -> str:
    """YAML text of a schema-1 file (validated before it is returned)."""
    import yaml

    data = dict(schema=SCHEMA, gpu=gpu, sm_count=int(sm_count), cuda=cuda, kdacupy=version, date=date,
                buckets=[e.to_dict() for e in entries])
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=200)
    parse_table(yaml.safe_load(text))  # never write what the loader would reject
    return text


_lock = threading.Lock()
_tables: dict = {}  # path -> Table | None (missing or invalid)
_selected: dict = {}  # (device id, user dir, bucket key) -> (TileConfig, source)
_devices: dict = {}  # device id -> (name, sm_count)
_warned: set = set()


def _warn_once(path, why):
    with _lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    warnings.warn(f"kdacupy: ignoring tuning file {path}: {why}", RuntimeWarning, stacklevel=4)


def load_table(path, warn=True) -> Table | None:
    """The validated table in ``path``, or None when it is missing (silently)
    or unusable (with one warning per file and process). Cached."""
    key = str(path)
    if key in _tables:
        return _tables[key]
    table, why = None, None
    try:
        import yaml

        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
        table = parse_table(data, path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # no file: the next source
    except TuningFileError as e:
        why = f"not a schema-{SCHEMA} tuning file ({e})"
    except OSError as e:
        why = f"unreadable ({e})"
    except Exception as e:  # noqa: BLE001  (YAML errors, odd content): never a crash
        why = f"not valid YAML ({type(e).__name__}: {e})"
    if why and warn:
        _warn_once(path, why)
    with _lock:
        _tables[key] = table
    return table


def clear_cache():
    """Forget parsed files, choices and warnings (tests; the tuner after writing)."""
    with _lock:
        _tables.clear()
        _selected.clear()
        _warned.clear()
        _arches.clear()


def device_facts() -> tuple[int, str, int]:
    """(device id, name, SM count) of CuPy's current device; cached per device."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    facts = _devices.get(dev)
    if facts is None:
        props = cupy.cuda.runtime.getDeviceProperties(dev)
        name = props["name"]
        if isinstance(name, bytes):
            name = name.split(b"\0", 1)[0].decode(errors="replace")
        facts = _devices[dev] = (name, int(props["multiProcessorCount"]))
    return (dev, *facts)


def lookup_paths(device_name: str, udir: Path | None = None) -> list[Path]:
    """The files kda_forward reads for a GPU model, in order: the user tuning
    directory's ``<model>.yaml``, then the shipped one (``python -m kdacupy.tune``
    writes the first by default; a file under any other name is never read)."""
    model = model_name(device_name)
    return [(udir if udir is not None else user_dir()) / f"{model}.yaml", shipped_dir() / f"{model}.yaml"]


def _lookup(bucket: dict, device_name: str, udir: Path):
    key = bucket_key(bucket)
    for path in lookup_paths(device_name, udir):
        table = load_table(path)
        if table is None:
            continue
        if table.gpu != device_name:
            _warn_once(path, f"tuned on {table.gpu!r}, this device is {device_name!r}")
            continue
        entry = table.entries.get(key)
        if entry is not None:
            return entry.config, str(path)
    return None


def _family(hit, wgmma: bool, p=None):
    """A file's choice for a caller that cannot take wgmma (every caller of the recurrence but the
    forward's own): its BV and stages on mma.sync. For the forward, a wgmma tile its problem's
    variants cannot take (head dims off the tiles, K > 128, V < BV: a bucket holds such problems
    too) runs on mma.sync as well, and the source says so."""
    if hit is None or hit[0].mma == "sync":
        return hit
    if not wgmma:
        return TileConfig(hit[0].BV, hit[0].stages), hit[1]
    from ...numerics.tiles import exact_dims
    if p is not None and not (exact_dims(p.K, p.V) and p.K <= 128 and hit[0].BV <= p.V):
        return TileConfig(hit[0].BV, hit[0].stages), (f"{hit[1]} (its {hit[0].mma} tile on mma.sync: K={p.K}, V={p.V} "
                                                      f"run the variants of mma.sync)")
    return hit


def describe_for(p, device_name: str, sm_count: int, arch: str | None = None,
                 wgmma: bool = False) -> tuple[TileConfig, str]:
    """``describe_selection`` for a named GPU model, SM count and target, without a
    device (``python -m kdacupy.bench --dry-run``); not cached."""
    hit = _family(_lookup(bucket_of(p, sm_count), device_name, user_dir()), wgmma, p)
    return hit if hit is not None else (heuristic(p, sm_count, arch if wgmma else None), HEURISTIC_SOURCE)


def device_arch() -> str:
    """The runtime's target on the current device (kdacupy/jit/targets.py)."""
    from ...jit import targets

    return targets.runtime_arch(targets.device_cc())


def describe_selection(p, wgmma: bool = False) -> tuple[TileConfig, str]:
    """The tile configuration for a Problem and where it comes from: a tuning
    file's path, or "heuristic (untuned)". ``wgmma``: the caller (the forward) can run the
    wgmma recurrence; the others get mma.sync whatever a file or the heuristic would pick."""
    if not p.device:
        return heuristic(p, DEFAULT_SM_COUNT), HEURISTIC_SOURCE
    dev, name, sm = device_facts()
    udir = user_dir()
    bucket = bucket_of(p, sm)
    key = (dev, str(udir), bucket_key(bucket))
    hit = _selected.get(key, False)
    if hit is False:
        hit = _lookup(bucket, name, udir)  # (config, path) or None
        with _lock:
            _selected[key] = hit
    hit = _family(hit, wgmma, p)
    # the heuristic costs a few integer operations: computed per call, not cached
    return hit if hit is not None else (heuristic(p, sm, _arch(dev) if wgmma else None), HEURISTIC_SOURCE)


_arches: dict = {}  # device id -> the runtime's target


def _arch(dev) -> str:
    if dev not in _arches:
        _arches[dev] = device_arch()
    return _arches[dev]


def current_arch() -> str:
    """The runtime's target on the current device (cached per device)."""
    return _arch(device_facts()[0])


def select_tiles(p, wgmma: bool = False) -> TileConfig:
    return describe_selection(p, wgmma)[0]

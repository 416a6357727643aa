"""Launch knobs of the decode kernel: the choice at run time and the tuner.

Knobs (``DecodeTiles``): BV value rows per CTA and warps per CTA. Where the
choice comes from, as for the forward's tiles (kdacupy/ops/forward/tuning.py):

1. ``$KDACUPY_TUNING_DIR/<model>.decode.yaml`` (else
   ``~/.cache/kdacupy/tuning/<model>.decode.yaml``), written by
   ``python -m kdacupy.tune --decode``;
2. the shipped ``tuning/<model>.decode.yaml``;
3. ``decode_heuristic`` ("heuristic (untuned)").

A bucket is K, V, the pool's dtype, the tokens per call (``T``: "1", "2-4",
">4") and the parallelism class of N * HV against the SM count. A file that
cannot be read or does not follow the schema below warns once and is ignored.

Schema::

    schema: 1
    kind: decode
    gpu: NVIDIA H200
    sm_count: 132
    buckets:
    - match: {K: 128, V: 128, pool: float32, tokens: '1', parallelism: '>=2'}
      config: {BV: 16, warps: 4}
      time_us: 12.5
"""
from __future__ import annotations

import warnings
from functools import lru_cache
from pathlib import Path

from .tiles import DecodeTiles, decode_candidates, decode_heuristic
from ...numerics.dtypes import dtype_name
from ..forward.tuning import DEFAULT_SM_COUNT, HEURISTIC_SOURCE, model_name, parallelism_class, shipped_dir, user_dir

TOKENS = (("1", 1), ("2-4", 4), (">4", float("inf")))
MATCH_KEYS = ("K", "V", "pool", "tokens", "parallelism")


def tokens_class(T: int) -> str:
    return next(name for name, bound in TOKENS if T <= bound)


def bucket_of(p, pool_dtype, sm_count: int) -> dict:
    return dict(K=int(p.K), V=int(p.V), pool=dtype_name(pool_dtype), tokens=tokens_class(p.T),
                parallelism=parallelism_class(p.N * p.HV, sm_count))


def bucket_key(b: dict) -> tuple:
    return tuple(b[k] for k in MATCH_KEYS)


def file_name(device_name: str) -> str:
    return f"{model_name(device_name)}.decode.yaml"


def parse(data, path) -> dict:
    """{bucket key: DecodeTiles} of a decode tuning file; ValueError when it does not follow the schema."""
    if not isinstance(data, dict) or data.get("schema") != 1 or data.get("kind") != "decode":
        raise ValueError("not a schema 1 decode tuning file")
    out = {}
    for i, e in enumerate(data.get("buckets") or []):
        m, c = e.get("match"), e.get("config")
        if not isinstance(m, dict) or set(m) != set(MATCH_KEYS) or not isinstance(c, dict) or set(c) != {"BV", "warps"}:
            raise ValueError(f"buckets[{i}]: expected match {MATCH_KEYS} and config BV, warps")
        t = DecodeTiles(int(c["BV"]), int(c["warps"]))
        if not t.valid_for(int(m["K"]), int(m["V"])) or t not in decode_candidates(int(m["K"]), int(m["V"])):
            raise ValueError(f"buckets[{i}]: config {c} is not a decode tile configuration for K, V")
        out[bucket_key(m)] = t
    return out


@lru_cache(maxsize=None)
def load(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        return {}
    try:
        import yaml
        return parse(yaml.safe_load(p.read_text()), path)
    except Exception as e:  # noqa: BLE001  (a broken file is ignored, with one warning)
        warnings.warn(f"kdacupy: ignoring decode tuning file {path}: {e}", stacklevel=3)
        return {}


@lru_cache(maxsize=None)
def _device():
    import cupy
    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return name, dev.attributes["MultiProcessorCount"]


def describe(p, pool_dtype) -> tuple[DecodeTiles, str]:
    """(tiles, where they came from) for a validated problem."""
    if not p.device:
        return decode_heuristic(p.K, p.V, p.N * p.HV, DEFAULT_SM_COUNT), HEURISTIC_SOURCE
    name, sm = _device()
    key = bucket_key(bucket_of(p, pool_dtype, sm))
    for d in (user_dir(), shipped_dir()):
        path = str(d / file_name(name))
        t = load(path).get(key)
        if t is not None:
            return t, path
    return decode_heuristic(p.K, p.V, p.N * p.HV, sm), HEURISTIC_SOURCE


def select(p, pool_dtype) -> DecodeTiles:
    return describe(p, pool_dtype)[0]


def clear_cache():
    load.cache_clear()

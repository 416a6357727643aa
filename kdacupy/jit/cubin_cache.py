"""Cubins the runtime built, on disk: a rendered source compiled once per target and NVRTC,
across processes (the runtime compiles through ``nvrtc.nvrtc_compile``, the compile report's
own call, for the target ``targets.target`` picks, then loads the cubin).

Files live in CuPy's kernel cache directory (``CUPY_CACHE_DIR``, default
``~/.cupy/kernel_cache``) as ``kdacupy-<sha1>.cubin``, the key covering the source, the
options, the target and NVRTC's version; written to a temporary name and renamed, so a
reader never sees half a file. ``CUPY_CACHE_IN_MEMORY=1`` keeps them to this process (a temporary directory).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .nvrtc import CUPY_ADDED_OPTIONS, NVRTC_OPTIONS, CompileResult, nvrtc_compile, nvrtc_version

_TMP = None  # CUPY_CACHE_IN_MEMORY=1: this process's directory, removed at exit


def cache_dir() -> Path:
    return Path(os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache"))


def key(source: str, arch: str) -> str:
    text = "\0".join((nvrtc_version(), arch, *NVRTC_OPTIONS, *CUPY_ADDED_OPTIONS, source))
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def _tmp_dir() -> Path:
    global _TMP
    if _TMP is None:
        _TMP = tempfile.TemporaryDirectory(prefix="kdacupy-cubins-")
    return Path(_TMP.name)


def cubin_path(source: str, arch: str) -> tuple[Path | None, CompileResult | None]:
    """The cubin file of ``source`` for ``arch``, and NVRTC's result when it was compiled now
    (None when it came from the cache). A failed compile gives (None, the failed result)."""
    name = f"kdacupy-{key(source, arch)}.cubin"
    in_memory = os.environ.get("CUPY_CACHE_IN_MEMORY", "0") not in ("", "0")
    path = (_tmp_dir() if in_memory else cache_dir()) / name
    if path.is_file():
        return path, None
    res = nvrtc_compile(source, arch)
    if not res.ok:
        return None, res
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kdacupy-", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(res.cubin)
    os.replace(tmp, path)
    return path, res

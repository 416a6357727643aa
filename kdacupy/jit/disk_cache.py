"""Writing a file of the on-disk caches (NVRTC's builds, nvdisasm's disassemblies: kdacupy.env.cache_dir)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def keep_file(path: Path, data: bytes) -> None:
    """``data`` into the cache file ``path``, through a temporary name (a reader never sees half a file);
    a cache that cannot be written is passed over (what was computed stands)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kdacupy-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass

"""Where the CUDA sources and tuned configs are: inside the installed package
(the wheel carries them as kdacupy/_kernels and kdacupy/_tuning), else at the
top of a source checkout."""
from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find(installed: str, checkout: str) -> Path:
    inside = _PKG / installed
    return inside if inside.is_dir() else _PKG.parent / checkout


def kernels_dir() -> Path:
    return _find("_kernels", "kernels")


def tuning_dir() -> Path:
    return _find("_tuning", "tuning")

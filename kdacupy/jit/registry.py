"""Every kernel variant the library can launch, by kernel: what
``python -m kdacupy.compile`` builds and ``tune --dry-run`` labels.

Each kernel family registers its enumerators when imported (e.g.
``kdacupy.ops.forward.variants``); this module imports no family, so the JIT
layer stays below the ops. A variant has ``kernel`` (the ``kernels/<kernel>.cu``
it renders), ``config()`` (the ``#define``s), ``smem`` (dynamic shared memory,
bytes) and ``label()`` (one line naming every option).
"""
from __future__ import annotations

from typing import Callable, Iterable

_FAMILIES: dict[str, Callable[[], Iterable]] = {}


def register(kernel: str, enumerate_variants: Callable[[], Iterable]) -> None:
    _FAMILIES[kernel] = enumerate_variants


def kernels() -> tuple[str, ...]:
    return tuple(_FAMILIES)


def variants(kernel: str | None = None) -> list:
    """Every registered variant, of one kernel or of all."""
    names = [kernel] if kernel else list(_FAMILIES)
    return [v for name in names for v in _FAMILIES[name]()]


def label(var) -> str:
    return var.label()

"""Render a kernel variant: the kernel's ``.cu`` text with every ``#include "..."``
of ``kernels/`` inlined (so a cache keyed on the text sees header changes) and a
block of ``#define NAME <int>`` lines in front. Only validated integers reach
the source: names must be upper-case identifiers, values plain ints.
"""
from __future__ import annotations

import re
from functools import lru_cache

from ..paths import kernels_dir
from . import enums

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


@lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (kernels_dir() / name).read_text()


def _inline(name: str, seen: set) -> str:
    if name in seen:  # every header is #pragma once
        return ""
    seen.add(name)
    text = _read(name).replace("#pragma once", "")
    return _INCLUDE.sub(lambda m: _inline(m.group(1), seen), text)


def render(kernel: str, config: dict) -> str:
    """Source of one variant of ``kernels/<kernel>.cu``: the enum names
    (``enums.py``), then the variant's configuration, then the text."""
    lines = [f"#define {name} {value}" for name, value in enums.defines().items()]
    for name, value in sorted(config.items()):
        if name in enums.defines():
            raise ValueError(f"config: {name} is an enum name (kdacupy/jit/enums.py), not a setting")
        if not _NAME.match(name) or not isinstance(value, int):
            raise ValueError(f"config: {name}={value!r} is not an upper-case name with an int value")
        lines.append(f"#define {name} {int(value)}")
    return f"// kdacupy variant of {kernel}.cu\n" + "\n".join(lines) + "\n" + _inline(f"{kernel}.cu", set())


def _origins(name: str, seen: set) -> list:
    """(file, line) of every line _inline(name) gives, in order."""
    if name in seen:
        return []
    seen.add(name)
    out = []
    for i, line in enumerate(_read(name).replace("#pragma once", "").split("\n")):
        m = _INCLUDE.match(line)
        if m and m.group(1) not in seen:
            out += _origins(m.group(1), seen)
        else:  # a line, or the include of a header already inlined (left empty)
            out.append((name, i + 1))
    return out


def line_origins(source: str) -> list:
    """Where each line of a rendered source comes from: (kernels/ file name, line), or None for the
    lines render() writes itself (the defines)."""
    text = source.split("\n")
    m = re.match(r"// kdacupy variant of (\w+\.cu)$", text[0]) if text else None
    if m is None:
        return [None] * len(text)
    body = _origins(m.group(1), set())  # the text's lines come last, after render's own
    return [None] * (len(text) - len(body)) + body


def origin_of(source: str, line: int) -> str:
    """'kernels/<file>:<line>' of a rendered source's line (1-based), or 'rendered line N'."""
    o = line_origins(source)
    return f"kernels/{o[line - 1][0]}:{o[line - 1][1]}" if 0 < line <= len(o) and o[line - 1] else f"rendered line {line}"


def config_label(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()) if k.startswith("KDA_"))

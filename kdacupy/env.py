"""Every ``KDACUPY_*`` environment switch: its default, its allowed values and
what it does, in one table (``SWITCHES``; the table in docs/guide/how-it-works.md lists the same).

Each switch is read through ``get(name)`` at the point of use (so a test or a
long-lived process that changes it sees the change) and checked there: a value
outside the allowed ones raises ``EnvError`` naming the variable, the value and
what is allowed. The first ``get`` of a process also looks for ``KDACUPY_*``
variables this table does not know and warns about each (a misspelt switch
would otherwise do nothing silently). Unset and empty mean the default. A new
switch is one ``Switch`` line in ``_TABLE`` and one row in docs/guide/how-it-works.md (a test
checks that table is ``markdown_table()``).
"""
from __future__ import annotations

import os
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


class EnvError(ValueError):
    """A KDACUPY_* environment variable holds a value the library cannot use."""


@dataclass(frozen=True)
class Switch:
    name: str
    default: object
    allowed: str  # for messages and the documentation
    doc: str
    parse: Callable[[str], object]


def _choice(*values: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise ValueError
        return text
    return parse


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError
    return text == "1"


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise ValueError
    return n


def _words(text: str) -> tuple:
    return tuple(shlex.split(text))  # ValueError on an unbalanced quote


def _text(text: str) -> str:
    return text


_CHECK_NAMES = ("memcheck", "racecheck", "aligncheck")


def _checks(text: str) -> tuple:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if any(n not in _CHECK_NAMES + ("all",) for n in names):
        raise ValueError
    return _CHECK_NAMES if "all" in names else tuple(dict.fromkeys(names))


_TABLE = (
    # the JIT (kdacupy/jit/)
    Switch("KDACUPY_JIT_VERBOSE", False, "0 or 1",
           "print each kernel variant's compile time and ptxas' resources to stderr", _flag),
    # tuned tile configurations (kdacupy/ops/forward/tuning.py)
    Switch("KDACUPY_TUNING_DIR", None, "a directory",
           "the user tuning directory (default ~/.cache/kdacupy/tuning), read before the shipped files "
           "and written by python -m kdacupy.tune", _text),
    # the forward's launches (kdacupy/ops/forward/fused.py)
    Switch("KDACUPY_FORWARD_FUSED", "auto", "auto, on or off",
           "the serial forward as one fused launch, and the split forward's final launch making its last "
           "segments, where they serve the call: where the model says it pays on sm_90a (auto), always (on, the "
           "emulation included; the split for fixed-length calls) or never (off: the prepare and recurrence "
           "launches)", _choice("auto", "on", "off")),
    # the CPU emulation (kdacupy/emulate/)
    Switch("KDACUPY_CACHE_DIR", None, "a directory",
           "where the emulation's compiled kernels, NVRTC's builds (their reports and cubins) and nvdisasm's "
           "disassemblies are cached (default ~/.cache/kdacupy)", _text),
    Switch("KDACUPY_EMULATE_ORDER", "forward", "forward or reverse",
           "order the emulated threads of a block run in between barriers; reverse exposes missing barriers",
           _choice("forward", "reverse")),
    Switch("KDACUPY_EMULATE_CP_ASYNC", "deferred", "deferred or eager",
           "when an emulated cp.async lands: at the covering wait (as on the GPU), or at issue (exposes "
           "reads that need no wait)", _choice("deferred", "eager")),
    Switch("KDACUPY_EMULATE_CXXFLAGS", (), "compiler flags",
           "extra host compiler flags for the emulation, e.g. \"-O0 -g\" for gdb", _words),
    Switch("KDACUPY_EMULATE_THREADS", None, "an integer >= 1",
           "OS threads an emulated launch runs its blocks on (default: the CPU count)", _positive_int),
    Switch("KDACUPY_EMULATE_STACK_KB", 256, "an integer >= 1",
           "stack of each emulated GPU thread, KiB", _positive_int),
    Switch("KDACUPY_EMULATE_CHECK", (), "a comma list of memcheck, racecheck, aligncheck, or all",
           "run emulated launches as a CPU compute-sanitizer: out-of-bounds accesses, shared-memory races, "
           "misaligned vector accesses raise EmulationError saying what and where; the launchers' scratch and "
           "new outputs start as NaN bytes (docs/guide/debugging.md)",
           _checks),
    Switch("KDACUPY_EMULATE_PROFILE", False, "0 or 1",
           "count each emulated launch's shared-memory wavefronts, global sectors, DRAM bytes, mma and barriers "
           "(kdacupy.emulate.profile_records(); python -m kdacupy.profile)", _flag),
    Switch("KDACUPY_EMULATE_NUMERICS", "exact", "exact or hardware",
           "the emulated PTX twins' arithmetic: exact, or the GPU's (.approx results within their ISA bounds, "
           "tensor-core accumulation, FTZ); used to size the GPU tolerances", _choice("exact", "hardware")),
    # measurements (kdacupy/cli/)
    Switch("KDACUPY_COMMIT", None, "a commit id",
           "the commit recorded with benchmark results when git cannot tell (e.g. outside a checkout)", _text),
)
SWITCHES = {s.name: s for s in _TABLE}
_scanned = [False]  # the environment has been looked at for unknown KDACUPY_* names


def get(name: str):
    """The checked value of switch ``name`` (its default when unset or empty)."""
    _warn_unknown()
    sw = SWITCHES[name]
    text = os.environ.get(name, "")
    if text == "":
        return sw.default
    try:
        return sw.parse(text)
    except ValueError:
        raise EnvError(f"{name}={text!r} is not valid: expected {sw.allowed} ({sw.doc})") from None


def cache_dir(part: str) -> Path:
    """``part``'s directory of the on-disk caches (the emulation's builds, NVRTC's, nvdisasm's):
    ``$KDACUPY_CACHE_DIR/part``, default ``~/.cache/kdacupy/part``."""
    root = get("KDACUPY_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "kdacupy") / part


def check_all() -> None:
    """Check every KDACUPY_* switch that is set; EnvError for the first bad one."""
    for name in SWITCHES:
        get(name)


def _warn_unknown() -> None:
    if _scanned[0]:
        return
    _scanned[0] = True
    for name in sorted(os.environ):
        if name.startswith("KDACUPY_") and name not in SWITCHES:
            warnings.warn(f"{name} is not a kdacupy switch and is ignored (known: {', '.join(SWITCHES)})",
                          stacklevel=3)


def _shown(default) -> str:
    if default is None or default == ():
        return "-"
    return str(int(default)) if isinstance(default, bool) else str(default)


def markdown_table() -> str:
    """The documentation's table of switches (docs/guide/how-it-works.md)."""
    rows = ["| Variable | Values | Default | Effect |", "|---|---|---|---|"]
    for s in _TABLE:
        rows.append(f"| `{s.name}` | {s.allowed} | {_shown(s.default)} | {s.doc} |")
    return "\n".join(rows)

"""Compile a rendered kernel source for the CPU emulation (g++/clang++ -> .so), with caching.

Cache key: sha256 of the source with its exports, the emulation headers, the
compiler (path and --version) and the flags. Files go to
$KDACUPY_CACHE_DIR/emulate or ~/.cache/kdacupy/emulate, written to a temporary
name and renamed with os.replace, so concurrent processes never see half a file; a lock file per key
makes a second process that needs the same build wait for the first and take its library.
$KDACUPY_EMULATE_CXXFLAGS adds flags (e.g. "-O0 -g" to debug a kernel in gdb);
$KDACUPY_EMULATE_NUMERICS (exact|hardware, see numerics.py) adds -DKDA_EMU_NUMERICS.

Instrumented builds (KDACUPY_EMULATE_CHECK, checks.h, and KDACUPY_EMULATE_PROFILE,
profile.h: one build serves both) compile the kernel with -fsanitize=thread and
line tables, then link it with tsan_hooks.cpp (its object built once, hooks/) instead of libtsan; their source
stays next to the library (<key>.cpp) for addr2line.

g++ builds force-include cuda_emu.h through a precompiled header (prelude/<key>/, one per
compiler, flags and emulation headers), which takes a fifth off each build.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Sequence

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None

from .. import env
from . import numerics
from .errors import EmulationError

HERE = Path(__file__).resolve().parent
HEADERS = ("cuda_emu.h", "ptx_twins.h")
CHECK_FILES = ("checks.h", "profile.h", "tsan_hooks.cpp")
#: compile-only flags of checked builds (the link gets none: no libtsan); -fno-tree-sra keeps a
#: vector load one access (scalarised, its alignment would go unchecked)
#: -Og as plain builds: __forceinline__ is always_inline (cuda_emu.h), which keeps the checks' reports and
#: the profile's anchors in their calling contexts, and the profile groups a request by calling context
#: (profile.h), so a call left out of line counts as ptxas' inlined copies do
CHECK_FLAGS = ("-fsanitize=thread", "-g1", "-DKDA_EMU_CHECK=1", "-fno-tree-sra")
#: every build at -Og: builds dominate a cold test run, and -Og compiles a kernel in ~30% less time than
#: -O1 (which ran as fast as -O2 at a third less), the kernels then running ~30% slower (measured on the
#: emulated test modules). IEEE arithmetic without contraction or fast-math at any level
FLAGS = ("-Og", "-std=c++17", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-fast-math",
         "-Wno-unknown-pragmas", "-DKDA_EMULATE")
NO_COMPILER = "backend='emulate' needs a C++17 compiler (g++ or clang++) on PATH, or set CXX"

# Counters the tests read: compiles run, .so files found on disk, in-process hits.
stats = {"compiled": 0, "disk_hits": 0, "memory_hits": 0}
_lock = threading.Lock()
_versions: dict[str, str] = {}


def find_compiler() -> str:
    """Absolute path of $CXX, else g++, else clang++; EmulationError if none is usable."""
    cxx = os.environ.get("CXX")
    if cxx:
        path = shutil.which(cxx)
        if path is None:
            raise EmulationError(f"{NO_COMPILER} (CXX={cxx!r} was not found)")
        return path
    for name in ("g++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    raise EmulationError(NO_COMPILER)


def _version(cxx: str) -> str:
    if cxx not in _versions:
        try:
            out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
        except OSError as e:
            raise EmulationError(f"{NO_COMPILER} ({cxx}: {e})") from None
        _versions[cxx] = out.stdout
    return _versions[cxx]


def cache_dir() -> Path:
    return env.cache_dir("emulate")


def full_source(source: str, names: Sequence[str]) -> str:
    """The translation unit: the kernel source, then one export per kernel name."""
    for n in names:
        if not n.isidentifier():
            raise EmulationError(f"kernel name {n!r} is not a C identifier")
    exports = "".join(f"KDA_EMU_EXPORT({n})\n" for n in names)
    return f"{source}\n// ---- emulation exports ----\n{exports}"


def build(source: str, names: Sequence[str], checked: bool = False, numerics_mode: str | None = None) -> Path:
    """Path of the shared library for (source, names), compiling it if not cached;
    ``checked``: instrumented (for the checks and the counters); ``numerics_mode``: the twins'
    arithmetic (default: $KDACUPY_EMULATE_NUMERICS); both are in the key."""
    cxx = find_compiler()
    text = full_source(source, names)
    flags = [*FLAGS, *(CHECK_FLAGS if checked else ()), numerics.define(numerics_mode), *env.get("KDACUPY_EMULATE_CXXFLAGS")]
    files = HEADERS + (CHECK_FILES if checked else ())
    h = hashlib.sha256()
    for part in (text, *((HERE / f).read_text() for f in files), cxx, _version(cxx), " ".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    key = h.hexdigest()[:32]
    out_dir = cache_dir()
    lib = out_dir / f"{key}.so"
    with _lock:  # one compile per key in this process
        if lib.exists():
            stats["disk_hits"] += 1
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "locks").mkdir(exist_ok=True)
        with _key_lock(out_dir / "locks" / key):  # and across processes: a second waits, then finds it
            if lib.exists():
                stats["disk_hits"] += 1
                return lib
            _compile(cxx, text, flags, files, checked, key, out_dir, lib)
            stats["compiled"] += 1
    return lib


@contextlib.contextmanager
def _key_lock(path: Path):
    """An exclusive lock on ``path`` across processes (pytest-xdist workers that need the same variant
    at once compile it once); where flock is missing, none (each process compiles, and the renames
    keep the cache whole)."""
    if fcntl is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _compile(cxx: str, text: str, flags, files, checked: bool, key: str, out_dir: Path, lib: Path) -> None:
    """Build ``text`` into ``lib``, through a temporary name."""
    with tempfile.TemporaryDirectory(prefix="kda_emu_") as tmp:
        src = Path(tmp) / "kernel.cpp"
        if checked:  # kept: the line tables name it
            src = out_dir / f"{key}.cpp"
            _write_atomic(src, text, out_dir)
        else:
            src.write_text(text)
        fd, tmp_lib = tempfile.mkstemp(suffix=".so.tmp", dir=out_dir)
        os.close(fd)
        inc = ["-I", str(HERE), "-include", _prelude(cxx, [f for f in flags if f != "-shared"], files, out_dir)]
        if checked:
            compile_flags = [f for f in flags if f != "-shared"]
            obj = str(Path(tmp) / "kernel.o")
            cmds = [[cxx, *compile_flags, *inc, "-c", str(src), "-o", obj],
                    [cxx, "-shared", "-pthread", obj, _hooks(cxx, out_dir), "-o", tmp_lib, "-Wl,-z,defs", "-ldl"]]
        else:
            cmds = [[cxx, *flags, *inc, str(src), "-o", tmp_lib]]
        for cmd in cmds:
            try:
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0 and "precompiled header" in res.stderr and inc[-1] != str(HERE / "cuda_emu.h"):
                    Path(inc[-1] + ".gch").unlink(missing_ok=True)  # damaged: the header itself, and anew next time
                    cmd[cmd.index(inc[-1])] = inc[-1] = str(HERE / "cuda_emu.h")
                    res = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:
                os.unlink(tmp_lib)
                if checked:
                    src.unlink(missing_ok=True)
                raise EmulationError(f"{NO_COMPILER} ({cxx}: {e})") from None
            if res.returncode != 0:
                os.unlink(tmp_lib)
                if checked:
                    src.unlink(missing_ok=True)
                raise EmulationError(f"emulation build failed ({' '.join(cmd)}):\n{res.stderr}{res.stdout}")
        os.replace(tmp_lib, lib)


def _hooks(cxx: str, out_dir: Path) -> str:
    """tsan_hooks.cpp's object, which every instrumented build links: compiled once per compiler and
    hooks source (it takes half a second, a third of a small instrumented build)."""
    h = hashlib.sha256()
    for part in ((HERE / "tsan_hooks.cpp").read_text(), cxx, _version(cxx)):
        h.update(part.encode())
        h.update(b"\0")
    obj = out_dir / "hooks" / f"{h.hexdigest()[:32]}.o"
    if not obj.exists():
        obj.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".o.tmp", dir=obj.parent)
        os.close(fd)
        cmd = [cxx, "-O2", "-fPIC", "-c", str(HERE / "tsan_hooks.cpp"), "-o", tmp]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            os.unlink(tmp)
            raise EmulationError(f"{NO_COMPILER} ({cxx}: {e})") from None
        if res.returncode != 0:
            os.unlink(tmp)
            raise EmulationError(f"emulation build failed ({' '.join(cmd)}):\n{res.stderr}{res.stdout}")
        os.replace(tmp, obj)  # concurrent builders each write a whole object; the last rename stands
    return str(obj)


def _prelude(cxx: str, compile_flags: Sequence[str], files: Sequence[str], out_dir: Path) -> str:
    """What a build force-includes: with g++, a one-line header that includes cuda_emu.h, next to
    its precompiled form (built once per compiler, flags and emulation headers; g++ takes
    ``<name>.gch`` for ``-include <name>``), which saves the ~0.3 s that parsing cuda_emu.h and
    the C++ headers costs each build; anything else, or a failed precompile, cuda_emu.h itself."""
    plain = str(HERE / "cuda_emu.h")
    if "clang" in _version(cxx).lower():  # clang reads precompiled headers only through -include-pch
        return plain
    h = hashlib.sha256()
    for part in (*((HERE / f).read_text() for f in files), cxx, _version(cxx), " ".join(compile_flags)):
        h.update(part.encode())
        h.update(b"\0")
    d = out_dir / "prelude" / h.hexdigest()[:32]
    stub, gch = d / "cuda_emu.h", d / "cuda_emu.h.gch"
    if gch.exists():
        return str(stub)
    d.mkdir(parents=True, exist_ok=True)
    _write_atomic(stub, f'#include "{plain}"\n', d)
    fd, tmp = tempfile.mkstemp(suffix=".gch.tmp", dir=d)
    os.close(fd)
    try:
        res = subprocess.run([cxx, *compile_flags, "-I", str(HERE), "-x", "c++-header", str(stub), "-o", tmp],
                             capture_output=True, text=True)
    except OSError:
        res = None
    if res is None or res.returncode != 0:
        os.unlink(tmp)
        return plain  # the build itself then reports what is wrong with the headers
    os.replace(tmp, gch)
    return str(stub)


def _write_atomic(path: Path, text: str, out_dir: Path) -> None:
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)

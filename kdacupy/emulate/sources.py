"""Source locations of code offsets in an instrumented emulation library (addr2line), for the
checks' messages and the profile's hot spots."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path


def source_location(lib: Path, offset: str, text: list[str]) -> str:
    """'at file:line `code`, inlined at ...' for a code offset in ``lib`` (addr2line);
    ``text``: the rendered source, whose lines map back to kernels/ where they occur once."""
    tool = shutil.which("addr2line")
    try:
        out = subprocess.run([tool, "-f", "-C", "-i", "-e", str(lib), f"0x{offset}"], capture_output=True,
                             text=True, timeout=60).stdout.split("\n") if tool else []
    except (OSError, subprocess.SubprocessError):
        out = []
    frames = []
    for func, loc in zip(out[0::2], out[1::2]):
        line = loc.rpartition(":")[2].split(" ")[0]
        if func.startswith("??") or not line.isdigit() or not 0 < int(line) <= len(text):
            continue
        code = text[int(line) - 1].strip()
        frames.append(f"{origin(code, text[0]) or f'rendered line {line}'} `{code[:100]}`")
    if not frames:
        return f"at code offset 0x{offset} of {lib}" + ("" if tool else " (addr2line not found)")
    return "at " + ", inlined at ".join(frames)


def origin(code: str, first_line: str) -> str | None:
    """'kernels/x.cu:N' when ``code`` is one line of kernels/ (the rendered .cu or a header) exactly once."""
    from ..paths import kernels_dir
    m = re.match(r"// kdacupy variant of (\w+\.cu)$", first_line)
    if not m or len(code) < 8:
        return None
    d = kernels_dir()
    hits = []
    for f in [d / m.group(1), *sorted(d.glob("*.cuh"))]:
        if f.is_file():
            hits += [f"kernels/{f.name}:{i + 1}" for i, x in enumerate(f.read_text().split("\n")) if x.strip() == code]
    return hits[0] if len(hits) == 1 else None


def inline_chains(lib: Path, offsets) -> dict:
    """{offset: [(file, line), ...]} of code offsets in ``lib``: each offset's source lines,
    innermost first (``addr2line -a -i``, one call for all of them); [] where unknown."""
    offsets = sorted(set(int(o) for o in offsets))
    tool = shutil.which("addr2line")
    if tool is None or not offsets:
        return {o: [] for o in offsets}
    out = subprocess.run([tool, "-a", "-i", "-e", str(lib)], input="\n".join(f"0x{o:x}" for o in offsets),
                         capture_output=True, text=True, timeout=600).stdout
    chains: dict = {}
    cur = None
    for line in out.split("\n"):
        if line.startswith("0x"):
            cur = chains.setdefault(int(line, 16), [])
        elif cur is not None and ":" in line:
            f, _, rest = line.rpartition(":")
            n = rest.split(" ")[0]
            if n.isdigit():
                cur.append((f, int(n)))
    return {o: chains.get(o, []) for o in offsets}

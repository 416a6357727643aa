"""The instruction mix of a cubin, from ``nvdisasm`` (pip's nvidia-cuda-nvdisasm)."""
from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from .disk_cache import keep_file

#: mnemonics counted (before the first dot): mma.sync's HMMA and wgmma's HGMMA (WARPGROUP: its
#: fence / wait), ldmatrix, local memory, global loads / stores, cp.async, bulk copies (UBLKCP,
#: and TMA tensor loads UTMALDG), mbarrier operations (SYNCS), the SFU, and Blackwell's tcgen05.mma
#: (UTCHMMA) and tensor-memory loads / stores (LDTM, STTM)
SASS_OPS = ("HMMA", "HGMMA", "WARPGROUP", "LDSM", "LDL", "STL", "LDG", "STG", "LDGSTS", "UBLKCP", "UTMALDG",
            "SYNCS", "MUFU", "UTCHMMA", "LDTM", "STTM")
NVDISASM_HINT = 'the SASS mix needs nvdisasm: pip install "kdacupy[test]" (or nvidia-cuda-nvdisasm)'


def nvdisasm() -> str | None:
    """Path of the disassembler, or None when it is not installed."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError:
        return None
    return find_nvidia_binary_utility("nvdisasm")


@lru_cache(maxsize=None)
def _version(tool: str) -> str:
    return subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout


def cache_dir() -> Path:
    """Where disassemblies are kept: ``$KDACUPY_CACHE_DIR/nvdisasm``, default ``~/.cache/kdacupy/nvdisasm``
    (a kernel of the profile takes 0.3-3 s of nvdisasm with line tables, each run)."""
    from .. import env

    return env.cache_dir("nvdisasm")


def disassemble(cubin: bytes, *flags: str) -> str:
    """``nvdisasm`` of a cubin with ``flags`` (kept on disk by the cubin, the flags and nvdisasm's version);
    RuntimeError when it is not installed."""
    tool = nvdisasm()
    if tool is None:
        raise RuntimeError(NVDISASM_HINT)
    key = hashlib.sha256("\0".join((_version(tool), *flags)).encode() + b"\0" + cubin).hexdigest()
    path = cache_dir() / f"{key}.txt"
    try:
        return path.read_text()
    except OSError:
        pass
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, *flags, f.name], capture_output=True, text=True, check=True).stdout
    keep_file(path, text.encode())
    return text


def sass_mix(cubin: bytes) -> dict:
    """Instruction counts of a cubin (static, as disassembled)."""
    text = disassemble(cubin)
    ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", text, re.M)
    return {op: sum(1 for x in ops if x == op) for op in SASS_OPS}

"""The forward pass's scratch memory: one persistent, grow-only buffer per
(device, stream).

Why not ``cupy.empty`` per call: a CUDA graph captures raw pointers. A per-call
workspace goes back to CuPy's pool when the call returns, the next allocation
gets the same block, and every replay of the graph then overwrites that
array. A buffer that lives as long as the process cannot be handed out again.

Rules:
- one buffer per (device, stream): calls on one stream are ordered, so they
  can share it; calls on different streams never do;
- it only grows. A buffer that was handed out while its stream was capturing
  is never freed (a graph may still point at it); it is retired, and kept;
  one that no capture saw is freed when it is replaced;
- graphs captured on the same stream share that stream's buffer: replay them
  on one stream (in order), not concurrently on several;
- ``release()`` frees the buffers no capture saw (e.g. before a large
  allocation elsewhere); captured ones stay for the life of the process.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

#: growth factor when a buffer must grow: a few reallocations for any workload
GROWTH = 1.5
ALIGN = 256  # bytes


@dataclass
class _Slot:
    buf: Any = None
    nbytes: int = 0
    captured: bool = False


@dataclass
class WorkspaceCache:
    """Grow-only buffers keyed by (device, stream). ``alloc(nbytes)`` makes a
    buffer (a 1-D uint8 array); ``capturing(key)`` says whether that stream is
    being captured into a graph right now."""

    alloc: Callable[[int], Any]
    capturing: Callable[[tuple], bool]
    slots: dict = field(default_factory=dict)
    retired: list = field(default_factory=list)  # buffers a graph may hold
    lock: Any = field(default_factory=threading.Lock)

    def get(self, key: tuple, nbytes: int):
        """A buffer of at least ``nbytes`` bytes for ``key`` (a view of exactly
        ``nbytes`` bytes)."""
        capturing = self.capturing(key)
        with self.lock:
            slot = self.slots.setdefault(key, _Slot())
            if slot.nbytes < nbytes:
                if slot.buf is not None and slot.captured:
                    self.retired.append(slot.buf)
                size = max(nbytes, int(slot.nbytes * GROWTH))
                size = -(-size // ALIGN) * ALIGN
                # the old buffer is dropped only after the new one exists: stream order keeps it
                # alive for work already queued (CuPy's pool reuses a block on the same stream only)
                slot.buf, slot.nbytes, slot.captured = self.alloc(size), size, False
            slot.captured |= capturing
            return slot.buf[:nbytes]

    def release(self) -> int:
        """Free every buffer no capture has seen; returns the bytes freed."""
        with self.lock:
            freed = 0
            for key in list(self.slots):
                if not self.slots[key].captured:
                    freed += self.slots.pop(key).nbytes
            return freed

    def held_bytes(self) -> int:
        with self.lock:
            return sum(s.nbytes for s in self.slots.values()) + sum(int(b.nbytes) for b in self.retired)


def _cupy_cache() -> WorkspaceCache:
    import cupy

    def alloc(nbytes):
        return cupy.empty(nbytes, dtype=cupy.uint8)

    def capturing(key):
        try:
            return bool(cupy.cuda.get_current_stream().is_capturing())
        except Exception:  # noqa: BLE001  (legacy stream while another captures: keep the buffer)
            return True

    return WorkspaceCache(alloc, capturing)


_device_cache: WorkspaceCache | None = None
_device_lock = threading.Lock()


def device_cache() -> WorkspaceCache:
    global _device_cache
    with _device_lock:
        if _device_cache is None:
            _device_cache = _cupy_cache()
        return _device_cache


def device_workspace(nbytes: int):
    """The current (device, stream)'s workspace, at least ``nbytes`` long."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    return device_cache().get((cupy.cuda.Device().id, stream.ptr), nbytes)


def scratch(p, a, nbytes: int, xp):
    """``nbytes`` of the forward's scratch memory (on the GPU the (device, stream)'s workspace, in the
    emulation a fresh array) and ``a`` with a strided ``cu_seqlens`` replaced by its copy after them (a
    device copy kernel: capturable, and a graph's replay re-reads the caller's array)."""
    import numpy as np

    from ..alloc import empty

    cu = a["cu_seqlens"]
    copy_cu = cu is not None and not cu.flags.c_contiguous
    cu_at = -(-nbytes // 8) * 8
    total = cu_at + (cu.nbytes if copy_cu else 0)
    ws = device_workspace(total) if p.device else empty(xp, total, np.uint8)
    if copy_cu:
        dense = ws[cu_at:cu_at + cu.nbytes].view(cu.dtype)
        dense[...] = cu
        a = dict(a, cu_seqlens=dense)
    return ws, a


def release() -> int:
    """Free the device workspaces that no CUDA graph can hold; the bytes freed."""
    return device_cache().release() if _device_cache is not None else 0

"""The persistent workspace (kdacupy/ops/forward/workspace.py) and the launcher's use of it, on
the CPU: the cache logic with NumPy buffers and a scripted capture flag; the
strided-cu_seqlens copy through the emulation; the HV limit. The GPU side
(allocations between capture and replay) is in test_gpu_forward.py."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.precision import kda_model
from kdacupy.ops.forward.workspace import GROWTH, WorkspaceCache

from ..inputs import make_inputs


class Fake:
    def __init__(self):
        self.capturing = set()
        self.allocs = []

    def cache(self):
        def alloc(n):
            buf = np.zeros(n, np.uint8)
            self.allocs.append(buf)
            return buf
        return WorkspaceCache(alloc, lambda key: key in self.capturing)


def ptr(x):
    return x.__array_interface__["data"][0]


def test_one_buffer_per_stream_reused_and_grow_only():
    f = Fake()
    c = f.cache()
    a = c.get((0, 1), 1000)
    assert a.nbytes == 1000
    b = c.get((0, 1), 500)  # smaller: the same memory
    assert ptr(b) == ptr(a) and b.nbytes == 500
    other = c.get((0, 2), 500)  # another stream: another buffer
    assert ptr(other) != ptr(a)
    other_dev = c.get((1, 1), 500)  # another device, same stream number
    assert ptr(other_dev) not in (ptr(a), ptr(other))
    big = c.get((0, 1), 1200)  # grows by at least GROWTH
    assert big.nbytes == 1200 and len(f.allocs) == 4 and f.allocs[-1].nbytes >= GROWTH * 1000
    assert ptr(c.get((0, 1), 1000)) == ptr(big)  # never shrinks back
    assert c.retired == []  # nothing captured: the old buffer was freed, not kept


def test_a_buffer_a_capture_saw_is_kept_when_replaced():
    f = Fake()
    c = f.cache()
    c.get((0, 7), 256)
    f.capturing.add((0, 7))
    held = c.get((0, 7), 256)  # handed out during a capture: a graph holds its pointer
    f.capturing.clear()
    grown = c.get((0, 7), 10_000)
    assert ptr(grown) != ptr(held)
    assert [ptr(r) for r in c.retired] == [ptr(f.allocs[0])]  # kept alive, never reused
    assert c.held_bytes() >= 10_000 + 256


def test_release_frees_only_uncaptured_buffers():
    f = Fake()
    c = f.cache()
    c.get((0, 1), 300)
    f.capturing.add((0, 2))
    captured = c.get((0, 2), 300)
    f.capturing.clear()
    assert c.release() >= 300
    assert list(c.slots) == [(0, 2)]
    assert ptr(c.get((0, 2), 100)) == ptr(captured)
    assert ptr(c.get((0, 1), 100)) == ptr(f.allocs[-1]) and len(f.allocs) == 3  # freed: a new one


def test_strided_cu_seqlens_is_copied_into_the_workspace():
    pytest.importorskip("kdacupy.emulate").find_compiler()
    x, opts = make_inputs(cu_seqlens=[5, 0, 21], H=1, K=64, V=64, state=np.float32)
    cu = opts["cu_seqlens"]
    strided = np.repeat(cu, 2)[::2]  # same values, stride 16 bytes
    assert not strided.flags.c_contiguous
    o, s = kdacupy.kda_forward(**x, **dict(opts, cu_seqlens=strided), output_final_state=True, backend="emulate")
    o2, s2 = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate")
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(s, s2)
    om, _ = kda_model(**x, **opts, output_final_state=True)
    assert np.abs(o.astype(np.float64) - om.astype(np.float64)).max() < 0.05


def test_more_value_heads_than_grid_y_is_refused():
    from kdacupy.numerics.dtypes import BF16
    HV = 65536
    q = np.zeros((1, 1, 1, 64), BF16)
    v = np.zeros((1, 1, HV, 64), BF16)
    g = np.zeros((1, 1, HV, 64), BF16)
    with pytest.raises(ValueError, match=r"v: expected at most 65535 value heads .* got HV = 65536"):
        kdacupy.kda_forward(q, q, v, g, backend="emulate")

"""``kdacupy.seqpar.state_maps`` and CUDA-graph capture, through the faked-capture
seam (``seqpar._capturing``) with a device problem faked on the CPU: refused while
the stream captures (its per-call temporaries cannot live in a graph), and its
launches take the stream's persistent workspace, as the forward's do, instead of
a per-call one."""
import dataclasses

import numpy as np
import pytest

from kdacupy import seqpar
from kdacupy.ops.seqpar import split

from ..inputs import make_inputs


def device_problem(monkeypatch):
    """state_maps' validation returns a problem marked as on the GPU (NumPy arrays kept)."""
    real = seqpar.validate

    def validate(*args, **kwargs):
        p, a = real(*args, **dict(kwargs, backend="emulate"))
        return dataclasses.replace(p, device=True, backend="cuda"), a

    monkeypatch.setattr(seqpar, "validate", validate)


class Launched(Exception):
    pass


def test_state_maps_is_refused_while_the_stream_captures(monkeypatch):
    device_problem(monkeypatch)

    def no_launch(p, a):
        raise Launched

    monkeypatch.setattr(seqpar, "KernelRun", no_launch)
    x, opts = make_inputs(cu_seqlens=[20, 0, 35], H=1, K=64, V=64)
    monkeypatch.setattr(seqpar, "_capturing", lambda: True)
    with pytest.raises(ValueError, match="state_maps: expected a stream that is not capturing a CUDA graph"):
        seqpar.state_maps(**x, **opts)
    monkeypatch.setattr(seqpar, "_capturing", lambda: False)
    with pytest.raises(Launched):  # not capturing: the launches go ahead
        seqpar.state_maps(**x, **opts)


class NullLoader:
    def __init__(self):
        self.launched = []

    def get(self, kernel, config, name):
        return kernel

    def launch(self, fn, grid, block, args, shared_mem):
        self.launched.append(fn)


def test_the_map_launches_take_the_persistent_workspace(monkeypatch, tmp_path):
    import kdacupy.jit.loaders as loaders
    from kdacupy.ops.forward import layouts, tuning
    from kdacupy.ops.forward import workspace as ws_mod

    device_problem(monkeypatch)
    monkeypatch.setattr(tuning, "device_facts", lambda: (0, "NVIDIA H200", 132))
    monkeypatch.setattr(tuning, "_arches", {0: "sm_90a"})  # its target: the maps take wgmma there
    monkeypatch.setenv("KDACUPY_TUNING_DIR", str(tmp_path))
    monkeypatch.setattr(seqpar, "_capturing", lambda: False)
    monkeypatch.setattr(split, "_xp", lambda p: np)  # the "device" arrays are NumPy here
    null = NullLoader()
    monkeypatch.setattr(loaders, "loader", lambda kind: null)
    asked = []

    def device_workspace(nbytes):
        asked.append(nbytes)
        return np.zeros(nbytes, np.uint8)

    monkeypatch.setattr(ws_mod, "device_workspace", device_workspace)
    x, opts = make_inputs(cu_seqlens=[20, 0, 35], H=2, K=64, V=64)
    M, B = seqpar.state_maps(**x, **opts)
    nslots = 3 + -(-55 // layouts.CHUNK)
    assert asked == [2 * nslots * layouts.workspace(64)["WS_STRIDE"]]
    assert null.launched == ["kda_prepare", "kda_recurrence"]  # the M and B maps merged: one launch
    assert M.shape == (3, 2, 64, 64) and B.shape == (3, 2, 64, 64)
    np.testing.assert_array_equal(M[1], np.broadcast_to(np.eye(64), (2, 64, 64)))  # the identity, in place

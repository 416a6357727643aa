"""The backward's chain tiles (kdacupy/ops/backward/tiles.py): their own choice, whatever a tuning file
says for the forward, and what the backward's launches get."""
import numpy as np
import pytest

import kdacupy
import kdacupy.ops.backward.kernels as bkernels
import kdacupy.ops.forward.tuning as tuning
from kdacupy.ops.backward.tiles import backward_tiles
from kdacupy.ops.forward.kernels import unfit
from kdacupy.ops.forward.tuning import TileConfig

from ..backward_cases import problem as backward_problem
from .test_tuning import dirs, entry, kimi, problem, write  # noqa: F401  (dirs: a fixture)


@pytest.mark.parametrize("K, V", [(64, 64), (128, 128), (256, 256), (64, 32), (64, 16), (60, 100), (64, 40),
                                  (200, 250)])
def test_every_value_dim_runs_bv64_with_three_stages(K, V):
    # off the tiles, V runs its tile (16 -> 64, 100 -> 128, 250 -> 256): BV = 64 divides each
    p = problem(K=K, V=V, T=8192, H=8, HV=8)
    assert backward_tiles(p) == TileConfig(64, 3) and unfit(p, TileConfig(64, 3)) is None


def test_a_forward_tuning_file_does_not_choose_the_backward_tiles(dirs):  # noqa: F811
    user, _ = dirs
    p = kimi(64, "fixed")
    write(user / "NVIDIA-H200.yaml", [entry(p, TileConfig(32, 2))])
    assert tuning.select_tiles(p) == TileConfig(32, 2)
    assert backward_tiles(p) == TileConfig(64, 3)


def test_the_backward_launches_its_chains_with_them(monkeypatch):
    x, opts, do, _ = backward_problem(T=20, K=64, V=64, gate="log")
    seen = []
    chain, recurrence = bkernels.launch_chain, bkernels.fwd.launch_recurrence

    def spy_chain(run, p, a, sc, dinit, nslots, per_seq, tiles):
        seen.append(("chain", tiles))
        return chain(run, p, a, sc, dinit, nslots, per_seq, tiles)

    def spy_recurrence(run, p, a, ws, o, s_out, nslots, per_seq, tiles, **kw):
        seen.append(("recurrence", tiles))
        return recurrence(run, p, a, ws, o, s_out, nslots, per_seq, tiles, **kw)

    monkeypatch.setattr(bkernels, "launch_chain", spy_chain)
    monkeypatch.setattr(bkernels.fwd, "launch_recurrence", spy_recurrence)
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    kdacupy.kda_backward(f32(do), **{k: f32(v) for k, v in x.items()}, **opts, backend="emulate")
    assert seen == [("recurrence", TileConfig(64, 3)), ("chain", TileConfig(64, 3))]

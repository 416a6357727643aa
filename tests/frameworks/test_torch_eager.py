"""kdacupy.torch.kda_decode's eager path (kdacupy/torch/eager.py) on CPU tensors standing for
CUDA tensors (kdacupy/cli/cuda_standins.py), no GPU: it launches what kdacupy.kda_decode
launches on CuPy arrays over the same memory, it is taken only where the custom op would do
the same thing, it notices tensors changed in place, and it bumps the pool's version as the
op's declared mutation does. The compat entry points' bench rows go down to the kernel."""
import numpy as np
import pytest

from tests.frameworks.common import import_torch

pytestmark = pytest.mark.torch
torch = import_torch()
cupy = pytest.importorskip("cupy", reason="needs CuPy (importable without a GPU) for the stand-ins")

import kdacupy  # noqa: E402
import kdacupy.torch as kt  # noqa: E402
from kdacupy.cli import bench_decode  # noqa: E402
from kdacupy.cli import cuda_standins as cs  # noqa: E402
from kdacupy.ops.forward.tuning import DEFAULT_SM_COUNT  # noqa: E402
from kdacupy.torch import eager  # noqa: E402
from kdacupy.torch.bridge import to_tensor  # noqa: E402

from tests.decode_inputs import make_decode  # noqa: E402

NO_TUNING = dict(name="kdacupy stand-in GPU", sm_count=DEFAULT_SM_COUNT)


@pytest.fixture()
def standins():
    with cs.standin_device(**NO_TUNING) as made, cs.standin_torch_cuda():
        yield made


def case(K=64, V=64):
    x, opts, pool = make_decode(N=3, T=1, H=2, HV=4, K=K, V=V)
    return x, opts, pool


def torch_args(x, opts, pool):
    t = lambda a: to_tensor(a) if isinstance(a, np.ndarray) else a  # noqa: E731
    return {n: t(a) for n, a in x.items()}, {n: t(a) for n, a in opts.items()}, to_tensor(pool)


def last_launch(made):
    fns = [fn for fn in made.values() if fn.last is not None]
    assert len(fns) == 1
    grid, block, args, smem = fns[0].last
    fns[0].last = None
    args = tuple(("pointer", a.data.ptr) if isinstance(a, cupy.ndarray) else (type(a), a.item()) for a in args)
    return fns[0].config, grid, block, args, smem


@pytest.mark.parametrize("K,V", [(64, 64), (60, 100)])  # a fixed-size variant, an any-size one
def test_the_eager_path_launches_what_kda_decode_launches_on_cupy(standins, K, V):
    x, opts, pool = case(K, V)
    tx, topts, tpool = torch_args(x, opts, pool)
    with torch.inference_mode():
        o = kt.kda_decode(**tx, **topts, state_pool=tpool)
        ours = last_launch(standins)
        o2 = kt.kda_decode(**tx, **topts, state_pool=tpool)  # the views cached: the same launch, o2 for o
        again = last_launch(standins)
        swap = {("pointer", o2.data_ptr()): ("pointer", o.data_ptr())}
        assert again[:3] + (tuple(swap.get(a, a) for a in again[3]),) + again[4:] == ours
    out = cs.device_view(o.view(torch.int16).numpy()).view(x["v"].dtype)  # o's memory, as the core gets it
    kdacupy.kda_decode(**cs.as_standins(x), **cs.as_standins(opts), state_pool=cs.device_view(pool), out=out)
    assert last_launch(standins) == ours
    assert ("pointer", tpool.data_ptr()) in ours[3] and ("pointer", o.data_ptr()) in ours[3]


def eager_args(tx, topts, tpool, **change):
    """ops.decode's positional arguments for the case, with ``change`` applied."""
    a = dict(tx, **topts, state_pool=tpool, num_accepted_tokens=None, out=torch.empty(tuple(tx["v"].shape),
             dtype=tx["v"].dtype), scale=None, backend=None)
    a.update(change)
    order = ("q", "k", "v", "g", "beta", "state_pool", "state_indices", "num_accepted_tokens", "A_log", "dt_bias",
             "out", "scale", "qk_l2norm", "beta_sigmoid", "allow_neg_eigval", "gate", "lower_bound", "state_layout",
             "backend", "null_slot", "cu_seqlens")
    return [a.get(n, dict(allow_neg_eigval=False, null_slot=-1).get(n)) for n in order]


def test_the_op_runs_where_eager_would_not_be_the_same(standins):
    from torch.utils._python_dispatch import TorchDispatchMode

    x, opts, pool = case()
    tx, topts, tpool = torch_args(x, opts, pool)
    with torch.inference_mode():
        assert eager.decode(*eager_args(tx, topts, tpool))
    seen = []

    class Logging(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Logging():
        assert not eager.decode(*eager_args(tx, topts, tpool))
    with torch.enable_grad():
        q = tx["q"].float().requires_grad_()
        assert not eager.decode(*eager_args(tx, topts, tpool, q=q))

    class Sub(torch.Tensor):
        pass

    with torch.inference_mode():
        assert not eager.decode(*eager_args(tx, topts, tpool, k=tx["k"].as_subclass(Sub)))
        assert not eager.decode(*eager_args(tx, topts, tpool, state_indices=torch.tensor([1, 3, 5])[None][0]
                                            .to(torch.int16)))  # a dtype the views are not made for
    with Logging():  # the public call under a mode: through the op, which the mode sees
        kt.kda_decode(**tx, **topts, state_pool=tpool)
    assert any("kdacupy.decode" in s for s in seen)


def test_the_eager_path_notices_tensors_changed_in_place(standins):
    x, opts, pool = case()
    tx, topts, tpool = torch_args(x, opts, pool)
    with torch.inference_mode():
        o = kt.kda_decode(**tx, **topts, state_pool=tpool)  # kept: the clone below may not take its memory
        before = last_launch(standins)
        moved = tx["q"].clone()
        tx["q"].set_(moved.untyped_storage(), 0, moved.shape, moved.stride())  # the same tensor, other memory
        kt.kda_decode(**tx, **topts, state_pool=tpool)
        after = last_launch(standins)
        assert ("pointer", moved.data_ptr()) in after[3] and ("pointer", moved.data_ptr()) not in before[3]
        assert o.data_ptr() != moved.data_ptr()
        tx["beta"].unsqueeze_(-1)  # its shape changed in place: kdacupy's own check, as through the op
        with pytest.raises(ValueError, match="beta"):
            kt.kda_decode(**tx, **topts, state_pool=tpool)


def test_the_pool_version_is_bumped_as_the_op_does(standins):
    x, opts, pool = case()
    tx, topts, tpool = torch_args(x, opts, pool)
    v0 = tpool._version
    kt.kda_decode(**tx, **topts, state_pool=tpool)
    kt.kda_decode(**tx, **topts, state_pool=tpool)
    assert tpool._version == v0 + 2
    assert sum(fn.launches for fn in standins.values()) == 2


def test_the_bench_reports_each_compat_entry_point():
    rows = bench_decode.compat_host_overhead(calls=50, gpu=NO_TUNING["name"], sm_count=DEFAULT_SM_COUNT)
    by = {r["entry"]: r for r in rows}
    for name in ("kdacupy.torch.kda_decode", "kdacupy.compat.fla.fused_recurrent_kda_fwd"):
        assert "error" not in by[name], by[name]
    for r in rows:  # a module there is timed to the kernel: one launch per call (and the first)
        assert "error" in r or r["launches"] == r["calls"] + 1 == 51, r

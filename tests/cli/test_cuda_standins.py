"""kda_decode's CUDA path on device-array stand-ins (kdacupy/cli/cuda_standins.py), no GPU:
the null kernel gets the launch the emulation's launcher makes for the same call (kernel
variant, grid, block, every argument, pointers included), first call and cached call alike;
the cached path notices changed arrays and options; the decode bench reports that path's
host time. Nothing is compiled (null kernels on both sides) and nothing is timed."""
from contextlib import contextmanager

import numpy as np
import pytest

import kdacupy
from kdacupy.cli import bench_decode
from kdacupy.cli import cuda_standins as cs
from kdacupy.emulate.loader import ArrayPointer
from kdacupy.jit.loaders import loader
from kdacupy.numerics.dtypes import BF16
from kdacupy.ops.decode import fastpath, kernels
from kdacupy.ops.forward.tuning import DEFAULT_SM_COUNT

from ..decode_inputs import make_decode

cupy = pytest.importorskip("cupy", reason="needs CuPy (importable without a GPU) for the stand-ins")

#: a device with no tuning file and the emulation's SM count: both paths take the same heuristic tiles
NO_TUNING = dict(name="kdacupy stand-in GPU", sm_count=DEFAULT_SM_COUNT)


@contextmanager
def null_emulation():
    """The emulation's loader with a NullKernel per variant: its launches kept, nothing compiled."""
    emu, made = loader("emulate"), {}

    def get(kernel, config, name):
        return made.setdefault((kernel, tuple(sorted(config.items()))), cs.NullKernel(kernel, config, name))

    emu.get = get
    kernels.launch_plan.cache_clear()
    fastpath.clear()
    try:
        yield made
    finally:
        del emu.get
        kernels.launch_plan.cache_clear()
        fastpath.clear()


def launched(made):
    """(kernel config, grid, block, arguments, shared memory) of the one kernel launched last."""
    fns = [fn for fn in made.values() if fn.last is not None]
    assert len(fns) == 1, [fn.config for fn in fns]
    grid, block, args, smem = fns[0].last
    fns[0].last = None
    return fns[0].config, grid, block, tuple(normal(a) for a in args), smem


def normal(a):
    """An argument as both sides can be compared: a pointer as its address, a scalar as (type, value)."""
    if isinstance(a, ArrayPointer):
        return "pointer", a.address
    if isinstance(a, cupy.ndarray):
        return "pointer", a.data.ptr
    return type(a), a.item()


def emulated(x, opts, pool, out):
    with null_emulation() as made:
        first = (kdacupy.kda_decode(**x, **opts, state_pool=pool, out=out, backend="emulate"), launched(made))
        cached = (kdacupy.kda_decode(**x, **opts, state_pool=pool, out=out, backend="emulate"), launched(made))
        assert len(fastpath._cache) == 1
    return first[1], cached[1]


def on_standins(x, opts, pool, out, **device):
    with cs.standin_device(**device) as made:
        x, opts = cs.as_standins(x), cs.as_standins(opts)
        pool, out = cs.device_view(pool), cs.device_view(out)
        first = (kdacupy.kda_decode(**x, **opts, state_pool=pool, out=out), launched(made))
        cached = (kdacupy.kda_decode(**x, **opts, state_pool=pool, out=out), launched(made))
        assert len(fastpath._cache) == 1  # the second call was the cached path
        assert all(fn.kernel == "kda_decode" for fn in made.values())
    return first[1], cached[1]


CASES = {
    "decode-fp32-sigmoid": dict(N=3, T=1, H=2, HV=4),
    "verify-bf16-kv-log": dict(N=2, T=3, H=1, HV=2, P=7, pool_dtype=BF16, layout="kv", gate="log",
                               indices=np.array([[0, 1, 2], [3, 4, 5]], np.int32)),
    "no-beta-int64": dict(N=2, T=1, H=1, beta=None, qk_l2norm=False, indices=np.array([3, 0], np.int64)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cuda_path_launches_what_the_emulation_launches(name):
    kw = dict(CASES[name])
    x, opts, pool = make_decode(**kw)
    if kw.get("T", 1) > 1:
        opts["num_accepted_tokens"] = np.array([2, 3], np.int32)
    out = np.empty(x["v"].shape, x["v"].dtype)
    emu = emulated(x, opts, pool, out)
    cuda = on_standins(x, opts, pool, out, **NO_TUNING)
    assert cuda == emu
    config, grid, block, args, smem = cuda[1]
    pointers = [a[1] for a in args if a[0] == "pointer"]
    assert x["q"].ctypes.data in pointers and pool.ctypes.data in pointers and out.ctypes.data in pointers


def test_a_tuned_device_changes_only_the_tiles():
    """With the H200's SM count the heuristic may pick other tiles: the config may differ in
    KDA_BV / KDA_WARPS (and the grid and block with them), never elsewhere."""
    x, opts, pool = make_decode(N=3, T=1, H=2, HV=4)
    out = np.empty(x["v"].shape, x["v"].dtype)
    emu = emulated(x, opts, pool, out)[1]
    cuda = on_standins(x, opts, pool, out, name="kdacupy stand-in GPU", sm_count=132)[1]
    tiles = ("KDA_BV", "KDA_WARPS")
    assert {n: v for n, v in cuda[0].items() if n not in tiles} == {n: v for n, v in emu[0].items() if n not in tiles}
    assert cuda[3] == emu[3]


@pytest.fixture()
def cached_call():
    """A stand-in call made once (its signature cached), and a way to call again with changes."""
    x, opts, pool = make_decode(N=3, T=1, H=2, HV=4, K=64, V=64)
    with cs.standin_device(**NO_TUNING) as made:
        x, opts = cs.as_standins(x), cs.as_standins(opts)
        pool = cs.device_view(pool)
        out = cs.device_array(x["v"].shape, x["v"].dtype)
        base = dict(x, **opts, state_pool=pool, out=out)
        kdacupy.kda_decode(**base)
        first = launched(made)

        def again(**change):
            kdacupy.kda_decode(**dict(base, **change))
            return launched(made)

        yield base, first, again


def arg_at(args, value):
    return [i for i, a in enumerate(args) if a == value]


def test_the_cached_path_follows_moved_and_restrided_arrays(cached_call):
    base, first, again = cached_call
    assert again() == first and len(fastpath._cache) == 1
    q2 = cs.device_array(base["q"].shape, base["q"].dtype)  # same signature, another address
    moved = again(q=q2)
    assert len(fastpath._cache) == 1
    slot = arg_at(first[3], ("pointer", base["q"].data.ptr))
    assert [moved[3][i] for i in slot] == [("pointer", q2.data.ptr)]
    wide = cs.device_array(base["q"].shape[:-1] + (2 * base["q"].shape[-1],), base["q"].dtype)
    strided = wide[..., : base["q"].shape[-1]]  # same shape, other strides: another key
    res = again(q=strided)
    assert len(fastpath._cache) == 2
    runs = lambda args, want: any(args[j:j + 3] == want for j in range(len(args)))  # noqa: E731
    want = tuple((np.int64, s // 2) for s in strided.strides[:3])  # q's batch, token, head strides in elements
    assert runs(res[3], want) and not runs(first[3], want)
    assert [res[3][i] for i in slot] == [("pointer", wide.data.ptr)]


def test_the_cached_path_notices_changed_options_and_dtypes(cached_call):
    base, first, again = cached_call
    scaled = again(scale=0.5)
    assert (np.float32, 0.5) in scaled[3] and (np.float32, 0.5) not in first[3]
    bf16_pool = cs.device_array(base["state_pool"].shape, BF16)
    assert again(state_pool=bf16_pool)[0]["KDA_POOL_DT"] != first[0]["KDA_POOL_DT"]
    idx64 = cs.device_view(np.array([1, 3, 5], np.int64))
    assert again(state_indices=idx64)[3] != first[3]
    assert len(fastpath._cache) == 4


def test_the_cached_path_rejects_what_the_first_call_would(cached_call):
    base, first, again = cached_call
    q = base["q"]
    host = np.zeros(q.nbytes + 16, np.uint8)
    off = -host.ctypes.data % 16 + 2  # rows starting 2 bytes past a 16-byte boundary
    odd = cs.device_view(host[off:off + q.nbytes].view(q.dtype).reshape(q.shape))
    with pytest.raises(ValueError, match="q: expected rows starting on 16-byte boundaries"):
        again(q=odd)
    pool = base["state_pool"]
    inside = cupy.ndarray(base["out"].shape, base["out"].dtype, memptr=pool.data)  # out in the pool's memory
    with pytest.raises(ValueError, match="out: expected memory separate from state_pool"):
        again(out=inside)
    other = cupy.ndarray(q.shape, q.dtype, memptr=cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(q.data.ptr, q.nbytes, q, 1), 0))  # the same memory, said to be on device 1
    with pytest.raises(ValueError, match="q: expected an array on the current CUDA device 0"):
        again(q=other)


def test_the_bench_reports_the_cuda_path_host_time():
    rows = bench_decode.cuda_host_overhead(calls=50, gpu=NO_TUNING["name"], sm_count=DEFAULT_SM_COUNT)
    assert [(r["T"], r["out_given"]) for r in rows] == [(1, True), (1, False), (4, True), (4, False)]
    for r in rows:  # every timed call (and the first) went down to the null kernel
        assert r["launches"] == r["calls"] + 1 == 51 and 0 < r["min_us"] <= r["median_us"]
        assert r["kernel"]["KDA_K"] == r["kernel"]["KDA_V"] == 128

"""kda_decode's host path: a call whose signature was seen skips the shape
checks but still rejects what depends on addresses and values (the same errors
as the first call), and the decode bench's CPU part."""
import json
import subprocess
import sys

import numpy as np
import pytest

import kdacupy
from kdacupy.ops.decode import fastpath as decode_fastpath
from kdacupy.cli import bench_decode
from kdacupy.numerics.dtypes import BF16

from ..decode_inputs import make_decode


@pytest.fixture()
def null():
    with bench_decode.null_launcher():
        yield


def first_then(x, opts, pool, **change):
    """One good call (fills the cache), then the same signature with ``change``."""
    kdacupy.kda_decode(**x, state_pool=pool, **opts, backend="emulate")
    assert len(decode_fastpath._cache) == 1
    args = dict(x, state_pool=pool, **opts)
    args.update(change)
    return args


@pytest.mark.emulate
def test_cached_calls_reject_what_the_first_call_would():
    """The real emulated kernel runs behind the cache, so "the pool is unchanged" would see a
    launch made before the rejection (under the null launcher nothing could change it)."""
    x, opts, pool = make_decode(N=3, T=2, H=1, P=8, indices=np.array([[0, 1], [2, 3], [4, 5]], np.int32))
    opts = dict(opts, num_accepted_tokens=np.array([1, 2, 1], np.int32))
    cases = [
        ("state_indices: expected distinct slots", dict(state_indices=np.array([[0, 1], [2, 3], [4, 1]], np.int32))),
        ("state_indices: expected slots < P = 8", dict(state_indices=np.array([[0, 1], [2, 3], [4, 8]], np.int32))),
        (r"num_accepted_tokens: expected values in \[1, T = 2\]",
         dict(num_accepted_tokens=np.array([1, 3, 1], np.int32))),
    ]
    for match, change in cases:
        decode_fastpath.clear()
        before = pool.copy()
        args = first_then(x, opts, pool, **change)
        assert not np.array_equal(pool, before)  # the first call ran the kernel: it wrote slots 0-5
        before = pool.copy()
        with pytest.raises(ValueError, match=match):
            kdacupy.kda_decode(**args, backend="emulate")
        np.testing.assert_array_equal(pool, before)


def test_cached_calls_check_overlap_alignment_and_flags(null):
    x, opts, pool = make_decode(N=2, T=1, H=1, K=64, V=64, P=5, pool_dtype=BF16)
    out = np.empty(x["v"].shape, BF16)
    decode_fastpath.clear()
    kdacupy.kda_decode(**x, state_pool=pool, **opts, out=out, backend="emulate")
    # an out of the same shape and strides that lives inside the pool: same key, caught per call
    fake = np.lib.stride_tricks.as_strided(pool, shape=out.shape, strides=out.strides)
    with pytest.raises(ValueError, match="out: expected memory separate from state_pool"):
        kdacupy.kda_decode(**x, state_pool=pool, **opts, out=fake, backend="emulate")
    ro = pool.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="state_pool: expected a writeable"):
        kdacupy.kda_decode(**x, state_pool=ro, **opts, out=out, backend="emulate")
    buf = np.zeros(x["q"].size * 2 + 8, np.uint8)[1:1 + x["q"].nbytes].view(BF16).reshape(x["q"].shape)
    buf[...] = x["q"]
    assert buf.strides == x["q"].strides and buf.ctypes.data % 16
    with pytest.raises(ValueError, match="q: expected rows starting on 16-byte boundaries"):
        kdacupy.kda_decode(**dict(x, q=buf), state_pool=pool, **opts, out=out, backend="emulate")


def test_option_types_are_part_of_the_key(null):
    x, opts, pool = make_decode(N=2, T=1, H=1, K=64, V=64, P=5)
    decode_fastpath.clear()
    kdacupy.kda_decode(**x, state_pool=pool, **opts, backend="emulate")
    with pytest.raises(TypeError, match="qk_l2norm: expected a bool"):
        kdacupy.kda_decode(**x, state_pool=pool, **dict(opts, qk_l2norm=1), backend="emulate")


def test_cached_calls_compute_the_same_as_first_calls():
    """The real emulated kernel: a second call with new arrays of the same
    signature (new addresses) uses the cached launch and still agrees."""
    x, opts, pool = make_decode(N=2, T=2, H=1, K=64, V=64, P=5)
    decode_fastpath.clear()
    kdacupy.kda_decode(**x, state_pool=pool.copy(), **opts, backend="emulate")
    x2, _, pool2 = make_decode(N=2, T=2, H=1, K=64, V=64, P=5, seed=4)
    p_fast, p_slow = pool2.copy(), pool2.copy()
    o_fast = kdacupy.kda_decode(**x2, state_pool=p_fast, **opts, backend="emulate")
    decode_fastpath.clear()
    o_slow = kdacupy.kda_decode(**x2, state_pool=p_slow, **opts, backend="emulate")
    np.testing.assert_array_equal(o_fast, o_slow)
    np.testing.assert_array_equal(p_fast, p_slow)


def test_bench_decode_shapes_and_bytes():
    shapes = bench_decode.decode_shapes()
    assert len(shapes) == 5 * 2 * 2 * 2
    b = bench_decode.step_bytes(dict(N=8, HV=16, T=4, pool=np.dtype(np.float32)))
    assert b["state_read"] == 8 * 16 * 128 * 128 * 4 and b["state_written"] == 4 * b["state_read"]
    assert b["total"] == b["state_read"] + b["state_written"] + b["inputs"] + b["output"]
    a, o = bench_decode.make_case(dict(N=8, HV=16, T=4, pool=np.dtype(np.float32)))
    assert o["state_indices"].shape == (8, 4) and len(set(o["state_indices"].ravel().tolist())) == 32


def test_host_overhead_times_the_whole_host_path_and_launches_nothing(monkeypatch):
    """bench_decode.host_overhead on a simulated clock: every kda_decode call takes 7 us, so the
    report must say 7.0 us per call (its min over repeats of the mean); each timed call went all
    the way to the (null) launch, and nothing ran: the pool is untouched."""
    import types

    import kdacupy.decode
    now = [0.0]
    monkeypatch.setattr(bench_decode, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    real = kdacupy.decode.kda_decode
    counts = dict(calls=0, launches=0)

    def timed(*a, **kw):
        now[0] += 7e-6
        counts["calls"] += 1
        return real(*a, **kw)

    def launch(fn, grid, block, args, shared_mem):
        counts["launches"] += 1

    monkeypatch.setattr(kdacupy.decode, "kda_decode", timed)
    monkeypatch.setattr(bench_decode._NullLoader, "launch", staticmethod(launch))
    pools = []
    real_case = bench_decode.make_case
    monkeypatch.setattr(bench_decode, "make_case", lambda s: pools.append(real_case(s)) or pools[-1])
    rows = bench_decode.host_overhead(calls=5, repeats=2)
    assert [(r["T"], r["out_given"]) for r in rows] == [(1, True), (1, False), (4, True), (4, False)]
    assert all((r["N"], r["HV"]) == (64, 32) for r in rows)
    assert all(r["us_per_call"] == pytest.approx(7.0) and r["numpy_pointer_us"] == 0.0 for r in rows)
    assert counts["calls"] == counts["launches"] == 4 * (1 + 5 * 2)
    for _, o in pools:  # zeros when built (too big to fill): still zeros, nothing was launched
        assert not o["state_pool"].any()


def test_bench_cli_measures_host_overhead_without_a_gpu(tmp_path):
    path = tmp_path / "decode.json"
    out = subprocess.run([sys.executable, "-m", "kdacupy.bench", "--shapes", "decode", "--json", str(path),
                          "--iters", "2"],
                         capture_output=True, text=True, timeout=600)
    doc = json.loads(path.read_text())
    rows = doc["host_overhead"]
    assert [(r["N"], r["HV"], r["T"], r["out_given"]) for r in rows] == [
        (64, 32, 1, True), (64, 32, 1, False), (64, 32, 4, True), (64, 32, 4, False)]
    for r in rows:  # what the JSON holds is what the table printed
        assert 0 < r["numpy_pointer_us"] and 0 < r["us_per_call"] < float("inf")
        line = (f"N=64 HV=32 T={r['T']} out {'given' if r['out_given'] else 'allocated'}: "
                f"{r['us_per_call']:.1f} us per call, of which {r['numpy_pointer_us']:.1f} us")
        assert line in out.stdout, (line, out.stdout)
    assert f"kda_forward's validation alone: {doc['forward_validation_us']:.1f} us" in out.stdout
    if "shapes" not in doc:
        assert out.returncode == 2 and "no CUDA GPU" in out.stderr


def test_decode_tuning_file_lookup(tmp_path, monkeypatch):
    import yaml

    from kdacupy.ops.decode import tuning as dt
    from kdacupy.ops.decode.kernels import DecodeTiles
    from kdacupy.validation import Problem

    p = Problem(B=64, T=1, H=32, HV=32, K=128, V=128, N=64, dtype=BF16, g_dtype=BF16, beta_dtype=BF16,
                gate="sigmoid", beta_mode="sigmoid", qk_l2norm=True, scale=1.0, lower_bound=-5.0,
                state_layout="vk", state_in_dtype=None, state_out_dtype=None, state_precision="fp32",
                varlen=False, device=True, backend="cuda")
    monkeypatch.setattr(dt, "_device", lambda: ("NVIDIA H200", 132))
    monkeypatch.setenv("KDACUPY_TUNING_DIR", str(tmp_path))
    dt.clear_cache()
    tiles, source = dt.describe(p, np.dtype(np.float32))
    assert source == "heuristic (untuned)" and tiles == dt.decode_heuristic(128, 128, 64 * 32, 132)
    b = dt.bucket_of(p, np.dtype(np.float32), 132)
    assert b == dict(K=128, V=128, pool="float32", tokens="1", parallelism=">=2")
    doc = dict(schema=1, kind="decode", gpu="NVIDIA H200", sm_count=132,
               buckets=[dict(match=b, config=dict(BV=32, warps=8), time_us=9.5)])
    (tmp_path / "NVIDIA-H200.decode.yaml").write_text(yaml.safe_dump(doc))
    dt.clear_cache()
    tiles, source = dt.describe(p, np.dtype(np.float32))
    assert tiles == DecodeTiles(32, 8) and source.endswith("NVIDIA-H200.decode.yaml")
    assert dt.describe(p, np.dtype(BF16))[1] == "heuristic (untuned)"  # another bucket
    doc["buckets"][0]["config"] = dict(BV=48, warps=8)  # not a tile configuration: the file is ignored
    (tmp_path / "NVIDIA-H200.decode.yaml").write_text(yaml.safe_dump(doc))
    dt.clear_cache()
    with pytest.warns(UserWarning, match="ignoring decode tuning file"):
        assert dt.describe(p, np.dtype(np.float32))[1] == "heuristic (untuned)"
    dt.clear_cache()


def test_decode_heuristic_and_tile_space():
    """The untuned rule over a grid of shapes, in terms of the grid it launches: 4 warps of
    4 value rows (BV = 16) when that grid has at least 4 CTAs per SM, else 4 warps of 2 rows
    (BV = 8, twice the CTAs); always a valid tile, and once wide, wide for every larger batch;
    head dims outside {64, 128, 256} too (ceil(V / BV) CTAs per head)."""
    from kdacupy.ops.decode.kernels import DECODE_TILE_SPACE, DecodeTiles, decode_candidates, decode_heuristic
    wide, narrow = DecodeTiles(16, 4), DecodeTiles(8, 4)
    seen = set()
    dims = (16, 60, 64, 96, 100, 128, 192, 256)
    for K in dims:
        for V in dims:
            assert decode_candidates(K, V) and all(t.valid_for(K, V) for t in decode_candidates(K, V))
            for sm in (1, 108, 132):
                was_wide = False
                for rows in sorted({1, 2, 16, 33, 64, 100, 132, 264, 528, 1000, 2048, 4096, 65536}):
                    t = decode_heuristic(K, V, rows, sm)
                    assert t.valid_for(K, V) and t.warps == 4 and t in (wide, narrow), (K, V, rows, sm, t)
                    ctas_per_sm = rows * -(-V // wide.BV) / sm  # the grid BV = 16 would launch
                    assert (t == wide) == (ctas_per_sm >= 4), (K, V, rows, sm, t)
                    assert t == wide or not was_wide, (K, V, rows, sm)
                    was_wide = t == wide
                    seen.add(t)
    assert seen == {wide, narrow}
    assert len(set(DECODE_TILE_SPACE)) == len(DECODE_TILE_SPACE)


def test_other_head_dims_select_their_key_tile_variant_and_tuning_buckets(tmp_path, monkeypatch):
    """K, V outside {64, 128, 256} run on the any-size variant of the key tile ceil(K / 32) * 32,
    which the compile registry builds at the Kimi options for the heuristic's tiles; a tuning
    file's bucket names the true K, V and its config must run them."""
    import yaml

    from kdacupy.ops.decode import tuning as dt
    from kdacupy.ops.decode.kernels import DecodeTiles, decode_candidates, decode_heuristic, decode_variant
    from kdacupy.ops.decode.variants import decode_variants
    from kdacupy.validation import Problem
    from kdacupy.validation.pool import Pool

    registry = set(decode_variants())
    for K, V, tile in ((16, 16, 32), (60, 100, 64), (100, 60, 128), (96, 96, 96), (192, 192, 192), (64, 60, 64),
                       (128, 128, 128), (256, 64, 256)):
        p = Problem(B=4, T=1, H=4, HV=4, K=K, V=V, N=4, dtype=BF16, g_dtype=BF16, beta_dtype=BF16,
                    gate="sigmoid", beta_mode="sigmoid", qk_l2norm=True, scale=K ** -0.5, lower_bound=-5.0,
                    state_layout="vk", state_in_dtype=None, state_out_dtype=None, state_precision="fp32",
                    varlen=False, device=True, backend="cuda")
        assert decode_candidates(K, V) and all(t.BV <= V for t in decode_candidates(K, V))
        for rows in (16, 4096):
            tiles = decode_heuristic(K, V, rows, 132)
            pool = Pool(8, np.dtype(BF16), "vk", False, False)
            var = decode_variant(p, pool, tiles)
            exact = K in (64, 128, 256) and V in (64, 128, 256)
            assert (var.K, var.V) == ((K, V) if exact else (tile, 0)), (K, V, var)
            assert var in registry, var.label()
    p = Problem(B=64, T=1, H=32, HV=32, K=60, V=100, N=64, dtype=BF16, g_dtype=BF16, beta_dtype=BF16,
                gate="sigmoid", beta_mode="sigmoid", qk_l2norm=True, scale=60 ** -0.5, lower_bound=-5.0,
                state_layout="vk", state_in_dtype=None, state_out_dtype=None, state_precision="fp32",
                varlen=False, device=True, backend="cuda")
    monkeypatch.setattr(dt, "_device", lambda: ("NVIDIA H200", 132))
    monkeypatch.setenv("KDACUPY_TUNING_DIR", str(tmp_path))
    dt.clear_cache()
    assert dt.describe(p, np.dtype(BF16)) == (decode_heuristic(60, 100, 64 * 32, 132), "heuristic (untuned)")
    b = dt.bucket_of(p, np.dtype(BF16), 132)
    assert (b["K"], b["V"]) == (60, 100)
    doc = dict(schema=1, kind="decode", gpu="NVIDIA H200", sm_count=132,
               buckets=[dict(match=b, config=dict(BV=64, warps=4), time_us=7.0)])  # 2 CTAs, the last 28 rows masked
    (tmp_path / "NVIDIA-H200.decode.yaml").write_text(yaml.safe_dump(doc))
    dt.clear_cache()
    assert dt.describe(p, np.dtype(BF16))[0] == DecodeTiles(64, 4)
    doc["buckets"][0]["match"] = dict(b, V=48)  # BV = 64 > V: not a tile configuration for those sizes
    (tmp_path / "NVIDIA-H200.decode.yaml").write_text(yaml.safe_dump(doc))
    dt.clear_cache()
    with pytest.warns(UserWarning, match="ignoring decode tuning file"):
        assert dt.describe(p, np.dtype(BF16))[1] == "heuristic (untuned)"
    dt.clear_cache()


def test_tune_decode_cli_without_a_gpu():
    from kdacupy.cli import timing
    if timing.gpu_available():
        pytest.skip("a GPU is present: the tuner would run")
    out = subprocess.run([sys.executable, "-m", "kdacupy.tune", "--decode"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "--dry-run" in out.stderr

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


def test_cached_calls_reject_what_the_first_call_would(null):
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
        args = first_then(x, opts, pool, **change)
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


def test_bench_cli_measures_host_overhead_without_a_gpu(tmp_path):
    path = tmp_path / "decode.json"
    out = subprocess.run([sys.executable, "-m", "kdacupy.bench", "--shapes", "decode", "--json", str(path),
                          "--iters", "2"],
                         capture_output=True, text=True, timeout=600)
    doc = json.loads(path.read_text())
    assert {r["T"] for r in doc["host_overhead"]} == {1, 4}
    assert all(r["us_per_call"] > 0 for r in doc["host_overhead"]) and doc["forward_validation_us"] > 0
    assert "host overhead of kda_decode" in out.stdout
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
    from kdacupy.ops.decode.kernels import DECODE_TILE_SPACE, DecodeTiles, decode_candidates, decode_heuristic
    for K in (64, 128, 256):
        for V in (64, 128, 256):
            assert decode_candidates(K, V) and all(t.valid_for(K, V) for t in decode_candidates(K, V))
            for rows in (1, 16, 4096):
                assert decode_heuristic(K, V, rows).valid_for(K, V)
    assert decode_heuristic(128, 128, 16, 132) == DecodeTiles(8, 4)  # few heads: more, smaller CTAs
    assert decode_heuristic(128, 128, 64 * 32, 132) == DecodeTiles(16, 4)
    assert len(set(DECODE_TILE_SPACE)) == len(DECODE_TILE_SPACE)


def test_tune_decode_cli_without_a_gpu():
    from kdacupy.cli import timing
    if timing.gpu_available():
        pytest.skip("a GPU is present: the tuner would run")
    out = subprocess.run([sys.executable, "-m", "kdacupy.tune", "--decode"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "--dry-run" in out.stderr

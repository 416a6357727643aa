"""``python -m kdacupy.bench`` without a GPU: help, the no-GPU message, the
shapes, the traffic formula, and the JSON it writes with the GPU steps
(inputs, kernel calls, timing, FLA) replaced."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kdacupy.cli.bench as bench
import kdacupy.cli.peers as peers
import kdacupy.cli.timing as timing
from kdacupy.cli.shapes import (KIMI_VARLEN, Shape, compulsory_bytes, fewhead_shapes, kimi_shapes, make_inputs, parse_shape,
                            shape_problem)
from kdacupy.ops.forward.tuning import TileConfig

ROOT = Path(__file__).resolve().parents[2]


def test_help_works_without_a_gpu():
    out = subprocess.run([sys.executable, "-m", "kdacupy.bench", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for word in ("--shapes", "--json", "--iters", "--warmup", "--no-fla", "FLA_FLASH_KDA", "copy bandwidth"):
        assert word in out.stdout


def test_without_a_gpu_it_says_so(monkeypatch, capsys):
    monkeypatch.setattr(timing, "gpu_available", lambda: False)
    assert bench.main(["--shapes", "kimi"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_kimi_shapes():
    shapes = kimi_shapes()
    assert len(shapes) == 6
    assert sorted((s.H, s.N, s.lens is not None, s.B) for s in shapes) == [
        (64, 1, False, 1), (64, 6, True, 1), (64, 8, True, 1), (96, 1, False, 1), (96, 6, True, 1), (96, 8, True, 1)]
    assert [s.lens for s in shapes if s.N == 8] == [(1024,) * 8] * 2
    for s in shapes:
        assert s.T == 8192 and (s.lens is None or sum(s.lens) == 8192)
        assert (s.K, s.V, s.hv, s.dtype, s.state_precision) == (128, 128, s.H, "bf16", "bf16")
    assert sum(KIMI_VARLEN) == 8192 and KIMI_VARLEN == (1300, 547, 2048, 963, 271, 3063)
    assert all(s.name.startswith("kimi-") for s in shapes)


def test_fewhead_shapes():
    got = {(s.H, s.T, s.lens) for s in fewhead_shapes()}
    for H in (12, 16):
        assert {(H, T, None) for T in (16384, 32768, 65536, 131072)} < got
        ragged = [s for s in fewhead_shapes() if s.H == H and s.lens]
        assert sorted(len(s.lens) for s in ragged) == [2, 4] and all(sum(s.lens) == s.T for s in ragged)
        assert all(n % 16 for s in ragged for n in s.lens)  # every sequence ends in a ragged chunk
    assert len(got) == 12 and all(s.B == 1 for s in fewhead_shapes())


def test_bytes_by_hand():
    s = Shape("tiny", T=3, H=2, HV=4, K=64, V=128, B=2)
    b = compulsory_bytes(s)
    q = 2 * 3 * 2 * 64 * 2  # B T H K x 2 bytes
    v = 2 * 3 * 4 * 128 * 2
    g = 2 * 3 * 4 * 64 * 2
    beta = 2 * 3 * 4 * 2
    state = 2 * 4 * 64 * 128 * 2  # N HV K V x bf16
    assert b["read"] == 2 * q + v + g + beta + 4 * 4 + 4 * 64 * 4 + state == 144448
    assert b["written"] == v + state == 137216
    assert b["total"] == 281664
    var = compulsory_bytes(Shape("tinyvar", T=30, H=1, K=64, V=64, lens=(10, 0, 20)))
    assert var["parts"]["cu_seqlens"] == 4 * 8 and var["parts"]["initial_state"] == 3 * 64 * 64 * 2


@pytest.mark.parametrize("shape", [Shape("a", T=19, H=2, HV=4, K=64, V=128, B=2),
                                   Shape("b", T=30, H=1, K=64, V=64, lens=(10, 0, 20)),
                                   Shape("c", T=17, H=1, K=64, V=64, dtype="fp32")])
def test_bytes_match_the_arrays(shape):
    """Every array the benchmark passes is read once; o and the final state written once."""
    arrays, options = make_inputs(shape)
    read = sum(x.nbytes for x in [*arrays.values(), *options.values()] if isinstance(x, np.ndarray))
    b = compulsory_bytes(shape)
    assert b["read"] == read
    assert b["written"] == arrays["v"].nbytes + options["initial_state"].nbytes


def test_inputs_are_random_normalised_and_never_zero():
    arrays, options = make_inputs(Shape("x", T=40, H=2, K=64, V=64, lens=(25, 15)))
    for n, x in [*arrays.items(), ("initial_state", options["initial_state"]), ("A_log", options["A_log"])]:
        assert np.count_nonzero(np.asarray(x, np.float32)) > 0.99 * x.size, n
    norms = np.linalg.norm(arrays["q"].astype(np.float32), axis=-1)
    assert np.allclose(norms, 1.0, atol=1e-2)
    assert options["initial_state"].shape == (2, 2, 64, 64) and options["state_layout"] == "vk"
    assert list(options["cu_seqlens"]) == [0, 25, 40]
    assert options["gate"] == "sigmoid" and options["lower_bound"] == -5.0 and options["beta_sigmoid"]


def test_the_benchmark_inputs_run_through_kda_forward():
    """The options are valid kda_forward arguments (the model backend, on the CPU)."""
    import kdacupy

    arrays, options = make_inputs(Shape("x", T=20, H=1, K=64, V=64, lens=(12, 8)))
    o, s = kdacupy.kda_forward(**arrays, **options, backend="model")
    assert o.shape == arrays["v"].shape and s.shape == options["initial_state"].shape
    assert np.isfinite(o.astype(np.float32)).all()


def test_shape_problem_sizes():
    p = shape_problem(Shape("x", T=65536, H=12))
    assert (p.T, p.H, p.HV, p.N, p.varlen, p.device) == (65536, 12, 12, 1, False, True)
    p = shape_problem(Shape("y", T=8192, H=64, lens=KIMI_VARLEN))
    assert (p.N, p.varlen) == (6, True)


def test_geomean_and_row():
    assert bench.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert bench.geomean([None, 0, 2.0]) == pytest.approx(2.0) and bench.geomean([]) is None
    s = Shape("kimi-x", T=8192, H=96)
    row = bench.make_row(s, (0.5, 0.4), TileConfig(32, 2), "heuristic (untuned)", dict(median_ms=1.5, min_ms=1.4),
                         copy_gbps=4000.0)
    total = compulsory_bytes(s)["total"]
    assert row["achieved_gbps"] == pytest.approx(total / 0.5e-3 / 1e9)
    assert row["fraction_of_copy_bw"] == pytest.approx(row["achieved_gbps"] / 4000.0)
    assert row["ratio_fla_over_kdacupy"] == pytest.approx(3.0)
    assert 1.0e9 < total < 1.02e9  # docs/design.md section 6: about 1 GB for T=8192, H=96, D=128 bf16


# ---------------------------------------------------------------------------
# a whole run, GPU steps replaced


INFO = dict(name="NVIDIA H200", model="NVIDIA-H200", sm_count=132, device_id=0, compute_capability="9.0",
            l2_bytes=50 * 2 ** 20, memory_bytes=141 * 2 ** 30, cupy="14.2.0", cuda_runtime=13000,
            cuda_driver=13000, kdacupy="0.1.0", python="3.11")


@pytest.fixture
def fake_gpu(monkeypatch):
    calls = dict(timed=0, kdacupy=0)

    def fake_time(fns, warmup, iters, clock="cupy"):
        calls["timed"] += 1
        for f in fns:
            f()
        return (2.0, 1.5) if clock == "torch" else (0.5, 0.45)

    def fake_calls(sets):
        def run(a=sets[0][0], o=sets[0][1]):
            calls["kdacupy"] += 1
            return "o", "s"
        return [run for _ in sets]

    monkeypatch.setattr(timing, "gpu_available", lambda: True)
    monkeypatch.setattr(timing, "device_info", lambda: dict(INFO))
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4000.0)
    monkeypatch.setattr(bench, "device_inputs", lambda shape, seed: ("arrays", "options"))
    monkeypatch.setattr(bench, "selection", lambda a, o: (TileConfig(32, 2), "heuristic (untuned)"))
    monkeypatch.setattr(bench, "kdacupy_calls", fake_calls)
    monkeypatch.setattr(timing, "finite", lambda x: True)
    monkeypatch.setattr(timing, "time_calls", fake_time)
    monkeypatch.setenv("KDACUPY_COMMIT", "cafe" * 10)
    return calls


def test_json_without_fla(fake_gpu, tmp_path, capsys):
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "kimi", "--json", str(path), "--no-fla", "--iters", "3"]) == 0
    doc = json.loads(path.read_text())
    assert doc["device"]["name"] == "NVIDIA H200" and doc["device"]["sm_count"] == 132
    assert doc["device"]["cupy"] == "14.2.0" and doc["device"]["cuda_runtime"] == 13000
    assert doc["commit"] and len(doc["commit"]) == 40  # git rev-parse, or KDACUPY_COMMIT
    assert doc["copy_bandwidth_gbps"] == 4000.0 and doc["iters"] == 3 and doc["complete"] is True
    assert len(doc["shapes"]) == 6 and doc["geomean_fla_over_kdacupy_kimi"] is None
    for r in doc["shapes"]:
        k = r["kdacupy"]
        assert (k["median_ms"], k["min_ms"], k["tiles"], k["tiles_source"]) == (
            0.5, 0.45, dict(BV=32, stages=2), "heuristic (untuned)")
        assert r["bytes"]["total"] == compulsory_bytes(parse_shape(
            f"T=8192,H={r['shape']['H']}" if r["shape"]["lens"] is None else
            f"varlen={':'.join(map(str, r['shape']['lens']))},H={r['shape']['H']}"))["total"]
        assert r["achieved_gbps"] == pytest.approx(r["bytes"]["total"] / 0.5e-3 / 1e9)
        assert r["fla"] is None and r["ratio_fla_over_kdacupy"] is None
    out = capsys.readouterr().out
    assert "kimi-T8192-H96" in out and "FLA did not run" in out and str(path) in out
    assert fake_gpu["timed"] == 6


class FakeFLA:
    version, layout_kw = "0.0-test", "state_v_first"

    def __init__(self):
        pass


def test_json_with_fla_ratios_errors_and_geomean(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "fla_importable", lambda: None)
    monkeypatch.setattr(peers, "FLA", FakeFLA)

    def fake_run_fla(fla, sets, o, s, warmup, iters):
        assert isinstance(fla, FakeFLA) and (o, s) == ("o", "s")
        name = fake_run_fla.names.pop(0)
        if name == "kimi-varlen6-H64":
            raise RuntimeError("triton: out of resources")
        ms = 2.0 if "H96" in name else 8.0
        return dict(median_ms=ms, min_ms=ms, rms_ratio_o=1e-3, rms_ratio_state=2e-3, state_dtype="float32",
                    backend="fused_infer")

    fake_run_fla.names = [s.name for s in kimi_shapes()]
    monkeypatch.setattr(peers, "run_fla", fake_run_fla)
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "kimi", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    rows = {r["shape"]["name"]: r for r in doc["shapes"]}
    assert rows["kimi-T8192-H96"]["ratio_fla_over_kdacupy"] == pytest.approx(4.0)
    assert rows["kimi-T8192-H64"]["ratio_fla_over_kdacupy"] == pytest.approx(16.0)
    assert rows["kimi-varlen6-H64"]["fla"] == dict(error="RuntimeError: triton: out of resources")
    assert rows["kimi-varlen6-H64"]["ratio_fla_over_kdacupy"] is None
    # three H96 shapes at 4x, two H64 shapes at 16x (one failed)
    assert doc["geomean_fla_over_kdacupy_kimi"] == pytest.approx(math.exp((3 * math.log(4) + 2 * math.log(16)) / 5))
    assert doc["kimi_shapes_with_fla"] == 5
    assert doc["fla_status"].startswith("fla 0.0-test")
    assert rows["kimi-T8192-H96"]["fla"]["state_dtype"] == "float32"


def test_default_json_path(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--shapes", "T=64,H=2", "--no-fla"]) == 0
    (f,) = (tmp_path / "benchmarks").glob("*.json")
    assert f.name.startswith("NVIDIA-H200_") and json.loads(f.read_text())["shapes"][0]["shape"]["T"] == 64


def test_small_inputs_rotate_two_sets(fake_gpu, tmp_path, monkeypatch):
    seeds = []
    monkeypatch.setattr(bench, "device_inputs", lambda shape, seed: seeds.append(seed) or ("a", "o"))
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "T=64,H=2", "T=65536,H=12", "--no-fla",
                       "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["shapes"]
    assert [r["rotated_inputs"] for r in rows] == [True, False] and seeds == [0, 1, 0]


def test_no_fla_when_not_importable(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "fla_importable", lambda: "fla is not installed")
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "T=64,H=2", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["fla_status"] == "fla is not installed"


def test_fla_state_layout_keyword_follows_the_signature():
    """Read from chunk_kda's signature: state_v_first, else the older
    transpose_state_layout, else none (FLA's [K, V] default); never a keyword
    that **kwargs would swallow."""
    import functools

    def new(q, k, v, g, beta, scale=None, initial_state=None, state_v_first=False, **kwargs):
        pass

    def old(q, k, v, g, beta, scale=None, initial_state=None, transpose_state_layout=False, **kwargs):
        pass

    def older(q, k, v, g, beta, scale=None, initial_state=None, **kwargs):
        pass

    @functools.wraps(new)
    def decorated(*args, **kwargs):  # as FLA's dispatch / torch.compiler.disable wrap it
        return new(*args, **kwargs)

    for fn, want in ((new, "state_v_first"), (old, "transpose_state_layout"), (older, None),
                     (decorated, "state_v_first")):
        assert peers.layout_keyword(peers.signature_params(fn)) == want


def test_a_failing_shape_is_recorded_and_the_rest_run(fake_gpu, tmp_path, monkeypatch, capsys):
    real = bench.bench_shape

    def flaky(shape, *a):
        if shape.T == 64:
            raise RuntimeError("CUDA_ERROR_OUT_OF_MEMORY")
        return real(shape, *a)

    monkeypatch.setattr(bench, "bench_shape", flaky)
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "T=64,H=2", "T=128,H=2", "--no-fla", "--json", str(path)]) == 1
    rows = json.loads(path.read_text())["shapes"]
    assert rows[0]["error"] == "RuntimeError: CUDA_ERROR_OUT_OF_MEMORY" and rows[0]["kdacupy"] is None
    assert rows[1]["kdacupy"]["median_ms"] == 0.5
    out = capsys.readouterr()
    assert "ERROR: RuntimeError" in out.out and "T=64,H=2" in out.err


def test_json_is_written_after_every_shape(fake_gpu, tmp_path, monkeypatch):
    real = bench.bench_shape

    def stop_at_second(shape, *a):
        if shape.T == 128:
            raise KeyboardInterrupt  # as a time limit would stop it
        return real(shape, *a)

    monkeypatch.setattr(bench, "bench_shape", stop_at_second)
    path = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--shapes", "T=64,H=2", "T=128,H=2", "--no-fla", "--json", str(path)])
    doc = json.loads(path.read_text())
    assert doc["complete"] is False and [r["shape"]["T"] for r in doc["shapes"]] == [64]

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
from kdacupy.numerics.dtypes import BF16
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
    assert (12, 8192, None) in got  # the serving shape (Kimi-K3 at tensor parallelism 8)
    assert len(got) == 13 and all(s.B == 1 for s in fewhead_shapes())


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


class DeviceClock:
    """A simulated GPU under the benchmark's own timing: ``timing.time_calls`` runs unchanged,
    its CUDA events read a virtual clock, and every kdacupy call advances that clock by a known
    time. So the JSON's times are what the benchmark measured, through its own median / min,
    warm-up and first-call handling, and the tests compute what they must be."""

    def __init__(self):
        self.now = 0.0

    def advance(self, ms):
        self.now += ms

    def event(self):
        clock = self

        class Event:
            def record(self, stream=None):
                self.t = clock.now

            def synchronize(self):
                pass
        return Event()

    @staticmethod
    def elapsed(start, end):
        return end.t - start.t


def call_ms(shape, i):
    """The simulated time of the i-th kdacupy call (0: the first, untimed one) on ``shape``:
    the bigger the shape, the longer, and every call a little longer than the last, so
    timing a warm-up call (or missing one) shows in the median and the min."""
    return shape.T * shape.H / (8192 * 96) * (1.0 + i / 100)


def expected_times(shape, warmup, iters):
    """(median, min) the benchmark must report: one untimed first call, ``warmup`` untimed calls,
    then ``iters`` timed ones."""
    timed = [call_ms(shape, i) for i in range(1 + warmup, 1 + warmup + iters)]
    return float(np.median(timed)), min(timed)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU steps replaced: device facts, inputs (a shape tag), kernel calls (NumPy outputs,
    so the benchmark's own finiteness check runs) and the device clock under its timing."""
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    clock = DeviceClock()
    calls = dict(kdacupy=0, nonfinite=set())

    def fake_calls(sets):
        shape = sets[0][0]["shape"]
        count = [0]

        def run():
            clock.advance(call_ms(shape, count[0]))
            count[0] += 1
            calls["kdacupy"] += 1
            o = np.full(4, np.nan if shape.name in calls["nonfinite"] else 1.0, BF16)
            return o, np.ones(4, np.float32)
        return [run for _ in sets]

    monkeypatch.setattr(timing, "gpu_available", lambda: True)
    monkeypatch.setattr(timing, "device_info", lambda: dict(INFO))
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4000.0)
    monkeypatch.setattr(bench, "device_inputs", lambda shape, seed: (dict(shape=shape), {}))
    monkeypatch.setattr(bench, "selection", lambda a, o: (TileConfig(32 if a["shape"].H > 64 else 64, 2),
                                                          "heuristic (untuned)"))
    monkeypatch.setattr(bench, "kdacupy_calls", fake_calls)
    monkeypatch.setattr(cupy.cuda, "Event", clock.event)
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: None)
    monkeypatch.setattr(cupy.cuda, "get_elapsed_time", clock.elapsed)
    monkeypatch.setenv("KDACUPY_COMMIT", "cafe" * 10)
    calls["clock"] = clock
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
    by_name = {s.name: s for s in kimi_shapes()}
    for r in doc["shapes"]:
        k, shape = r["kdacupy"], by_name[r["shape"]["name"]]
        med, mn = expected_times(shape, 10, 3)  # --warmup 10 (the default), --iters 3
        assert k["median_ms"] == pytest.approx(med) and k["min_ms"] == pytest.approx(mn)
        assert k["tiles"] == dict(BV=32 if shape.H > 64 else 64, stages=2) and k["finite"] is True
        assert r["bytes"]["total"] == compulsory_bytes(parse_shape(
            f"T=8192,H={r['shape']['H']}" if r["shape"]["lens"] is None else
            f"varlen={':'.join(map(str, r['shape']['lens']))},H={r['shape']['H']}"))["total"]
        assert r["achieved_gbps"] == pytest.approx(r["bytes"]["total"] / (med * 1e-3) / 1e9)
        assert r["fla"] is None and r["ratio_fla_over_kdacupy"] is None
    out = capsys.readouterr().out
    assert "kimi-T8192-H96" in out and "FLA did not run" in out and str(path) in out
    assert fake_gpu["kdacupy"] == 6 * (1 + 10 + 3)


def test_non_finite_output_is_recorded_and_fails_the_run(fake_gpu, tmp_path, capsys):
    """The benchmark's own finiteness check (timing.finite on the first call's outputs)."""
    fake_gpu["nonfinite"].add("kimi-T8192-H64")
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "kimi", "--json", str(path), "--no-fla", "--iters", "2"]) == 1
    rows = {r["shape"]["name"]: r for r in json.loads(path.read_text())["shapes"]}
    assert [n for n, r in rows.items() if not r["kdacupy"]["finite"]] == ["kimi-T8192-H64"]
    assert "non-finite output for kimi-T8192-H64" in capsys.readouterr().err


class FakeFLA:
    version, layout_kw = "0.0-test", "state_v_first"

    def __init__(self):
        pass


def test_json_with_fla_ratios_errors_and_geomean(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "fla_importable", lambda: None)
    monkeypatch.setattr(peers, "FLA", FakeFLA)

    def fake_run_fla(fla, sets, o, s, warmup, iters):
        assert isinstance(fla, FakeFLA) and bench.timing.finite(o) and s.dtype == np.float32  # the first call's
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
    ratios = []
    for shape in kimi_shapes():
        r = rows[shape.name]
        if shape.name == "kimi-varlen6-H64":
            assert r["fla"] == dict(error="RuntimeError: triton: out of resources")
            assert r["ratio_fla_over_kdacupy"] is None
            continue
        med = expected_times(shape, 10, 100)[0]  # the defaults: --warmup 10, --iters 100
        ratios.append((2.0 if shape.H == 96 else 8.0) / med)
        assert r["ratio_fla_over_kdacupy"] == pytest.approx(ratios[-1])
    assert doc["geomean_fla_over_kdacupy_kimi"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 5))
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
    monkeypatch.setattr(bench, "device_inputs", lambda shape, seed: seeds.append(seed) or (dict(shape=shape), {}))
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
    assert rows[1]["kdacupy"]["median_ms"] == pytest.approx(expected_times(parse_shape("T=128,H=2"), 10, 100)[0])
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

"""The serial-vs-split columns of ``python -m kdacupy.bench`` without a GPU: the
device replaced (kda_forward's outputs, the CUDA-event clock: tests/cli/test_bench_cli.py's
fake_gpu), the benchmark's own code kept (its calls, its timing, its finiteness and RMS
checks), the JSON and the table checked; and one run end to end on the precision model."""
import json

import numpy as np
import pytest

import kdacupy.api
import kdacupy.cli.bench as bench
import kdacupy.cli.bench_seqpar as bench_seqpar
from kdacupy.cli.shapes import parse_shape

from .test_bench_cli import expected_times, fake_gpu  # noqa: F401  (the fixture)

KDACUPY_CALLS = bench.kdacupy_calls  # the real one (fake_gpu replaces it)

#: simulated time of one call, by segment count (1: serial)
SPLIT_MS = {1: 8.0, 2: 6.0, 4: 4.0, 8: 2.0, 16: 2.5, 32: 3.0}


def split_times(n, warmup, iters):
    """(median, min) for n segments: one untimed first call, warm-up, timed calls, each call a
    little longer than the last (so a timed warm-up call would show)."""
    timed = [SPLIT_MS[n] * (1.0 + i / 100) for i in range(1 + warmup, 1 + warmup + iters)]
    return float(np.median(timed)), min(timed)


@pytest.fixture
def fake_split(fake_gpu, monkeypatch):  # noqa: F811
    """kda_forward(backend="cuda", sequence_parallel=n) replaced by a call that takes SPLIT_MS[n]
    on the simulated clock and returns the serial output, or it times (1 + 1e-3) for a split
    (NaN for the n in ``nonfinite``)."""
    clock, seen, nonfinite = fake_gpu["clock"], [], set()
    count = {}

    def fake_forward(shape=None, backend=None, sequence_parallel=None, **kw):
        assert backend == "cuda" and shape is not None
        n = sequence_parallel
        clock.advance(SPLIT_MS[n] * (1.0 + count.get(n, 0) / 100))
        count[n] = count.get(n, 0) + 1
        seen.append(n)
        o = np.linspace(1.0, 2.0, 64, dtype=np.float32) * (1.0 if n == 1 else 1.0 + 1e-3)
        if n in nonfinite:
            o[3] = np.nan
        return o, np.ones(8, np.float32)

    def fresh_shape():
        count.clear()

    monkeypatch.setattr(kdacupy.api, "kda_forward", fake_forward)
    monkeypatch.setattr(bench_seqpar, "auto_choice", lambda sets: (16, "on: predicted gain 3.00x"))
    real_measure = bench_seqpar.measure
    monkeypatch.setattr(bench_seqpar, "measure", lambda *a: fresh_shape() or real_measure(*a))
    return dict(seen=seen, nonfinite=nonfinite)


def test_fewhead_shapes_get_serial_and_split_columns(fake_split, tmp_path, capsys):
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "fewhead", "--no-fla", "--json", str(path), "--iters", "2"]) == 0
    doc = json.loads(path.read_text())
    assert len(doc["shapes"]) == 13
    serial = split_times(1, 10, 2)
    for r in doc["shapes"]:
        sp = r["seqpar"]
        assert sp["auto_segments"] == 16
        assert sp["serial"]["median_ms"] == pytest.approx(serial[0]) and sp["serial"]["min_ms"] == pytest.approx(serial[1])
        assert sorted(map(int, sp["splits"])) == list(bench_seqpar.DEFAULT_SPLITS)
        for n, row in sp["splits"].items():
            med, mn = split_times(int(n), 10, 2)
            assert row["median_ms"] == pytest.approx(med) and row["min_ms"] == pytest.approx(mn)
            assert row["speedup"] == pytest.approx(serial[0] / med)
            assert row["rms_vs_serial_o"] == pytest.approx(1e-3, rel=1e-3) and row["rms_vs_serial_state"] == 0.0
            assert row["finite"] is True
        assert sp["best"] == dict(segments=8, speedup=pytest.approx(SPLIT_MS[1] / SPLIT_MS[8]))
    out = capsys.readouterr().out
    assert "sequence parallelism: serial vs split" in out and "8@4.00x" in out and "fewhead-varlen4-H16" in out
    assert fake_split["seen"].count(1) == 13 * (1 + 10 + 2)


def test_a_non_finite_split_is_flagged(fake_split, tmp_path):
    fake_split["nonfinite"].add(32)
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "T=4096,H=2", "--no-fla", "--json", str(path), "--split", "8", "32",
                       "--iters", "2"]) == 0
    (r,) = json.loads(path.read_text())["shapes"]
    assert r["seqpar"]["splits"]["8"]["finite"] is True and r["seqpar"]["splits"]["32"]["finite"] is False


def test_one_run_end_to_end_on_the_precision_model(fake_gpu, tmp_path, monkeypatch):  # noqa: F811
    """The benchmark's calls, checks and JSON for real, the kernels' results from the precision
    model (kda_forward(backend="cuda") runs backend="model" on NumPy inputs), the clock simulated:
    catches what faking the calls would hide (an import that fails, a split the RMS check flags)."""
    from kdacupy.cli.shapes import make_inputs
    real = kdacupy.api.kda_forward
    clock = fake_gpu["clock"]

    def on_the_model(*a, backend=None, **kw):
        assert backend == "cuda"
        clock.advance(1.0)
        return real(*a, backend="model", **kw)

    monkeypatch.setattr(kdacupy.api, "kda_forward", on_the_model)
    monkeypatch.setattr(bench, "kdacupy_calls", KDACUPY_CALLS)
    monkeypatch.setattr(bench, "device_inputs", lambda shape, seed: make_inputs(shape, np, seed))
    from kdacupy.ops.forward.tuning import TileConfig
    monkeypatch.setattr(bench, "selection", lambda a, o: (TileConfig(32, 2), "heuristic (untuned)"))
    path = tmp_path / "r.json"
    rc = bench.main(["--shapes", "T=64,H=2", "--no-fla", "--json", str(path), "--split", "2", "--iters", "2",
                      "--warmup", "1"])
    (r,) = json.loads(path.read_text())["shapes"]
    assert rc == 0, r
    assert r["kdacupy"]["finite"] is True and r["kdacupy"]["median_ms"] == pytest.approx(1.0)
    sp = r["seqpar"]
    assert sp["auto_segments"] == 1 and sp["auto_why"].startswith("off")  # NumPy arrays: serial
    row = sp["splits"]["2"]
    assert row["finite"] is True and 0 < row["rms_vs_serial_o"] < 2.0 ** -8 and row["rms_vs_serial_state"] < 2.0 ** -8


def test_split_counts_on_any_shape_and_off_switch(fake_split, tmp_path):
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "T=4096,H=2", "--no-fla", "--json", str(path), "--split", "4"]) == 0
    (r,) = json.loads(path.read_text())["shapes"]
    assert list(r["seqpar"]["splits"]) == ["4"]
    assert bench.main(["--shapes", "T=4096,H=2", "--no-fla", "--json", str(path)]) == 0
    assert "seqpar" not in json.loads(path.read_text())["shapes"][0]  # not a fewhead shape
    assert bench.main(["--shapes", "fewhead", "--no-fla", "--json", str(path), "--no-split"]) == 0
    assert all("seqpar" not in r for r in json.loads(path.read_text())["shapes"])


def test_a_failing_split_is_recorded(fake_split, tmp_path, monkeypatch, capsys):
    def boom(sets):
        raise RuntimeError("CUDA_ERROR_OUT_OF_MEMORY")
    monkeypatch.setattr(bench_seqpar, "auto_choice", boom)
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "T=4096,H=2", "--no-fla", "--json", str(path), "--split", "4"]) == 0
    (r,) = json.loads(path.read_text())["shapes"]
    assert r["seqpar"] == dict(error="RuntimeError: CUDA_ERROR_OUT_OF_MEMORY")
    assert r["kdacupy"]["median_ms"] == pytest.approx(expected_times(parse_shape("T=4096,H=2"), 10, 100)[0])
    assert "ERROR: RuntimeError" in capsys.readouterr().out


def test_bad_split_count_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--split", "0"])
    assert e.value.code == 2 and "--split" in capsys.readouterr().err

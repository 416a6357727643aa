"""The serial-vs-split columns of ``python -m kdacupy.bench`` without a GPU:
the kernel calls and the timing replaced, the JSON and the table checked."""
import json

import pytest

import kdacupy.cli.bench as bench
import kdacupy.cli.bench_seqpar as bench_seqpar
import kdacupy.cli.timing as timing

from .test_bench_cli import fake_gpu  # noqa: F401  (the fixture)


@pytest.fixture
def fake_split(fake_gpu, monkeypatch):  # noqa: F811
    seen = []

    def calls_for(sets, n):
        def run():
            seen.append(n)
            return ("o", n), ("s", n)
        return [run]

    times = {1: 8.0, 4: 4.0, 8: 2.0, 16: 2.5, 32: 3.0}

    def fake_time(fns, warmup, iters, clock="cupy"):
        (o, n), _ = fns[0]()
        return times[n], times[n] * 0.9

    monkeypatch.setattr(bench_seqpar, "calls_for", calls_for)
    monkeypatch.setattr(bench_seqpar, "auto_choice", lambda sets: (16, "on: predicted gain 3.00x"))
    monkeypatch.setattr(bench_seqpar, "rms_ratio", lambda x, ref: 1e-3 if x[1] != ref[1] else 0.0)
    monkeypatch.setattr(timing, "time_calls", lambda fns, w, i, clock="cupy":
                        fake_time(fns, w, i) if isinstance(fns[0]()[0], tuple) else (0.5, 0.45))
    return seen


def test_fewhead_shapes_get_serial_and_split_columns(fake_split, tmp_path, capsys):
    path = tmp_path / "r.json"
    assert bench.main(["--shapes", "fewhead", "--no-fla", "--json", str(path), "--iters", "2"]) == 0
    doc = json.loads(path.read_text())
    assert len(doc["shapes"]) == 12
    for r in doc["shapes"]:
        sp = r["seqpar"]
        assert sp["auto_segments"] == 16 and sp["serial"] == dict(median_ms=8.0, min_ms=8.0 * 0.9)
        assert sorted(map(int, sp["splits"])) == list(bench_seqpar.DEFAULT_SPLITS)
        assert sp["splits"]["8"]["speedup"] == pytest.approx(4.0)
        assert sp["splits"]["8"]["rms_vs_serial_o"] == 1e-3 and sp["splits"]["8"]["finite"] is True
        assert sp["best"] == dict(segments=8, speedup=pytest.approx(4.0))
    out = capsys.readouterr().out
    assert "sequence parallelism: serial vs split" in out and "8@4.00x" in out and "fewhead-varlen4-H16" in out


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
    assert r["seqpar"] == dict(error="RuntimeError: CUDA_ERROR_OUT_OF_MEMORY") and r["kdacupy"]["median_ms"] == 0.5
    assert "ERROR: RuntimeError" in capsys.readouterr().out


def test_bad_split_count_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--split", "0"])
    assert e.value.code == 2 and "--split" in capsys.readouterr().err

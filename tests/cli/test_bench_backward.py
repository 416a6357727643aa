"""``python -m kdacupy.bench --shapes backward``: what runs without a GPU (the dry run, the refusal,
the inputs and the table); the timing itself runs on the GPU (benchmarks/device_check.sh)."""
import subprocess
import sys

import numpy as np
import pytest

from kdacupy.cli import bench_backward
from kdacupy.cli.shapes import parse_shape
from kdacupy.numerics.dtypes import BF16

from ..conftest import missing


def test_dry_run_lists_the_kimi_shapes_and_their_scratch():
    out = subprocess.run([sys.executable, "-m", "kdacupy.bench", "--shapes", "backward", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("kimi-")]
    assert len(rows) == 6
    h96 = next(ln for ln in rows if ln.startswith("kimi-T8192-H96 "))
    # slots, scratch GB (docs/design.md section 9.3), kept GB (section 9.5), grid
    assert h96.split()[1:5] == ["512", "3.93", "2.29", "512x96"]


@pytest.mark.skipif(missing("gpu") is None, reason="a GPU is present: the benchmark would run")
def test_without_a_gpu_it_says_so():
    out = subprocess.run([sys.executable, "-m", "kdacupy.bench", "--shapes", "backward", "T=64,H=1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no CUDA GPU" in out.stderr


def test_loss_inputs_are_the_forward_benchmarks_plus_the_cotangents():
    shape = parse_shape("varlen=20:0:13,H=2,K=64,V=64")
    arrays, fwd, bwd = bench_backward.loss_inputs(shape, np)
    assert arrays["do"].shape == arrays["v"].shape and arrays["do"].dtype == BF16
    assert bwd["dfinal_state"].shape == fwd["initial_state"].shape == (3, 2, 64, 64)
    assert bwd["dfinal_state"].dtype == fwd["state_dtype"]
    assert "output_final_state" not in bwd and "state_dtype" not in bwd and fwd["output_final_state"]
    import kdacupy
    grads = kdacupy.kda_backward(**arrays, **bwd, backend="model")  # the options are kda_backward's
    assert grads.dA_log.shape == (2,) and grads.dinitial_state.shape == (3, 2, 64, 64)


def test_table_names_the_shape_times_ratio_and_agreement():
    timing = lambda m: dict(median_ms=m, min_ms=m)  # noqa: E731
    row = dict(shape=dict(name="kimi-T8192-H96"), finite=True, repeatable=True,
               kdacupy=dict(forward=timing(1.0), backward=timing(3.0), forward_backward=timing(4.0)),
               fla=dict(median_ms=8.0, rms_ratio_vs_fla=dict(dq=1e-3, dk=4e-3, dv=None),
                        run_to_run_max_abs=dict(dq=2e-6, dk=0.0)), ratio_fla_over_kdacupy=2.0)
    text = bench_backward.format_table([row], bench_backward.geomean([2.0, 2.0]))
    line = text.splitlines()[2]
    assert line.split()[:7] == ["kimi-T8192-H96", "1.000", "3.000", "4.000", "-", "yes", "8.000"]
    assert "2.00" in line and "4.0e-03 (dk)" in line and "2.0e-06" in line
    assert text.splitlines()[-1].endswith("2.00 (goal 1.5)")
    kept = dict(row, saved_same=True, kdacupy=dict(row["kdacupy"], train_saved=timing(3.5)))
    assert bench_backward.format_table([kept]).splitlines()[2].split()[4:6] == ["3.500", "yes"]
    differs = dict(kept, saved_same=False)  # the kept states' gradients must be the stateless ones
    assert bench_backward.format_table([differs]).splitlines()[2].split()[5] == "NO"


def test_kdacupys_times_are_written_before_fla_starts(tmp_path, monkeypatch):
    """FLA's first call compiles and autotunes its Triton kernels; a run stopped there from
    outside (the prepared run's time box: SIGINT) still leaves kdacupy's times in the JSON."""
    from kdacupy.cli import bench, timing
    monkeypatch.setattr(timing, "gpu_available", lambda: True)
    monkeypatch.setattr(timing, "device_info", lambda: dict(name="NVIDIA H200", sm_count=132, model="H200"))
    monkeypatch.setattr(bench_backward, "FLABackward", lambda: type("F", (), dict(fla=type("X", (), dict(
        version="0.6.0", layout_kw="state_v_first"))))())
    monkeypatch.setattr(bench_backward.peers, "fla_importable", lambda: None)
    ms = dict(median_ms=1.0, min_ms=1.0)

    def stopped_in_fla(shape, args, fla, on_kdacupy):
        on_kdacupy(dict(shape=shape.to_dict(), finite=True, repeatable=True, fla=None, ratio_fla_over_kdacupy=None,
                        kdacupy=dict(forward=ms, backward=ms, forward_backward=ms)))
        raise KeyboardInterrupt  # what the box's SIGINT raises inside FLA's autotuning

    monkeypatch.setattr(bench_backward, "bench_shape", stopped_in_fla)
    out = tmp_path / "bench-backward.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--shapes", "backward", "kimi-T8192-H96", "--json", str(out)])
    import json
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and [r["shape"]["name"] for r in doc["shapes"]] == ["kimi-T8192-H96"]
    assert doc["shapes"][0]["kdacupy"]["backward"]["median_ms"] == 1.0 and doc["shapes"][0]["fla"] == "pending"

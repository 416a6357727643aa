"""benchmarks/device_check.sh, without a GPU: its steps (``--print-steps``)
fit the time budget and each has a CPU form; the results it names are few and
known; the tuning step writes the file the benchmark steps read; and the
harness itself, driven with a stand-in for python, logs every step live under
$OUT, records a box that runs out (with the step's partial output) and a
failing step, goes on to the next steps, and its rehearsal check catches both
and a stray file. The full CPU rehearsal (every step's real CPU form) is CI's
step after the test suite (.ci/run)."""
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.sh"
BUDGET_S = 7 * 60  # the sum of the boxes: one rerun of a failed step must still fit 15 minutes of the GPU machine
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None or shutil.which("timeout") is None, reason="needs bash and timeout")


def steps():
    out = subprocess.run([BASH, str(SCRIPT), "--print-steps"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    return [dict(name=r[0], box=int(r[1]), gpu=r[2], cpu=r[3]) for r in rows]


def test_the_steps_fit_the_budget_and_each_has_a_cpu_form():
    s = steps()
    assert len(s) >= 12 and len({x["name"] for x in s}) == len(s)
    assert all(x["box"] > 0 and x["gpu"] and x["cpu"] for x in s)
    assert sum(x["box"] for x in s) < BUDGET_S, sum(x["box"] for x in s)
    # the header's table says the same boxes
    text = SCRIPT.read_text()
    for i, x in enumerate(s, 1):
        assert re.search(rf"^# *{i} +{re.escape(x['name'])} +{x['box']} ", text, re.M), x["name"]
    assert f"the boxes' sum, {sum(x['box'] for x in s)} s" in text


def test_what_the_steps_need_is_there():
    s = {x["name"]: x for x in steps()}
    gpu = "\n".join(x["gpu"] for x in s.values())
    assert "sanitize.py" in gpu and "--only forward pool split maps" in gpu  # decode, split, maps sanitized too
    assert "tests/gpu/test_gpu_distributed.py" in s[list(s)[-1]]["gpu"]  # CP last, on its own
    assert "--ignore=tests/gpu/test_gpu_distributed.py" in gpu
    for x in s.values():
        if "$PYTEST" in x["gpu"]:
            assert x["cpu"] == x["gpu"]  # the GPU tests themselves skip on the CPU
        for script in re.findall(r"benchmarks/\w+\.py", x["gpu"] + x["cpu"]):
            assert (ROOT / script).is_file(), script
    text = SCRIPT.read_text()
    assert 'PYTEST="$PY -m pytest -v -rA' in text and "faulthandler_timeout" in text


def test_results_are_few_and_named():
    text = SCRIPT.read_text()
    allowed = set(re.search(r'^RESULTS="([^"]+)"', text, re.M).group(1).split())
    written = {m for x in steps() for m in re.findall(r'"\$OUT/([^"]+)"', x["gpu"])}
    assert written <= allowed, written - allowed
    assert len(allowed) + 1 <= 8  # and the tuning file: eight files at most come back


def test_the_tuning_step_writes_the_file_the_benchmarks_read(tmp_path, monkeypatch, capsys):
    """The tune step's own command (fake GPU steps, as in tests/cli/test_tune_cli.py), with the
    environment the script sets, leaves the file kda_forward reads for the benchmark steps."""
    import kdacupy.cli.bench as bench
    import kdacupy.cli.tune as tune
    import kdacupy.ops.forward.tuning as tuning
    from kdacupy.cli.shapes import resolve_shapes, shape_problem

    from .cli.test_tune_cli import Fake

    (tune_step,) = [x for x in steps() if "kdacupy.tune" in x["gpu"]]
    argv = shlex.split(tune_step["gpu"])
    assert argv[:3] == ["$PY", "-m", "kdacupy.tune"]
    assert 'KDACUPY_TUNING_DIR=$OUT/tuning' in SCRIPT.read_text()
    monkeypatch.setenv("KDACUPY_TUNING_DIR", str(tmp_path / "out" / "tuning"))
    monkeypatch.setattr(tuning, "shipped_dir", lambda: tmp_path / "shipped")
    monkeypatch.setattr(tuning, "device_facts", lambda: (0, "NVIDIA H200", 132))
    tuning.clear_cache()
    Fake().install(monkeypatch)
    try:
        assert tune.main(argv[3:]) == 0
        assert "kda_forward reads it" in capsys.readouterr().out
        written = tmp_path / "out" / "tuning" / "NVIDIA-H200.yaml"
        for shape in resolve_shapes(["kimi"]):
            assert tuning.describe_selection(shape_problem(shape))[1] == str(written), shape.name
        (bench_step,) = [x for x in steps() if "kdacupy.bench --shapes kimi " in x["gpu"]]
        assert bench.main(shlex.split(bench_step["cpu"])[3:]) == 0  # its dry run: every tile from the file
        rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("kimi-")]
        assert len(rows) == 6 and all(str(written) in ln for ln in rows)
    finally:
        tuning.clear_cache()


STAND_IN = """#!/usr/bin/env bash
# python's stand-in: says what it was asked; the tuner hangs, the sanitizer runs fail
echo "stand-in: $*"
case "$*" in
  *kdacupy.tune*) echo "tuning started"; sleep 30 ;;
  *sanitize.py*) exit 3 ;;
  *"--shapes decode"*) touch "$OUT/stray.txt" ;;
esac
exit 0
"""


def test_the_harness_logs_live_records_boxes_and_failures_and_goes_on(tmp_path):
    py = tmp_path / "python"
    py.write_text(STAND_IN)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": str(py), "BOX_OVERRIDE": "2"}
    res = subprocess.run([BASH, str(SCRIPT), "--cpu-rehearsal"], capture_output=True, text=True, env=env,
                         timeout=120, cwd=tmp_path)
    summary, log = (out / "summary.txt").read_text(), (out / "run.log").read_text()
    n = len(steps())
    assert res.returncode == 1, res.stdout + res.stderr
    lines = {int(m.group(1)): m.group(0) for m in re.finditer(r"^ ?(\d+) .*$", summary, re.M)}
    assert sorted(lines) == list(range(1, n + 1))  # every step ran, also after the hang and the failures
    (tune_i,) = [i for i, x in enumerate(steps(), 1) if "kdacupy.tune" in x["cpu"]]
    assert "rc=124" in lines[tune_i] and "TIMED OUT (box 2 s)" in lines[tune_i]
    assert "tuning started" in log.split(f"===== step {tune_i}: ")[1].split("=====")[0]  # its partial output
    san = [i for i, x in enumerate(steps(), 1) if "sanitize.py" in x["cpu"]]
    assert len(san) == 3 and all("rc=3" in lines[i] and "FAILED" in lines[i] for i in san)
    assert f"rehearsal: step {tune_i} (tuning (Kimi shapes)) ended with status 124" in summary
    assert "rehearsal: unexpected file under $OUT: stray.txt" in summary
    assert "predictions (the emulation profiler's, per kernel)" in summary  # where its prediction will go
    for i in range(1, n + 1):
        assert f"===== step {i}: " in log and f"===== step {i} ended: " in log


def test_only_reruns_the_steps_named(tmp_path):
    py = tmp_path / "python"
    py.write_text(STAND_IN)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": str(py)}
    res = subprocess.run([BASH, str(SCRIPT), "--cpu-rehearsal", "--only", "2", "3"], capture_output=True, text=True,
                         env=env, timeout=60, cwd=tmp_path)
    summary = (out / "summary.txt").read_text()
    assert res.returncode == 0, summary
    assert [int(m.group(1)) for m in re.finditer(r"^ ?(\d+) ", summary, re.M)] == [2, 3]

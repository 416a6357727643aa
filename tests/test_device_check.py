"""benchmarks/device_check.sh, without a GPU: its steps (``--print-steps``)
each have a CPU form, and the guaranteed prefix of the 420 s budget (the steps
that start even when every box before them runs out) holds the must-haves; the
results it names are few and known; the tuning step writes the file the
benchmark steps read; and the harness itself, driven with a stand-in for
python, logs every step live under $OUT, records a box that runs out (with the
step's partial output) and a failing step, goes on to the next steps, leaves
out the steps the budget cannot hold (saying so, and how to rerun them), sets
the profiler's predictions next to the measured times, and its rehearsal check
catches all of it and a stray file. The full CPU rehearsal (every step's real
CPU form) is CI's step after the test suite (.ci/run)."""
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.sh"
BUDGET_S = 7 * 60  # the run's budget: one rerun of a failed step must still fit 15 minutes of the GPU machine
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None or shutil.which("timeout") is None, reason="needs bash and timeout")


def steps():
    out = subprocess.run([BASH, str(SCRIPT), "--print-steps"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    return [dict(name=r[0], box=int(r[1]), gpu=r[2], cpu=r[3], join=int(r[4]) if r[4] else None) for r in rows]


def guaranteed_prefix(s, budget=BUDGET_S):
    """(how many steps start even when every box runs out, their worst-case end): a background
    step's box runs beside the steps before the one it is joined before."""
    t = bg_end = n = 0
    for i, x in enumerate(s, 1):
        if any(y["join"] == i for y in s):
            t = max(t, bg_end)
        if t + x["box"] > budget:
            break
        if x["join"]:
            bg_end = t + x["box"]
        else:
            t += x["box"]
        n = i
    return n, t


def test_each_step_has_a_cpu_form_and_the_header_says_the_boxes():
    s = steps()
    assert len(s) >= 12 and len({x["name"] for x in s}) == len(s)
    assert all(x["box"] > 0 and x["gpu"] and x["cpu"] for x in s)
    text = SCRIPT.read_text()
    for i, x in enumerate(s, 1):  # the header's table says the same boxes
        assert re.search(rf"^# *{i} +{re.escape(x['name'])} +{x['box']} ", text, re.M), x["name"]
    assert f"the boxes' sum, {sum(x['box'] for x in s)} s" in text
    n, t = guaranteed_prefix(s)
    assert t <= BUDGET_S and f"the guaranteed prefix (steps 1-{n}: every" in text and f"to its end, {t} s)" in text
    assert f"within a\n# budget of {BUDGET_S} s" in text or f"budget of {BUDGET_S} s" in text


#: what a first GPU run must bring back even when every box runs out: a command's text per step
MUST_HAVES = {"device info": "benchmarks/device_info.py", "PTX conformance": "-s tests/gpu/test_gpu_ptx.py",
              "GPU suite": "--ignore=tests/gpu/test_gpu_ptx.py", "GPU backward": "--durations=10 tests/gpu/test_gpu_backward",
              "tuning": "kdacupy.tune --shapes kimi", "Kimi benchmark": "--shapes kimi --no-fla --json",
              "forward against FLA": "--shapes kimi96", "backward against FLA": "--shapes backward",
              "memcheck": "--tool memcheck", "long sweep": "--durations=5 tests/gpu/test_gpu_long.py",
              "decode against FLA": "--shapes decode"}


def test_the_guaranteed_prefix_holds_the_must_haves():
    s = steps()
    n, _ = guaranteed_prefix(s)
    for what, text in MUST_HAVES.items():
        (i,) = [i for i, x in enumerate(s, 1) if text in x["gpu"]]
        assert i <= n, f"{what} (step {i}) is outside the guaranteed prefix (steps 1-{n})"
    fla = [i for i, x in enumerate(s, 1) if "--shapes kimi96" in x["gpu"] or "--shapes backward" in x["gpu"]]
    assert "whl" in s[0]["gpu"] and 1 < min(fla)  # FLA installed first
    assert "tests/gpu/test_gpu_distributed.py" in s[-1]["gpu"] and n < len(s)  # CP last; the rest when time is left


def test_the_background_step_runs_beside_test_steps_only_and_costs_the_prefix_nothing():
    s = steps()
    (bg,) = [(i, x) for i, x in enumerate(s, 1) if x["join"]]
    i, x = bg
    assert "fla_precompile.py" in x["gpu"] and i == 2  # right after FLA's wheels
    beside = s[i:x["join"] - 1]
    assert beside and all("kdacupy.bench" not in y["gpu"] and "kdacupy.tune" not in y["gpu"] for y in beside)
    assert "kdacupy.tune" in s[x["join"] - 1]["gpu"]  # joined before the first timing step
    assert x["box"] <= sum(y["box"] for y in beside)  # ends inside their boxes
    fla = [j for j, y in enumerate(s, 1) if "--shapes kimi96" in y["gpu"] or "--shapes backward" in y["gpu"]]
    assert min(fla) > x["join"]
    # it compiles what the FLA steps run: their shapes
    from benchmarks import fla_precompile
    gpu = "\n".join(y["gpu"] for y in s)
    assert f"--shapes {' '.join(fla_precompile.FORWARD_SHAPES)} --json" in gpu
    assert f"--shapes backward {' '.join(fla_precompile.BACKWARD_SHAPES)} " in gpu


def test_what_the_steps_need_is_there():
    s = {x["name"]: x for x in steps()}
    gpu = "\n".join(x["gpu"] for x in s.values())
    assert "sanitize.py" in gpu and "--only forward pool split maps" in gpu  # decode, split, maps sanitized too
    assert "tests/gpu/test_gpu_distributed.py" in s[list(s)[-1]]["gpu"]  # CP last, on its own
    assert "--ignore=tests/gpu/test_gpu_distributed.py" in gpu and "--ignore=tests/gpu/test_gpu_backward.py" in gpu
    assert "tests/frameworks/test_gpu_frameworks.py" in gpu
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
    assert "bench-backward.json" in allowed


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
# python's stand-in: says what it was asked; the tuner hangs, the sanitizer runs fail, the
# Kimi benchmark leaves a bench.json (a median twice the prediction), the profiler is the real one
case "$*" in *kdacupy.profile*) exec "$REAL_PYTHON" "$@" ;; esac
echo "stand-in: $*"
case "$*" in
  *kdacupy.tune*) echo "tuning started"; sleep 30 ;;
  *sanitize.py*) exit 3 ;;
  *"--shapes decode"*) touch "$OUT/stray.txt" ;;
  *"--shapes kimi --no-fla"*) echo '{"shapes": [{"shape": {"name": "kimi-T8192-H96"}, "kdacupy": {"median_ms": 2.228}}]}' \
    > "$OUT/bench.json" ;;
esac
exit 0
"""


def run_stand_in(tmp_path, *args, real_profiler=False, **env):
    """The script in its CPU rehearsal with python's stand-in; the profiler's predictions (six processes) are the
    real ones only where asked for (``real_profiler``), else the stand-in's echo."""
    text = STAND_IN
    if not real_profiler:
        text = text.replace('*kdacupy.profile*) exec "$REAL_PYTHON" "$@" ;;',
                            '*kdacupy.profile*) echo "profile: $*"; exit 0 ;;')
        assert text != STAND_IN
    py = tmp_path / "python"
    py.write_text(text)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": str(py), "REAL_PYTHON": sys.executable, **env}
    res = subprocess.run([BASH, str(SCRIPT), "--cpu-rehearsal", *args], capture_output=True, text=True, env=env,
                         timeout=120, cwd=tmp_path)
    return res, (out / "summary.txt").read_text(), (out / "run.log").read_text()


def step_lines(summary):
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^ ?(\d+) .*$", summary, re.M)}


def test_the_harness_logs_live_records_boxes_and_failures_and_goes_on(tmp_path):
    res, summary, log = run_stand_in(tmp_path, BOX_OVERRIDE="2", real_profiler=True)
    n = len(steps())
    assert res.returncode == 1, res.stdout + res.stderr
    lines = step_lines(summary)
    assert sorted(lines) == list(range(1, n + 1))  # every step ran, also after the hang and the failures
    (tune_i,) = [i for i, x in enumerate(steps(), 1) if "kdacupy.tune" in x["cpu"]]
    assert "rc=124" in lines[tune_i] and "TIMED OUT (box 2 s)" in lines[tune_i]
    assert "tuning started" in log.split(f"===== step {tune_i}: ")[1].split("=====")[0]  # its partial output
    san = [i for i, x in enumerate(steps(), 1) if "sanitize.py" in x["cpu"]]
    assert len(san) == 3 and all("rc=3" in lines[i] and "FAILED" in lines[i] for i in san)
    assert f"rehearsal: step {tune_i} (tuning (Kimi shapes)) ended with status 124" in summary
    assert "rehearsal: unexpected file under $OUT: stray.txt" in summary
    assert "not run" not in summary and "(background) ok" in lines[2]
    for i in range(1, n + 1):
        assert f"===== step {i}: " in log and f"===== step {i} ended: " in log
    assert f"which steps 1-{guaranteed_prefix(steps())[0]} fit" in summary.splitlines()[0]
    # the profiler's predictions next to the measured median: the issue-aware profile's, then the
    # one before the issue term (0.496 ms predicted, HBM floor 0.211)
    preds = summary.split("predictions (the emulation profiler's, per kernel) next to the measured")[1]
    aware, before = preds.split("issue-aware (docs/design.md section 11.4")[1].split("before the issue term")
    doc = json.loads((ROOT / "benchmarks" / "profile-kimi-h200-backward2.json").read_text())
    run = next(e for e in doc["runs"] if e["name"] == "kimi-T8192-H96" and e["kind"] == "forward")
    p_ms, floor_ms = run["predicted_s"] * 1e3, run["hbm_floor_s"] * 1e3
    for part, predicted, floor, ratio in ((aware, f"{p_ms:.3f}", f"{floor_ms:.3f}", f"{2.228 / p_ms:.2f}"),
                                          (before, "0.496", "0.211", "4.49")):
        row = next(ln for ln in part.splitlines() if ln.startswith("kimi-T8192-H96 "))
        assert row.split()[1:6] == [predicted, floor, "-", "2.228", ratio], row
    assert "issue" in aware and "instr/chunk" in aware  # each kernel's issue term and its busiest scheduler
    assert re.search(r"^kimi-T8192-H64 .* - +- ", preds, re.M)  # not measured: no ratio


def test_steps_the_budget_cannot_hold_are_left_out_and_named(tmp_path):
    """Budget 3 s, every box 2 s: the steps before the tuner (which hangs its 2 s box) run, every
    later one is not started; each still has its line, its log entry and the rerun to run."""
    res, summary, log = run_stand_in(tmp_path, BOX_OVERRIDE="2", DEVICE_CHECK_BUDGET="3")
    s = steps()
    n = len(s)
    (tune_i,) = [i for i, x in enumerate(s, 1) if "kdacupy.tune" in x["cpu"]]
    lines = step_lines(summary)
    assert sorted(lines) == list(range(1, n + 1)) and res.returncode == 1
    assert all("not run" not in lines[i] for i in range(1, tune_i + 1))
    later = list(range(tune_i + 1, n + 1))
    for i in later:
        left = int(re.search(r"not run: only (\d+) s of the 3 s budget left, box 2 s; rerun with --only (\d+)$",
                             lines[i]).group(1))
        assert left < 2 and lines[i].endswith(f"--only {i}")
        assert f"===== step {i}: {s[i - 1]['name']} not run" in log and f"===== step {i} ended: not run" in log
        assert f"rehearsal: step {i} ({s[i - 1]['name']}) was not run: the budget ran out" in summary
    rerun = " ".join(map(str, later))
    assert f"not run for the budget: {rerun}; rerun with: bash benchmarks/device_check.sh --only {rerun}" in summary
    assert "predictions (the emulation profiler's" in summary and "total " in summary  # the run still ends


def test_only_reruns_the_steps_named_within_the_budget(tmp_path):
    res, summary, _ = run_stand_in(tmp_path, "--only", "3", "4")
    assert res.returncode == 0, summary
    assert [int(m.group(1)) for m in re.finditer(r"^ ?(\d+) ", summary, re.M)] == [3, 4]
    res, summary, _ = run_stand_in(tmp_path, "--only", "3", "4", DEVICE_CHECK_BUDGET="9")  # boxes 10 and 25
    assert res.returncode == 1 and all(f"rerun with --only {i}" in step_lines(summary)[i] for i in (3, 4))


def test_the_nsight_compute_table_sets_each_kernel_next_to_its_prediction(tmp_path):
    """benchmarks/ncu_issue.py reads ncu's CSV (its own lines first, then the table; the first
    launch of each kernel; values with thousands separators, times in their unit) and prints
    measured / predicted for the instructions, the busiest scheduler and the time."""
    doc = json.loads((ROOT / "benchmarks" / "profile-kimi-h200-issue.json").read_text())
    run = next(e for e in doc["runs"] if e["name"] == "kimi-T8192-H64")
    prep = next(r for r in run["kernels"] if r["kernel"] == "kda_prepare")
    instr = sum(prep["issue"]["warps_per_cta"]) * prep["counts"]["ctas"]
    head = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name",' \
           '"Metric Name","Metric Unit","Metric Value"'
    rows = [f'"{i}","1","python","h","kda_prepare(const void*)","1","7","","{m}","{u}","{v}"'
            for i, m, u, v in ((0, "smsp__inst_executed.sum", "inst", f"{2 * instr:,.0f}"),
                               (0, "gpu__time_duration.sum", "usecond", f"{3 * prep['time_s'] * 1e6:.3f}"),
                               (1, "smsp__inst_executed.sum", "inst", "1"))]  # a second launch: not read
    csv_path = tmp_path / "ncu.csv"
    csv_path.write_text("==PROF== Connected to process\n" + "\n".join([head, *rows]) + "\n")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ncu_issue.py"), str(csv_path), "--profile",
                          str(ROOT / "benchmarks" / "profile-kimi-h200-issue.json")], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("kda_prepare"))
    assert row.split()[3] == "2.00" and row.split()[-2] == "3.00", row
    rec = next(ln for ln in out.stdout.splitlines() if ln.startswith("kda_recurrence"))
    assert rec.split()[2] == "-"  # not measured

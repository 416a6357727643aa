"""``--figure`` of ``python -m kdacupy.accuracy`` and ``python -m kdacupy.profile`` (the docs'
pictures), drawn from saved JSON: the files appear, their titles quote the recorded numbers, the
profile's marks each kernel's bound, and an unknown run is refused naming it."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from kdacupy.cli import accuracy, figures, profile

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                reason="--figure needs Matplotlib: the [docs] extra")


def _text(path):
    return " ".join(re.findall(r"<text[^>]*>([^<]*)", path.read_text()))


def test_accuracy_figure_from_a_saved_sweep(tmp_path, capsys):
    src = ROOT / "benchmarks" / "accuracy-model-T2048.json"
    assert accuracy.main(["--show", str(src), "--figure", str(tmp_path / "a.svg")]) == 0
    text = _text(tmp_path / "a.svg")
    doc = json.loads(src.read_text())
    assert figures.accuracy_title(doc) in text and "bf16 rounding floor" in text
    assert "g=-8 b=+4" in text  # one tick per case
    assert "worst o ratio" in capsys.readouterr().out


def test_profile_figure_marks_each_kernels_bound(tmp_path):
    src = ROOT / "benchmarks" / "profile-kimi-h200-issue.json"
    doc = json.loads(src.read_text())
    run = doc["runs"][2]
    assert profile.main(["--show", str(src), "--figure", str(tmp_path / "r.svg"), "--figure-run", run["name"]]) == 0
    text = _text(tmp_path / "r.svg")
    assert figures.roofline_title(run) in text
    for k in run["kernels"]:
        assert f"{k['kernel']}: bound by {k['bound']}" in text
    with pytest.raises(SystemExit, match="--figure-run 'nope': no such run"):
        profile.main(["--show", str(src), "--figure", str(tmp_path / "x.svg"), "--figure-run", "nope"])

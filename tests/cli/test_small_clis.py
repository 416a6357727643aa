"""The compile and accuracy CLIs without a GPU: every entry point's help,
the errors a new user meets, accuracy's progress and column names."""
import subprocess
import sys
from pathlib import Path

import pytest

from kdacupy.cli import accuracy, compile as compile_cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["tune", "bench", "compile", "accuracy"])
def test_every_entry_point_has_help(name):
    out = subprocess.run([sys.executable, "-m", f"kdacupy.{name}", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m kdacupy.{name}")


def test_compile_match_without_a_match_fails(capsys):
    assert compile_cli.main(["--match", "K=48"]) == 2
    err = capsys.readouterr().err
    assert "no variant matches 'K=48' (--kernel all)" in err


def test_compile_sass_without_nvdisasm_gives_a_hint(monkeypatch, capsys):
    monkeypatch.setattr(compile_cli, "nvdisasm", lambda: None)
    assert compile_cli.main(["--sass", "--match", "K=64 V=64"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install "kdacupy[test]"' in err and "nvidia-cuda-nvdisasm" in err


def test_accuracy_reports_progress_and_names_its_columns(capsys):
    assert accuracy.main(["--backend", "reference", "--T", "32", "--H", "1", "--K", "64", "--V", "64",
                          "--quick"]) == 0
    out, err = capsys.readouterr()
    assert [ln.split("]")[0] for ln in err.splitlines()] == [f"[{i}/6" for i in range(1, 7)]
    assert "abs max: max |x - ref| (absolute); ratio: ||x - ref|| / ||ref||" in out
    assert "o abs max" in out and "o ratio" in out and "S ratio" in out

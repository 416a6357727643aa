"""The tuner's file and the lookup agree: what ``python -m kdacupy.tune`` writes
by default is what kda_forward (and so the benchmark) reads, a file written
anywhere else is announced as unread, and ``python -m kdacupy.bench --dry-run``
shows, per shape, which file the tiles come from. The tuner's GPU steps are
replaced as in test_tune_cli.py."""
import pytest

import kdacupy.cli.bench as bench
import kdacupy.cli.tune as tune
import kdacupy.ops.forward.tuning as tuning
from kdacupy.cli.shapes import parse_shape, shape_problem
from kdacupy.ops.forward.tuning import TileConfig

from .test_tune_cli import SPEC, Fake, user  # noqa: F401  (the fixture)


def test_a_file_the_lookup_never_reads_is_announced(user, monkeypatch, capsys):  # noqa: F811
    Fake().install(monkeypatch)
    assert tune.main(["--shapes", SPEC, "--output", str(user / "tuned.yaml")]) == 0
    out, err = capsys.readouterr()
    assert f"note: kda_forward does not read {user / 'tuned.yaml'}: for NVIDIA H200 it reads " \
           f"{user / 'NVIDIA-H200.yaml'}" in err
    assert "kda_forward does not read it" in out
    p = shape_problem(parse_shape(SPEC))
    assert tuning.describe_selection(p)[1] == tuning.HEURISTIC_SOURCE  # indeed unread


def test_the_default_output_is_read_and_the_dry_run_says_so(user, monkeypatch, capsys):  # noqa: F811
    Fake().install(monkeypatch)
    assert tune.main(["--shapes", SPEC]) == 0
    out, err = capsys.readouterr()
    assert "kda_forward reads it" in out and "note:" not in err
    p = shape_problem(parse_shape(SPEC))
    assert tuning.describe_selection(p) == (TileConfig(64, 3), str(user / "NVIDIA-H200.yaml"))
    assert bench.main(["--dry-run", "--shapes", SPEC, "T=64,H=2,K=64,V=64"]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("T=",))}
    assert "64/3" in rows[SPEC] and str(user / "NVIDIA-H200.yaml") in rows[SPEC]
    assert "heuristic (untuned)" in rows["T=64,H=2,K=64,V=64"]  # a bucket the file lacks


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3"])
def test_the_dry_run_names_the_files_of_another_model(user, capsys, gpu):  # noqa: F811
    assert bench.main(["--dry-run", "--shapes", SPEC, "--gpu", gpu, "--sm-count", "132"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA-H100-80GB-HBM3.yaml (missing)" in out and "heuristic (untuned)" in out

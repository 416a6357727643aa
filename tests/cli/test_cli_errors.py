"""Bad command-line arguments get argparse's treatment on every CLI: exit status 2 and one
error line naming the option, never a traceback; and the long-running tools say what they
are about to do (the compile's variant count and estimate, accuracy's reference time)."""
import pytest

from kdacupy.cli import accuracy, compile as compile_cli
from kdacupy.distributed import __main__ as cp_demo
from kdacupy.jit.device import why_no_gpu


def refused(main, argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv, option", [
    (["--T", "0"], "--T"), (["--T", "-5"], "--T"), (["--T", "many"], "--T"), (["--H", "0"], "--H"),
    (["--json", "/nonexistent/dir/x.json"], "--json"), (["--sequence-parallel", "0"], "--sequence-parallel"),
    (["--sequence-parallel", "100000"], "--sequence-parallel"), (["--seed", "-1"], "--seed"),
])
def test_accuracy_refuses_bad_arguments(argv, option, capsys):
    assert option in refused(accuracy.main, argv, capsys)


def test_accuracy_json_at_a_directory_is_refused(tmp_path, capsys):
    assert "not a writable file" in refused(accuracy.main, ["--json", str(tmp_path)], capsys)


@pytest.mark.skipif(why_no_gpu() is None, reason="a GPU is present: --backend cuda is accepted")
@pytest.mark.parametrize("main", [accuracy.main, cp_demo.main], ids=["accuracy", "distributed"])
def test_backend_cuda_without_a_gpu_says_why(main, capsys):
    line = refused(main, ["--backend", "cuda"], capsys)
    assert "--backend cuda" in line and why_no_gpu() in line


@pytest.mark.parametrize("argv", [["--T", "0"], ["--T", "x"]])
def test_the_cp_demo_refuses_bad_arguments(argv, capsys):
    assert "--T" in refused(cp_demo.main, argv, capsys)


@pytest.mark.parametrize("argv", [["--jobs", "-1"], ["--jobs", "two"]])
def test_compile_refuses_bad_jobs(argv, capsys):
    assert "--jobs" in refused(compile_cli.main, argv, capsys)


@pytest.mark.nvrtc
def test_compile_says_how_many_and_how_long_before_it_is_done(capsys):
    assert compile_cli.main(["--kernel", "decode", "--match", "K=64 V=64 dt=float32 g=float32 beta=sigmoid",
                             "--match", "pool=float32", "--jobs", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    n = int(err[0].split()[0])
    assert n > 1 and err[0].startswith(f"{n} variant(s) for sm_90a (the runtime's target on compute capability 9.0), "
                                       "1 parallel compile(s)")
    assert err[1].startswith("  the first took ") and f"for the other {n - 1}" in err[1]


def test_accuracy_progress_counts_the_float64_reference(capsys):
    assert accuracy.main(["--backend", "model", "--T", "16", "--H", "1", "--K", "64", "--V", "64", "--quick"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 6 and all("; the float64 reference " in ln for ln in err), err

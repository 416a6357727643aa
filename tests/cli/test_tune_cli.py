"""``python -m kdacupy.tune`` without a GPU: --dry-run compiles through NVRTC;
the measuring loop runs with the GPU steps (compile, parity, timing) replaced,
to check resuming, the choice and the YAML it writes."""
import argparse
import json

import pytest

import kdacupy.cli.timing as timing
import kdacupy.cli.tune as tune
import kdacupy.ops.forward.tuning as tuning
from kdacupy.cli.shapes import Shape, parse_shape, resolve_shapes, shape_arg, shape_problem
from kdacupy.ops.forward.tuning import TileConfig

H200 = "NVIDIA H200"


# ---------------------------------------------------------------------------
# --dry-run


@pytest.mark.nvrtc
def test_dry_run_compiles_every_candidate(capsys):
    rc = tune.main(["--dry-run", "--shapes", "T=64,H=2,K=64,V=64", "--arch", "sm_90a"])
    out, err = capsys.readouterr()
    lines = [x for x in out.splitlines() if not x.startswith("#")]
    assert rc == 0, out + err
    assert out.splitlines()[0] == ("# bucket K=64 V=64 bfloat16 state=bf16 fixed par<0.25 len<=1024: "
                                   "tuned on T=64,H=2,K=64,V=64; shapes: T=64,H=2,K=64,V=64")
    expected = [f"BV={bv} stages={st}" for bv in (16, 32, 64) for st in (2, 3)]  # BV <= V = 64
    expected += [f"BV=64 stages={st} mma=wgmma" for st in (2, 3)]  # sm_90a: the wgmma ones too
    assert len(lines) == len(expected)
    for line, cfg in zip(lines, expected):
        label, c, prep, rec = line.split(" | ")
        assert label == "K=64 V=64 bfloat16 state=bf16 fixed par<0.25 len<=1024" and c == cfg
        assert prep.startswith("prepare regs=") and "spill_stores=" in prep
        assert rec.startswith("recurrence regs=") and " smem=" in rec and "FAILED" not in line
    assert "1 buckets, 8 candidates for sm_90a, 0 failed" in err


def test_dry_run_reports_a_failing_compile(capsys, monkeypatch):
    from kdacupy.jit import nvrtc as comp


    def flaky(var, arch, sass=False):
        if getattr(var, "tiles", None) == TileConfig(32, 3):
            return comp.CompileResult(False, "error: injected failure")
        return comp.CompileResult(True, "", regs=64, spill_stores=0, spill_loads=0, stack=0)

    monkeypatch.setattr(comp, "compile_variant", flaky)
    rc = tune.main(["--dry-run", "--shapes", "T=64,H=2,K=64,V=64"])
    out = capsys.readouterr().out
    assert rc == 1
    bad = [x for x in out.splitlines() if x.endswith("| FAILED")]
    assert len(bad) == 1 and "BV=32 stages=3" in bad[0] and "injected failure" in out


def test_dry_run_without_nvrtc(capsys, monkeypatch):
    from kdacupy.jit import nvrtc as comp

    def missing(var, arch, sass=False):
        raise OSError("libnvrtc.so.13: cannot open shared object file")

    monkeypatch.setattr(comp, "compile_variant", missing)
    assert tune.main(["--dry-run", "--shapes", "T=64,H=2,K=64,V=64"]) == 1
    assert "cannot compile through NVRTC" in capsys.readouterr().err


def test_dry_run_groups_shapes_into_buckets(capsys, monkeypatch):
    from kdacupy.jit import nvrtc as comp

    monkeypatch.setattr(comp, "compile_variant", lambda var, arch, sass=False: comp.CompileResult(
        True, "", regs=1, spill_stores=0, spill_loads=0, stack=0))
    assert tune.main(["--dry-run", "--shapes", "kimi"]) == 0
    out = capsys.readouterr().out
    heads = [x for x in out.splitlines() if x.startswith("# bucket")]
    assert len(heads) == 4  # fixed H96, fixed H64, varlen6 (both H), varlen 8 x 1024 (both H)
    assert sum(1 for x in out.splitlines() if not x.startswith("#")) == 4 * (8 + 4)  # mma.sync and wgmma


# ---------------------------------------------------------------------------
# shapes


def test_shape_specs():
    s = parse_shape("T=8192,H=96,K=128,V=128")
    assert (s.B, s.T, s.H, s.hv, s.K, s.V, s.lens, s.N) == (1, 8192, 96, 96, 128, 128, None, 1)
    s = parse_shape("varlen=1300:547:2048,H=64")
    assert (s.T, s.lens, s.N, s.H) == (3895, (1300, 547, 2048), 3, 64)
    s = parse_shape("varlen=1024x8,H=64,HV=128,K=64,V=256,dtype=fp16,state=fp32")
    assert (s.T, s.N, s.hv, s.K, s.V, s.dtype, s.state_precision) == (8192, 8, 128, 64, 256, "fp16", "fp32")
    assert parse_shape("B=4,T=100,H=2").N == 4


@pytest.mark.parametrize("spec,why", [
    ("T=8192", "H is required"), ("H=8", r"T \(or varlen\)"), ("T=8192,H=8,X=1", "unknown key"),
    ("T=8192,H=8,K=300", "K must be in \\[16, 256\\]"), ("T=8192,H", "KEY=VALUE"), ("T=8192;H=8", "integers"), ("T=big,H=8", "integers"),
    ("varlen=10:20,H=8,B=2", "B=1"), ("varlen=10:20,T=31,H=8", "sum to 30"), ("T=8,H=3,HV=4", "multiple"),
    ("T=8,H=2,dtype=int8", "dtype"), ("T=8,H=2,state=fp16", "state"), ("T=8,H=2,H=3", "twice"),
])
def test_bad_shape_specs(spec, why):
    with pytest.raises(ValueError, match=why):
        parse_shape(spec)


def test_bad_spec_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        tune.main(["--dry-run", "--shapes", "T=8192"])
    assert e.value.code == 2 and "H is required" in capsys.readouterr().err


def test_named_sets_and_duplicates():
    assert len(resolve_shapes(["kimi"])) == 6 and len(resolve_shapes(["fewhead"])) == 13
    assert resolve_shapes(["all"]) == resolve_shapes(["kimi", "fewhead", "kimi"])
    assert len(resolve_shapes(["T=64,H=2", "T=64,H=2"])) == 1
    # one shape of a set by its name (the Kimi names keep the benchmarks' geometric mean)
    assert resolve_shapes(["kimi-T8192-H96", "kimi96"]) == resolve_shapes(["kimi96"])
    assert resolve_shapes(["kimi-varlen6-H64"])[0].lens == (1300, 547, 2048, 963, 271, 3063)
    assert shape_arg("fewhead-T16384-H12") == "fewhead-T16384-H12"
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
        shape_arg("kimi-T8192-H32")


# ---------------------------------------------------------------------------
# no GPU


def test_without_a_gpu_it_says_so(capsys, monkeypatch):
    monkeypatch.setattr(timing, "gpu_available", lambda: False)
    assert tune.main(["--shapes", "T=64,H=2"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "--dry-run" in err


# ---------------------------------------------------------------------------
# the measuring loop, GPU steps replaced


FAKE_DEVICE = dict(device_id=0, name=H200, sm_count=132, cuda_runtime=13000, l2_bytes=50 * 2 ** 20)
# made-up times: BV=64 stages=3 fastest, BV=16 stages=2 faster still but failing parity
TIMES = {TileConfig(bv, st): 1.0 + 0.01 * i for i, (bv, st) in
         enumerate([(64, 3), (64, 2), (128, 2), (32, 3), (128, 3), (32, 2), (16, 3)])}
TIMES[TileConfig(16, 2)] = 0.1


class Fake:
    def __init__(self, interrupt_after=None, fail=(TileConfig(16, 2),)):
        self.measured, self.checked, self.interrupt_after, self.fail = [], [], interrupt_after, set(fail)

    def install(self, monkeypatch):
        monkeypatch.setattr(timing, "gpu_available", lambda: True)
        monkeypatch.setattr(timing, "device_info", lambda: dict(FAKE_DEVICE))
        monkeypatch.setattr(tune, "load_variants", lambda bucket, cfgs, jobs: {})
        monkeypatch.setattr(tune, "parity_reference", lambda bucket: "reference")
        monkeypatch.setattr(tune, "check_parity", self.check)
        monkeypatch.setattr(tune, "timing_inputs", lambda bucket, l2: "inputs")
        monkeypatch.setattr(tune, "measure", self.measure)
        return self

    def check(self, ref, bucket, cfg):
        assert ref == "reference"
        self.checked.append(cfg)
        return "parity: output RMS ratio 0.5 > 0.0039" if cfg in self.fail else None

    def measure(self, inputs, cfg, warmup, iters):
        assert inputs == "inputs"
        if self.interrupt_after is not None and len(self.measured) == self.interrupt_after:
            raise KeyboardInterrupt
        self.measured.append(cfg)
        return TIMES[cfg]


@pytest.fixture
def user(tmp_path, monkeypatch):
    d = tmp_path / "user"
    monkeypatch.setenv("KDACUPY_TUNING_DIR", str(d))
    monkeypatch.setattr(tuning, "shipped_dir", lambda: tmp_path / "shipped")
    monkeypatch.setattr(tuning, "device_facts", lambda: (0, H200, 132))
    tuning.clear_cache()
    yield d
    tuning.clear_cache()


SPEC = "T=8192,H=96,K=128,V=128"


def test_interrupted_run_resumes_without_remeasuring(user, monkeypatch, capsys):
    first = Fake(interrupt_after=3).install(monkeypatch)
    assert tune.main(["--shapes", SPEC]) == 130
    out = user / "NVIDIA-H200.yaml"
    sidecar = user / "NVIDIA-H200.yaml.partial.json"
    assert not out.exists() and sidecar.exists()
    kept = json.loads(sidecar.read_text())["results"]
    assert len(first.measured) == 3 and sum("time_ms" in r for b in kept.values() for r in b.values()) == 3
    assert "run again to resume" in capsys.readouterr().err

    second = Fake().install(monkeypatch)
    assert tune.main(["--shapes", SPEC]) == 0
    assert not set(second.measured) & set(first.measured)  # nothing measured twice
    assert set(second.measured) | set(first.measured) == set(TIMES) - {TileConfig(16, 2)}
    assert TileConfig(16, 2) in first.checked and TileConfig(16, 2) not in second.checked  # failures kept too
    assert out.exists() and not sidecar.exists()

    table = tuning.load_table(out)
    assert table.gpu == H200 and table.sm_count == 132 and table.cuda == 13000
    (e,) = table.entries.values()
    assert e.config == TileConfig(64, 3) and e.time_ms == TIMES[TileConfig(64, 3)]
    assert e.runner_up == (TileConfig(64, 2), TIMES[TileConfig(64, 2)])
    assert e.margin == pytest.approx(TIMES[TileConfig(64, 2)] / TIMES[TileConfig(64, 3)] - 1)
    # kda_forward picks it up: the user file for this GPU, this bucket
    p = shape_problem(parse_shape(SPEC))
    assert tuning.describe_selection(p) == (TileConfig(64, 3), str(out))
    assert tuning.select_tiles(p) == TileConfig(64, 3)


def test_a_candidate_failing_parity_is_never_chosen(user, monkeypatch, capsys):
    fake = Fake().install(monkeypatch)
    assert tune.main(["--shapes", SPEC, "--output", str(user / "t.yaml")]) == 0
    assert TileConfig(16, 2) not in fake.measured and TileConfig(16, 2) in fake.checked
    (e,) = tuning.load_table(user / "t.yaml").entries.values()
    assert e.config == TileConfig(64, 3)
    out = capsys.readouterr().out
    assert "BV=16 stages=2" in out and "FAILED: parity" in out
    assert "heuristic BV=32 stages=2" in out  # the untuned choice and its time, for comparison


def test_compile_failure_is_reported_and_skipped(user, monkeypatch, capsys):
    fake = Fake(fail=()).install(monkeypatch)
    monkeypatch.setattr(tune, "load_variants", lambda b, cfgs, jobs: {TileConfig(16, 2): "compile failed: x"})
    assert tune.main(["--shapes", SPEC]) == 0
    assert TileConfig(16, 2) not in fake.checked and TileConfig(16, 2) not in fake.measured
    assert "FAILED: compile failed: x" in capsys.readouterr().out


def test_bucket_without_usable_candidate(user, monkeypatch):
    Fake(fail=tuple(TIMES)).install(monkeypatch)
    assert tune.main(["--shapes", SPEC, "T=64,H=2,K=64,V=64"]) == 1
    assert tuning.load_table(user / "NVIDIA-H200.yaml").entries == {}


def test_restart_ignores_the_sidecar(user, monkeypatch):
    Fake(interrupt_after=2).install(monkeypatch)
    assert tune.main(["--shapes", SPEC]) == 130
    again = Fake().install(monkeypatch)
    assert tune.main(["--shapes", SPEC, "--restart"]) == 0
    assert len(again.measured) == 7


def test_sidecar_from_other_kernels_is_not_used(user, monkeypatch, capsys):
    Fake(interrupt_after=2).install(monkeypatch)
    assert tune.main(["--shapes", SPEC]) == 130
    monkeypatch.setattr(tune, "kernels_hash", lambda: "changed")
    again = Fake().install(monkeypatch)
    assert tune.main(["--shapes", SPEC]) == 0
    assert len(again.measured) == 7 and "starting afresh" in capsys.readouterr().err


def test_buckets_of_an_earlier_run_are_kept(user, monkeypatch):
    Fake().install(monkeypatch)
    assert tune.main(["--shapes", SPEC]) == 0
    assert tune.main(["--shapes", "varlen=1024x8,H=64"]) == 0
    table = tuning.load_table(user / "NVIDIA-H200.yaml")
    assert sorted((m.match["varlen"], m.match["seqlen"]) for m in table.entries.values()) == [
        (False, "<=8192"), (True, "<=1024")]


def test_each_bucket_is_tuned_once(user, monkeypatch):
    fake = Fake().install(monkeypatch)
    # varlen6 with H=96 and H=64 share a bucket
    assert tune.main(["--shapes", "varlen=1300:547:2048:963:271:3063,H=96",
                      "varlen=1300:547:2048:963:271:3063,H=64"]) == 0
    assert len(fake.measured) == 7


def test_progress_line(capsys):
    import io

    buf = io.StringIO()
    p = tune.Progress(4, buf)
    p.step("a")
    p.step("b", 3)
    assert buf.getvalue().splitlines() == ["[######..................] 1/4 a", "[########################] 4/4 b"]


def test_parity_input_matches_the_bucket_kind():
    b = tune.group_buckets([Shape("x", 4096, 8, lens=(4000, 96), K=64, V=256, state_precision="fp32")], 132)[0]
    s = tune.parity_shape(b)
    assert (s.K, s.V, s.state_precision, s.lens is not None, s.dtype) == (64, 256, "fp32", True, "bf16")
    assert 0 in s.lens and s.T < 200
    b = tune.group_buckets([Shape("y", 8192, 8)], 132)[0]
    s = tune.parity_shape(b)
    assert s.lens is None and s.T % 16 and s.B == 2


@pytest.mark.emulate
def test_parity_check_through_the_emulation(monkeypatch):
    """The tuner's parity step (inputs, the model, both comparisons) run on the
    CPU: the real kernels pass, a kernel with a wrong output or state does not."""
    import numpy as np

    import kdacupy.ops.forward.kernels as kernels

    for shape in (Shape("x", 4096, 8, K=64, V=64), Shape("y", 4096, 8, K=64, V=64, lens=(4000, 96))):
        b = tune.group_buckets([shape], 132)[0]
        ref = tune.parity_reference(b, device=False)
        for cfg in (TileConfig(16, 3), TileConfig(64, 2)):
            assert tune.check_parity(ref, b, cfg, backend="emulate") is None

    real = kernels.forward

    def off_by_ten_percent(which):
        def forward(p, a, tiles=None):
            o, s = real(p, a, tiles)
            bad = lambda x: (x.astype(np.float32) * 1.1).astype(x.dtype)  # noqa: E731
            return (bad(o), s) if which == "o" else (o, bad(s))
        return forward

    b = tune.group_buckets([Shape("x", 4096, 8, K=64, V=64)], 132)[0]
    ref = tune.parity_reference(b, device=False)
    monkeypatch.setattr(kernels, "forward", off_by_ten_percent("o"))
    assert tune.check_parity(ref, b, TileConfig(32, 2), backend="emulate").startswith("parity: output")
    monkeypatch.setattr(kernels, "forward", off_by_ten_percent("s"))
    assert tune.check_parity(ref, b, TileConfig(32, 2), backend="emulate").startswith("parity: final state")
    monkeypatch.setattr(kernels, "forward", lambda p, a, tiles=None: 1 / 0)
    assert tune.check_parity(ref, b, TileConfig(32, 2), backend="emulate").startswith("parity run failed")


def test_timing_failure_is_reported_not_kept(user, monkeypatch, capsys):
    fake = Fake().install(monkeypatch)
    real = fake.measure

    def flaky(inputs, cfg, warmup, iters):
        if cfg == TileConfig(64, 3):
            raise RuntimeError("cudaErrorLaunchOutOfResources")
        return real(inputs, cfg, warmup, iters)

    monkeypatch.setattr(tune, "measure", flaky)
    assert tune.main(["--shapes", SPEC, "--output", str(user / "t.yaml")]) == 0
    (e,) = tuning.load_table(user / "t.yaml").entries.values()
    assert e.config == TileConfig(64, 2)  # the fastest that could be timed
    assert "FAILED: timing failed: RuntimeError: cudaErrorLaunchOutOfResources" in capsys.readouterr().out

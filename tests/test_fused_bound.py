"""benchmarks/fused_bound.py: the issue bound of a fused forward from a saved profile (docs/design.md
section 5), on the committed records and on a run built here whose terms are known."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("fused_bound", ROOT / "benchmarks" / "fused_bound.py")
fused_bound = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fused_bound)

GPU = {"sms": 2, "schedulers": 4, "clock_ghz": 1.0}


def run(chain_path=1000.0, mean_path=500.0):
    prepare = {"kernel": "kda_prepare", "counts": {"ctas": 10}, "issue": {"warps_per_cta": [300.0, 100.0]}}
    chain = {"kernel": "kda_recurrence", "counts": {"ctas": 2}, "issue": {"warps_per_cta": [900.0, 700.0]},
             "latency": {"path_cycles": chain_path, "mean_path_cycles": mean_path}}
    return {"name": "x", "kind": "forward", "kernels": [prepare, chain], "hbm_floor_s": 1e-6, "predicted_s": 9e-6}


def test_the_terms_of_a_known_run():
    b = fused_bound.fused_bound(run(), GPU)
    assert b["issue"] == pytest.approx((400 * 10 + 1600 * 2) / 8 / 1e9)  # 7,200 instructions on 8 schedulers
    assert b["chains"] == pytest.approx(900 * 2 / 1e9)  # the busiest warp, scaled to the longest CTA
    assert b["fused"] == pytest.approx(max(b["issue"], b["chains"], 1e-6)) and b["two_kernels"] == 9e-6
    assert fused_bound.fused_bound(run(5000.0, 5000.0), GPU)["chains"] == pytest.approx(5000 / 1e9)  # the path


def test_the_split_forward_is_refused():
    r = run()
    r["kernels"].append(dict(r["kernels"][1]))
    with pytest.raises(ValueError, match="not the two-kernel forward"):
        fused_bound.fused_bound(r, GPU)


@pytest.mark.parametrize("record", ["profile-kimi-h200-step3c.json", "profile-kimi-b200-step3c.json"])
def test_the_records_bound_below_the_two_kernels(record, capsys):
    fused_bound.main([str(ROOT / "benchmarks" / record)])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("kimi-")]
    assert len(rows) == 6
    for name, two, fused, issue, chains, hbm in rows:
        assert float(fused) == max(float(issue), float(chains), float(hbm)) and float(fused) < float(two), name

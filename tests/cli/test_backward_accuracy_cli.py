"""``python -m kdacupy.accuracy --backward``: one row per regime, every gradient's ratio, JSON."""
import json
import subprocess
import sys


def test_backward_accuracy_reports_every_gradient(tmp_path):
    out = tmp_path / "rows.json"
    res = subprocess.run([sys.executable, "-m", "kdacupy.accuracy", "--backward", "--quick", "--T", "48", "--H", "1",
                          "--K", "64", "--V", "64", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    head = next(ln for ln in lines if "dA_log" in ln and "ddt_bias" in ln and "|" in ln)
    assert all(f in head for f in ("dq", "dk", "dv", "dg", "dbeta", "dS0"))
    assert sum(1 for ln in lines if ln.strip().startswith(("-8 ", "-4 ", "0 ", "8 ", "U(", "N("))) == 6
    assert "worst:" in lines[-1]
    data = json.loads(out.read_text())
    assert data["backward"] and len(data["rows"]) == 6
    for row in data["rows"]:
        assert row["finite"] and 0 < row["dq"] < 2e-2 and row["dinitial_state"] is not None

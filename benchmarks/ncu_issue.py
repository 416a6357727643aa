"""The issue-aware profile's predictions per kernel next to Nsight Compute's measurement of the same
kernels (the device script's step "Nsight Compute: instructions per kernel"): warp instructions
executed in all, on the busiest scheduler (SM sub-partition), the issue-active cycles and the
kernel's time, against ``python -m kdacupy.profile``'s instructions per warp (docs/design.md
section 11.4), its issue term and its predicted time.

    ncu --csv --metrics $(python benchmarks/ncu_issue.py --metrics) -k regex:kda_ -c 4 \\
        python -m kdacupy.bench --shapes kimi-T8192-H64 --no-fla --iters 1 --warmup 0 > ncu.csv
    python benchmarks/ncu_issue.py ncu.csv --profile benchmarks/profile-kimi-h200-backward2.json --shape kimi-T8192-H64

Without the CSV it prints the predictions alone (the CPU rehearsal's form).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

#: Nsight Compute's metrics: warp-level instructions executed (summed over the SM sub-partitions,
#: and their maximum: the busiest scheduler), the cycles a sub-partition issued in (mean), the SMs'
#: elapsed cycles (the slowest) and the kernel's time
METRICS = ("smsp__inst_executed.sum", "smsp__inst_executed.max", "smsp__issue_active.avg", "sm__cycles_elapsed.max",
           "gpu__time_duration.sum")


def measured(path: Path) -> dict:
    """{kernel name: {metric: value}} of ncu --csv output: each kernel's first launch."""
    text = path.read_text(errors="replace")
    start = text.find('"ID"')  # ncu prints its own lines before the table
    rows = list(csv.DictReader(text[start:].splitlines())) if start >= 0 else []
    out: dict = {}
    first_id: dict = {}
    for r in rows:
        name = r.get("Kernel Name", "").split("(")[0]
        if not name or r.get("Metric Name") not in METRICS:
            continue
        first_id.setdefault(name, r["ID"])
        if r["ID"] != first_id[name]:
            continue
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        unit = r.get("Metric Unit", "")
        scale = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}.get(unit, 1.0)
        out.setdefault(name, {})[r["Metric Name"]] = value * scale
    return out


def predicted(profile: Path, shape: str) -> list[dict]:
    """Per kernel of the profile's run of ``shape``: warp instructions per launch in all, the busiest
    scheduler's per launch (its issue term in cycles), the predicted time and its bound."""
    doc = json.loads(profile.read_text())
    gpu = doc["gpu"]
    run = next((e for e in doc["runs"] if e["name"] == shape), None)
    if run is None:
        sys.exit(f"{profile}: no run named {shape} (runs: {', '.join(e['name'] for e in doc['runs'])})")
    out = []
    for r in run["kernels"]:
        row = dict(kernel=r["kernel"], time_s=r["time_s"], bound=r["bound"])
        if "issue" in r:
            i, ctas = r["issue"], r["counts"]["ctas"] / max(1, r["launches"])
            row["instructions"] = sum(i["warps_per_cta"]) * ctas
            row["issue_cycles"] = r["times"]["issue"] * gpu["clock_ghz"] * 1e9 / max(1, r["launches"])
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?", help="ncu --csv output (absent: the predictions alone)")
    ap.add_argument("--profile", default="benchmarks/profile-kimi-h200-backward2.json")
    ap.add_argument("--shape", default="kimi-T8192-H64")
    ap.add_argument("--metrics", action="store_true", help="print the metrics for ncu --metrics and exit")
    args = ap.parse_args(argv)
    if args.metrics:
        print(",".join(METRICS))
        return 0
    pred = predicted(Path(args.profile), args.shape)
    got = measured(Path(args.csv)) if args.csv else {}
    if args.csv and not got:
        print(f"{args.csv}: no kernel measured (ncu's output follows)")
        print(Path(args.csv).read_text(errors="replace")[-2000:])
    print(f"{args.shape}: predicted ({args.profile}) / measured (Nsight Compute) per kernel launch")
    print(f"{'kernel':16} {'instr pred':>12} {'instr meas':>12} {'m/p':>5} {'busiest pred':>12} {'busiest meas':>12} "
          f"{'m/p':>5} {'issue-active':>12} {'time pred us':>12} {'time meas us':>12} {'m/p':>5}  bound")
    ratio = lambda m, p: f"{m / p:5.2f}" if m and p else f"{'-':>5}"  # noqa: E731
    for p in pred:
        m = got.get(p["kernel"], {})
        fmt = lambda x, k=1.0: f"{x / k:12.0f}" if x else f"{'-':>12}"  # noqa: E731
        t_meas = m.get("gpu__time_duration.sum")
        print(f"{p['kernel']:16} {fmt(p.get('instructions'))} {fmt(m.get('smsp__inst_executed.sum'))} "
              f"{ratio(m.get('smsp__inst_executed.sum'), p.get('instructions'))} {fmt(p.get('issue_cycles'))} "
              f"{fmt(m.get('smsp__inst_executed.max'))} {ratio(m.get('smsp__inst_executed.max'), p.get('issue_cycles'))} "
              f"{fmt(m.get('smsp__issue_active.avg'))} {p['time_s'] * 1e6:12.1f} "
              f"{f'{t_meas * 1e6:12.1f}' if t_meas else f'{chr(45):>12}'} {ratio(t_meas, p['time_s'])}  {p['bound']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

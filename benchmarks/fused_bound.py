"""The issue bound of the forward as one persistent launch, from a saved profile of the two kernels
(docs/design.md section 5): what a fused form, with the workspace handed over in L2 instead of DRAM,
could reach by the issue-aware model's own counts.

Two kernels each take their own time: the sum of their bounds (``predicted``). One launch that runs
the prepare's CTAs and the recurrence's chains side by side on every SM is bound instead by

- issue: every warp instruction of both kernels (each kernel's warps per CTA, from the SASS, times
  its CTAs) over all the GPU's schedulers at one instruction a cycle, perfectly balanced;
- the chains: the longest recurrence CTA's dependent path or its busiest warp's instructions over its
  whole sequence, which no overlap shortens (one chain per CTA, one CTA an SM while the chains fit);
- HBM: the compulsory bytes (the workspace no longer leaves L2).

Each is a lower bound and so is their maximum: the producers' and consumers' balance, the ring's
hand-over and L2 misses are not counted.

    PYTHONPATH=. python benchmarks/fused_bound.py benchmarks/profile-kimi-h200-step3c.json
"""
from __future__ import annotations

import json
import sys


def warp_instructions(kernel: dict) -> float:
    """All the warp instructions a kernel issues: its warps' per-CTA counts summed, times its CTAs."""
    return sum(kernel["issue"]["warps_per_cta"]) * kernel["counts"]["ctas"]


def fused_bound(run: dict, gpu: dict) -> dict:
    """The three terms (seconds) of one forward run of a saved profile; each kernel launched once."""
    kernels = {k["kernel"]: k for k in run["kernels"]}
    prepare, chain = kernels["kda_prepare"], kernels["kda_recurrence"]
    if run.get("segments", 1) != 1 or len(run["kernels"]) != 2:
        raise ValueError(f"{run['name']}: not the two-kernel forward")
    hz = gpu["clock_ghz"] * 1e9
    issue = sum(map(warp_instructions, (prepare, chain))) / (gpu["sms"] * gpu["schedulers"]) / hz
    # the longest chain: its dependent path, or its busiest warp's instructions (the SASS counts are a mean
    # over the CTAs: scaled to the longest CTA by the paths' ratio, for varlen's unequal sequences)
    lat = chain["latency"]
    longest = lat["path_cycles"] / lat["mean_path_cycles"]
    chains = max(lat["path_cycles"], max(chain["issue"]["warps_per_cta"]) * longest) / hz
    return {"issue": issue, "chains": chains, "hbm": run["hbm_floor_s"],
            "fused": max(issue, chains, run["hbm_floor_s"]), "two_kernels": run["predicted_s"]}


def main(argv: list[str]) -> None:
    for path in argv:
        saved = json.load(open(path))
        gpu = saved["gpu"]
        print(f"{path}: {gpu['name']}, {gpu['sms']} SMs x {gpu['schedulers']} schedulers at {gpu['clock_ghz']} GHz")
        print(f"{'shape':24} {'two kernels':>11} {'fused':>7} {'issue':>7} {'chains':>7} {'HBM':>7}  (ms)")
        for run in saved["runs"]:
            if run["kind"] != "forward" or run.get("segments", 1) != 1:
                continue
            b = fused_bound(run, gpu)
            print(f"{run['name']:24} {b['two_kernels'] * 1e3:11.3f} {b['fused'] * 1e3:7.3f} {b['issue'] * 1e3:7.3f} "
                  f"{b['chains'] * 1e3:7.3f} {b['hbm'] * 1e3:7.3f}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["benchmarks/profile-kimi-h200-step3c.json"])

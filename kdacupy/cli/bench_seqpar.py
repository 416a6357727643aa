"""Serial against split columns of ``python -m kdacupy.bench`` (sequence
parallelism, docs/design.md section 7.2).

For a shape: the library's choice for ``sequence_parallel=None`` and why, the
serial run's time (``sequence_parallel=1``), and per forced segment count n its
time, the speedup over serial, and before any timing the RMS ratio of its output
and final state against the serial run's (a wrong split shows as O(1) here; the
parity tolerance is 2^-8).
"""
from __future__ import annotations

from . import timing

#: segment counts the fewhead shapes are measured with (calibrates seqpar's heuristic)
DEFAULT_SPLITS = (4, 8, 16, 32)


def calls_for(sets, n):
    """Closures running ``kda_forward`` on each input set with ``sequence_parallel=n``."""
    from ..api import kda_forward

    return [lambda a=a, o=o: kda_forward(**a, **o, backend="cuda", sequence_parallel=n) for a, o in sets]


def auto_choice(sets):
    from ..seqpar import explain

    arrays, options = sets[0]
    return explain(**arrays, **options)


def rms_ratio(x, ref):
    import cupy

    x, ref = x.astype(cupy.float64), ref.astype(cupy.float64)
    norm = float(cupy.linalg.norm(ref))
    return float(cupy.linalg.norm(x - ref)) / norm if norm else 0.0


def measure(sets, splits, warmup, iters) -> dict:
    auto, why = auto_choice(sets)
    serial = calls_for(sets, 1)
    o1, s1 = serial[0]()
    med, mn = timing.time_calls(serial, warmup, iters)
    out = dict(auto_segments=auto, auto_why=why, serial=dict(median_ms=med, min_ms=mn), splits={})
    for n in splits:
        calls = calls_for(sets, n)
        o2, s2 = calls[0]()
        row = dict(finite=timing.finite(o2) and timing.finite(s2), rms_vs_serial_o=rms_ratio(o2, o1),
                   rms_vs_serial_state=rms_ratio(s2, s1))
        del o2, s2
        row["median_ms"], row["min_ms"] = timing.time_calls(calls, warmup, iters)
        row["speedup"] = med / row["median_ms"]
        out["splits"][str(n)] = row
    best = max(out["splits"].items(), key=lambda kv: kv[1]["speedup"], default=None)
    out["best"] = None if best is None else dict(segments=int(best[0]), speedup=best[1]["speedup"])
    return out


def format_table(rows) -> str:
    rows = [r for r in rows if r.get("seqpar")]
    if not rows:
        return ""
    ns = sorted({int(n) for r in rows if "splits" in r["seqpar"] for n in r["seqpar"]["splits"]})
    head = f"{'shape':<24} {'auto':>4} {'serial ms':>9} " + " ".join(f"{'n=' + str(n):>8}" for n in ns) + \
        f" {'best':>10} {'rms o':>8}"
    lines = ["sequence parallelism: serial vs split (ms; best = segments @ speedup over serial)", head,
             "-" * len(head)]
    for r in rows:
        sp = r["seqpar"]
        if sp.get("error"):
            lines.append(f"{r['shape']['name']:<24} ERROR: {sp['error'][:200]}")
            continue
        cells = []
        for n in ns:
            c = sp["splits"].get(str(n))
            cells.append(f"{c['median_ms']:8.3f}" if c else f"{'-':>8}")
        b = sp["best"]
        best = f"{b['segments']}@{b['speedup']:.2f}x" if b else "-"
        worst_rms = max((c["rms_vs_serial_o"] for c in sp["splits"].values()), default=0.0)
        lines.append(f"{r['shape']['name']:<24} {sp['auto_segments']:>4} {sp['serial']['median_ms']:9.3f} "
                     + " ".join(cells) + f" {best:>10} {worst_rms:8.1e}")
    return "\n".join(lines)

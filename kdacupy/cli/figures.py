"""Figures for the documentation: the accuracy sweep (each case's output error against its bf16
rounding floor) and the roofline of a profiled run (each kernel's time per term, the bound
marked). Matplotlib (the ``[docs]`` extra) draws them; SVG text stays text (``svg.fonttype``
none) and the files carry no date, so a figure is a function of its JSON and the titles quote
the numbers a test compares with ``benchmarks/``."""
from __future__ import annotations

from pathlib import Path

#: the roofline's terms, in the order drawn (kdacupy/cli/roofline.py names them)
TERMS = ("hbm", "smem", "tensor", "sfu", "latency", "issue")


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit(f"--figure needs Matplotlib (pip install 'kdacupy[docs]'): {e}") from e
    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "kdacupy", "font.size": 9})
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None} if str(path).endswith(".svg") else None, bbox_inches="tight")


def accuracy_title(doc) -> str:
    """The accuracy figure's title: the sweep and its output RMSE ratios (min / median / max)."""
    errs = sorted(r["o_rmse"] for r in doc["rows"])
    mid = errs[len(errs) // 2] if len(errs) % 2 else 0.5 * (errs[len(errs) // 2 - 1] + errs[len(errs) // 2])
    return (f"backend={doc['backend']} T={doc['T']} K={doc['K']} V={doc['V']} state={doc['state_precision']}: "
            f"output RMSE ratio {errs[0]:.2e} / {mid:.2e} / {errs[-1]:.2e} (min / median / max)")


def accuracy(doc, path) -> None:
    """One point per case: the output's RMSE ratio against float64, and the bf16 floor (the error
    of rounding the exact output to bf16 once) beside it; log scale."""
    plt = _pyplot()
    rows = doc["rows"]
    labels = [r.get("case") or f"g={r['g']} b={r['dt_bias']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(rows)), 3.2))
    x = range(len(rows))
    ax.semilogy(x, [r["o_rmse"] for r in rows], "o", ms=4, label="output RMSE ratio")
    ax.semilogy(x, [r["o_bf16_floor"] for r in rows], "_", ms=9, color="k", label="bf16 rounding floor")
    ax.set_xticks(list(x), labels, rotation=90, fontsize=6)
    ax.set_ylabel("against float64")
    ax.set_title(accuracy_title(doc), fontsize=8)
    ax.legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)


def roofline_title(run) -> str:
    """The roofline figure's title: the run, its predicted time and its HBM floor."""
    return (f"{run['name']} {run['kind']}: {run['predicted_s'] * 1e3:.3f} ms predicted, "
            f"HBM floor {run['hbm_floor_s'] * 1e3:.3f} ms")


def roofline(doc, path, name=None) -> None:
    """Each kernel of one run (``name``, default the first) as a row of bars, one per roofline term
    (time in microseconds), the term that binds drawn solid and the others faint."""
    plt = _pyplot()
    runs = [r for r in doc["runs"] if name is None or r["name"] == name]
    if not runs:
        raise SystemExit(f"--figure-run {name!r}: no such run (have {', '.join(r['name'] for r in doc['runs'])})")
    run = runs[0]
    kernels = run["kernels"]
    fig, axes = plt.subplots(len(kernels), 1, figsize=(6.5, 1.3 + 1.1 * len(kernels)), squeeze=False)
    for ax, k in zip(axes[:, 0], kernels):
        times = [1e6 * k["times"].get(t, 0.0) for t in TERMS]
        bound = k.get("bound")
        colors = ["C3" if t == bound else "C0" for t in TERMS]
        alphas = [1.0 if t == bound else 0.35 for t in TERMS]
        for i, (t, c, a) in enumerate(zip(times, colors, alphas)):
            ax.barh(i, t, color=c, alpha=a)
        ax.set_yticks(range(len(TERMS)), TERMS)
        ax.invert_yaxis()
        ax.set_title(f"{k['kernel']}: bound by {bound}, {1e6 * k['time_s']:.1f} us", fontsize=8, loc="left")
        ax.set_xlabel("us")
    fig.suptitle(roofline_title(run), fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)

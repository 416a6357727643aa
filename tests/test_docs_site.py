"""The documentation: the site (mkdocs.yml, docs/) builds in strict mode, with an API reference
entry for every public name; the code blocks marked as running on the CPU run; the README stays
a front door (about 200 lines, its two commands); and the figures the README and the docs quote
agree with the recorded results under benchmarks/."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
MARK = "<!-- runs on the CPU (tests/test_docs_site.py) -->"
PUBLIC = ("kdacupy", "kdacupy.torch", "kdacupy.jax", "kdacupy.distributed", "kdacupy.compat.fla",
          "kdacupy.compat.flashkda", "kdacupy.compat.vllm", "kdacupy.compat.sglang")


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "NO_MKDOCS_2_WARNING": "1"}


def _public_names(module):
    """A module's ``__all__``, read from its source (no framework import needed)."""
    spec = importlib.util.find_spec(module)
    src = Path(spec.origin).read_text()
    m = re.search(r"^__all__ = \[(.*?)\]", src, flags=re.S | re.M)
    return re.findall(r'"(\w+)"', m.group(1))


def test_the_site_builds_in_strict_mode_with_every_public_name(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("the site needs the [docs] extra (mkdocs, mkdocs-material, mkdocstrings[python]); the README's "
                    "test command installs it")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    html = "".join(p.read_text() for p in (tmp_path / "site" / "reference").rglob("*.html"))
    missing = [f"{m}.{n}" for m in PUBLIC for n in _public_names(m)
               if n != "__version__" and f'id="{m}.{n}"' not in html]
    assert not missing, f"public names without an API reference entry: {missing}"


def _blocks(path):
    text = path.read_text()
    return re.findall(re.escape(MARK) + r"\n```python\n(.*?)```", text, flags=re.S)


RUNNABLE = [(p, i, code) for p in [README, *PAGES] for i, code in enumerate(_blocks(p))]


def test_the_docs_have_runnable_examples():
    pages = {p.relative_to(ROOT).as_posix() for p, _, _ in RUNNABLE}
    assert len(RUNNABLE) >= 5 and {"README.md", "docs/guide/forward.md", "docs/guide/serving.md"} <= pages, pages


RUNNER = r"""
import json, sys, traceback
failed = []
for label, code in json.loads(sys.stdin.read()):
    try:
        exec(compile(code, label, "exec"), {"__name__": "__main__"})
    except Exception:
        failed.append(label + ":\n" + traceback.format_exc())
print(json.dumps(failed))
"""


@pytest.mark.torch
def test_the_marked_code_blocks_run_on_the_cpu():
    """Every marked block, each in a namespace of its own, in one process (one import of kdacupy and
    torch for all of them); blocks that need torch skip without it, saying so."""
    have_torch = importlib.util.find_spec("torch") is not None
    blocks = [(f"{p.relative_to(ROOT)} block {i}", code) for p, i, code in RUNNABLE
              if have_torch or "torch" not in code]
    if not blocks:
        pytest.skip("every marked block uses torch: the test-frameworks extra")
    r = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(blocks), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    failed = json.loads(r.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(failed)


def test_the_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert ".venv/bin/pip install . && .venv/bin/python -m kdacupy.accuracy --quick" in text
    assert '.venv/bin/pip install ".[test,test-frameworks,distributed,docs]" && .venv/bin/python -m pytest' in text
    for page in re.findall(r"`(docs/[\w/.-]+\.md)`", text):
        assert (ROOT / page).is_file(), page


def _doc(name):
    return json.loads((ROOT / "benchmarks" / name).read_text())


def _svg_text(path):
    return " ".join(re.findall(r"<text[^>]*>([^<]*)", path.read_text()))


def test_the_figures_are_those_of_the_recorded_results():
    """Each figure's title quotes the numbers of its JSON: redrawn from benchmarks/, the titles match."""
    from kdacupy.cli import figures
    acc, prof = _doc("accuracy-model-T2048.json"), _doc("profile-kimi-h200-step3.json")
    assert figures.accuracy_title(acc) in _svg_text(ROOT / "docs" / "figures" / "accuracy-model.svg")
    assert figures.roofline_title(prof["runs"][0]) in _svg_text(ROOT / "docs" / "figures" / "roofline-kimi-h200.svg")


def test_the_readme_quotes_the_recorded_figures():
    text = README.read_text()
    runs = {(r["name"], r["kind"]): r for r in _doc("profile-kimi-h200-backward2.json")["runs"]}
    forward = {r["name"]: r for r in _doc("profile-kimi-h200-step3o.json")["runs"]}  # the forward's latest
    for h in (96, 64):
        fwd, bwd = forward[f"kimi-T8192-H{h}"], runs[(f"kimi-T8192-H{h} backward", "backward")]
        for what, seconds in (("forward", fwd["predicted_s"]), ("backward", bwd["predicted_s"]),
                              ("HBM floor of the forward", fwd["hbm_floor_s"])):
            row = re.search(rf"^\| {what} \| ([\d.]+) ms \| ([\d.]+) ms \|$", text, flags=re.M)
            quoted = float(row.group(1 if h == 96 else 2))
            assert abs(quoted - seconds * 1e3) <= 0.0005 + 0.001 * seconds * 1e3, (what, h, quoted, seconds)
    train = {r["name"]: r for r in _doc("profile-kimi-h200-train.json")["runs"]}
    row = re.search(r"^\| training step with kept states \(forward \+ backward\) \| ([\d.]+) ms \| ([\d.]+) ms \|$", text,
                    flags=re.M)
    for i, h in ((1, 96), (2, 64)):
        assert abs(float(row.group(i)) - train[f"kimi-T8192-H{h} train"]["predicted_s"] * 1e3) <= 0.0005, h
    rows = _doc("accuracy-model-T2048.json")["rows"]
    errs = sorted(r["o_rmse"] for r in rows)
    for value in (errs[0], errs[-1], errs[len(errs) // 2 - 1] / 2 + errs[len(errs) // 2] / 2,
                  max(r["o_bf16_floor"] for r in rows)):
        assert f"{value:.2e}".replace("e-0", "e-") in text, value

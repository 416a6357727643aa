"""Mutation run of the CPU suite: each planted kernel bug of benchmarks/mutants.yaml goes into a
throwaway copy of the tree, and the tests named for it run there; a mutant they let through is a
hole in the suite. Prints per mutant killed (by which test), survived, timeout, error or stale,
then the kill ratio; --json writes the same for benchmarks/ (with the commit).

    .venv/bin/python benchmarks/mutate.py [--list] [--only NAME[,NAME]] [--jobs N] [--timeout S]
                                           [--json FILE] [--baseline]
    .venv/bin/python benchmarks/mutate.py --generate REV_RANGE [--sample N] [--seed S] ...

``--generate`` draws mutants by rule (comparison flips, off-by-one bounds, dropped barriers /
fences / waits, swapped index terms, dropped key fields, dropped validations) over the lines a
commit range added (benchmarks/mutate_rules.py), each with the tests of its file.

Each copy has the tree's files without .git, .venv and caches; pytest runs in it with this
interpreter and PYTHONPATH at the copy, and a probe first checks that the copy's kdacupy and
kernels (kdacupy.paths.kernels_dir()) are the ones imported. The emulation's build cache is the
usual one: its key is the rendered source, so only the mutated kernel's variants compile.
Exit status: 0 when every mutant was decided (killed or survived), 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "benchmarks" / "mutants.yaml"
FIELDS = {"name": str, "file": str, "old": str, "new": str, "why": str, "tests": list}
OPTIONAL = {"audit": ("survived", "lucky-kill")}
SKIP_TOP = {".git", ".venv", "build", "dist", ".whl"}
SKIP_ANY = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
DECIDED = ("killed", "survived")
PROBE = ("import json, kdacupy, kdacupy.paths as p; "
         "print(json.dumps([kdacupy.__file__, str(p.kernels_dir())]))")


def load(path: Path = MUTANTS) -> list[dict]:
    """The mutants of ``path``, each checked for its fields (ValueError naming the bad one)."""
    items = yaml.safe_load(Path(path).read_text())
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected a non-empty list of mutants")
    seen = set()
    for i, m in enumerate(items):
        label = m.get("name", f"#{i}") if isinstance(m, dict) else f"#{i}"
        if not isinstance(m, dict):
            raise ValueError(f"mutant {label}: not a mapping")
        missing = [f for f in FIELDS if f not in m]
        extra = [f for f in m if f not in FIELDS and f not in OPTIONAL]
        if missing or extra:
            raise ValueError(f"mutant {label}: missing {missing}, unknown {extra}")
        bad = [f for f, t in FIELDS.items() if not isinstance(m[f], t)]
        if bad or not m["tests"] or not all(isinstance(t, str) and t for t in m["tests"]):
            raise ValueError(f"mutant {label}: wrong type of {bad or ['tests']}")
        for f, allowed in OPTIONAL.items():
            if f in m and m[f] not in allowed:
                raise ValueError(f"mutant {label}: {f} must be one of {allowed}")
        if not m["name"] or not m["old"] or m["old"] == m["new"]:
            raise ValueError(f"mutant {label}: needs a name and an old text that the new one changes")
        if code_only(m["old"]) == code_only(m["new"]):
            raise ValueError(f"mutant {label}: changes only comments or spacing, no behaviour")
        if not m["file"].startswith("kernels/"):
            raise ValueError(f"mutant {label}: {m['file']} is not under kernels/")
        if m["name"] in seen:
            raise ValueError(f"mutant {label}: duplicate name")
        seen.add(m["name"])
    return items


def stale(m: dict, root: Path = ROOT) -> str | None:
    """Why ``m`` no longer applies to the tree at ``root`` (its old text not there exactly once), or None."""
    path = root / m["file"]
    if not path.is_file():
        return f"{m['file']} does not exist"
    n = path.read_text().count(m["old"])
    return None if n == 1 else f"its old text occurs {n} times in {m['file']} (must be once)"


def code_only(text: str) -> str:
    """``text`` without // comments and whitespace: what a mutant must change."""
    return re.sub(r"\s+", "", re.sub(r"//[^\n]*", "", text))


def copy_tree(src: Path, dst: Path) -> None:
    def ignore(folder, names):
        top = Path(folder).resolve() == src.resolve()
        return {n for n in names if n in SKIP_ANY or n.endswith((".pyc", ".egg-info")) or (top and n in SKIP_TOP)}
    shutil.copytree(src, dst, symlinks=True, ignore=ignore)


def outcome(rc: int, output: str) -> tuple[str, str | None, str]:
    """(status, killing test, detail) of a ``pytest -x -q`` run that exited ``rc``."""
    last = next((ln for ln in reversed(output.splitlines()) if re.search(r" in [\d.]+s\b", ln)), "")
    counts = {k.rstrip("s"): int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)\b", last)}
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    if rc == 1 and failed:
        if "emulation build failed" in output:
            return "error", failed[0], "the mutant does not compile: a planted bug must build"
        return "killed", failed[0], ""
    if rc == 0 and counts.get("passed", 0) > 0:
        return "survived", None, f"{counts['skipped']} skipped" if counts.get("skipped") else ""
    if rc == 0:
        return "error", None, f"no test ran ({counts.get('skipped', 0)} skipped)"
    return "error", None, f"pytest exited {rc}"


def probe(tree: Path, env: dict, m: dict | None, mutated: str | None) -> str | None:
    """Why the copy at ``tree`` is not what its Python imports (or its kernel file not ``mutated``),
    or None."""
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=tree, env=env, capture_output=True, text=True,
                         timeout=120)
    if res.returncode != 0:
        return f"import probe failed: {res.stderr.strip()[-500:]}"
    pkg, kernels = (Path(x).resolve() for x in json.loads(res.stdout.strip().splitlines()[-1]))
    if not pkg.is_relative_to(tree.resolve()) or kernels != (tree / "kernels").resolve():
        return f"the copy imports kdacupy from {pkg} and its kernels from {kernels}"
    if m is not None and m["file"].startswith("kernels/") and \
            (kernels / m["file"].removeprefix("kernels/")).read_text() != mutated:
        return "the imported kernels lack the mutation"
    if m is not None and not m["file"].startswith("kernels/") and (tree / m["file"]).read_text() != mutated:
        return "the copy lacks the mutation"
    return None


def run_tests(tree: Path, env: dict, tests: list[str], timeout: float, sweeps: bool = True) -> tuple[int | None, str]:
    """(exit status, output) of pytest on ``tests`` in ``tree``; status None when it outlasted ``timeout``
    (its whole process group is killed: emulated modules run in forked children). ``sweeps``: the tests
    whole, the points beyond the default run's sample included (tests/sweeps.py); else that sample alone."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *(["--sweeps"] * sweeps), *tests]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def run_mutant(m: dict | None, tests: list[str], timeout: float, sweeps: bool = True) -> dict:
    """One mutant (None: the unmutated tree) in its own copy of the tree."""
    t0 = time.monotonic()
    res = dict(mutant=m["name"] if m else "(baseline)", file=m["file"] if m else None, tests=tests,
               status="error", killed_by=None, detail="")
    if m is not None and "rule" in m:  # a generated mutant: what it changed, for the survivors' review
        res.update(rule=m["rule"], old=m["old"].split("\n")[0].strip(), new=m["new"].split("\n")[0].strip())
    with tempfile.TemporaryDirectory(prefix="kda_mutant_") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(ROOT, tree)
        mutated = None
        if m is not None:
            if why := stale(m, tree):  # the tree changed since the check before the run
                res.update(status="stale", detail=why, seconds=round(time.monotonic() - t0, 1))
                return res
            path = tree / m["file"]
            mutated = path.read_text().replace(m["old"], m["new"], 1)
            path.write_text(mutated)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
               "PYTHONDONTWRITEBYTECODE": "1"}
        why = probe(tree, env, m, mutated)
        if why:
            res["detail"] = why
        else:
            rc, out = run_tests(tree, env, tests, timeout, sweeps)
            if rc is None:
                res.update(status="timeout", detail=f"no verdict in {timeout:g} s")
            else:
                res["status"], res["killed_by"], res["detail"] = outcome(rc, out)
            if res["status"] not in DECIDED:
                res["output_tail"] = "\n".join(out.splitlines()[-30:])
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def table(results: list[dict]) -> str:
    w = max(len(r["mutant"]) for r in results)
    lines = [f"{'mutant':<{w}}  {'status':<8}  {'s':>6}  killed by / detail", "-" * (w + 40)]
    for r in results:
        what = r["killed_by"] or r["detail"]
        lines.append(f"{r['mutant']:<{w}}  {r['status']:<8}  {r.get('seconds', 0):>6.1f}  {what}")
    return "\n".join(lines)


def summary(results: list[dict]) -> dict:
    by = {s: [r["mutant"] for r in results if r["status"] == s]
          for s in ("killed", "survived", "timeout", "error", "stale")}
    tried = len(by["killed"]) + len(by["survived"]) + len(by["timeout"])
    return dict(counts={s: len(v) for s, v in by.items()}, survivors=by["survived"],
                kill_ratio=round(len(by["killed"]) / tried, 4) if tried else None,
                undecided=by["timeout"] + by["error"] + by["stale"])


def git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
        return out.stdout.rstrip()
    except (OSError, subprocess.SubprocessError):
        return None


def select(mutants: list[dict], only: str | None) -> list[dict]:
    if not only:
        return mutants
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in {m["name"] for m in mutants}]
    if unknown:
        raise SystemExit(f"unknown mutant(s): {', '.join(unknown)} (see --list)")
    return [m for m in mutants if m["name"] in names]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="print the mutants (and which are stale) and stop")
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant's tests (default 600)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--default-run", action="store_true",
                    help="run the files of each mutant's tests as the default suite does: their sample, without the "
                         "sweep's points (tests/sweeps.py)")
    ap.add_argument("--baseline", action="store_true",
                    help="first run the selected mutants' tests on the unmutated tree; stop if they fail there")
    ap.add_argument("--generate", metavar="REV_RANGE",
                    help="instead of mutants.yaml, mutants generated by rule over the lines REV_RANGE added "
                         "(benchmarks/mutate_rules.py)")
    ap.add_argument("--sample", type=int, default=30, help="with --generate: how many, spread over the rules")
    ap.add_argument("--seed", type=int, default=0, help="with --generate: the sample's seed")
    args = ap.parse_args(argv)
    if args.generate:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import mutate_rules
        mutants = select(mutate_rules.sample(mutate_rules.generate(args.generate), args.sample, args.seed), args.only)
    else:
        mutants = select(load(), args.only)
    if args.list:
        for m in mutants:
            flag = f"  STALE: {why}" if (why := stale(m)) else ""
            audit = f" [audit: {m['audit']}]" if "audit" in m else ""
            print(f"{m['name']}{audit}{flag}\n  {m['file']}: {m['why']}\n  tests: {' '.join(m['tests'])}")
        return 0
    results: dict[str, dict] = {}
    todo = []
    for m in mutants:
        if why := stale(m):
            print(f"stale mutant {m['name']}: {why}", file=sys.stderr)
            results[m["name"]] = dict(mutant=m["name"], file=m["file"], tests=m["tests"], status="stale",
                                      killed_by=None, detail=why, seconds=0.0)
        else:
            todo.append(m)
    if args.baseline and todo:
        base = run_mutant(None, list(dict.fromkeys(t for m in todo for t in m["tests"])), args.timeout)
        if base["status"] != "survived":  # on the unmutated tree "survived" is: every test passed
            print(f"baseline: the tests fail on the unmutated tree ({base['status']}: "
                  f"{base['killed_by'] or base['detail']})\n{base.get('output_tail', '')}", file=sys.stderr)
            return 1
        print(f"baseline: the tests pass on the unmutated tree ({base['seconds']} s)", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        # --default-run: a named point may be a sweep's, so the named tests' files, as the default run takes them
        files = lambda m: list(dict.fromkeys(t.split("::")[0] for t in m["tests"]))  # noqa: E731
        tests = {m["name"]: files(m) if args.default_run else m["tests"] for m in todo}
        futures = {pool.submit(run_mutant, m, tests[m["name"]], args.timeout, not args.default_run): m for m in todo}
        for i, f in enumerate(as_completed(futures), 1):
            try:
                r = f.result()
            except Exception as e:  # noqa: BLE001  (a copy or probe that broke: this mutant's error, not the run's)
                m = futures[f]
                r = dict(mutant=m["name"], file=m["file"], tests=m["tests"], status="error", killed_by=None,
                         detail=f"{type(e).__name__}: {e}", seconds=0.0)
            results[r["mutant"]] = r
            print(f"[{i}/{len(todo)}] {r['mutant']}: {r['status']} {r['killed_by'] or r['detail']} ({r['seconds']} s)",
                  flush=True)
            if r["status"] not in DECIDED and r.get("output_tail"):
                print(r["output_tail"], flush=True)
    ordered = [results[m["name"]] for m in mutants]
    s = summary(ordered)
    print("\n" + table(ordered))
    c = s["counts"]
    ratio = "n/a" if s["kill_ratio"] is None else f"{100 * s['kill_ratio']:.0f}%"
    print(f"\nkilled {c['killed']} of {c['killed'] + c['survived'] + c['timeout']} ({ratio}); survived {c['survived']}"
          f"{': ' + ', '.join(s['survivors']) if s['survivors'] else ''}; timeout {c['timeout']}, error {c['error']},"
          f" stale {c['stale']}")
    if args.json:
        doc = dict(commit=git("rev-parse", "HEAD"), uncommitted=(git("status", "--porcelain", "--", "kernels", "tests")
                                                                or "").splitlines(),
                   python=sys.version.split()[0], timeout_s=args.timeout, jobs=args.jobs, default_run=args.default_run,
                   summary=s, results=ordered,
                   generated=None if not args.generate else dict(range=args.generate, sample=args.sample,
                                                                 seed=args.seed))
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if not s["undecided"] else 1


if __name__ == "__main__":
    sys.exit(main())

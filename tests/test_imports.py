"""Nothing under kdacupy/ or benchmarks/ may break silently when code moves:
every module of the package and every script of benchmarks/ imports (no GPU
needed), and every import statement in them that names the project's own code
(kdacupy.*, tests.*, relative imports; at module level or inside a function,
where a plain import would not see it) resolves to a module and a name that
exist. Third-party imports (cupy, torch, fla, mpi4py, ...) are optional
extras and not checked. benchmarks/device_check.sh passes ``bash -n``."""
import ast
import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "kdacupy"
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
OWN = ("kdacupy", "tests")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(module_name(p) for p in PKG.rglob("*.py"))


def own_imports(path: Path, importer: str | None):
    """(line, module, names) of every import of the project's own code in ``path``;
    ``importer`` is the file's module name (None for a script: no relative imports)."""
    tree = ast.parse(path.read_text(), str(path))
    package = None
    if importer is not None:
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OWN:
                    yield node.lineno, a.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert package is not None, f"{path}:{node.lineno}: a relative import in a script"
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
                if mod.split(".")[0] not in OWN:
                    continue
            yield node.lineno, mod, tuple(a.name for a in node.names if a.name != "*")


def unresolved(path: Path, importer: str | None) -> list:
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    bad = []
    for line, mod, names in own_imports(path, importer):
        try:
            m = importlib.import_module(mod)
        except ImportError as e:
            bad.append(f"{shown}:{line}: import {mod}: {e}")
            continue
        for n in names:
            if hasattr(m, n):
                continue
            try:
                importlib.import_module(f"{mod}.{n}")
            except ImportError:
                bad.append(f"{shown}:{line}: {mod} has no {n!r}")
    return bad


def module_path(name: str) -> Path:
    f = ROOT.joinpath(*name.split("."))
    return f.with_suffix(".py") if f.with_suffix(".py").exists() else f / "__init__.py"


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    importlib.import_module(name)


def test_every_own_import_in_the_package_resolves():
    bad = [b for name in MODULES for b in unresolved(module_path(name), name)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_script_imports_and_its_imports_resolve(script, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    spec = importlib.util.spec_from_file_location(f"_benchmark_{script.stem}", script)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)  # the scripts run nothing at import (``if __name__ == "__main__"``)
    assert callable(getattr(mod, "main", None)), f"{script.name}: no main()"
    bad = unresolved(script, None)
    assert not bad, "\n".join(bad)


def test_the_resolver_catches_a_moved_name(tmp_path):
    """The check itself: an import of a module that moved (as kdacupy.dtypes did) and a
    lazy import of a missing name inside a function (as size_parity.py's was) are both reported."""
    probe = tmp_path / "moved.py"
    probe.write_text("from kdacupy.dtypes import BF16\n\ndef main():\n    from kdacupy.cli.accuracy import NOPE\n")
    bad = unresolved(probe, None)
    assert any("moved.py:1: import kdacupy.dtypes" in b for b in bad), bad
    assert any("moved.py:4: kdacupy.cli.accuracy has no 'NOPE'" in b for b in bad), bad


def test_device_check_script_parses():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    res = subprocess.run([bash, "-n", str(ROOT / "benchmarks" / "device_check.sh")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr

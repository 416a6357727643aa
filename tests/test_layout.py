"""The package's structure (docs/design.md section 3): the import graph of
kdacupy, over every module and every import (module-level and inside
functions, relative and absolute), has no circle, and no layer imports one
above it; no function is longer than 120 lines."""
import ast
from functools import lru_cache
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kdacupy"
ENTRY_POINTS = {"kdacupy.tune", "kdacupy.bench", "kdacupy.compile", "kdacupy.accuracy", "kdacupy.profile"}
#: the top of the package: public faces only (everything else lives in the layer it serves)
FACES = {"kdacupy", "kdacupy.api", "kdacupy.backward", "kdacupy.decode", "kdacupy.seqpar", "kdacupy.saved", "kdacupy.env", "kdacupy.paths"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def resolve(importer: str, node) -> set:
    """The kdacupy modules one import statement loads."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
        return {t for t in targets if t in MODULES}
    if node.level:
        base = importer.split(".") if is_package(importer) else importer.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    found = set()
    for a in node.names:
        sub = f"{mod}.{a.name}"
        found.add(sub if sub in MODULES else mod)
    return {m for m in found if m in MODULES}


@lru_cache(maxsize=None)
def parsed(name: str) -> ast.Module:
    """The module's syntax tree, parsed once for the file's tests (a second a test, parsed for each)."""
    return ast.parse(MODULES[name].read_text())


@lru_cache(maxsize=None)
def _graph() -> dict:
    return {name: frozenset(set().union(*(resolve(name, n) for n in ast.walk(parsed(name))
                                          if isinstance(n, (ast.Import, ast.ImportFrom))), set()) - {name})
            for name in MODULES}


def import_graph() -> dict:
    """Module -> the kdacupy modules it imports (built once; each call a copy the caller may change)."""
    return {name: set(deps) for name, deps in _graph().items()}


def find_cycle(graph):
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_the_graph_sees_relative_and_function_level_imports():
    g = import_graph()
    assert "kdacupy.ops.forward.kernels" in g["kdacupy.api"]  # inside kda_forward, relative
    assert "kdacupy.jit.loaders" in g["kdacupy.ops.forward.kernels"]
    assert "kdacupy.numerics.dtypes" in g["kdacupy.validation.arrays"]
    assert "kdacupy.validation.problem" in g["kdacupy.validation"]  # a package's __init__ counts as a module
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_no_cycle_between_packages():
    """Each subpackage (numerics, jit, ops, emulate, cli) as one node, each top-level module as its own."""
    def node(m):
        parts = m.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 or is_package(m) and m != "kdacupy" else m

    graph = {}
    for m, deps in import_graph().items():
        graph.setdefault(node(m), set()).update(node(d) for d in deps if node(d) != node(m))
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


# layer -> the packages it may not import
FORBIDDEN = {
    "kdacupy.numerics": ("kdacupy.ops", "kdacupy.jit", "kdacupy.cli", "kdacupy.emulate", "kdacupy.api"),
    "kdacupy.emulate": ("kdacupy.ops", "kdacupy.jit", "kdacupy.cli", "kdacupy.numerics", "kdacupy.api"),
    "kdacupy.jit": ("kdacupy.ops", "kdacupy.cli", "kdacupy.api", "kdacupy.validation"),
    "kdacupy.ops": ("kdacupy.cli", "kdacupy.api", "kdacupy.validation"),
    "kdacupy.validation": ("kdacupy.jit", "kdacupy.emulate", "kdacupy.cli", "kdacupy.api", "kdacupy.decode",
                           "kdacupy.seqpar", "kdacupy.distributed"),
}


def under(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def test_layers_import_only_downwards():
    bad = []
    for mod, deps in import_graph().items():
        for layer, banned in FORBIDDEN.items():
            if under(mod, layer):
                bad += [f"{mod} -> {d}" for d in deps if any(under(d, b) for b in banned)]
        if not under(mod, "kdacupy.cli") and mod not in ENTRY_POINTS:
            bad += [f"{mod} -> {d}" for d in deps if under(d, "kdacupy.cli")]
    assert not bad, "\n".join(bad)


def test_the_top_of_the_package_holds_only_faces_and_entry_points():
    top = {m for m in MODULES if m.count(".") <= 1 and not is_package(m) or m == "kdacupy"}
    assert top == FACES | ENTRY_POINTS, sorted(top ^ (FACES | ENTRY_POINTS))


def test_validation_reaches_ops_only_for_the_kernels_limits():
    """Checks come before dispatch: the validation layer knows the kernels' limits, not their launchers."""
    bad = [f"{m} -> {d}" for m, deps in import_graph().items() if under(m, "kdacupy.validation")
           for d in deps if under(d, "kdacupy.ops") and d != "kdacupy.ops.forward.limits"]
    assert not bad, "\n".join(bad)


def test_entry_points_are_thin():
    for name in ENTRY_POINTS:
        assert import_graph()[name] == {name.replace("kdacupy.", "kdacupy.cli.")}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_functions_are_at_most_120_lines(name):
    tree = parsed(name)
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 120]
    assert not long, f"{MODULES[name]}: {', '.join(long)}"


# the framework faces (docs/design.md section 10) sit on the public API: each may import
# kdacupy's public names (the package itself, and kdacupy.distributed's context parallelism)
# and the faces listed for it, nothing deeper
FRAMEWORK_FACES = {"kdacupy.torch": ("kdacupy.distributed",), "kdacupy.jax": ("kdacupy.distributed",),
                   "kdacupy.compat": ("kdacupy.torch",)}
#: third-party frameworks, and the packages that may import each: its face, the benchmark
#: CLIs, which time FLA itself on torch tensors, and kdacupy.distributed, whose engine for a
#: torch.distributed process group imports torch.distributed (only when given one, as MPI)
FRAMEWORKS = {"torch": ("kdacupy.torch", "kdacupy.cli", "kdacupy.distributed"), "jax": ("kdacupy.jax",),
              "jaxlib": ("kdacupy.jax",), "fla": ("kdacupy.compat", "kdacupy.cli")}


def test_faces_use_only_the_public_api():
    bad = []
    for mod, deps in import_graph().items():
        face = next((f for f in FRAMEWORK_FACES if under(mod, f)), None)
        for d in deps:
            if face is None:
                if any(under(d, f) for f in FRAMEWORK_FACES):
                    bad.append(f"{mod} -> {d} (the core never imports a framework face)")
            elif not (d == "kdacupy" or under(d, face) or any(under(d, f) for f in FRAMEWORK_FACES[face])):
                bad.append(f"{mod} -> {d} (a face imports only kdacupy's public names)")
    assert not bad, "\n".join(bad)


def test_only_its_face_imports_a_framework():
    bad = []
    for name, path in MODULES.items():
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                tops = [a.name.split(".")[0] for a in n.names]
            elif isinstance(n, ast.ImportFrom) and not n.level:
                tops = [(n.module or "").split(".")[0]]
            else:
                continue
            bad += [f"{name} imports {t}" for t in tops if t in FRAMEWORKS and not any(under(name, p) for p in FRAMEWORKS[t])]
    assert not bad, "\n".join(bad)

"""The planted kernel bugs of benchmarks/mutants.yaml hold true of the tree (benchmarks/mutate.py
runs them; this test runs none): enough of them, every kernel covered, each old text exactly once
in its file, each a change of code (not of a comment or of spacing), each named test there."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("kda_mutate", ROOT / "benchmarks" / "mutate.py")
mutate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutate)
MUTANTS = mutate.load()


def test_the_list_has_twenty_mutants_over_every_kernel():
    assert len(MUTANTS) >= 20
    files = {m["file"] for m in MUTANTS}
    kernels = {f"kernels/{p.name}" for p in (ROOT / "kernels").glob("*.cu")}
    assert kernels <= files, sorted(kernels - files)
    assert any(f.endswith(".cuh") for f in files)


def test_every_old_text_occurs_exactly_once_in_its_file():
    bad = [f"{m['name']}: {why}" for m in MUTANTS if (why := mutate.stale(m))]
    assert not bad, "rewrite these against the current kernels:\n" + "\n".join(bad)


def test_every_mutant_changes_code():
    same = [m["name"] for m in MUTANTS if mutate.code_only(m["old"]) == mutate.code_only(m["new"])]
    assert not same


def test_every_named_test_exists():
    missing = []
    for m in MUTANTS:
        for node in m["tests"]:
            path, _, rest = node.partition("::")
            func = re.sub(r"\[.*\]$", "", rest.split("::")[-1])
            text = (ROOT / path).read_text() if (ROOT / path).is_file() else None
            defined = text is not None and (not func or re.search(rf"^\s*def {func}\(", text, re.M))
            if not defined:
                missing.append(f"{m['name']}: {node}")
    assert not missing, missing


def test_stale_and_malformed_mutants_are_named(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.cu").write_text("a = b;\na = b;\n")
    m = dict(name="m", file="kernels/k.cu", old="a = b;", new="a = c;", why="w", tests=["tests/x.py"])
    assert "2 times" in mutate.stale(m, tmp_path)
    assert "0 times" in mutate.stale(dict(m, old="c = d;"), tmp_path)
    assert "does not exist" in mutate.stale(dict(m, file="kernels/none.cu"), tmp_path)
    bad = tmp_path / "bad.yaml"
    for text, msg in [("- {name: m, file: kernels/k.cu, old: x, new: x, why: w, tests: [t]}", "changes"),
                      ("- {name: m, file: kernels/k.cu, old: 'x;  // a', new: 'x;  // b', why: w, tests: [t]}",
                       "only comments"),
                      ("- {name: m, file: kernels/k.cu, old: x, new: y, tests: [t]}", "missing"),
                      ("- {name: m, file: k.cu, old: x, new: y, why: w, tests: [t]}", "not under kernels"),
                      ("- {name: m, file: kernels/k.cu, old: x, new: y, why: w, tests: [t]}\n" * 2, "duplicate")]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=msg):
            mutate.load(bad)


def test_a_run_is_read_as_killed_survived_or_error():
    killed = "F\n=== short test summary info ===\nFAILED tests/a.py::test_b[c] - AssertionError\n1 failed in 2.0s\n"
    assert mutate.outcome(1, killed) == ("killed", "tests/a.py::test_b[c]", "")
    assert mutate.outcome(0, "..s\n2 passed, 1 skipped in 3.1s\n") == ("survived", None, "1 skipped")
    assert mutate.outcome(0, "ss\n2 skipped in 0.1s\n")[0] == "error"  # nothing ran: no verdict
    assert mutate.outcome(4, "ERROR: not found: tests/a.py::nope\n")[0] == "error"
    build = killed.replace("AssertionError", "EmulationError: emulation build failed (g++ ...)")
    assert mutate.outcome(1, build)[0] == "error"

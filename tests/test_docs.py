"""Citations of the design document point at sections it has, and the
repository speaks of the project alone."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SUFFIXES = {".py", ".md", ".cu", ".cuh", ".h", ".sh", ".toml", ".yaml", ".txt", ""}


def repo_files():
    for top in ("kdacupy", "kernels", "tests", "benchmarks", "tuning", "docs", ".ci"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                yield path
    yield ROOT / "README.md"
    yield ROOT / "pyproject.toml"


def headings():
    found = set()
    for line in DESIGN.read_text().splitlines():
        m = re.match(r"#{2,3} (\d+(?:\.\d+)?)\.? ", line)
        if m:
            found.add(m.group(1))
    return found


def test_every_cited_section_exists():
    have, cited = headings(), 0
    assert {"1", "2", "3", "4", "5", "6", "7", "7.2"} <= have
    bad = []
    for path in repo_files():
        for m in re.finditer(r"docs/design\.md\s+section\s+(\d+(?:\.\d+)?)", path.read_text()):
            cited += 1
            if m.group(1) not in have:
                bad.append(f"{path.relative_to(ROOT)}: section {m.group(1)}")
    assert cited >= 8 and not bad, bad


def test_no_citation_of_a_document_the_repository_lacks():
    old = re.compile(r"\bDESIGN(\.md)?\b|\b(METHOD|KINDS)\.md\b")
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in repo_files() if p != Path(__file__).resolve()
           for i, line in enumerate(p.read_text().splitlines(), 1) if old.search(line)]
    assert not bad, bad


def test_the_repository_names_no_development_machine_or_process():
    # absolute paths of a machine's home or work folders, and words of a development process (pytest's
    # `request.session`, an attribute, is code)
    words = re.compile(r"(?<![\w.])/(?:work|home|root|mnt)/\w|(?<!\w)\.library\b|\blent\b|(?<![\w.])sessions?\b"
                       r"|\bdev(?:elopment)? machine\b|device tool")
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in repo_files() if p != Path(__file__).resolve()
           for i, line in enumerate(p.read_text().splitlines(), 1) if words.search(line)]
    assert not bad, bad


def test_help_of_kda_forward_cites_the_design_document():
    import kdacupy
    assert "docs/design.md section 1" in kdacupy.kda_forward.__doc__


def test_paths_the_readme_and_the_docs_name_exist():
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    paths = set(re.findall(r"`((?:kdacupy|kernels|tests|benchmarks|tuning|docs|examples)/[\w/.-]*)`", text))
    assert len(paths) >= 10
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing

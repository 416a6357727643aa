"""The generated cases a long search found failing (tests/generated/found/*.json, kept by
tests/generated/record.py), replayed on every run: each is a regression case."""
import json
from pathlib import Path

import pytest

from . import properties

FOUND = sorted((Path(__file__).resolve().parent / "found").glob("*.json"))


def check_of(name):
    """A check by name: tests/generated/properties.py's, or the faces' (tests/generated/test_faces.py,
    which needs torch)."""
    if hasattr(properties, name):
        return getattr(properties, name)
    pytest.importorskip("torch")
    from . import test_faces
    return getattr(test_faces, name, None)


@pytest.mark.parametrize("path", FOUND, ids=[p.stem for p in FOUND])
def test_a_kept_case_holds(path):
    saved = json.loads(path.read_text())
    check_of(saved["check"])(saved["case"])


def test_the_kept_cases_name_their_checks():
    for path in FOUND:
        saved = json.loads(path.read_text())
        assert callable(check_of(saved["check"])) and isinstance(saved["case"], dict), path

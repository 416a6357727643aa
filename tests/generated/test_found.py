"""The generated cases a long search found failing (tests/generated/found/*.json, kept by
tests/generated/record.py), replayed on every run: each is a regression case."""
import json
from pathlib import Path

import pytest

from . import properties

FOUND = sorted((Path(__file__).resolve().parent / "found").glob("*.json"))


@pytest.mark.parametrize("path", FOUND, ids=[p.stem for p in FOUND])
def test_a_kept_case_holds(path):
    saved = json.loads(path.read_text())
    getattr(properties, saved["check"])(saved["case"])


def test_the_kept_cases_name_their_checks():
    for path in FOUND:
        saved = json.loads(path.read_text())
        assert callable(getattr(properties, saved["check"], None)) and isinstance(saved["case"], dict), path

"""Failing generated cases kept as regression cases (tests/generated/found/, replayed by
tests/generated/test_found.py): in the ``search`` profile only, the case of each failing call is
written; Hypothesis's last call is its shrunk example, so that is what stays."""
from __future__ import annotations

import json
from pathlib import Path

from hypothesis import settings

FOUND = Path(__file__).resolve().parent / "found"


def examples(n: int) -> int:
    """``n`` examples in CI; the search profile's budget scaled alike."""
    return n if settings.get_current_profile_name() != "search" else max(n, settings.default.max_examples * n // 12)


def checked(name, check, case):
    try:
        check(case)
    except Exception:  # noqa: BLE001  (a crash or a refusal of a valid case is a finding too)
        if settings.get_current_profile_name() == "search":
            FOUND.mkdir(exist_ok=True)
            (FOUND / f"{name}.json").write_text(json.dumps(dict(check=check.__name__, case=case), indent=1) + "\n")
        raise

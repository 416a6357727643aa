"""Hypothesis's profiles for the generated cases (tests/generated/cases.py):

- ``ci`` (the default): a fixed number of examples per property, derandomized (the same examples
  on every run, so CI is deterministic and its time is known), no example database;
- ``search``: a long randomized search (``--hypothesis-profile=search``); a failing case, once
  Hypothesis has shrunk it, is kept under tests/generated/found/ as JSON, and every run replays
  the kept cases (tests/generated/test_found.py): commit them with the fix.

    .venv/bin/python -m pytest tests/generated -p no:randomly --hypothesis-profile=search
"""
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=12, derandomize=True, database=None, **_COMMON)
settings.register_profile("search", max_examples=1000, **_COMMON)
settings.load_profile("ci")

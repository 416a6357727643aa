"""The default run's sample of a test matrix; the other points are marked ``sweep``.

The suite's cold run (every kernel variant compiled anew) has to stay within a few minutes on two
cores, and most of it is builds: each emulated or NVRTC variant costs one to three seconds before
its first test. So a matrix whose points each build their own variant runs a sample by default,
one that still takes every value of every axis at least once, and the rest of its points carry the
``sweep`` marker: deselected unless ``pytest --sweeps`` (CI runs ``pytest -m sweep --sweeps`` after
the default suite, so every point runs before a change lands). A whole test may carry the marker too
(``@pytest.mark.sweep``) where it checks on a larger case what a default test checks on a smaller one;
its comment names that test.
"""
from __future__ import annotations

from typing import Callable, Iterable

import pytest
from _pytest.mark.structures import ParameterSet

SWEEP = pytest.mark.sweep


def sample(params: Iterable, keep: Callable[..., bool], ids: Callable | None = None, cover: bool = True) -> list:
    """``params`` as pytest params, those for which ``keep(*values)`` is false marked ``sweep``;
    ``ids`` names each from its values, as parametrize's ``ids`` would. A plain value is one
    argument, a tuple several; a pytest.param keeps its own id and marks. ``cover``: the kept points
    must take every value each argument takes in the matrix (ValueError naming the first missed)."""
    out = []
    for p in params:
        if isinstance(p, ParameterSet):
            values, marks, pid = p.values, list(p.marks), p.id
        else:
            values, marks, pid = (p if isinstance(p, tuple) else (p,)), [], None
        if pid is None and ids is not None:
            pid = ids(*values)
        if not keep(*values):
            marks.append(SWEEP)
        out.append(pytest.param(*values, marks=marks, id=pid))
    if cover:
        every, taken = _values(p.values for p in out), _values(kept(out))
        taken += [set()] * (len(every) - len(taken))  # (nothing kept: every value missed)
        for i, (a, b) in enumerate(zip(every, taken)):
            if a - b:
                raise ValueError(f"the sample leaves out argument {i}'s value(s) {sorted(a - b)}")
    return out


def _values(rows) -> list[set]:
    """Per argument position, the reprs of the values it takes over ``rows``."""
    cols: list[set] = []
    for row in rows:
        for i, v in enumerate(row):
            if i == len(cols):
                cols.append(set())
            cols[i].add(repr(v))
    return cols


def kept(params: list) -> list:
    """The values of the points of ``sample``'s output that the default run keeps."""
    return [p.values for p in params if not any(m.name == "sweep" for m in p.marks)]

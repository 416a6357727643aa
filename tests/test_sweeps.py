"""The default run's sample of a matrix (tests/sweeps.py) and the --sweeps option (tests/conftest.py)."""
from pathlib import Path

import pytest

from .sweeps import kept, sample

ROOT = Path(__file__).resolve().parent.parent


def test_the_points_left_out_carry_the_marker_and_keep_their_ids():
    grid = [(d, n) for d in ("bf16", "fp32") for n in (64, 128)] + [pytest.param("fp16", 32, id="odd")]
    params = sample(grid, lambda d, n: (d, n) in {("bf16", 64), ("fp32", 128), ("fp16", 32)})
    assert [p.id for p in params] == [None, None, None, None, "odd"]
    assert kept(params) == [("bf16", 64), ("fp32", 128), ("fp16", 32)]
    swept = [p.values for p in params if any(m.name == "sweep" for m in p.marks)]
    assert swept == [("bf16", 128), ("fp32", 64)]
    assert [p.values for p in sample([1, 2], lambda v: True)] == [(1,), (2,)]  # plain values: one argument


def test_a_sample_must_take_every_value_of_every_argument():
    grid = [(d, n) for d in ("bf16", "fp32") for n in (64, 128)]
    with pytest.raises(ValueError, match=r"argument 1's value\(s\) \['128'\]"):
        sample(grid, lambda d, n: n == 64)
    with pytest.raises(ValueError, match="argument 0"):
        sample(grid, lambda d, n: False)
    assert len(kept(sample(grid, lambda d, n: n == 64, cover=False))) == 2


class _Collected:
    def __init__(self):
        self.ids = []

    @pytest.hookimpl(trylast=True)  # after the conftest's deselection
    def pytest_collection_modifyitems(self, items):
        self.ids = [item.nodeid for item in items]


def collected(*args):
    """The ids a run of tests/test_sweeps.py with ``args`` selects (a collection in this process: the repository's
    conftest, its --sweeps option and its deselection, as a run from the command line has them)."""
    got = _Collected()
    rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
                      str(ROOT / "tests" / "test_sweeps.py"), *args], plugins=[got])
    assert rc == 0
    return got.ids


def test_the_default_run_deselects_the_sweep_and_the_option_brings_it_back():
    default, everything, only = collected(), collected("--sweeps"), collected("-m", "sweep", "--sweeps")
    assert only == [t for t in everything if t not in default] and only
    assert all("test_a_point_of_the_sweep" in t for t in only)
    assert sorted(default + only) == sorted(everything)


@pytest.mark.parametrize("n", sample([1, 2, 3], lambda n: n == 1, cover=False))
def test_a_point_of_the_sweep(n):
    """The matrix the collection test above selects from: n = 1 by default, 2 and 3 with --sweeps."""
    assert n in (1, 2, 3)

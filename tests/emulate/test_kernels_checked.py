"""Every emulated kernel again, with every check on (KDACUPY_EMULATE_CHECK=all): each run must
raise nothing and give results bit-identical to the unchecked run, also in the stress modes
(cp.async landing at issue, threads in reverse order) on a subset of the cases.

Covered through the public calls: the forward over the whole case matrix (and the rest of
test_kernels_emulate.py, re-collected here under the autouse fixture), ``kda_decode`` on one
case per kernel path, each twice (the second call takes the cached fast path, which passes the
pointers itself), the forward through a state pool, the split forward (maps and the scan
kernel), each also in the stress modes, and a long case (2007 tokens: the stress modes'
reordering is per barrier interval, which a long case repeats, not changes). Bit-identity to the
unchecked run is the stronger form of the emulated-vs-model parity, so that parity test is not re-run
under the checks. Each checked build costs ~2 s of the cold run, so the default run takes a sample of
the cases, tiles and decode paths (below); the rest is a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy

from ..cases import CASES, case_inputs
from ..decode_cases import DECODE_CASES, decode_case
from ..inputs import make_inputs
from ..sweeps import sample
from . import test_kernels_emulate
from .test_kernels_emulate import *  # noqa: F401,F403  (the suite, re-collected under the checks)

# implied by test_checked_results_are_bit_identical below with the unchecked suite's parity test;
# the accuracy test's kernels are those of the case matrix (a numerics test, not a memory one)
del test_emulated_kernels_match_the_model, test_emulation_accuracy_against_the_reference  # noqa: F821
assert hasattr(test_kernels_emulate, "test_emulated_kernels_match_the_model")


# The tile test re-collected under the checks: BV = 32 at 3 stages (test_forward_rings.py's racecheck ring
# build) and the widest, BV = 128, by default; BV = 16 and 64 are a sweep
# (cover=False: the axis is the tiles themselves, every one of which the unchecked suite runs).
_every_tile = test_kernels_emulate.test_every_tile_configuration_computes_the_same
TILES = next(m.args[1] for m in _every_tile.pytestmark if m.name == "parametrize")


@pytest.mark.parametrize("tiles", sample(TILES, lambda t: t.BV in (32, 128), cover=False))
def test_every_tile_configuration_computes_the_same(tiles, monkeypatch):
    _every_tile(tiles, monkeypatch)


@pytest.fixture(autouse=True)
def every_check(monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    monkeypatch.delenv("KDACUPY_EMULATE_CP_ASYNC", raising=False)
    monkeypatch.delenv("KDACUPY_EMULATE_ORDER", raising=False)


def checked_and_plain(run, monkeypatch, **stress):
    """``run()`` under every check (and the stress modes given), then unchecked; both results."""
    for k, v in stress.items():
        monkeypatch.setenv(k, v)
    checked = run()
    for k in stress:
        monkeypatch.delenv(k)
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "")
    plain = run()
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    return checked, plain


def identical(a, b):
    for x, y in zip(a, b):
        if x is None or y is None:
            assert x is None and y is None
        else:
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


def forward(name, precision, **kw):
    x, opts = case_inputs(name, precision)
    return lambda: kdacupy.kda_forward(**x, **opts, backend="emulate", **kw)


STRESS = {"eager": {"KDACUPY_EMULATE_CP_ASYNC": "eager"}, "reverse": {"KDACUPY_EMULATE_ORDER": "reverse"}}
STRESS_CASES = ["fixed-gva-sigmoid", "varlen-ragged-zero-vk-bf16", "fp32-inputs", "V256"]


# The checks look at memory, so the checked matrix takes each memory pattern once. The bf16 state on
# every case but two whose accesses other cases already make: fp16-inputs (bf16's 2-byte elements, K = 128
# in softplus-raw-beta, no initial state in log-gate-no-beta) and no-l2norm-neg-eigval (options that change
# arithmetic only, at fixed-gva-sigmoid's K = V = 64). The fp32 state (its own loads and stores) on the
# stress cases, which span both layouts, varlen, fp32 inputs and V = 256. Each checked build costs ~1.7 s
# of the cold run; the unchecked parity suite runs every case in both precisions.
SAME_ACCESSES = {"fp16-inputs", "no-l2norm-neg-eigval"}
CHECKED_CASES = ([(name, "bf16") for name in CASES if name not in SAME_ACCESSES]
                 + [(name, "fp32") for name in STRESS_CASES])
assert SAME_ACCESSES <= set(CASES)
# The default run: both layouts and varlen at the bf16 state, the fp32 state on varlen, K = V = 128 (the Kimi
# dims), V = 256, fp32 g and beta with no initial state; the rest (fp32 inputs' two checked builds among them)
# is a sweep (cover=False: not every case is checked by default, each runs unchecked in test_kernels_emulate.py).
CHECKED_SAMPLE = {("fixed-gva-sigmoid", "bf16"), ("varlen-ragged-zero-vk-bf16", "bf16"),
                  ("varlen-ragged-zero-vk-bf16", "fp32"), ("softplus-raw-beta", "bf16"), ("V256", "bf16"),
                  ("g-and-beta-fp32", "bf16")}


@pytest.mark.parametrize("name, precision", sample(CHECKED_CASES, lambda n, p: (n, p) in CHECKED_SAMPLE, cover=False))
def test_checked_results_are_bit_identical(name, precision, monkeypatch):
    identical(*checked_and_plain(forward(name, precision), monkeypatch))


# the default run: the stress cases whose bf16 build the sample above makes, in both modes
# (cover=False: fp32-inputs' checked build is a sweep)
@pytest.mark.parametrize("name, stress", sample([(n, s) for n in STRESS_CASES for s in STRESS],
                                                lambda n, s: (n, "bf16") in CHECKED_SAMPLE, cover=False))
def test_checked_stress_modes_are_bit_identical(name, stress, monkeypatch):
    identical(*checked_and_plain(forward(name, "bf16"), monkeypatch, **STRESS[stress]))


def decode_twice(name):
    """Two kda_decode calls on one pool copy: the first validates, the second takes the fast path;
    returns both outputs and the pool."""
    from kdacupy.ops.decode import fastpath
    x, opts, pool = decode_case(name)

    def run():
        fastpath.clear()
        p = pool.copy()
        o1 = kdacupy.kda_decode(**x, state_pool=p, **opts, backend="emulate")
        hits = len(fastpath._cache)
        o2 = kdacupy.kda_decode(**x, state_pool=p, **opts, backend="emulate")
        assert hits == 1 and len(fastpath._cache) == 1  # the second call was the cached one
        return o1, o2, p
    return run


#: the decode kernel's paths at one checked build each: [N, T] indices with accepted counts
#: (bf16 "vk" and fp32 "kv" pools, GVA), [N] indices with no beta and a log gate, K = V = 128
DECODE_CHECKED = ["vk-bf16-pool-verify", "kv-fp32-pool-verify", "log-gate-no-beta", "softplus-raw-beta-128"]
assert set(DECODE_CHECKED) <= set(DECODE_CASES)


# the default run: both pools and layouts, [N, T] and [N] indices, K = V = 128; log-gate-no-beta is a sweep
# (cover=False: the axis is the list of paths itself)
@pytest.mark.parametrize("name", sample(DECODE_CHECKED, lambda n: n != "log-gate-no-beta", cover=False))
def test_checked_decode_through_the_public_call_and_its_fast_path(name, monkeypatch):
    identical(*checked_and_plain(decode_twice(name), monkeypatch))


@pytest.mark.parametrize("stress", list(STRESS))
def test_checked_decode_stress_modes(stress, monkeypatch):
    identical(*checked_and_plain(decode_twice("vk-bf16-pool-verify"), monkeypatch, **STRESS[stress]))


def test_checked_decode_with_padding_and_out(monkeypatch):
    """Negative slots (padding and skipped stores) and a strided out under the checks (the
    variant of "vk-bf16-pool-verify": N = 2, T = 3)."""
    x, opts, pool = decode_case("vk-bf16-pool-verify")
    opts = dict(opts, state_indices=np.array([[0, -1, 2], [-1, 3, 4]]), num_accepted_tokens=None)
    out = np.zeros((2, 6) + x["v"].shape[2:], x["v"].dtype)[:, ::2]

    def run():
        p = pool.copy()
        o = kdacupy.kda_decode(**x, state_pool=p, **opts, out=out, backend="emulate")
        return o.copy(), p
    identical(*checked_and_plain(run, monkeypatch))


@pytest.mark.parametrize("layout, stress", [("vk", None), ("kv", None), ("vk", "eager"), ("kv", "reverse")])
def test_checked_forward_through_a_pool(layout, stress, monkeypatch):
    x, opts = make_inputs(cu_seqlens=[5, 0, 21, 17], H=1, HV=2, K=64, V=64)
    pool = (0.5 * np.random.default_rng(7).standard_normal((6, 2, 64, 64))).astype(np.float32)
    idx = np.array([4, 1, -1, 0], np.int32)

    def run():
        p = pool.copy()
        o, _ = kdacupy.kda_forward(**x, **opts, state_layout=layout, state_pool=p, state_indices=idx,
                                   backend="emulate")
        return o, p
    identical(*checked_and_plain(run, monkeypatch, **STRESS.get(stress, {})))


@pytest.mark.parametrize("stress", [None, "eager", "reverse"])
def test_checked_split_forward_maps_and_scan(stress, monkeypatch):
    """sequence_parallel: the merged maps' launch (its work list, v's rows from the B part on, the
    initial state folded into the first B map), the scan kernel and the final varlen forward."""
    x, opts = case_inputs("varlen-ragged-zero-vk-bf16", "bf16")
    identical(*checked_and_plain(lambda: kdacupy.kda_forward(**x, **opts, backend="emulate", sequence_parallel=3),
                                 monkeypatch, **STRESS.get(stress, {})))


def test_checked_long_case(monkeypatch):
    """A long sequence (many chunks: the cp.async ring wraps many times, workspace slots in the
    hundreds) next to a short one, under the checks."""
    x, opts = make_inputs(cu_seqlens=[2000, 7], H=1, K=64, V=64, state=np.float32)
    identical(*checked_and_plain(lambda: kdacupy.kda_forward(**x, **opts, output_final_state=True,
                                                             backend="emulate"), monkeypatch))

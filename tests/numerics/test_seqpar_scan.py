"""The sequence-parallel scan (kernels/kda_seqpar_scan.cu, docs/design.md section 7.2) bit for
bit against its precision model (kdacupy/numerics/scan_model.py), on random maps and on an
input whose every row's answer depends on the summation order.

The order-exposing maps: each row k of M holds +2^25 at key b TI - 1 and -2^25 at key b TI (the
last key of one staged block of TI keys and the first of the next; b = 1 + k mod (K / TI - 1),
so every pair of adjacent blocks meets in some row), every other key 1, against a state of ones.
In the kernel's order (keys ascending from B = 0) the b TI - 1 ones before +2^25 add exactly,
2^25 + b TI - 1 rounds to 2^25 + b TI (fp32's unit there is 4), -2^25 cancels to b TI and the
K - b TI - 1 ones after add exactly: K - 1 in every element. In any other order of the blocks,
some row meets -2^25 first; below 2^25 fp32's unit is 2, so each later 1 is a tie that rounds
back to even, and at least the 30 ones of those two blocks are lost.

The scan's variants differ in K and V alone (not in the layout or S0's dtype): the default run takes the
order-exposing maps at every layout and S0 dtype at K = 64 and one point at K = 128, and the double
buffer at K = 128 under racecheck and at K = 256 under eager copies; the rest is a sweep (tests/sweeps.py).
"""
import functools
import itertools

import numpy as np
import pytest

from kdacupy.numerics.backward_arith import fma32
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.scan_model import scan_model
from kdacupy.ops.seqpar import split

from ..sweeps import sample


TI = split.scan_ti  # keys of M per staged block, per K
BIG = np.float32(2.0 ** 25)


def order_maps(K):
    """[K, K]: row k's +-2^25 pair across the boundary of blocks b - 1 and b, ones elsewhere."""
    M = np.ones((K, K), np.float32)
    for k in range(K):
        b = 1 + k % (K // TI(K) - 1)
        M[k, b * TI(K) - 1], M[k, b * TI(K)] = BIG, -BIG
    return M


def chain_in_block_order(M, blocks):
    """Per row, the fmaf chain of M's row . ones from 0 over the key blocks in the order ``blocks``."""
    acc = np.zeros(M.shape[0])
    ti = TI(M.shape[1])
    for blk in blocks:
        for i in range(blk * ti, (blk + 1) * ti):
            acc = fma32(M[:, i], 1.0, acc)
    return acc


def order_case(K, V, N=2, HV=2):
    """Four segments per sequence: maps (order_maps, 0), (0, ones), (order_maps, 0); S0 ones.
    The starts: S0, K - 1 (zero with no initial state), 1, K - 1."""
    n = 4
    M = np.zeros((N, n, HV, K, K), np.float32)
    B = np.zeros((N, n, HV, K, V), np.float32)
    M[:, 0] = M[:, 2] = order_maps(K)
    B[:, 1] = 1
    return M.reshape(N * n, HV, K, K), B.reshape(N * n, HV, K, V), np.ones((N, HV, K, V), np.float32), n


def random_case(K, V, N=2, n=3, HV=2, seed=1):
    rng = np.random.default_rng(seed)
    M = (np.eye(K) + 0.1 * rng.standard_normal((N * n, HV, K, K))).astype(np.float32)
    B = rng.standard_normal((N * n, HV, K, V)).astype(np.float32)
    S0 = rng.standard_normal((N, HV, K, V)).astype(np.float32)
    return M, B, S0, n


def layout(S, state_layout):
    return S if state_layout == "kv" else np.ascontiguousarray(S.swapaxes(-1, -2))


def run_kernel(M, B, S0, n, state_layout, s0_dtype):
    """The scan kernel's starts (fp32, kv) from S0 given in ``s0_dtype`` (None: no initial state),
    and the fp32 values of the S0 it was given."""
    from kdacupy.jit.loaders import loader
    if s0_dtype is None:
        s0, S0 = None, np.zeros_like(S0)
    else:
        S0 = S0.astype(s0_dtype).astype(np.float32)
        s0 = layout(S0, state_layout).astype(s0_dtype)
    got = split.scan_kernel(loader("emulate"), M, B, s0, None if s0 is None else s0.dtype, state_layout, n)
    assert got.dtype == np.float32
    return layout(got, state_layout), S0


@pytest.mark.parametrize("K", [64, 128, 256])
def test_order_maps_tell_the_kernel_order_from_any_other_block_order(K):
    """The model's answer is K - 1 in every element; the same chain over the blocks in any
    other order (reversed, rotated, two swapped) gives less in some row."""
    M, B, S0, n = order_case(K, 16, N=1, HV=1)
    S = scan_model(M, B, S0, n)
    np.testing.assert_array_equal(S[[1, 3]], np.float32(K - 1))
    np.testing.assert_array_equal(S[2], np.float32(1))
    nb = K // TI(K)
    rows = order_maps(K)
    np.testing.assert_array_equal(chain_in_block_order(rows, range(nb)), K - 1)
    for blocks in [list(reversed(range(nb))), list(range(1, nb)) + [0], [1, 0] + list(range(2, nb))]:
        worst = chain_in_block_order(rows, blocks).min()
        assert worst <= K - 2 * TI(K), (blocks, worst)


def test_model_is_the_scan():
    """The model against the float64 scan (split.scan): the same recurrence, rounded in fp32."""
    M, B, S0, n = random_case(64, 32)
    want = split.scan(M.astype(np.float64), B.astype(np.float64), S0.astype(np.float64), n)
    got = scan_model(M, B, S0, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_array_equal(got.reshape((2, n) + got.shape[1:])[:, 0], S0)


@pytest.mark.emulate  # skipped, with the reason, without a host compiler (tests/conftest.py)
@pytest.mark.parametrize("K, V, state_layout, s0_dtype", [
    (64, 64, "kv", np.float32), (64, 64, "vk", np.float32), (128, 64, "vk", BF16), (64, 128, "kv", None),
    (60, 100, "vk", np.float32), (17, 33, "kv", BF16)])  # any head size: the tiles' any-size variants
def test_scan_kernel_is_the_fp32_scan(K, V, state_layout, s0_dtype):
    """Random maps near I: every start bit for bit the model's (fp32 FMA chains in key order)."""
    M, B, S0, n = random_case(K, V)
    got, S0 = run_kernel(M, B, S0, n, state_layout, s0_dtype)
    np.testing.assert_array_equal(got, scan_model(M, B, S0, n))
    np.testing.assert_array_equal(got.reshape((2, n) + got.shape[1:])[:, 0], S0)


@functools.lru_cache(maxsize=None)
def order_model(K, V, with_s0):
    M, B, S0, n = order_case(K, V)
    return scan_model(M, B, S0 if with_s0 else np.zeros_like(S0), n)


@pytest.mark.emulate  # skipped, with the reason, without a host compiler (tests/conftest.py)
# the default run: every layout and S0 dtype at K = 64 (one build), the vk layout from a bf16 S0 at K = 128
@pytest.mark.parametrize("state_layout, s0_dtype, K", sample(
    [(lay, s0, K) for K in (64, 128) for lay, s0 in itertools.product(["kv", "vk"], [np.float32, BF16, None])],
    lambda lay, s0, K: K == 64 or (lay, s0) == ("vk", BF16),
    ids=lambda lay, s0, K: f"{lay}-{'None' if s0 is None else np.dtype(s0).name}-{K}"))
def test_scan_kernel_keeps_the_key_order(K, state_layout, s0_dtype):
    """The order-exposing maps: K - 1 in every element of the product starts (0 for the first
    without an initial state), as the model has it; a reordered sum loses 30 or more."""
    M, B, S0, n = order_case(K, 64)
    got, S0 = run_kernel(M, B, S0, n, state_layout, s0_dtype)
    np.testing.assert_array_equal(got, order_model(K, 64, s0_dtype is not None))
    got = got.reshape((2, n) + got.shape[1:])
    np.testing.assert_array_equal(got[:, 1], np.float32(0 if s0_dtype is None else K - 1))
    np.testing.assert_array_equal(got[:, 2], np.float32(1))
    np.testing.assert_array_equal(got[:, 3], np.float32(K - 1))


@pytest.mark.emulate  # skipped, with the reason, without a host compiler (tests/conftest.py)
# staged blocks of 16 and 8 keys; the default run: K = 128 under racecheck, K = 256 under eager copies
@pytest.mark.parametrize("K, mode", sample([(K, m) for m in ("racecheck", "eager") for K in (128, 256)],
                                           lambda K, m: (K == 128) == (m == "racecheck")))
def test_scan_kernel_double_buffers_m_under_checks(K, mode, monkeypatch):
    """The next block of M is in flight (cp.async, two buffers) while this one is read: under racecheck
    (a buffer read before its copies' wait, or refilled before every thread read it, is an error) and
    under eager copies, every start is the model's, bit for bit, over 3 segments (two steps of M)."""
    for k in ("KDACUPY_EMULATE_CHECK", "KDACUPY_EMULATE_CP_ASYNC", "KDACUPY_EMULATE_ORDER"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(*{"racecheck": ("KDACUPY_EMULATE_CHECK", "all"), "eager": ("KDACUPY_EMULATE_CP_ASYNC", "eager")}[mode])
    M, B, S0, n = random_case(K, 64, N=1, HV=1)  # the tiles' sizes: the variant that copies M ahead
    got, S0 = run_kernel(M, B, S0, n, "kv", np.float32)
    np.testing.assert_array_equal(got, scan_model(M, B, S0, n))


@pytest.mark.emulate  # skipped, with the reason, without a host compiler (tests/conftest.py)
@pytest.mark.parametrize("K, V", [(64, 64), (128, 128)])
def test_the_split_scan_reads_maps_side_by_side_and_skips_the_first_product(K, V):
    """The split's scan: M and B as views of the merged maps' [K, K + V] state (rows K + V floats
    apart) and ``m_from = 1`` (its M_0 S_0 is zero: the first start is B_0). Bit for bit the model's
    scan with M_0 zero; M_0 itself, poisoned with NaN, is never read."""
    from kdacupy.jit.loaders import loader
    M, B, S0, n = random_case(K, V, n=4)
    merged = np.concatenate([M, B], axis=-1)
    merged.reshape((2, n) + merged.shape[1:])[:, 0, :, :, :K] = np.nan
    got = split.scan_kernel(loader("emulate"), merged[..., :K], merged[..., K:], S0, S0.dtype, "kv", n, m_from=1)
    M.reshape((2, n) + M.shape[1:])[:, 0] = 0
    np.testing.assert_array_equal(got, scan_model(M, B, S0, n))
    np.testing.assert_array_equal(got.reshape((2, n) + got.shape[1:])[:, 1], B.reshape((2, n) + B.shape[1:])[:, 0])

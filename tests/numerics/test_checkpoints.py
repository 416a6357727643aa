"""Checkpoints of ``kda_forward`` on the NumPy backends (docs/design.md section 7.1): the state at
every boundary of each sequence (counted from its own start under cu_seqlens) equals the same
forward stopped there (to the bit on the model), into a dense buffer, into rows, into the state
pool itself; and one test per validation error (nothing written)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.dtypes import BF16

from ..checkpoint_cases import expected_boundaries, stopped, varlen_case
from ..inputs import make_inputs

F32 = np.float32
LENGTHS = (70, 32, 0, 64)


@pytest.mark.parametrize("backend", ["model", "reference"])
@pytest.mark.parametrize("every,dtype,precision", [(32, F32, "bf16"), (16, BF16, "fp32")])
def test_each_checkpoint_is_the_forward_stopped_there(backend, every, dtype, precision):
    """Varlen: a boundary is counted from each sequence's start; the empty sequence and boundaries
    past a sequence's end (or past J) write nothing."""
    x, opts = varlen_case(LENGTHS)
    J = 3
    ck = np.full((4, J, 2, 64, 64), np.nan, dtype)
    o, fin = kdacupy.kda_forward(**x, **opts, output_final_state=True, checkpoint_every=every, checkpoints=ck,
                                 state_precision=precision, backend=backend)
    plain = kdacupy.kda_forward(**x, **opts, output_final_state=True, state_precision=precision, backend=backend)
    np.testing.assert_array_equal(o, plain[0])  # checkpoints change nothing else
    np.testing.assert_array_equal(fin, plain[1])
    want = expected_boundaries(LENGTHS, every, J)
    for n in range(4):
        for j in range(1, J + 1):
            got = ck[n, j - 1].astype(F32)
            if (n, j) not in want:
                assert np.isnan(got).all(), (n, j)
                continue
            ref = stopped(x, opts, n, j * every, backend, dtype, precision).astype(F32)
            if backend == "model":
                np.testing.assert_array_equal(got, ref)
            else:  # float64 chunked at gcd(64, every) against 64: the same state to float64 rounding
                np.testing.assert_allclose(got, ref, rtol=1e-6 if dtype == F32 else 2 ** -8, atol=1e-7)


@pytest.mark.parametrize("backend", ["model", "reference"])
def test_rows_of_the_state_pool_itself(backend):
    """Prefix caching into pool slots: boundaries to rows of state_pool (the pool read and written
    at the state_indices slots), the boundaries of sequence 1 beyond J dropped, -1 skipped."""
    x, opts = make_inputs(B=2, T=64, H=1, HV=1, K=64, V=64, seed=3)
    opts["qk_l2norm"] = True
    pool = (0.5 * np.random.default_rng(4).standard_normal((8, 1, 64, 64))).astype(F32)
    before = pool.copy()
    slots = np.array([1, 2], np.int32)
    rows = np.array([[5, -1], [6, 7]], np.int64)  # boundaries at 32 and 64 tokens
    kdacupy.kda_forward(**x, **opts, state_pool=pool, state_indices=slots, checkpoint_every=32,
                        checkpoints=pool, checkpoint_indices=rows, backend=backend)
    # by hand: each checkpoint row is the pool slot's state after 32 (rows 5, 6) or 64 (row 7) tokens
    for n, row, end in ((0, 5, 32), (1, 6, 32), (1, 7, 64)):
        seq = {k: v[n:n + 1, :end] for k, v in x.items()}
        p = before.copy()
        kdacupy.kda_forward(**seq, **opts, state_pool=p, state_indices=slots[n:n + 1], backend=backend)
        np.testing.assert_array_equal(pool[row], p[slots[n]])
        if end == 64:
            np.testing.assert_array_equal(pool[slots[n]], p[slots[n]])  # the final state, as without checkpoints
    np.testing.assert_array_equal(pool[[0, 3, 4]], before[[0, 3, 4]])

def bad(match, exc=ValueError, **change):
    """The checkpointed call with ``change`` raises ``match``; nothing is written."""
    x, opts = make_inputs(B=2, T=32, H=1, HV=1, K=64, V=64)
    args = dict(x, **opts, checkpoint_every=16, checkpoints=np.full((2, 2, 1, 64, 64), 3.0, F32))
    args.update(change)
    before = {n: np.array(args[n], copy=True) for n in ("checkpoints", "state_pool")
              if isinstance(args.get(n), np.ndarray)}
    with pytest.raises(exc, match=match):
        kdacupy.kda_forward(**args, backend="model")
    for n, b in before.items():
        np.testing.assert_array_equal(args[n], b)


def test_validation_errors():
    ck = np.zeros((2, 2, 1, 64, 64), F32)
    bad("checkpoint_every: expected a positive multiple of 16", checkpoint_every=24)
    bad("checkpoint_every: expected a positive multiple of 16", checkpoint_every=0)
    bad("checkpoint_every: expected a positive multiple of 16", TypeError, checkpoint_every=32.0)
    bad("checkpoint_every: expected a positive multiple of 16", TypeError, checkpoint_every=None)
    bad(r"checkpoint_every: expected a positive multiple of 16 below 2\^31", checkpoint_every=2**35)  # int32 launch
    bad("checkpoint_every: expected None without checkpoints", checkpoints=None)
    bad("checkpoint_indices: expected None without checkpoints", checkpoints=None, checkpoint_every=None,
        checkpoint_indices=np.zeros((2, 1), np.int32))
    bad(r"checkpoints: expected shape \(N = 2, J >= 1, 1, 64, 64\)", checkpoints=np.zeros((3, 2, 1, 64, 64), F32))
    bad(r"checkpoints: expected shape \(N = 2, J >= 1, 1, 64, 64\)", checkpoints=np.zeros((2, 2, 1, 64, 32), F32))
    bad(r"checkpoints: expected shape \(R >= 1, 1, 64, 64\)", checkpoints=ck,
        checkpoint_indices=np.zeros((2, 2), np.int32))
    bad("checkpoints: expected dtype", TypeError, checkpoints=ck.astype(np.float16))
    bad("checkpoints: expected a C-contiguous", checkpoints=np.zeros((2, 2, 1, 64, 64), F32).swapaxes(3, 4))
    ro = np.zeros((2, 2, 1, 64, 64), F32)
    ro.flags.writeable = False
    bad("checkpoints: expected a writeable", checkpoints=ro)
    rows = np.zeros((4, 1, 64, 64), F32)
    bad(r"checkpoint_indices: expected rows < R = 4", checkpoints=rows, checkpoint_indices=np.array([[0, 4], [1, 2]]))
    bad("checkpoint_indices: expected distinct rows", checkpoints=rows, checkpoint_indices=np.array([[0, 1], [1, 2]]))
    bad("checkpoint_indices: expected shape", checkpoints=rows, checkpoint_indices=np.array([0, 1]))
    bad("checkpoint_indices: expected dtype int32 or int64", TypeError, checkpoints=rows,
        checkpoint_indices=np.zeros((2, 2), np.float32))
    pool = np.zeros((6, 1, 64, 64), F32)
    bad("checkpoint_indices: expected rows apart from the state_indices slots", state_pool=pool,
        state_indices=np.array([1, 2], np.int32), checkpoints=pool, checkpoint_indices=np.array([[3, 2], [4, 5]]))
    bad("checkpoints: expected memory separate from state_pool", state_pool=pool,
        state_indices=np.array([1, 2], np.int32), checkpoints=pool[2:], checkpoint_indices=np.array([[0, 1], [2, 3]]))
    bad("sequence_parallel: expected None or 1 with checkpoints", sequence_parallel=2)

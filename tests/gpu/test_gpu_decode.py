"""The decode kernel and the pool-reading forward on a GPU: parity with the
decode precision model (tolerance ``kdacupy.numerics.parity.GPU``), padding, and a
decode step captured into a CUDA graph and replayed with new tokens and slots.
The step comparison is tests/decode_checks.py's, which the emulated suite runs on
the CPU. Skipped without a GPU."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.parity import GPU, mismatch

from ..decode_cases import DECODE_CASES, decode_case, written_slots
from ..decode_checks import check_decode_step
from ..decode_inputs import make_decode

cp = pytest.importorskip("cupy", reason="CuPy is not installed")


def dev(d):
    return {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in d.items()}


def agree(x, ref):
    why = mismatch(x, ref, GPU)
    assert why is None, why


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_kernel_matches_the_model(name):
    for size in ({}, dict(N=37)):
        if size and "indices" in DECODE_CASES[name]:
            size = dict(N=37, accepted=list(np.arange(37) % DECODE_CASES[name]["T"] + 1))
        x, opts, pool = decode_case(name, **size)
        pd = cp.asarray(pool)
        o = kdacupy.kda_decode(**dev(x), state_pool=pd, **dev(opts))
        check_decode_step(cp.asnumpy(o), cp.asnumpy(pd), pool, x, opts, written_slots(name, x["q"].shape[0]), [],
                          GPU)


def test_padding_and_device_indices_out_of_range():
    """Rows 0 (-1) and 2 (99: device indices are not validated, >= P is padding) give zeros
    and touch nothing; rows 1 and 3 match the model from slots 5 and 0 and write them back;
    slots 1-4 stay bitwise (tests/decode_checks.py; the CPU twin is test_decode_emulate.py's
    test_device_style_out_of_range_indices_are_padding)."""
    x, opts, pool = make_decode(N=4, T=1, H=2, HV=4, K=128, V=128, P=6, pool_dtype=BF16)
    idx = cp.asarray(np.array([-1, 5, 99, 0], np.int32))
    pd = cp.asarray(pool)
    out = cp.full(x["v"].shape, np.nan, dtype=x["v"].dtype)
    kdacupy.kda_decode(**dev(x), state_pool=pd, **dev(dict(opts, state_indices=idx)), out=out)
    host = dict(opts, state_indices=np.array([-1, 5, -1, 0], np.int32))  # what 99 means
    check_decode_step(cp.asnumpy(out), cp.asnumpy(pd), pool, x, host, {5, 0}, [0, 2], GPU)


def test_null_slot_and_device_cu_seqlens():
    """vLLM's way: slot 0 (the null block) and -1 pad with null_slot=0, device cu_seqlens of equal
    lengths go to the kernel (checked there, not by the host): the same step as -1 slots and no
    offsets, bit for bit (a trap on unequal offsets would end the CUDA context: it is tested on
    the emulation, test_decode_emulate.py's test_device_style_cu_seqlens_are_checked_by_the_kernel)."""
    x, opts, pool = make_decode(N=4, T=1, H=2, HV=4, K=128, V=128, P=6, pool_dtype=BF16)
    want_pool = cp.asarray(pool)
    want = kdacupy.kda_decode(**dev(x), state_pool=want_pool,
                              **dev(dict(opts, state_indices=np.array([-1, 5, -1, 3], np.int32))))
    pd = cp.asarray(pool)
    o = kdacupy.kda_decode(**dev(x), state_pool=pd, **dev(dict(opts, state_indices=np.array([0, 5, -1, 3], np.int32))),
                           null_slot=0, cu_seqlens=cp.arange(5, dtype=cp.int32))
    assert cp.array_equal(o, want) and cp.array_equal(pd, want_pool)


def test_decode_step_captures_into_a_cuda_graph_and_replays():
    """What engines do: one captured decode step, replayed with new tokens and
    slots copied into the same device buffers, no host synchronisation inside."""
    N = 8
    x, opts, pool = make_decode(N=N, T=1, H=2, HV=4, K=128, V=128, P=2 * N + 1, pool_dtype=np.float32)
    bufs = dev(x)
    idx = cp.asarray(opts["state_indices"])
    pd = cp.asarray(pool)
    out = cp.empty(x["v"].shape, dtype=x["v"].dtype)
    kw = {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in opts.items() if n != "state_indices"}
    kdacupy.kda_decode(**bufs, state_pool=pd, state_indices=idx, **kw, out=out)  # compile outside the capture
    cp.cuda.Device().synchronize()
    pd[...] = cp.asarray(pool)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        kdacupy.kda_decode(**bufs, state_pool=pd, state_indices=idx, **kw, out=out)
        graph = stream.end_capture()
    pm = pool.copy()
    for step in range(3):
        nx, _, _ = make_decode(N=N, T=1, H=2, HV=4, K=128, V=128, seed=100 + step)
        new_idx = np.roll(opts["state_indices"], step).astype(np.int32)
        with stream:  # the new step's inputs, ordered before the replay on the same stream
            for n in bufs:
                bufs[n][...] = cp.asarray(nx[n])
            idx[...] = cp.asarray(new_idx)
        graph.launch(stream)
        stream.synchronize()
        om = kdacupy.kda_decode(**nx, state_pool=pm, **dict(opts, state_indices=new_idx), backend="model")
        agree(cp.asnumpy(out), om)
        agree(cp.asnumpy(pd), pm)


def test_prefill_into_the_pool_then_decode_on_the_gpu():
    from ..inputs import make_inputs
    x, opts = make_inputs(cu_seqlens=[40, 0, 17, 1], H=1, HV=2, K=128, V=128)
    pool = (0.5 * np.random.default_rng(1).standard_normal((6, 2, 128, 128))).astype(BF16)
    idx = np.array([4, 1, -1, 0], np.int32)
    pm, pd = pool.copy(), cp.asarray(pool)
    om, _ = kdacupy.kda_forward(**x, **opts, state_layout="vk", state_pool=pm, state_indices=idx, backend="model")
    o, s = kdacupy.kda_forward(**dev(x), **dev(opts), state_layout="vk", state_pool=pd,
                               state_indices=cp.asarray(idx))
    assert s is None
    agree(cp.asnumpy(o), om)
    agree(cp.asnumpy(pd), pm)


def run_decode(x, opts, pool):
    pd = cp.asarray(pool)
    o = kdacupy.kda_decode(**dev(x), state_pool=pd, **dev(opts))
    return cp.asnumpy(o), cp.asnumpy(pd)


@pytest.mark.parametrize("gate", ["log", "softplus", "sigmoid"])
def test_gates_by_hand(gate):
    """The decode kernel's gate and beta against the definition written out in
    tests/activations.py (test_activations.py runs the same on the model and the emulation)."""
    from .. import activations as act
    act.decode_gate(run_decode, gate)


@pytest.mark.parametrize("mode", ["none", "raw", "sigmoid", "neg_eigval"])
def test_beta_by_hand(mode):
    from .. import activations as act
    act.decode_beta(run_decode, mode)

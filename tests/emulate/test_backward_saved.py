"""``kda_forward(save_for_backward=True)`` and ``kda_backward(saved=...)`` on the CPU emulation: the forward
that keeps its workspace and chunk states returns what the plain forward returns, the backward that reads
them runs three launches instead of five and gives the stateless backward's gradients to the bit (so the
model's), the kept buffer is wholly written (checked runs start it as NaN bytes), and a KDASaved from any
other call is refused before a launch. The default run takes each case and each state precision once
(every pair builds its own variants); the other pairs are a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.emulate import launched
from kdacupy.numerics.backward_model import kda_backward_model
from kdacupy.numerics.dtypes import BF16

from ..sweeps import sample
from .test_backward_checked import assert_no_unwritten_byte
from .test_backward_emulate import assert_bitwise, inputs

pytestmark = pytest.mark.emulate

#: the emulation suite's cases (their backward variants are built already): grouped heads with the l2norm
#: and negative eigenvalues; varlen with a zero-length sequence, the vk layout, fp32 gates and beta
CASES = ["gva-sigmoid-l2norm-neg-eigval", "varlen-gva-softplus-vk-f32-gate-and-beta"]


def forward(x, opts, **kw):
    return kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="emulate", **kw)


def backward(x, opts, do, ds, **kw):
    return kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="emulate", **kw)


# the default run: varlen at the bf16 state (the Kimi serving form), the grouped heads at the fp32 state
@pytest.mark.parametrize("name, precision", sample([(n, p) for n in CASES for p in ("bf16", "fp32")],
                                                   lambda n, p: (n == CASES[1]) == (p == "bf16")))
def test_kept_states_give_the_same_forward_and_gradients(name, precision):
    x, opts, do, ds = inputs(name)
    opts = dict(opts, state_precision=precision)
    o, final = forward(x, opts)
    with launched() as kernels_run:
        o_kept, final_kept, saved = forward(x, opts, save_for_backward=True)
    assert kernels_run == ["kda_prepare", "kda_recurrence"]
    np.testing.assert_array_equal(o_kept, o)
    np.testing.assert_array_equal(final_kept, final)
    assert isinstance(saved, kdacupy.KDASaved) and saved.nbytes > 0
    with launched() as kernels_run:
        got = backward(x, opts, do, ds, saved=saved)
    assert kernels_run == ["kda_bwd_chain", "kda_bwd_chunk", "kda_bwd_reduce"]
    assert_bitwise(got, backward(x, opts, do, ds))
    assert_bitwise(got, kda_backward_model(do, **x, dfinal_state=ds, **opts))
    assert_bitwise(backward(x, opts, do, ds, saved=saved), got)  # read, not consumed: a second backward agrees


def test_the_kept_buffer_is_wholly_written(monkeypatch):
    """Under the checks every allocation starts as NaN bytes and every access is bounds-checked: the
    backward reads no kept byte the forward did not write, and nothing outside the buffer."""
    name = CASES[1]
    x, opts, do, ds = inputs(name)
    want = backward(x, opts, do, ds)
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    _, _, saved = forward(x, opts, save_for_backward=True)
    got = backward(x, opts, do, ds, saved=saved)
    assert_no_unwritten_byte(got)
    assert_bitwise(got, want)


def test_the_numpy_backends_keep_nothing_and_recompute():
    x, opts, do, ds = inputs(CASES[0])
    o, final, saved = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="model",
                                          save_for_backward=True)
    want_o, want_final = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend="model")
    np.testing.assert_array_equal(o, want_o)
    np.testing.assert_array_equal(final, want_final)
    assert saved.nbytes == 0
    got = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts, backend="model", saved=saved)
    assert_bitwise(got, kda_backward_model(do, **x, dfinal_state=ds, **opts))


def test_a_callers_buffer_holds_the_kept_parts():
    """A framework's allocation (torch's, XLA's) of nbytes(...) bytes: the forward writes the kept parts
    there, the backward reads them there."""
    x, opts, do, ds = inputs(CASES[1])
    n = kdacupy.saved_nbytes(x["q"].shape, x["v"].shape, len(opts["cu_seqlens"]) - 1)
    buf = np.full(n + 16, 0xFF, np.uint8)  # one byte more than asked for is allowed
    _, _, saved = forward(x, opts, save_for_backward=buf)
    assert saved.buffer is buf and saved.nbytes == n + 16
    assert (buf[:n] != 0xFF).any() and (buf[n:] == 0xFF).all()  # written there, and only within its size
    assert_bitwise(backward(x, opts, do, ds, saved=saved), backward(x, opts, do, ds))


def test_kept_bytes_are_the_workspace_and_a_state_per_chunk():
    """What the docstring promises the memory is: per value head and 16-token chunk, the state (bf16:
    2 K V bytes; fp32: 4 K V) and the workspace block (about 14 KB at K = 128)."""
    x, opts, do, ds = inputs(CASES[0])
    B, T, HV, V = x["v"].shape
    K = x["q"].shape[-1]
    blocks = B * HV * -(-T // 16)
    for precision, state_bytes in (("bf16", 2), ("fp32", 4)):
        _, _, saved = forward(x, dict(opts, state_precision=precision), save_for_backward=True)
        per_block = saved.nbytes / blocks - state_bytes * K * V
        assert 3 * 16 * K * 2 <= per_block <= 3 * 16 * K * 2 + 2048, precision  # q_dec, k_dec, k_res, small parts


def refused(x, opts, do, ds, saved, match, exc=ValueError):
    with launched() as kernels_run, pytest.raises(exc, match=match):
        backward(x, opts, do, ds, saved=saved)
    assert kernels_run == []  # refused before any launch


def test_a_saved_of_another_call_is_refused():
    x, opts, do, ds = inputs(CASES[0])
    _, _, saved = forward(x, opts, save_for_backward=True)
    refused(dict(x, q=x["q"].copy()), opts, do, ds, saved, r"saved: .*\(q is another array\)")
    refused(x, dict(opts, scale=0.25), do, ds, saved, r"saved: .*scale differs")
    refused(x, dict(opts, state_precision="fp32"), do, ds, saved, r"saved: .*state_precision differs")
    refused(x, dict(opts, initial_state=opts["initial_state"].astype(BF16)), do, ds, saved,
            r"saved: .*state_in_dtype differs")
    refused(x, opts, do, ds, object(), r"saved: expected None or the KDASaved", TypeError)


def test_an_empty_saved_recomputes():
    """A NumPy backend's KDASaved (nothing kept) of the same call: the kernels' backward recomputes."""
    x, opts, do, ds = inputs(CASES[0])
    _, _, empty = kdacupy.kda_forward(**x, **opts, backend="model", save_for_backward=True)
    with launched() as kernels_run:
        got = backward(x, opts, do, ds, saved=empty)
    assert kernels_run[:2] == ["kda_prepare", "kda_recurrence"]
    assert_bitwise(got, kda_backward_model(do, **x, dfinal_state=ds, **opts))


@pytest.mark.parametrize("extra, match", [
    (dict(sequence_parallel=2), r"sequence_parallel: expected None or 1 with save_for_backward=True"),
    (dict(checkpoint_every=16), r"checkpoint_every: expected None with save_for_backward=True"),
    (dict(save_for_backward="yes"), r"save_for_backward: expected a NumPy or CuPy array"),
    (dict(save_for_backward=np.zeros(64, np.uint8)), r"save_for_backward: .* uint8 buffer of at least \d+ bytes"),
    (dict(save_for_backward=np.zeros(1 << 20, np.float32)), r"save_for_backward: .* uint8 buffer"),
])
def test_the_forward_refuses_what_it_cannot_keep(extra, match):
    x, opts, _, _ = inputs(CASES[0])
    kw = dict(save_for_backward=True) | extra
    with launched() as kernels_run, pytest.raises((ValueError, TypeError), match=match):
        kdacupy.kda_forward(**x, **opts, backend="emulate", **kw)
    assert kernels_run == []


def test_the_forward_refuses_a_pool():
    x, opts, _, _ = inputs(CASES[0])
    B, _, HV, V = x["v"].shape
    pool = np.zeros((B, HV, V, x["q"].shape[-1]), np.float32)
    opts = {n: v for n, v in opts.items() if n != "initial_state"}
    with pytest.raises(ValueError, match=r"state_pool: expected None with save_for_backward=True"):
        kdacupy.kda_forward(**x, **opts, state_pool=pool, state_indices=np.arange(B, dtype=np.int32),
                            backend="emulate", save_for_backward=True)


@pytest.mark.sweep  # (tests/sweeps.py) the default run keeps states on two cases above; any head dims'
# backward runs by default in test_backward_any_dims.py
def test_kept_states_at_any_head_dims_and_a_batch():
    """Head dims off the tiles (K = 16, V = 96: the kept buffer at the tiles' sizes, as the launchers lay it
    out) and a batch of two fixed-length sequences: the stateless gradients, to the bit."""
    from .test_backward_any_dims import inputs as any_inputs

    x, opts, do, ds = any_inputs("K16-V96-log-batched")
    o, final = forward(x, opts)
    o_kept, final_kept, saved = forward(x, opts, save_for_backward=True)
    np.testing.assert_array_equal(o_kept, o)
    np.testing.assert_array_equal(final_kept, final)
    assert saved.nbytes == kdacupy.saved_nbytes(x["q"].shape, x["v"].shape)
    assert_bitwise(backward(x, opts, do, ds, saved=saved), backward(x, opts, do, ds))


def test_kept_states_with_a_strided_cu_seqlens():
    """cu_seqlens a strided view (the launchers copy it into scratch, the forward's and the backward's own):
    the same gradients; another array of the same values is another call."""
    x, opts, do, ds = inputs(CASES[1])
    cu = np.zeros(2 * len(opts["cu_seqlens"]), opts["cu_seqlens"].dtype)
    cu[::2] = opts["cu_seqlens"]
    strided = dict(opts, cu_seqlens=cu[::2])
    _, _, saved = forward(x, strided, save_for_backward=True)
    assert_bitwise(backward(x, strided, do, ds, saved=saved), backward(x, opts, do, ds))
    refused(x, opts, do, ds, saved, r"saved: .*\(cu_seqlens is another array\)")

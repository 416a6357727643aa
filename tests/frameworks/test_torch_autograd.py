"""kdacupy.torch's autograd on CPU tensors: torch.autograd.gradcheck in float64 (finite
differences of the op itself), the gradients equal kdacupy.kda_backward's, and the backward
traces under torch.compile(fullgraph=True). The kept states' gradients on the emulated kernels run by
default on one case (their builds, 2-5 s a case of the cold run); the other is a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

from tests.frameworks.common import CASES, import_torch, numpy_case, one_thread
from tests.sweeps import sample

pytestmark = pytest.mark.torch
torch = import_torch()

import kdacupy  # noqa: E402
import kdacupy.torch as kt  # noqa: E402
from kdacupy.torch.bridge import to_array  # noqa: E402

ARRAYS = ("q", "k", "v", "g", "beta")
DIFFERENTIABLE = ARRAYS + ("initial_state", "A_log", "dt_bias")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def leaves(case, dtype=torch.float64):
    """The case's tensors, every differentiable one a leaf that requires grad."""
    x, opts = numpy_case(case)
    t = {n: torch.from_numpy(x[n]).to(dtype).requires_grad_() for n in ARRAYS}
    o = dict(opts)
    for n in ("initial_state", "A_log", "dt_bias"):
        if n in o:
            o[n] = torch.from_numpy(o[n]).to(dtype if n == "initial_state" or dtype == torch.float64
                                              else torch.float32).requires_grad_()
    if "cu_seqlens" in o:
        o["cu_seqlens"] = torch.from_numpy(o["cu_seqlens"])
    return t, o


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradcheck_float64(case):
    """Finite differences of the op against its backward, every differentiable input at once
    (fast mode: random directions, so the reference runs a handful of times, not per element).
    Fast mode scales atol by the sums of its random vectors (~50 x 50 here), hence the tight
    atol: it fails a 0.1% error in one gradient (and then spends minutes in slow mode to
    report it)."""
    t, o = leaves(case)
    names = [n for n in DIFFERENTIABLE if n in t or n in o]
    tensors = tuple(t[n] if n in t else o[n] for n in names)

    def f(*xs):
        given = dict(zip(names, xs))
        out, final = kt.kda(*(given[n] for n in ARRAYS), output_final_state=True,
                            **dict(o, **{n: given[n] for n in names if n not in ARRAYS}))
        return out, final

    assert torch.autograd.gradcheck(f, tensors, fast_mode=True, eps=1e-6, atol=1e-12, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_are_kda_backwards(case, dtype):
    t, o = leaves(case, dtype)
    out, final = kt.kda(*(t[n] for n in ARRAYS), output_final_state=True, **o)
    gen = torch.Generator().manual_seed(1)
    do, dfinal = torch.randn(out.shape, generator=gen, dtype=dtype), torch.randn(final.shape, generator=gen,
                                                                                 dtype=final.dtype)
    ((out * do).sum() + (final * dfinal).sum()).backward()
    arrays = {n: to_array(v) for n, v in t.items()}
    opts = {n: to_array(v) if isinstance(v, torch.Tensor) else v for n, v in o.items()}
    ref = kdacupy.kda_backward(to_array(do), *(arrays[n] for n in ARRAYS), dfinal_state=to_array(dfinal), **opts)
    given = dict(t, **{n: o[n] for n in DIFFERENTIABLE if n in o})
    for n, r in zip(DIFFERENTIABLE, ref):
        if n in given:
            grad = given[n].grad
            assert grad is not None and grad.dtype == given[n].dtype, n
            assert np.array_equal(to_array(grad), r.reshape(grad.shape)), n
        else:
            assert r is None


def test_no_final_state_loss_means_no_dfinal_state():
    """Without output_final_state the backward gets no dfinal_state (the placeholder output's
    zero gradient is not passed on)."""
    t, o = leaves("log-raw-beta")
    out, none = kt.kda(*(t[n] for n in ARRAYS), **o)
    assert none is None
    out.square().sum().backward()
    arrays = {n: to_array(v.detach()) for n, v in t.items()}
    opts = {n: to_array(v.detach()) if isinstance(v, torch.Tensor) else v for n, v in o.items()}
    ref = kdacupy.kda_backward(2 * to_array(out.detach()), *(arrays[n] for n in ARRAYS), **opts)
    assert np.array_equal(to_array(t["q"].grad), ref.dq)
    assert np.array_equal(to_array(o["initial_state"].grad), ref.dinitial_state)


def test_compile_fullgraph_backward():
    """torch.compile(fullgraph=True) traces forward and backward ops (AOTAutograd's joint graph)
    and gives the eager gradients."""
    grads = []
    for compiled in (False, True):
        t, o = leaves("sigmoid-gva-l2norm", torch.float32)
        w = torch.linspace(-1, 1, 64 * 64).reshape(64, 64).requires_grad_()

        def loss(q, k, v, g, beta):
            out, final = kt.kda(q @ w, k, v, g, beta, output_final_state=True, **o)
            return out.square().mean() + final.mean()

        fn = torch.compile(loss, fullgraph=True, backend="aot_eager") if compiled else loss
        fn(*(t[n] for n in ARRAYS)).backward()
        grads.append([w.grad] + [t[n].grad for n in ARRAYS] + [o["A_log"].grad, o["dt_bias"].grad])
    for eager, compiled in zip(*grads):
        assert torch.equal(eager, compiled)


def test_opcheck_backward():
    t, o = leaves("softplus-varlen-vk", torch.float32)
    args = (torch.randn(t["v"].shape), torch.randn(o["initial_state"].shape), *(t[n].detach() for n in ARRAYS),
            o["initial_state"].detach(), o["cu_seqlens"], o["A_log"].detach().float(), o["dt_bias"].detach().float(),
            None, False, True, False, "softplus", None, "vk", "bf16", None)
    torch.library.opcheck(torch.ops.kdacupy.backward.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def _grads(case, dtype, backend, save):
    """Every differentiable input's gradient of a loss over o and the final state, and the backward's launches."""
    from kdacupy.emulate import launched

    t, o = leaves(case, dtype)
    out, final = kt.kda(*(t[n] for n in ARRAYS), output_final_state=True, backend=backend, save_for_backward=save,
                        **o)
    gen = torch.Generator().manual_seed(1)
    loss = (out * torch.randn(out.shape, generator=gen, dtype=dtype)).sum() + final.square().sum()
    with launched() as kernels_run:
        loss.backward()
    given = dict(t, **{n: o[n] for n in DIFFERENTIABLE if n in o})
    return [given[n].grad for n in DIFFERENTIABLE if n in given], kernels_run


# (cover=False: varlen's kept states run by default on the emulated kernels in test_opcheck_saving_ops)
@pytest.mark.parametrize("case", sample(["sigmoid-gva-l2norm", "softplus-varlen-vk"],
                                        lambda c: c == "sigmoid-gva-l2norm", cover=False))
def test_save_for_backward_keeps_the_states_and_gives_the_same_gradients(case):
    """On the kernels (the emulation): the backward runs without the forward's two launches and gives the
    stateless backward's gradients to the bit; on a NumPy backend nothing is kept, the gradients the same."""
    want, launches = _grads(case, torch.float32, "emulate", False)
    assert launches[:2] == ["kda_prepare", "kda_recurrence"]
    got, launches = _grads(case, torch.float32, "emulate", True)
    assert launches == ["kda_bwd_chain", "kda_bwd_chunk", "kda_bwd_reduce"]
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    for a, b in zip(_grads(case, torch.float64, None, True)[0], _grads(case, torch.float64, None, False)[0]):
        assert torch.equal(a, b)


def test_save_for_backward_without_grad_keeps_nothing():
    t, o = leaves("sigmoid-gva-l2norm", torch.float32)
    with torch.no_grad():
        out, _ = kt.kda(*(t[n] for n in ARRAYS), backend="emulate", save_for_backward=True, **o)
    want, _ = kt.kda(*(t[n].detach() for n in ARRAYS), backend="emulate", **{n: v.detach() if isinstance(
        v, torch.Tensor) else v for n, v in o.items()})
    assert out.grad_fn is None and torch.equal(out, want)
    with pytest.raises(TypeError, match="save_for_backward: expected a bool"):
        kt.kda(*(t[n] for n in ARRAYS), save_for_backward="yes", **o)
    with pytest.raises(ValueError, match="sequence_parallel: expected None or 1 with save_for_backward"):
        kt.kda(*(t[n] for n in ARRAYS), save_for_backward=True, sequence_parallel=2, **o)


def test_opcheck_saving_ops():
    """Schema, fake tensors (the kept buffer's size from the shapes alone) and AOT dispatch of forward_saving
    and backward_saved, on the emulated kernels. forward_saving's AOT dispatch is test_compile_fullgraph_saving's:
    opcheck's compares every output byte of two runs, and the kept buffer's bytes no kernel writes or reads
    (alignment, varlen's spare slots) are left as allocated (zeroing them would cost a pass over the buffer)."""
    t, o = leaves("softplus-varlen-vk", torch.float32)
    ins = (*(t[n].detach() for n in ARRAYS), o["initial_state"].detach(), o["cu_seqlens"],
           o["A_log"].detach().float(), o["dt_bias"].detach().float())
    opts = (None, False, True, False, "softplus", None, "vk", "bf16", "emulate")
    fwd_args = ins + (None, True) + opts[1:7] + (None,) + opts[7:]
    torch.library.opcheck(torch.ops.kdacupy.forward_saving.default, fwd_args, test_utils=("test_schema", "test_faketensor"))
    _, final, kept = torch.ops.kdacupy.forward_saving(*fwd_args)
    assert kept.dtype == torch.uint8 and kept.numel() > 0
    bwd_args = (torch.randn(t["v"].shape), torch.randn(final.shape), kept) + ins + opts
    torch.library.opcheck(torch.ops.kdacupy.backward_saved.default, bwd_args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_compile_fullgraph_saving():
    """torch.compile(fullgraph=True) traces forward_saving and backward_saved (AOTAutograd's joint graph, the
    kept buffer a saved activation) and gives the eager gradients, which are the stateless backward's."""
    grads = []
    for compiled, save in ((False, False), (False, True), (True, True)):
        t, o = leaves("sigmoid-gva-l2norm", torch.float32)
        w = torch.linspace(-1, 1, 64 * 64).reshape(64, 64).requires_grad_()

        def loss(q, k, v, g, beta):
            out, final = kt.kda(q @ w, k, v, g, beta, output_final_state=True, backend="emulate",
                                save_for_backward=save, **o)
            return out.square().mean() + final.mean()

        fn = torch.compile(loss, fullgraph=True, backend="aot_eager") if compiled else loss
        fn(*(t[n] for n in ARRAYS)).backward()
        grads.append([w.grad] + [t[n].grad for n in ARRAYS] + [o["A_log"].grad, o["dt_bias"].grad])
    for a, b, c in zip(*grads):
        assert torch.equal(a, b) and torch.equal(b, c)

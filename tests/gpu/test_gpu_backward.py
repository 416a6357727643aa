"""The backward kernels on a GPU: parity with the precision model, accuracy against the float64
reference gradient, bitwise repeatability (no atomics), CUDA graph capture, the current stream.
Skipped without a GPU (tests/conftest.py).

Tolerance: ``kdacupy.numerics.parity.GPU`` (the forward's, derived in its docstring). Sized for
the backward with the emulation under KDACUPY_EMULATE_NUMERICS=hardware (every .approx result
perturbed within its PTX ISA bound, tensor-core sums truncated, FTZ) against the model on the
emulation suite's cases (tests/emulate/test_backward_emulate.py, both state precisions): worst
max |diff| / range 1.4e-3 (dq, fp16 inputs), worst RMS ratio 2.0e-4, 20x inside the tolerance.
As for the forward, short sequences only: a tipped bf16 rounding is carried for as long as the
gate remembers, so long runs are compared with the float64 reference."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.backward_model import kda_backward_model
from kdacupy.numerics.backward_reference import kda_backward_reference
from kdacupy.numerics.parity import GPU, mismatch

from ..emulate.test_backward_emulate import CASES, inputs

cp = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu  # skipped without a GPU (tests/conftest.py)

U_BF16 = 2.0 ** -9  # the error unit u (tests/numerics/test_precision.py)


@pytest.fixture(autouse=True)
def free_device_memory():
    yield
    from kdacupy.ops.forward import workspace
    workspace.release()
    cp.get_default_memory_pool().free_all_blocks()


def to_dev(d):
    return {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in d.items()}


def host(grads):
    return [None if g is None else cp.asnumpy(g) for g in grads]


def gpu_backward(x, opts, do, ds, **kw):
    return kdacupy.kda_backward(cp.asarray(do), **to_dev(x), dfinal_state=None if ds is None else cp.asarray(ds),
                                **to_dev(opts), **kw)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_the_model(name, precision):
    x, opts, do, ds = inputs(name)
    got = host(gpu_backward(x, opts, do, ds, state_precision=precision))
    want = kda_backward_model(do, **x, dfinal_state=ds, **opts, state_precision=precision)
    for field, a, b in zip(kdacupy.KDAGradients._fields, got, want):
        assert (a is None) == (b is None), field
        if b is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, field
            why = mismatch(a, b, GPU)
            assert why is None, f"{field}: {why}"


def sweep_problem(T=1024, H=4, g_regime="N(0,8)", bias_regime="U(-8,8)", seed=3):
    from kdacupy.cli.accuracy import OPTIONS, make_inputs
    from kdacupy.cli.accuracy_backward import loss_inputs
    return loss_inputs(make_inputs(T, H, 128, 128, g_regime, bias_regime, seed), OPTIONS, seed)


@pytest.mark.parametrize("g_regime,bias_regime", [("N(0,8)", "U(-8,8)"), ("-8", "-8"), ("8", "+8")])
def test_accuracy_against_the_reference(g_regime, bias_regime):
    args, opts = sweep_problem(g_regime=g_regime, bias_regime=bias_regime)
    got = host(kdacupy.kda_backward(**to_dev(args), **to_dev(opts)))
    refs = kda_backward_reference(**args, **opts)
    for field, a, r in zip(kdacupy.KDAGradients._fields, got, refs):
        if field == "dA_log" or r is None:  # dA_log: its bound is its sum's condition (test_backward_model.py)
            continue
        ratio = float(np.linalg.norm(a.astype(np.float64) - r) / np.linalg.norm(r))
        assert ratio < 10 * U_BF16, (field, ratio)


def test_two_runs_are_bitwise_equal():
    """No floating-point atomics: every reduction has one order, so two runs agree to the bit."""
    args, opts = sweep_problem(T=2048, H=8)
    dev_a, dev_o = to_dev(args), to_dev(opts)
    first = host(kdacupy.kda_backward(**dev_a, **dev_o))
    for _ in range(3):
        again = host(kdacupy.kda_backward(**dev_a, **dev_o))
        for field, a, b in zip(kdacupy.KDAGradients._fields, first, again):
            np.testing.assert_array_equal(a, b, err_msg=field)


def test_cuda_graph_capture_and_replay():
    args, opts = sweep_problem(T=700, H=2)
    opts["cu_seqlens"] = np.array([0, 100, 100, 700])  # varlen, a zero-length sequence, device cu_seqlens
    opts["initial_state"] = np.concatenate([opts["initial_state"]] * 3)
    opts["dfinal_state"] = np.concatenate([opts["dfinal_state"]] * 3)
    dev_a, dev_o = to_dev(args), to_dev(opts)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ref = host(kdacupy.kda_backward(**dev_a, **dev_o))  # warm: compile, size the workspace
        stream.begin_capture()
        grads = kdacupy.kda_backward(**dev_a, **dev_o)
        graph = stream.end_capture()
        for g in grads:
            if g is not None:
                g.fill(0)
        graph.launch(stream)
        stream.synchronize()
    for field, a, b in zip(kdacupy.KDAGradients._fields, host(grads), ref):
        np.testing.assert_array_equal(a, b, err_msg=field)
    # a new upstream gradient in place: the replay computes its gradients
    do2 = (args["do"].astype(np.float32) * -0.5).astype(args["do"].dtype)
    dev_a["do"][...] = cp.asarray(do2)
    with stream:
        graph.launch(stream)
        stream.synchronize()
    eager = host(kdacupy.kda_backward(**dict(dev_a), **dev_o))
    for field, a, b in zip(kdacupy.KDAGradients._fields, host(grads), eager):
        np.testing.assert_array_equal(a, b, err_msg=field)


def test_runs_on_the_current_stream():
    x, opts, do, ds = inputs("K128-V128-batched-mixed-chunks")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        grads = host(gpu_backward(x, opts, do, ds))
        stream.synchronize()
    want = kda_backward_model(do, **x, dfinal_state=ds, **opts)
    for field, a, b in zip(kdacupy.KDAGradients._fields, grads, want):
        if b is not None:
            assert mismatch(a, b, GPU) is None, field


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_kept_states_give_the_stateless_gradients(precision):
    """kda_forward(save_for_backward=True) then kda_backward(saved=...): the forward's own output and the
    stateless backward's gradients, to the bit (the same kernels write the same bytes: docs/design.md 9.5)."""
    x, opts, do, ds = inputs("varlen-gva-softplus-vk-f32-gate-and-beta")
    dev_x, dev_o = to_dev(x), to_dev(dict(opts, state_precision=precision))
    o, final = kdacupy.kda_forward(**dev_x, **dev_o, output_final_state=True)
    o_kept, final_kept, saved = kdacupy.kda_forward(**dev_x, **dev_o, output_final_state=True, save_for_backward=True)
    assert bool(cp.array_equal(o, o_kept)) and bool(cp.array_equal(final, final_kept))
    assert saved.nbytes == kdacupy.saved_nbytes(x["q"].shape, x["v"].shape, len(opts["cu_seqlens"]) - 1, precision)
    dev_do, dev_ds = cp.asarray(do), cp.asarray(ds)  # the forward's own arrays: the fingerprint holds their addresses
    want = host(kdacupy.kda_backward(dev_do, **dev_x, dfinal_state=dev_ds, **dev_o))
    got = host(kdacupy.kda_backward(dev_do, **dev_x, dfinal_state=dev_ds, **dev_o, saved=saved))
    for field, a, b in zip(kdacupy.KDAGradients._fields, got, want):
        assert (a is None) == (b is None), field
        if b is not None:
            np.testing.assert_array_equal(a, b, err_msg=field)


def test_kept_states_in_a_cuda_graph():
    """The training step with kept states captured once (the kept buffer preallocated, as a framework's) and
    replayed: the eager step's gradients."""
    x, opts, do, ds = inputs("varlen-gva-softplus-vk-f32-gate-and-beta")
    dev_x, dev_o = to_dev(x), to_dev(opts)
    dev_do, dev_ds = cp.asarray(do), cp.asarray(ds)
    buf = cp.empty(kdacupy.saved_nbytes(x["q"].shape, x["v"].shape, len(opts["cu_seqlens"]) - 1), cp.uint8)

    def step():
        _, _, saved = kdacupy.kda_forward(**dev_x, **dev_o, save_for_backward=buf)
        return kdacupy.kda_backward(dev_do, **dev_x, dfinal_state=dev_ds, **dev_o, saved=saved)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        eager = host(step())  # warm: compile, size the scratch
        stream.begin_capture()
        grads = step()
        graph = stream.end_capture()
        for g in grads:
            if g is not None:
                g.fill(0)
        buf.fill(0)
        graph.launch(stream)
        stream.synchronize()
    for field, a, b in zip(kdacupy.KDAGradients._fields, host(grads), eager):
        np.testing.assert_array_equal(a, b, err_msg=field)

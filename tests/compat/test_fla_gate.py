"""kdacupy.compat.fla's gate: ``fused_kda_gate`` (fla-core 0.6.0's signature, forward and
backward) against fla-core's own naive torch gates, ``patch()`` covering it, and the gate
arguments that fla-core drops without ``use_gate_in_kernel=True``, refused by name."""
import inspect

import pytest

from tests.conftest import MARKERS
from tests.frameworks.common import import_torch, one_thread

pytestmark = pytest.mark.torch
torch = import_torch()

import kdacupy.compat.fla as compat  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def fla_gate():
    pytest.importorskip("fla.ops.kda", reason=MARKERS["fla"])
    if __import__("importlib.metadata").metadata.version("fla-core") != "0.6.0":
        pytest.skip(MARKERS["fla"])
    import fla.ops.kda.gate
    return fla.ops.kda.gate


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.fla
def test_signature_is_fla_cores():
    theirs = inspect.signature(fla_gate().fused_kda_gate).parameters
    ours = inspect.signature(compat.fused_kda_gate).parameters
    described = lambda params: [(p.name, p.kind, p.default) for p in params.values()]  # noqa: E731
    assert described(ours) == described(theirs)


@pytest.mark.fla
@pytest.mark.parametrize("case", ["softplus", "bounded", "bounded-no-A_log", "bf16-4d-A_log"])
def test_forward_and_backward_against_fla_cores_naive_gates(case):
    """Values and the gradients of g, A_log and dt_bias (fla-core's naive gates differentiated by
    torch's autograd), float32 to 1e-6; A_log in the layer's [1, 1, H, 1] bf16 shape too."""
    gate = fla_gate()
    gen = torch.Generator().manual_seed(0)
    B, T, H, K = 2, 5, 3, 64
    g = torch.randn(B, T, H, K, generator=gen) * 4
    A_log = torch.log(torch.empty(H).uniform_(1, 16, generator=gen))
    dt_bias = torch.randn(H * K, generator=gen)
    lower_bound = None if case == "softplus" else -5.0
    if case == "bounded-no-A_log":
        A_log = None
    if case == "bf16-4d-A_log":
        A_log, dt_bias = A_log.reshape(1, 1, H, 1).bfloat16(), dt_bias.bfloat16()
    leaves = [x for x in (g, A_log, dt_bias) if x is not None]
    ours_in = [x.detach().clone().requires_grad_() for x in leaves]
    ref_in = [x.detach().clone().requires_grad_() for x in leaves]
    unpack = lambda xs: (xs[0], xs[1] if A_log is not None else None, xs[-1])  # noqa: E731
    ours = compat.fused_kda_gate(*unpack(ours_in), lower_bound=lower_bound)
    naive = gate.naive_kda_gate if lower_bound is None else gate.naive_kda_lowerbound_gate
    ref = naive(*unpack(ref_in), **({} if lower_bound is None else dict(lower_bound=lower_bound)))
    assert ours.dtype == torch.float32 and ours.shape == g.shape
    assert rel(ours, ref) < 1e-6
    dy = torch.randn(ours.shape, generator=gen)
    for a, b in zip(torch.autograd.grad((ours * dy).sum(), ours_in), torch.autograd.grad((ref * dy).sum(), ref_in)):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert rel(a, b) < (1e-6 if a.dtype == torch.float32 else 2.0 ** -8)


@pytest.mark.fla
def test_patch_covers_the_gate():
    gate = fla_gate()
    original = gate.fused_kda_gate
    compat.patch()
    try:
        assert gate.fused_kda_gate is compat.fused_kda_gate
    finally:
        compat.unpatch()
    assert gate.fused_kda_gate is original


def test_gate_arguments_without_the_flag_raise_naming_it():
    """fla-core reads g as the log decay without use_gate_in_kernel and drops A_log, dt_bias and
    lower_bound; a call that passes them meant the gate (README "FLA's names")."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.rand(1, 8, 1, 64, generator=gen) for _ in range(3))
    g, beta = torch.randn(1, 8, 1, 64, generator=gen), torch.rand(1, 8, 1, generator=gen)
    given = dict(A_log=torch.zeros(1), dt_bias=torch.zeros(64), lower_bound=-5.0)
    calls = (("chunk_kda", compat.chunk_kda, {}), ("fused_recurrent_kda", compat.fused_recurrent_kda, {}),
             ("fused_recurrent_kda_fwd", compat.fused_recurrent_kda_fwd,
              dict(initial_state=torch.zeros(1, 1, 64, 64))))
    for fn, call, extra in calls:
        for name, value in given.items():
            with pytest.raises(ValueError, match=f"^{name}: {fn}\\(\\) applies A_log, dt_bias and lower_bound only "
                                                 f"with use_gate_in_kernel=True"):
                call(q, k, v, g, beta, **{name: value}, **extra)
    # chunk_kda's safe_gate with a log decay g: lower_bound is the declared bound, as fla-core's tests pass it
    o, _ = compat.chunk_kda(q, k, v, -torch.rand(1, 8, 1, 64), beta, safe_gate=True, lower_bound=-5.0)
    assert o.shape == v.shape
    with pytest.raises(ValueError, match="^A_log: fused_kda_gate"):  # fla-core multiplies by e then
        compat.fused_kda_gate(g)

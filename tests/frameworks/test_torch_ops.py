"""kdacupy.torch on CPU tensors: the custom ops against kdacupy's own NumPy calls, zero-copy,
the ops' schemas and fake implementations (torch.library.opcheck), torch.compile(fullgraph=True)
traces, the state pool, and the errors."""
import numpy as np
import pytest

from tests.frameworks.common import CASES, import_torch, numpy_case, one_thread

pytestmark = pytest.mark.torch
torch = import_torch()

import kdacupy  # noqa: E402
import kdacupy.torch as kt  # noqa: E402
from kdacupy.torch.bridge import to_array, to_tensor  # noqa: E402

ARRAYS = ("q", "k", "v", "g", "beta")
TENSOR_OPTIONS = ("initial_state", "A_log", "dt_bias", "cu_seqlens")

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def as_torch(x, opts, dtype=torch.float64):
    """Tensors of the case: q, k, v, g, beta in ``dtype``; the float parameters in float64 for
    float64 calls, else float32 (A_log, dt_bias) and the state in float32."""
    t = {n: torch.from_numpy(x[n]).to(dtype) for n in ARRAYS}
    o = dict(opts)
    for n in TENSOR_OPTIONS:
        if n in o:
            a = torch.from_numpy(np.asarray(o[n]))
            o[n] = a if n == "cu_seqlens" or dtype == torch.float64 else a.to(torch.float32)
    return t, o


def as_numpy(t, o):
    arrays = {n: to_array(v) for n, v in t.items()}
    return arrays, {n: to_array(v) if isinstance(v, torch.Tensor) else v for n, v in o.items()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_is_kdacupys_forward(case, dtype):
    """The op returns exactly what kdacupy.kda_forward returns for the same arrays."""
    t, o = as_torch(*numpy_case(case), dtype)
    out, final = kt.kda(*(t[n] for n in ARRAYS), output_final_state=True, **o)
    a, ao = as_numpy(t, o)
    ref_o, ref_s = kdacupy.kda_forward(*(a[n] for n in ARRAYS), output_final_state=True, **ao)
    assert out.dtype == dtype and tuple(out.shape) == ref_o.shape
    assert np.array_equal(to_array(out), ref_o)
    assert to_array(final).dtype == ref_s.dtype and np.array_equal(to_array(final), ref_s)
    assert kt.kda(*(t[n] for n in ARRAYS), **o)[1] is None  # output_final_state=False


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bridge_shares_memory(dtype):
    x = torch.randn(3, 8, 16).to(dtype)[:, 1:5]  # a strided view
    a = to_array(x)
    assert a.ctypes.data == x.data_ptr() and a.shape == tuple(x.shape)
    assert a.strides == tuple(s * x.element_size() for s in x.stride())
    back = to_tensor(a)
    assert back.data_ptr() == x.data_ptr() and back.dtype == dtype and torch.equal(back, x)
    a[0, 0, 0] = 7  # one memory: a write through the array shows in the tensor
    assert x[0, 0, 0].item() == 7


def test_strided_inputs_read_in_place(monkeypatch):
    """q, k, v as views of one fused projection are read where they are (no copy) and give the
    result of contiguous copies; a view whose last dim is not contiguous is copied first."""
    t, o = as_torch(*numpy_case("log-raw-beta"), torch.float32)
    fused = torch.cat([t["q"], t["k"], t["v"].flatten(2, 3).unflatten(2, (2, 64))], dim=2)
    q, k, v = fused[:, :, :1], fused[:, :, 1:2], fused[:, :, 2:]
    assert not q.is_contiguous()
    seen, real = [], kdacupy.kda_forward
    monkeypatch.setattr(kdacupy, "kda_forward", lambda *a, **kw: seen.append(a[0].ctypes.data) or real(*a, **kw))
    out, _ = kt.kda(q, k, v, t["g"], t["beta"], **o)
    assert seen == [q.data_ptr()]
    ref, _ = kt.kda(q.contiguous(), k.contiguous(), v.contiguous(), t["g"], t["beta"], **o)
    assert torch.equal(out, ref)
    g_t = t["g"].transpose(-1, -2).contiguous().transpose(-1, -2)  # last-dim stride 2 (HV): copied
    assert g_t.stride(-1) != 1 and torch.equal(kt.kda(q, k, v, g_t, t["beta"], **o)[0], ref)
    h0 = o["initial_state"].transpose(-1, -2).contiguous().transpose(-1, -2)  # a transposed state: copied
    assert torch.equal(kt.kda(q, k, v, t["g"], t["beta"], **dict(o, initial_state=h0))[0], ref)


def test_prefill_into_pool_then_decode_in_place():
    """Chunked prefill writes each sequence's final state into its pool slot; decode then
    updates the pool in place: both as kdacupy's NumPy calls on a copy of the pool."""
    x, opts = numpy_case("softplus-varlen-vk")
    t, o = as_torch(x, opts, torch.float32)
    del o["initial_state"]
    pool = torch.randn(6, 1, 64, 64)
    slots = torch.tensor([4, -1, 1], dtype=torch.int32)
    ref_pool = pool.numpy().copy()
    o_pre, none = kt.kda(*(t[n] for n in ARRAYS), state_pool=pool, state_indices=slots, **o)
    a, ao = as_numpy(t, o)
    ref_pre, _ = kdacupy.kda_forward(*(a[n] for n in ARRAYS), state_pool=ref_pool, state_indices=slots.numpy(), **ao)
    assert none is None and np.array_equal(o_pre.numpy(), ref_pre) and np.array_equal(pool.numpy(), ref_pool)

    step = {n: t[n][:, :3].reshape((3, 1) + tuple(t[n].shape[2:])) for n in ARRAYS}
    gate = {n: o[n] for n in ("gate", "A_log", "dt_bias", "beta_sigmoid")}
    o_dec = kt.kda_decode(*(step[n] for n in ARRAYS), state_pool=pool, state_indices=[4, -1, 1], **gate)
    ref_dec = kdacupy.kda_decode(*(step[n].numpy() for n in ARRAYS), state_pool=ref_pool,
                                 state_indices=np.array([4, -1, 1]), **{n: to_array(v) if isinstance(
                                     v, torch.Tensor) else v for n, v in gate.items()})
    assert np.array_equal(o_dec.numpy(), ref_dec) and np.array_equal(pool.numpy(), ref_pool)
    assert not o_dec[1].any()  # slot -1: padding, zeros


def _forward_args(case, dtype=torch.float32):
    """The forward op's positional arguments for a case, with output_final_state."""
    t, o = as_torch(*numpy_case(case), dtype)
    return (t["q"], t["k"], t["v"], t["g"], t["beta"], o.get("initial_state"), o.get("cu_seqlens"), o.get("A_log"),
            o.get("dt_bias"), o.get("scale"), True, o.get("qk_l2norm", False), o.get("beta_sigmoid", False),
            o.get("allow_neg_eigval", False), o.get("gate", "log"), o.get("lower_bound"), o.get("state_layout", "kv"),
            None, "bf16", None, None)


@pytest.mark.parametrize("case", sorted(CASES))
def test_opcheck_forward(case):
    """Schema, fake tensor (shapes, dtypes and strides of the real results) and AOT dispatch of the forward op."""
    torch.library.opcheck(torch.ops.kdacupy.forward.default, _forward_args(case),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_opcheck_decode_declares_its_mutations():
    """opcheck's schema test fails an op that writes an argument its schema does not mark mutated."""
    q, k, v, g, beta = (torch.randn(2, 1, 1, 64), torch.randn(2, 1, 1, 64), torch.randn(2, 1, 2, 64),
                        -torch.rand(2, 1, 2, 64), torch.rand(2, 1, 2))
    args = (q, k, v, g, beta, torch.randn(4, 2, 64, 64), torch.tensor([2, 0]), None, None, None,
            torch.empty(2, 1, 2, 64), None, True, False, False, "log", None, "vk", None, 0,
            torch.tensor([0, 1, 2], dtype=torch.int32))  # null_slot 0: slot 0 pads; cu_seqlens of N = 2
    torch.library.opcheck(torch.ops.kdacupy.decode.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_compile_fullgraph_forward():
    """torch.compile(fullgraph=True) traces the op (fake implementation) inside a model's code
    and gives the eager result (aot_eager: AOTAutograd's trace, without a C++ build)."""
    t, o = as_torch(*numpy_case("sigmoid-gva-l2norm"), torch.float32)
    w = torch.randn(64, 64) / 8

    def layer(q, k, v, g, beta):
        out, final = kt.kda(q @ w, k @ w, v, g, beta, output_final_state=True, **o)
        return out.square().mean() + final.mean()

    eager = layer(*(t[n] for n in ARRAYS))
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(*(t[n] for n in ARRAYS))
    assert torch.equal(eager, compiled)


def test_compile_fullgraph_decode_mutates_the_pool():
    """A compiled decode step updates the caller's pool as the eager one does."""
    q, k, v, g, beta = (torch.randn(2, 1, 1, 64), torch.randn(2, 1, 1, 64), torch.randn(2, 1, 1, 64),
                        -torch.rand(2, 1, 1, 64), torch.rand(2, 1, 1))
    pools = [torch.randn(3, 1, 64, 64) for _ in range(2)]
    pools[1].copy_(pools[0])
    before = pools[0].clone()
    idx = torch.tensor([2, 0], dtype=torch.int32)

    def step(pool, q):
        return kt.kda_decode(q * 2, k, v, g, beta, state_pool=pool, state_indices=idx, qk_l2norm=True) + 1

    eager = step(pools[0], q)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(pools[1], q)
    assert torch.equal(eager, compiled) and torch.equal(pools[0], pools[1])
    assert torch.equal(pools[1][1], before[1]) and not torch.equal(pools[1][[0, 2]], before[[0, 2]])


def test_errors_name_the_argument():
    t, o = as_torch(*numpy_case("log-raw-beta"), torch.float32)
    args = [t[n] for n in ARRAYS]
    with pytest.raises(ValueError, match=r"^g: expected shape"):
        kt.kda(*args[:3], args[3][:, :, :1], args[4], **o)
    with pytest.raises(TypeError, match="use_qk_l2norm_in_kernel.*kdacupy.compat.fla"):
        kt.kda(*args, use_qk_l2norm_in_kernel=True)
    with pytest.raises(TypeError, match="'out'.*may not return their inputs"):
        kt.kda(*args, out=torch.empty_like(args[2]))
    with pytest.raises(TypeError, match="^qk_l2norm: expected a bool"):
        kt.kda(*args, qk_l2norm=1)
    with pytest.raises(TypeError, match="^state_dtype: expected a torch dtype"):
        kt.kda(*args, state_dtype="float32", output_final_state=True)
    with pytest.raises(ValueError, match="^output_final_state: expected False with state_pool"):
        kt.kda(*args, output_final_state=True, state_pool=torch.zeros(2, 2, 64, 64), state_indices=[0, 1])
    with pytest.raises(TypeError, match="^state_indices: expected a tensor"):
        kt.kda_decode(*args, state_pool=torch.zeros(2, 2, 64, 64), state_indices=None)
    # a list of floats or bools is refused, not truncated to slots 0 and 1 or offsets [0, 16, 32]
    pool = torch.zeros(2, 2, 64, 64)
    for name, bad, call in (("state_indices", [0.7, 1.2], lambda x: kt.kda(*args, state_pool=pool, state_indices=x)),
                            ("state_indices", [True, False], lambda x: kt.kda(*args, state_pool=pool, state_indices=x)),
                            ("cu_seqlens", [0, 16.5, 32], lambda x: kt.kda(*args, cu_seqlens=x))):
        before = pool.clone()
        with pytest.raises(TypeError, match=f"^{name}: expected an integer tensor, a list of ints or None, got a list"):
            call(bad)
        assert torch.equal(pool, before)
    # arguments that are not tensors are named, not an AttributeError from inside
    for i, name in enumerate(ARRAYS):
        for bad in ([1.0], args[i].numpy(), "x"):
            with pytest.raises(TypeError, match=f"^{name}: expected a torch tensor"):
                kt.kda(*args[:i], bad, *args[i + 1:], **o)
            with pytest.raises(TypeError, match=f"^{name}: expected a torch tensor"):
                kt.kda_decode(*args[:i], bad, *args[i + 1:], state_pool=pool, state_indices=[0])
    for name in ("initial_state", "A_log", "dt_bias", "state_pool"):
        with pytest.raises(TypeError, match=f"^{name}: expected a torch tensor or None, got list"):
            kt.kda(*args, **dict(o, **{name: [0.0]}))
    with pytest.raises(TypeError, match="^state_pool: expected a torch tensor or None, got list"):
        kt.kda_decode(*args, state_pool=[0.0], state_indices=[0])


def test_the_faces_token_limit_is_the_cores():
    from kdacupy.torch.api import MAX_TOKENS
    from kdacupy.validation.shapes import MAX_TOKENS as CORE
    assert MAX_TOKENS == CORE == (1 << 31) - 1


def test_more_tokens_than_the_kernels_count_are_refused_before_any_copy():
    """B * T >= 2^31 (the launchers' 32-bit token counts): refused naming q on every backend, before
    the face copies a broadcast (stride-0) tensor into memory."""
    huge = torch.zeros(1, dtype=torch.float32).expand(2, 1 << 30, 1, 16)  # 2^31 tokens, no memory
    v = torch.zeros(1).expand(2, 1 << 30, 1, 16)
    with pytest.raises(ValueError, match=r"^q: expected at most 2\^31 - 1 tokens"):
        kt.kda(huge, huge, v, huge)
    a = np.broadcast_to(np.zeros(1, np.float32), (2, 1 << 30, 1, 16))
    for backend in ("reference", "model"):
        with pytest.raises(ValueError, match=r"^q: expected at most 2\^31 - 1 tokens"):
            kdacupy.kda_forward(a, a, a, a, backend=backend)

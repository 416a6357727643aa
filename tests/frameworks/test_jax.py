"""kdacupy.jax on the CPU: the buffer callbacks against kdacupy's own NumPy calls, under
jax.jit and jax.vmap (folded into the batch, and per index), the CUDA kernels' own code
(backend="emulate") on XLA's buffers, gradients, decode with the pool aliased, the errors, and
examples/jax_kda_layer.py training.

Naming the emulation makes this module run in a forked child (tests/isolation.py), so JAX's
runtime, with its threads, starts there and never in the pytest process, which later forks
the emulated modules' children (JAX warns at every fork after it has started).

Every point traces and compiles its own XLA programs (0.3-1 s each on the CPU), so the default run takes a
sample of the case matrices, every case and every dtype at least once; the rest is a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

from tests.conftest import MARKERS
from tests.frameworks.common import CASES, numpy_case, one_thread
from tests.sweeps import sample

pytestmark = pytest.mark.jax
jax = pytest.importorskip("jax", reason=MARKERS["jax"])
pytest.importorskip("jax.experimental.buffer_callback", reason=MARKERS["jax"])

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

import kdacupy  # noqa: E402
import kdacupy.jax as kj  # noqa: E402

ARRAYS = ("q", "k", "v", "g", "beta")

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def cast(x, opts, dtype):
    """The case in ``dtype`` (float parameters float32 unless float64; the state float32)."""
    x = {n: x[n].astype(dtype) for n in ARRAYS}
    opts = dict(opts)
    for n in ("A_log", "dt_bias", "initial_state"):
        if n in opts and dtype != np.float64:
            opts[n] = opts[n].astype(np.float32)
    return x, opts


def to_jax(x, opts):
    return ({n: jnp.asarray(a) for n, a in x.items()},
            {n: jnp.asarray(a) if isinstance(a, np.ndarray) else a for n, a in opts.items()})


DTYPES = [np.float64, np.float32, ml_dtypes.bfloat16]


# the default run: each case in one dtype, the dtypes in turn
@pytest.mark.parametrize("case, dtype", sample(
    [(c, d) for c in sorted(CASES) for d in DTYPES], lambda c, d: DTYPES.index(d) == sorted(CASES).index(c) % 3,
    ids=lambda c, d: f"{c}-{np.dtype(d).name}"))
def test_forward_is_kdacupys_forward(case, dtype, x64):
    x, opts = cast(*numpy_case(case), dtype)
    ref_o, ref_s = kdacupy.kda_forward(*(x[n] for n in ARRAYS), output_final_state=True, **opts)
    jx, jo = to_jax(x, opts)
    o, s = kj.kda(*(jx[n] for n in ARRAYS), output_final_state=True, **jo)
    assert o.dtype == ref_o.dtype and np.array_equal(np.asarray(o), ref_o)
    assert s.dtype == ref_s.dtype and np.array_equal(np.asarray(s), ref_s)
    jitted = jax.jit(lambda *a: kj.kda(*a, **jo)[0])(*(jx[n] for n in ARRAYS))
    assert np.array_equal(np.asarray(jitted), ref_o)


def test_vmap_over_batch_folds_into_one_call(monkeypatch, x64):
    """vmap over a batch of sequences (per-head parameters shared): one kdacupy call on the
    whole batch, the result of the batched call."""
    x, opts = numpy_case("sigmoid-gva-l2norm")
    x = {n: np.concatenate([a, 0.5 * a[:, ::-1]]) for n, a in x.items()}  # B = 2
    ref_o, ref_s = kdacupy.kda_forward(*(x[n] for n in ARRAYS), output_final_state=True, **opts)
    calls = []
    real = kdacupy.kda_forward
    monkeypatch.setattr(kdacupy, "kda_forward", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    jx, jo = to_jax(x, opts)

    def one(q, k, v, g, beta):  # one sequence, [T, H, K]
        o, s = kj.kda(q[None], k[None], v[None], g[None], beta[None], output_final_state=True, **jo)
        return o[0], s[0]

    o, s = jax.jit(jax.vmap(one))(*(jx[n] for n in ARRAYS))
    assert calls == [(2,) + x["q"].shape[1:]]
    assert np.array_equal(np.asarray(o), ref_o) and np.array_equal(np.asarray(s), ref_s)


def test_vmap_with_mapped_parameters_runs_per_index(x64):
    """A mapped A_log (and a mapped cu_seqlens) cannot fold into B: one call per index."""
    x, opts = numpy_case("softplus-varlen-vk")
    A_logs = np.stack([opts["A_log"], opts["A_log"] - 1.0])
    refs = [kdacupy.kda_forward(*(x[n] for n in ARRAYS), **dict(opts, A_log=a))[0] for a in A_logs]
    jx, jo = to_jax(x, opts)
    f = jax.vmap(lambda a: kj.kda(*(jx[n] for n in ARRAYS), **dict(jo, A_log=a))[0])
    o = f(jnp.asarray(A_logs))
    assert np.array_equal(np.asarray(o), np.stack(refs))


def test_nested_vmap(x64):
    x, opts = numpy_case("log-raw-beta")
    xs = {n: np.stack([np.stack([a * (1 + i + j) / 4 for j in range(2)]) for i in range(3)]) for n, a in x.items()}
    jx, jo = to_jax(xs, opts)
    f = jax.vmap(jax.vmap(lambda q, k, v, g, b: kj.kda(q, k, v, g, b, **jo)[0]))
    o = np.asarray(f(*(jx[n] for n in ARRAYS)))
    for i in range(3):
        for j in range(2):
            ref, _ = kdacupy.kda_forward(*(xs[n][i, j] for n in ARRAYS), **opts)
            assert np.array_equal(o[i, j], ref)


def test_decode_returns_the_updated_pool(x64):
    """Functional decode: the new pool is kdacupy.kda_decode's in-place result; the caller's
    pool array is left as it was unless donated; under jit with donation it runs too."""
    rng = np.random.default_rng(3)
    N, H, HV, K = 3, 1, 2, 64
    q, k = (rng.standard_normal((N, 2, H, K)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((N, 2, HV, K)).astype(np.float32)
    g = -rng.uniform(0, 1, (N, 2, HV, K)).astype(np.float32)
    beta = rng.uniform(0, 1, (N, 2, HV)).astype(np.float32)
    pool = rng.standard_normal((8, HV, K, K)).astype(np.float32)
    idx = np.array([[5, 2], [-1, 3], [0, 7]], dtype=np.int32)
    acc = np.array([2, 1, 1], dtype=np.int32)
    ref_pool = pool.copy()
    ref = kdacupy.kda_decode(q, k, v, g, beta, state_pool=ref_pool, state_indices=idx, num_accepted_tokens=acc,
                             qk_l2norm=True)
    jpool = jnp.asarray(pool)
    args = tuple(map(jnp.asarray, (q, k, v, g, beta)))
    o, new_pool = kj.kda_decode(*args, state_pool=jpool, state_indices=jnp.asarray(idx),
                                num_accepted_tokens=jnp.asarray(acc), qk_l2norm=True)
    assert np.array_equal(np.asarray(o), ref) and np.array_equal(np.asarray(new_pool), ref_pool)
    assert np.array_equal(np.asarray(jpool), pool)  # not donated: the input is unchanged
    step = jax.jit(lambda p, *a: kj.kda_decode(*a, state_pool=p, state_indices=jnp.asarray(idx),
                                               num_accepted_tokens=jnp.asarray(acc), qk_l2norm=True),
                   donate_argnums=0)
    o2, pool2 = step(jnp.asarray(pool), *args)
    assert np.array_equal(np.asarray(o2), ref) and np.array_equal(np.asarray(pool2), ref_pool)


@pytest.mark.emulate
def test_jit_runs_the_cuda_kernels_emulated():
    """backend="emulate" through the callback: XLA's buffers go through the .cu kernels the GPU
    runs (compiled for the CPU), bit for bit kdacupy's own emulated call."""
    from tests.inputs import make_inputs
    x, opts = make_inputs()  # bf16, the sigmoid gate, beta logits: the emulated suite's variant
    ref, _ = kdacupy.kda_forward(*(x[n] for n in ARRAYS), **opts, backend="emulate")
    jx, jo = to_jax(x, opts)
    o = jax.jit(lambda *a: kj.kda(*a, **jo, backend="emulate")[0])(*(jx[n] for n in ARRAYS))
    assert np.array_equal(np.asarray(o), ref)


def test_example_layer_trains():
    """examples/jax_kda_layer.py: a few jitted Adam steps, the loss falls at every step."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "examples" / "jax_kda_layer.py"
    spec = importlib.util.spec_from_file_location("examples_jax_kda_layer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    losses = module.train(steps=4)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_errors_name_the_argument():
    x, opts = cast(*numpy_case("log-raw-beta"), np.float32)
    jx, jo = to_jax(x, opts)
    args = [jx[n] for n in ARRAYS]
    with pytest.raises(ValueError, match=r"^q: expected a 4-D array"):
        kj.kda(args[0][0], *args[1:], **jo)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"ValueError: g: expected shape"):  # in the callback
        jax.jit(lambda *a: kj.kda(*a, **jo)[0])(*args[:3], args[3][:, :, :1], args[4]).block_until_ready()
    with pytest.raises(TypeError, match=r"^qk_l2norm: expected a bool"):
        kj.kda(*args, qk_l2norm="yes")


DIFFERENTIABLE = ARRAYS + ("initial_state", "A_log", "dt_bias")


def _loss_parts(case, dtype=np.float64):
    x, opts = cast(*numpy_case(case), dtype)
    jx, jo = to_jax(x, opts)
    names = [n for n in DIFFERENTIABLE if n in jx or n in jo]
    static = {n: a for n, a in jo.items() if n not in names}

    def call(*xs):
        given = dict(zip(names, xs))
        return kj.kda(*(given[n] for n in ARRAYS), output_final_state=True,
                      **dict(static, **{n: given[n] for n in names if n not in ARRAYS}))

    return x, opts, names, [jx[n] if n in jx else jo[n] for n in names], call


#: the cases whose gradients test_grad_is_kda_backwards checks by default, test_check_grads_float64 the others
GRAD_SAMPLE = {"log-raw-beta", "softplus-varlen-vk"}


# (cover=False: each case's gradient is checked by default here or in test_check_grads_float64)
@pytest.mark.parametrize("case", sample(sorted(CASES), lambda c: c in GRAD_SAMPLE, cover=False))
def test_grad_is_kda_backwards(case, x64):
    """jax.grad (under jit) of sum(o * do) + sum(final * dfinal) equals kdacupy.kda_backward."""
    x, opts, names, args, call = _loss_parts(case)
    rng = np.random.default_rng(5)
    o, s = call(*args)
    do, ds = rng.standard_normal(o.shape), rng.standard_normal(s.shape)

    def loss(*xs):
        o, s = call(*xs)
        return (o * do).sum() + (s * ds).sum()

    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)
    ref = kdacupy.kda_backward(do, *(x[n] for n in ARRAYS), dfinal_state=ds, **opts)
    for n, r in zip(DIFFERENTIABLE, ref):
        if n in names:
            assert np.array_equal(np.asarray(grads[names.index(n)]), r), n


# (cover=False: the cases test_grad_is_kda_backwards leaves to the sweep)
@pytest.mark.parametrize("case", sample(sorted(CASES), lambda c: c not in GRAD_SAMPLE, cover=False))
def test_check_grads_float64(case, x64):
    """jax.test_util.check_grads: reverse mode against finite differences in float64."""
    from jax.test_util import check_grads
    _, _, _, args, call = _loss_parts(case)
    check_grads(lambda *xs: call(*xs), args, order=1, modes=("rev",), eps=1e-6, atol=1e-6, rtol=1e-6)


def test_vmap_of_grad_gives_per_example_gradients(x64):
    """Per-example gradients (vmap of grad, A_log shared): each is kda_backward's for its example."""
    x, opts = numpy_case("sigmoid-gva-l2norm")
    xs = {n: np.stack([a, 0.7 * a]) for n, a in x.items()}
    jx, jo = to_jax(xs, opts)

    def loss(q, k, v, g, beta, A_log):
        o, s = kj.kda(q, k, v, g, beta, output_final_state=True, **dict(jo, A_log=A_log))
        return o.sum() + 0.5 * s.sum()

    grads = jax.vmap(jax.grad(loss, argnums=(0, 5)), in_axes=(0, 0, 0, 0, 0, None))(
        *(jx[n] for n in ARRAYS), jo["A_log"])
    for i in range(2):
        o, s = kdacupy.kda_forward(*(xs[n][i] for n in ARRAYS), output_final_state=True, **opts)
        ref = kdacupy.kda_backward(np.ones_like(o), *(xs[n][i] for n in ARRAYS), dfinal_state=np.full_like(s, 0.5),
                                   **opts)
        assert np.array_equal(np.asarray(grads[0][i]), ref.dq)
        assert np.array_equal(np.asarray(grads[1][i]), ref.dA_log)


def test_grad_inside_shard_map_passes_its_checks(x64):
    """kda on a shard inside jax.shard_map (its default check_vma=True) under jax.grad: the
    callbacks' results are typed as varying like their inputs and each gradient like its
    argument, the shared A_log's and dt_bias's summed over the shards (it used to need
    check_vma=False: "the manual axis types do not match"). One device here;
    tests/dist/test_jax_cp.py runs four."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    x, opts = numpy_case("sigmoid-gva-l2norm")
    mesh = jax.make_mesh((1,), ("b",))
    rng = np.random.default_rng(2)
    o1, _ = kdacupy.kda_forward(*(x[n] for n in ARRAYS), **opts)
    do = rng.standard_normal(o1.shape)
    ref = kdacupy.kda_backward(do, *(x[n] for n in ARRAYS), **opts)
    jx, jo = to_jax(x, opts)
    static = {n: a for n, a in jo.items() if n not in ("A_log", "dt_bias")}
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    args = [put(jx[n], P("b")) for n in ARRAYS] + [put(jo[n], P()) for n in ("A_log", "dt_bias")]

    def shard_loss(q, k, v, g, beta, A_log, dt_bias, do):
        o, _ = kj.kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, **static)
        return jax.lax.psum((o * do).sum(), "b")

    loss = jax.shard_map(shard_loss, mesh=mesh, in_specs=(P("b"),) * 5 + (P(), P(), P("b")), out_specs=P())
    grads = jax.jit(jax.grad(loss, argnums=tuple(range(7))))(*args, put(jnp.asarray(do), P("b")))
    for n, got in zip(ARRAYS + ("A_log", "dt_bias"), grads):
        assert np.array_equal(np.asarray(got), getattr(ref, "d" + n)), n


def _grads(case, dtype, vmapped=False, **kw):
    """jax.grad (under jit) of a loss over o and the final state, every differentiable input; ``vmapped``: of
    two examples at once, A_log shared (per-index calls)."""
    x, opts, names, args, _ = _loss_parts(case, dtype)
    jo = {n: a for n, a in to_jax(x, opts)[1].items() if n not in names}

    def loss(*xs):
        given = dict(zip(names, xs))
        o, s = kj.kda(*(given[n] for n in ARRAYS), output_final_state=True, **jo,
                      **{n: given[n] for n in names if n not in ARRAYS}, **kw)
        return (o.astype(jnp.float32) * jnp.linspace(-1, 1, o.size).reshape(o.shape)).sum() + s.astype(
            jnp.float32).sum()

    if not vmapped:
        return jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)
    axes = tuple(0 if n in ARRAYS else None for n in names)
    stacked = [jnp.stack([a, 0.5 * a]) if n in ARRAYS else a for n, a in zip(names, args)]
    return jax.jit(jax.vmap(jax.grad(loss, argnums=tuple(range(len(args)))), in_axes=axes))(*stacked)


# (cover=False: the kept buffers under vmap are the sweep's; per-index calls run by default in
# test_vmap_with_mapped_parameters_runs_per_index, the same builds in the grad point)
@pytest.mark.parametrize("vmapped", sample([False, True], lambda v: not v, ids=lambda v: ["grad", "vmap-of-grad"][v],
                                           cover=False))
def test_save_for_backward_gives_the_same_gradients(vmapped):
    """The forward's kept buffer as a residual (emulated kernels: the backward reads it, one call per vmap
    index) and on the NumPy reference (nothing kept): the gradients of the stateless backward, to the bit."""
    from kdacupy.emulate import launched
    for backend, dtype in (("emulate", np.float32), (None, np.float64)):
        with jax.enable_x64(dtype == np.float64):
            want = _grads("sigmoid-gva-l2norm", dtype, vmapped, backend=backend)
            with launched() as kernels_run:
                got = jax.block_until_ready(_grads("sigmoid-gva-l2norm", dtype, vmapped, backend=backend,
                                                   save_for_backward=True))
        for a, b in zip(got, want):
            assert np.array_equal(np.asarray(a), np.asarray(b)), backend
        if backend == "emulate":  # per example: the kept forward's two launches, then the backward's three
            assert kernels_run == (1 + vmapped) * ["kda_prepare", "kda_recurrence"] + (1 + vmapped) * [
                "kda_bwd_chain", "kda_bwd_chunk", "kda_bwd_reduce"]


def test_save_for_backward_keeps_a_buffer_on_the_kernels():
    """The residual is kdacupy.saved_nbytes of XLA's memory on the kernels' backends, empty on the NumPy ones."""
    x, opts = cast(*numpy_case("sigmoid-gva-l2norm"), np.float32)
    jx, jo = to_jax(x, opts)
    args = [jx[n] for n in ARRAYS]
    for backend, size in (("emulate", kdacupy.saved_nbytes(x["q"].shape, x["v"].shape)), ("reference", 0)):
        _, vjp = jax.vjp(lambda *a: kj.kda(*a, **jo, backend=backend, save_for_backward=True)[0], *args)
        kept = [leaf for leaf in jax.tree_util.tree_leaves(vjp) if getattr(leaf, "dtype", None) == np.uint8]
        assert [k.shape for k in kept] == [(size,)], backend
    with pytest.raises(ValueError, match="sequence_parallel: expected None or 1 with save_for_backward"):
        kj.kda(*args, **jo, save_for_backward=True, sequence_parallel=2)

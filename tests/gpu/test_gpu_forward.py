"""The CUDA kernels on a GPU: parity with the precision model over the option
matrix (tolerance ``kdacupy.numerics.parity.GPU``, derived in its docstring), accuracy
against the float64 reference, determinism, 64-bit offsets, CUDA graphs,
streams, torch / JAX inputs and device-side errors. Skipped without a GPU
(tests/conftest.py). The T = 8192 sweep is in test_gpu_long.py (run last: it is the slowest)."""
import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX takes memory as it needs it, not 75%

import kdacupy
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.parity import GPU, mismatch
from kdacupy.numerics.precision import kda_model

from ..cases import CASES, case_inputs, check_against_reference
from ..inputs import make_inputs

cp = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.gpu  # skipped without a GPU (tests/conftest.py)


@pytest.fixture(autouse=True)
def free_device_memory():
    """Each test starts with CuPy's pools empty (the 2^31-offset test holds ~45 GB)."""
    yield
    from kdacupy.ops.forward import workspace
    workspace.release()
    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()


def to_dev(d):
    return {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in d.items()}


def gpu_run(x, opts, **kw):
    o, s = kdacupy.kda_forward(**to_dev(x), **to_dev(opts), **kw)
    return cp.asnumpy(o), (None if s is None else cp.asnumpy(s))


def agree(x, ref):
    why = mismatch(x, ref, GPU)
    assert why is None, why


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_the_model(name, precision):
    longer = {"cu_seqlens": [150, 0, 77, 300, 1]} if "cu_seqlens" in CASES[name][0] else {"T": 300}
    for size in ({}, longer):
        x, opts = case_inputs(name, precision, **size)
        o, s = gpu_run(x, opts)
        om, sm = kda_model(**x, **opts)
        assert o.dtype == om.dtype and s.dtype == sm.dtype
        agree(o, om)
        agree(s, sm)
        check_against_reference(name, x, opts, o, s)  # the definition itself, not only the model


def test_every_tail_length_zero_length_and_poisoned_out():
    lens = list(range(0, 18)) + [0]
    x, opts = make_inputs(cu_seqlens=lens, H=2, K=128, V=128, state=np.float32)
    out = cp.full(x["v"].shape, np.nan, dtype=BF16)
    o, s = kdacupy.kda_forward(**to_dev(x), **to_dev(opts), output_final_state=True, out=out)
    assert o is out
    om, sm = kda_model(**x, **opts, output_final_state=True)
    agree(cp.asnumpy(o), om)
    agree(cp.asnumpy(s), sm)
    np.testing.assert_array_equal(cp.asnumpy(s)[[0, -1]], opts["initial_state"][[0, -1]])


def test_two_runs_are_bitwise_equal():
    x, opts = make_inputs(T=4096, H=8, K=128, V=128, state=BF16)
    a = gpu_run(x, opts, output_final_state=True)
    b = gpu_run(x, opts, output_final_state=True)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def families_agree(arch, tile_sets, precision, monkeypatch):
    """The forward at each of ``tile_sets`` (the first mma.sync's) on an ``arch`` device: every later one
    bit for bit the first, the first of them against the model. Ragged varlen with a zero-length sequence,
    K = V = 128."""
    import kdacupy.ops.forward.kernels as kernels
    from kdacupy.jit import targets

    if targets.runtime_arch(targets.device_cc()) != arch:
        pytest.skip(f"the {tile_sets[1].mma} recurrence is {arch}'s")
    x, opts = make_inputs(cu_seqlens=[700, 0, 333, 16, 1], H=2, HV=4, K=128, V=128, state=np.float32)
    runs = []
    for tiles in tile_sets:
        monkeypatch.setattr(kernels, "select_tiles", lambda p, tiles=tiles: tiles)
        runs.append(gpu_run(x, opts, output_final_state=True, state_precision=precision))
    for o, s in runs[1:]:
        np.testing.assert_array_equal(o.view(np.uint16), runs[0][0].view(np.uint16))
        np.testing.assert_array_equal(s.view(np.uint32), runs[0][1].view(np.uint32))
    om, sm = kda_model(**x, **opts, output_final_state=True, state_precision=precision)
    agree(runs[1][0], om)
    agree(runs[1][1], sm)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_wgmma_and_mma_sync_agree_bit_for_bit(precision, monkeypatch):
    """On sm_90a both MMA families of the recurrence (docs/design.md section 5): the twins take each
    k16 step of both as the exact sum rounded once, so they agree to the bit; a difference here
    says the hardware's two families sum differently (the conformance probes of test_gpu_ptx.py
    say how). BV 64 and 128."""
    from kdacupy.ops.forward.tuning import TileConfig

    families_agree("sm_90a", (TileConfig(32, 2), TileConfig(64, 3, "wgmma"), TileConfig(128, 2, "wgmma")),
                   precision, monkeypatch)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_tcgen05_and_mma_sync_agree_bit_for_bit(precision, monkeypatch):
    """On sm_100a both MMA families of the recurrence (kernels/recurrence_tcgen05.cuh): the twins take each
    k16 step of both as the exact sum rounded once, so they agree to the bit; a difference here says the
    hardware's families sum differently, or a twin's layout assumption (A in tensor memory, two bf16 a
    column, M = 64's second lanes) is wrong (test_gpu_ptx.py's tcgen05 probes say which). BV = 128 at 2
    and 3 stages and BV = 64."""
    from kdacupy.ops.forward.tuning import TileConfig

    families_agree("sm_100a", (TileConfig(64, 3), TileConfig(128, 2, "tcgen05"), TileConfig(128, 3, "tcgen05"),
                               TileConfig(64, 3, "tcgen05")), precision, monkeypatch)


def test_offsets_beyond_2_to_the_31():
    # T * H * K = 2^31 + ...: the last sequence sits past every 32-bit offset
    H, K = 64, 128
    T = (1 << 31) // (H * K) + 64
    rng = cp.random.default_rng(7)
    shape = (1, T, H, K)
    q, k, v, g = (rng.standard_normal(shape, dtype=cp.float32).astype(BF16) for _ in range(4))
    beta = rng.standard_normal((1, T, H), dtype=cp.float32).astype(BF16)
    cu = cp.asarray(np.array([0, T - 100, T], dtype=np.int64))
    opts = dict(qk_l2norm=True, beta_sigmoid=True, gate="sigmoid", lower_bound=-5.0, cu_seqlens=cu,
                output_final_state=True)
    o, s = kdacupy.kda_forward(q, k, v, g, beta, **opts)
    tail = {n: cp.asnumpy(a[:, T - 100:]) for n, a in dict(q=q, k=k, v=v, g=g, beta=beta).items()}
    om, sm = kda_model(**tail, **dict(opts, cu_seqlens=None))
    agree(cp.asnumpy(o[:, T - 100:]), om)
    agree(cp.asnumpy(s[1:]), sm)


def captured_and_replayed(x, opts, warm=False):
    """kda_forward(output_final_state=True) captured into a graph on a new stream, its o and final state
    zeroed and the graph replayed: (the uncaptured run first when ``warm``, or None; the replay's (o, s))."""
    dx, dopts = to_dev(x), to_dev(opts)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ref = kdacupy.kda_forward(**dx, **dopts, output_final_state=True) if warm else None  # compile, pool blocks
        stream.begin_capture()
        o, s = kdacupy.kda_forward(**dx, **dopts, output_final_state=True)
        graph = stream.end_capture()
        o.fill(0)
        s.fill(0)
        graph.launch(stream)
        stream.synchronize()
    return ref, (o, s)


def test_cuda_graph_capture_and_replay():
    """The replay writes o and the final state again: both are zeroed first (nothing stale can
    pass), and the uncaptured run they must equal bitwise agrees with the model."""
    x, opts = make_inputs(cu_seqlens=[100, 0, 333], H=4, K=128, V=128, state=BF16)
    ref, (o, s) = captured_and_replayed(x, opts, warm=True)
    np.testing.assert_array_equal(cp.asnumpy(o), cp.asnumpy(ref[0]))
    np.testing.assert_array_equal(cp.asnumpy(s), cp.asnumpy(ref[1]))
    om, sm = kda_model(**x, **opts, output_final_state=True)
    agree(cp.asnumpy(ref[0]), om)
    agree(cp.asnumpy(ref[1]), sm)


def test_graph_replay_survives_allocations_between_capture_and_replay():
    # a per-call workspace would go back to the pool at the end of the captured call, the
    # arrays below would get its memory, and every replay would overwrite them
    x, opts = make_inputs(cu_seqlens=[100, 0, 333], H=4, K=128, V=128, state=BF16)
    dx, dopts = to_dev(x), to_dev(opts)
    dopts["cu_seqlens"] = cp.repeat(dopts["cu_seqlens"], 2)[::2]  # strided: copied into the workspace
    assert not dopts["cu_seqlens"].flags.c_contiguous
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ref = kdacupy.kda_forward(**dx, **dopts, output_final_state=True)  # warm: compile, size the workspace
        stream.begin_capture()
        o, s = kdacupy.kda_forward(**dx, **dopts, output_final_state=True)
        graph = stream.end_capture()
        junk = [cp.full(1 << n, 7, dtype=cp.uint8) for n in range(8, 27)]  # 256 B .. 64 MiB
        v2 = cp.asarray((x["v"].astype(np.float32) * 2).astype(BF16))
        other = kdacupy.kda_forward(**dict(dx, v=v2), **dopts)[0]  # another call in between
        o.fill(0)
        s.fill(0)
        graph.launch(stream)
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(o), cp.asnumpy(ref[0]))
    np.testing.assert_array_equal(cp.asnumpy(s), cp.asnumpy(ref[1]))
    assert all(bool((j == 7).all()) for j in junk)
    assert not np.array_equal(cp.asnumpy(other), cp.asnumpy(o))


def test_host_cu_seqlens_is_refused_during_capture():
    x, opts = make_inputs(cu_seqlens=[10, 20], H=2, K=64, V=64)
    dx, dopts = to_dev(x), to_dev(opts)
    host = dict(dopts, cu_seqlens=opts["cu_seqlens"])  # every copy to the device made before the capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        kdacupy.kda_forward(**dx, **dopts)  # warm
        stream.begin_capture()
        try:
            with pytest.raises(ValueError, match="cu_seqlens: expected a device .CuPy. array while the current "
                                                 "stream is capturing"):
                kdacupy.kda_forward(**dx, **host)
        finally:
            stream.end_capture()


def test_workspace_is_one_per_stream_and_persists():
    from kdacupy.ops.forward import workspace
    x, opts = make_inputs(T=100, H=2, K=64, V=64)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with s1:
        kdacupy.kda_forward(**to_dev(x), **to_dev(opts))
        a = workspace.device_workspace(1).data.ptr
    with s2:
        kdacupy.kda_forward(**to_dev(x), **to_dev(opts))
        b = workspace.device_workspace(1).data.ptr
    with s1:
        kdacupy.kda_forward(**to_dev(x), **to_dev(opts))
        assert workspace.device_workspace(1).data.ptr == a != b
    cp.cuda.Device().synchronize()


def test_runs_on_the_current_stream():
    x, opts = make_inputs(T=1000, H=4, K=128, V=128)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        o, _ = kdacupy.kda_forward(**to_dev(x), **to_dev(opts))
        stream.synchronize()
    om, _ = kda_model(**x, **opts)
    agree(cp.asnumpy(o), om)


def test_each_variant_compiles_once_per_process():
    from kdacupy.jit.loaders import loader
    x, opts = make_inputs(T=64, H=2, K=64, V=64)
    gpu_run(x, opts)
    n = len(loader("cuda")._cache)
    gpu_run(x, opts)
    assert len(loader("cuda")._cache) == n


def test_torch_and_jax_inputs_zero_copy():
    x, opts = make_inputs(T=200, H=2, K=128, V=128)
    ref, _ = gpu_run(x, opts)
    ran = False
    try:
        import torch
        tx = {n: torch.from_dlpack(cp.asarray(a)) for n, a in x.items()}
        o, _ = kdacupy.kda_forward(**tx, **to_dev(opts))
        assert isinstance(o, cp.ndarray)
        np.testing.assert_array_equal(cp.asnumpy(o), ref)
        # inputs still being written on torch's current stream (a side stream): from_dlpack hands
        # CuPy's stream to torch's __dlpack__(stream=...), which makes it wait for those writes
        side = torch.cuda.Stream()
        dopts = to_dev(opts)
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU time before the copies land
            tx = {n: t.clone() for n, t in tx.items()}
            o, _ = kdacupy.kda_forward(**tx, **dopts)
        np.testing.assert_array_equal(cp.asnumpy(o), ref)
        torch.cuda.synchronize()
        ran = True
    except ImportError:
        pass
    try:
        import jax
        import jax.numpy as jnp
        if any(d.platform == "gpu" for d in jax.devices()):
            jx = {n: jnp.asarray(a) for n, a in x.items()}
            o, _ = kdacupy.kda_forward(**jx, **to_dev(opts))
            np.testing.assert_array_equal(cp.asnumpy(o), ref)
            ran = True
    except ImportError:
        pass
    if not ran:
        pytest.skip("neither torch nor JAX (with a GPU) is installed")


def test_bad_device_input():
    x, opts = make_inputs(T=32, H=2, K=64, V=64)
    dx = to_dev(x)
    with pytest.raises(ValueError, match="v: expected a CuPy"):
        kdacupy.kda_forward(**dict(dx, v=x["v"]), **to_dev(opts))
    with pytest.raises(ValueError, match="backend: expected NumPy arrays for backend='emulate'"):
        kdacupy.kda_forward(**dx, **to_dev(opts), backend="emulate")
    out = cp.full(x["v"].shape, 7, dtype=BF16)
    with pytest.raises(ValueError, match="lower_bound"):
        kdacupy.kda_forward(**dx, **dict(to_dev(opts), lower_bound=1.0), out=out)
    assert bool((out == 7).all())
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device(1):
            v1 = cp.asarray(x["v"])
        with pytest.raises(ValueError, match="v: expected an array on the current CUDA device"):
            kdacupy.kda_forward(**dict(dx, v=v1), **to_dev(opts))


@pytest.mark.parametrize("name", ["repeat-key g=0 T=8192", "repeat-key slow beta~2"])
def test_long_repeated_keys_against_the_reference(name):
    # one key for 8192 tokens (no decay, beta ~ 0.98; slow decay, beta ~ 1.96): the inputs
    # that broke the fp16 Neumann inverse. At this length kernel-vs-model differences
    # reach the model's own error (docs/design.md section 2), so the check is the float64
    # reference: the kernels' error within REF_FACTOR (1.1) of the model's on the same inputs
    # (tests/numerics/test_adversarial.py; rehearsed under KDACUPY_EMULATE_NUMERICS=hardware
    # on these inputs: within 0.4%).
    from kdacupy.cli.accuracy import adversarial_inputs
    from kdacupy.numerics.reference import kda_reference

    from ..numerics.test_adversarial import errors, within_model
    x, opts = adversarial_inputs(name, 8192, 4, 128, 128, seed=6)
    o, s = gpu_run(x, opts)
    ref = kda_reference(**x, **{n: v for n, v in opts.items() if n != "state_dtype"})
    within_model(errors(o, s, *ref), errors(*kda_model(**x, **opts), *ref))


@pytest.mark.parametrize("gate", ["log", "softplus", "sigmoid"])
def test_gates_by_hand(gate):
    """The gate as the prepare kernel computes it, against the definition written out in
    tests/activations.py (test_activations.py runs the same on the model and the emulation)."""
    from .. import activations as act
    act.forward_gate(gpu_run, gate)


@pytest.mark.parametrize("mode", ["none", "raw", "sigmoid", "neg_eigval"])
def test_beta_by_hand(mode):
    from .. import activations as act
    act.forward_beta(gpu_run, mode)


@pytest.mark.parametrize("producers", [None, 1])
def test_fused_forward_is_the_two_launch_forward_bit_for_bit(producers, monkeypatch):
    """The fused forward (kernels/kda_forward_fused.cu, a cooperative launch on sm_90a) against the two
    launches at its tiles: the same bits, the first against the model; every block the device holds beside
    the consumers producing, and a single producer (the ring full most of the time). Ragged varlen with a
    zero-length sequence (the slots no sequence uses), then a CUDA graph's replay of the fused call."""
    import kdacupy.ops.forward.fused as fused
    import kdacupy.ops.forward.kernels as kernels
    from kdacupy.jit import targets
    from kdacupy.ops.forward.tuning import TileConfig

    if targets.runtime_arch(targets.device_cc()) != "sm_90a":
        pytest.skip("the fused forward is sm_90a's (the wgmma chain)")
    x, opts = make_inputs(cu_seqlens=[700, 0, 333, 16, 1], H=2, HV=4, K=128, V=128, state=np.float32)
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(64, 3, "wgmma"))
    monkeypatch.setattr(fused, "pays", lambda *a, **k: False)
    two = gpu_run(x, opts, output_final_state=True)
    monkeypatch.setattr(fused, "pays", lambda *a, **k: True)
    real = fused.forward_fused
    monkeypatch.setattr(fused, "forward_fused", lambda *a: real(*a[:8], producers, *a[9:]))
    one = gpu_run(x, opts, output_final_state=True)
    np.testing.assert_array_equal(one[0].view(np.uint16), two[0].view(np.uint16))
    np.testing.assert_array_equal(one[1].view(np.uint32), two[1].view(np.uint32))
    om, sm = kda_model(**x, **opts, output_final_state=True)
    agree(two[0], om)
    agree(two[1], sm)
    _, (o, s) = captured_and_replayed(x, opts)
    np.testing.assert_array_equal(cp.asnumpy(o).view(np.uint16), two[0].view(np.uint16))
    np.testing.assert_array_equal(cp.asnumpy(s).view(np.uint32), two[1].view(np.uint32))

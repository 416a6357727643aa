"""What a new user ran into (one test per rough edge): defaults that must agree,
errors that must name the right argument, every backend applying the kernels'
input rules."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.reference import kda_reference

from ..inputs import make_inputs, rmse_ratio


# ---------------------------------------------------------------------------
# one pool, one layout


def test_prefill_then_decode_with_default_layouts_is_the_one_call_result():
    """kda_forward(state_pool=) and kda_decode on one pool with no state_layout given: the
    forward's pooled default is the decode's ("vk"), so the decode step continues the
    prefilled state. K == V, where a layout mix-up is not caught by any shape check."""
    T, K = 20, 64
    x, opts = make_inputs(B=2, T=T + 1, H=1, HV=2, K=K, V=K, seed=3)
    pre = {n: a[:, :T] for n, a in x.items()}
    step = {n: a[:, T:] for n, a in x.items()}
    pool = np.zeros((5, 2, K, K), np.float32)
    rng = np.random.default_rng(4)
    s0 = (0.5 * rng.standard_normal((2, 2, K, K))).astype(np.float32)  # [N, HV, K, V]
    slots = np.array([3, 1], np.int32)
    pool[slots] = s0.swapaxes(-1, -2)  # the pool is "vk"; its slots hold S^T
    kdacupy.kda_forward(**pre, **opts, state_pool=pool, state_indices=slots)
    o1 = kdacupy.kda_decode(**step, **opts, state_pool=pool, state_indices=slots)
    # the whole sequence in one float64 call from the same states
    ref, _ = kda_reference(**{n: a.astype(np.float64) for n, a in x.items()},
                           **{n: v for n, v in opts.items()}, initial_state=s0.astype(np.float64))
    assert rmse_ratio(o1, ref[:, T:]) < 1e-2  # bf16 output rounding; a layout mix-up gives ~1


# ---------------------------------------------------------------------------
# the GPU tests' skip reason, in plain words


class _FakeRuntimeError(Exception):
    def __init__(self, status):
        super().__init__(f"cudaError {status}")
        self.status = status


def _fake_cupy(monkeypatch, driver, count=None, status=None):
    import sys
    import types

    def device_count():
        if status is not None:
            raise _FakeRuntimeError(status)
        return count

    rt = types.SimpleNamespace(driverGetVersion=lambda: driver, runtimeGetVersion=lambda: 13000,
                               getDeviceCount=device_count)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt)))


@pytest.mark.parametrize("driver, count, status, said", [
    (0, None, None, "no CUDA GPU (no NVIDIA driver found)"),
    (12040, None, 35, "no usable CUDA GPU (the NVIDIA driver supports CUDA up to 12.4, older than the CUDA 13.0 "
                      "runtime)"),
    (13000, None, 100, "no CUDA GPU (the NVIDIA driver sees no device)"),
    (13000, 0, None, "no CUDA GPU (the NVIDIA driver sees no device)"),
    (13000, 2, None, None),
])
def test_why_no_gpu_says_it_in_plain_words(monkeypatch, driver, count, status, said):
    from kdacupy.jit.device import why_no_gpu
    _fake_cupy(monkeypatch, driver, count, status)
    assert why_no_gpu() == said


def test_the_gpu_skip_reason_is_plain_words():
    from kdacupy.jit.device import why_no_gpu
    from ..conftest import MARKERS, missing
    why = why_no_gpu()
    assert missing("gpu") == why
    if why is not None:  # this machine has no GPU: the reason a skipped GPU test shows
        assert why.startswith(("no CUDA GPU", "no usable CUDA GPU")) and "Error" not in why.split("(")[0]
        assert MARKERS["gpu"].startswith("needs a CUDA GPU")


# ---------------------------------------------------------------------------
# smaller: the right argument blamed, nothing accepted silently


def test_q_with_no_heads_blames_q():
    x, opts = make_inputs(T=4, H=1, K=64, V=64)
    x = dict(x, q=x["q"][:, :, :0], k=x["k"][:, :, :0])
    with pytest.raises(ValueError, match=r"^q: expected at least one query/key head"):
        kdacupy.kda_forward(**x, **opts)


def test_state_dtype_without_output_final_state_is_refused():
    x, opts = make_inputs(T=4, H=1, K=64, V=64)
    with pytest.raises(ValueError, match=r"^state_dtype: expected None without output_final_state=True"):
        kdacupy.kda_forward(**x, **opts, state_dtype=np.float32)
    o, s = kdacupy.kda_forward(**x, **opts, state_dtype=np.float32, output_final_state=True)
    assert s.dtype == np.float32


def test_more_segments_than_chunks_warns():
    from kdacupy.seqpar import SegmentWarning
    x, opts = make_inputs(T=40, H=1, K=64, V=64)  # 3 chunks
    with pytest.warns(SegmentWarning, match=r"sequence_parallel=5 is more than the 3 16-token chunk\(s\) of T = 40"):
        kdacupy.kda_forward(**x, **opts, backend="model", sequence_parallel=5)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kdacupy.kda_forward(**x, **opts, backend="model", sequence_parallel=3)


@pytest.mark.parametrize("name, value", [("KDACUPY_EMULATE_CHECK", "memchek"), ("KDACUPY_EMULATE_NUMERICS", "fast"),
                                         ("KDACUPY_EMULATE_ORDER", "sideways"),
                                         ("KDACUPY_EMULATE_CP_ASYNC", "late")])
def test_bad_emulation_switches_raise_the_documented_env_error(monkeypatch, name, value):
    from kdacupy.emulate import EmulationError
    from kdacupy.emulate.loader import _mode, checks
    from kdacupy.emulate.numerics import mode
    from kdacupy.env import EnvError
    monkeypatch.setenv(name, value)
    read = {"KDACUPY_EMULATE_CHECK": checks, "KDACUPY_EMULATE_NUMERICS": mode}.get(name, _mode)
    with pytest.raises(EnvError, match=f"^{name}='{value}' is not valid") as e:
        read()
    assert isinstance(e.value, EmulationError) and isinstance(e.value, ValueError)


def test_a_cp_rank_mismatch_in_cu_seqlens_shows_the_values():
    """kda_forward_cp's agreement check compares each rank's signature: a mismatch names the
    offsets, not their hashes (two ranks simulated: rank 1's signature from other offsets)."""
    from kdacupy.distributed.agree import collective_check
    from kdacupy.distributed.call import LocalCall
    x, opts = make_inputs(T=8, H=1, K=64, V=64)
    locals_ = [LocalCall(*(x[n] for n in "qkvg"), x["beta"], cu_seqlens=np.array(cu), options=opts)
               for cu in ([0, 3, 20], [0, 4, 20])]

    class TwoRanks:
        requires_device = False  # an MPI communicator (NCCL would need device arrays)

        def allgather_obj(self, info):
            other = dict(info, sig=locals_[1].signature())
            return [info, other]

    with pytest.raises(ValueError) as e:
        collective_check(TwoRanks(), "kda_forward_cp", lambda: locals_[0])
    assert "disagree on cu_seqlens: rank 0 has [0, 3, 20], rank 1 has [0, 4, 20]" in str(e.value)


# ---------------------------------------------------------------------------
# the kernels' input rules on every backend


def _strided_last_dim(x):
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


def _misaligned_rows(x):
    buf = np.zeros(x.size * x.itemsize + 64, np.uint8)
    off = 2 if buf.ctypes.data % 16 == 0 else 16 - buf.ctypes.data % 16 + 2
    y = buf[off:off + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


@pytest.mark.parametrize("backend", ["reference", "model"])
@pytest.mark.parametrize("make, said", [(_strided_last_dim, "a contiguous last dim"),
                                        (_misaligned_rows, "rows starting on 16-byte boundaries")])
def test_cpu_backends_refuse_what_the_kernels_refuse(backend, make, said):
    x, opts = make_inputs(T=8, H=1, K=64, V=64)
    bad = dict(x, q=make(x["q"]))
    np.testing.assert_array_equal(bad["q"], x["q"])
    with pytest.raises(ValueError, match=f"^q: expected {said}"):
        kdacupy.kda_forward(**bad, **opts, backend=backend)
    from ..decode_inputs import make_decode
    xd, od, pool = make_decode(N=2, T=1, H=1, K=64, V=64)
    with pytest.raises(ValueError, match=f"^k: expected {said}"):
        kdacupy.kda_decode(**dict(xd, k=make(xd["k"])), **od, state_pool=pool, backend=backend)


# ---------------------------------------------------------------------------
# keyword help beyond kda_forward


@pytest.mark.parametrize("name, hint", [
    ("ssm_state_indices", "state_indices"), ("inplace_final_state", "state_pool="),
    ("state_v_first", "state_layout='vk'"), ("initial_state", "state_pool="),
    ("use_qk_l2norm_in_kernel", "qk_l2norm=True"), ("state_precision", "nothing: kda_decode keeps the state in fp32"),
])
def test_kda_decode_names_kdacupys_spelling(name, hint):
    from ..decode_inputs import make_decode
    x, opts, pool = make_decode(N=2, T=1, H=1, K=64, V=64)
    with pytest.raises(TypeError, match=rf"^kda_decode\(\) got an unexpected keyword argument '{name}': "
                                        rf"kdacupy spells it {hint}"):
        kdacupy.kda_decode(**x, **opts, state_pool=pool, **{name: True})


def test_kda_forward_knows_fla_0_6_names():
    x, opts = make_inputs(T=4, H=1, K=64, V=64)
    with pytest.raises(TypeError, match=r"'state_v_first': kdacupy spells it state_layout='vk'"):
        kdacupy.kda_forward(**x, **opts, state_v_first=True)


def test_seqpar_explain_takes_the_forwards_keywords_and_names_flas():
    from kdacupy import seqpar
    x, opts = make_inputs(T=40, H=1, K=64, V=64, state=np.float32)
    assert seqpar.explain(**x, **opts, state_precision="fp32", output_final_state=True, state_dtype=BF16) == (
        1, "off: backend 'reference' runs serially unless sequence_parallel is given")
    pool = np.zeros((2, 1, 64, 64), np.float32)
    pooled = {n: v for n, v in opts.items() if n not in ("initial_state", "state_layout")}
    n, why = seqpar.explain(**x, **pooled, state_pool=pool, state_indices=np.array([0], np.int32), sm_count=132)
    assert n == 1 and "state_pool" in why
    with pytest.raises(TypeError, match=r"explain\(\) got an unexpected keyword argument 'use_qk_l2norm_in_kernel': "
                                        r"kdacupy spells it qk_l2norm=True"):
        seqpar.explain(**x, use_qk_l2norm_in_kernel=True)


def test_state_maps_take_the_forwards_layout_and_precision():
    """state_layout="vk": the maps for [V, K] states (S0 @ M^T + B^T is the vk final state);
    state_precision is accepted (the maps are fp32 runs for either)."""
    from kdacupy import seqpar
    x, opts = make_inputs(T=40, H=1, HV=2, K=64, V=64, state=np.float32, state_layout="vk")
    s0 = opts.pop("initial_state").astype(np.float64)
    opts.pop("state_layout")
    Mt, Bt = seqpar.state_maps(**x, **opts, state_layout="vk", state_precision="fp32")
    M, B = seqpar.state_maps(**x, **opts)
    np.testing.assert_array_equal(Mt, M.swapaxes(-1, -2))
    np.testing.assert_array_equal(Bt, B.swapaxes(-1, -2))
    _, s_end = kda_reference(**{n: a.astype(np.float64) for n, a in x.items()}, **opts, initial_state=s0,
                             state_layout="vk", output_final_state=True)
    np.testing.assert_allclose(s0 @ Mt + Bt, s_end, rtol=1e-9, atol=1e-9)
    with pytest.raises(TypeError, match=r"'initial_state': the maps do not depend on a state"):
        seqpar.state_maps(**x, **opts, initial_state=s0)


# ---------------------------------------------------------------------------
# pool indices under CUDA-graph capture (faked: no GPU needed)


def _fake_device_array(host):
    """A cupy.ndarray over host memory: enough for the checks, which read flags and strides only."""
    cp = pytest.importorskip("cupy")
    mem = cp.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0)
    return cp.ndarray(host.shape, host.dtype, memptr=cp.cuda.MemoryPointer(mem, 0), strides=host.strides)


@pytest.mark.parametrize("which", ["state_indices", "num_accepted_tokens"])
@pytest.mark.parametrize("kind", ["host", "strided device"])
def test_indices_that_need_a_copy_are_refused_while_capturing(monkeypatch, which, kind):
    import re
    from kdacupy.validation import pool as pool_checks
    N, T = 4, 2
    good = dict(state_indices=_fake_device_array(np.arange(N * T, dtype=np.int32).reshape(N, T)),
                num_accepted_tokens=_fake_device_array(np.ones(N, np.int32)))
    if kind == "host":
        bad = np.arange(N * T, dtype=np.int32).reshape(N, T) if which == "state_indices" else np.ones(N, np.int32)
        said = "a device (CuPy) array while the current stream is capturing a CUDA graph (a graph cannot hold"
    else:
        wide = np.ones((N, 2 * T) if which == "state_indices" else 2 * N, np.int32)
        bad = _fake_device_array(wide)[:, ::2] if which == "state_indices" else _fake_device_array(wide)[::2]
        said = "a C-contiguous device array while the current stream is capturing a CUDA graph (a contiguous copy"
    args = dict(good, **{which: bad})
    monkeypatch.setattr(pool_checks, "capturing", lambda cp: True)
    with pytest.raises(ValueError, match="^" + re.escape(f"{which}: expected {said}")):
        pool_checks.check_indices(args["state_indices"], args["num_accepted_tokens"], N=N, T=T, P=9, device=True)
    monkeypatch.setattr(pool_checks, "capturing", lambda cp: False)  # not capturing: no refusal (a copy is fine)
    if kind == "strided device":
        monkeypatch.setattr(pool_checks, "cupy_module", lambda: type("xp", (), dict(
            ascontiguousarray=staticmethod(lambda a: a), asarray=staticmethod(lambda a: a))))
        pool_checks.check_indices(args["state_indices"], args["num_accepted_tokens"], N=N, T=T, P=9, device=True)


def test_kda_forward_and_kda_decode_check_their_indices_in_one_place(monkeypatch):
    """Both public calls reach pool.check_indices (so the capture rule holds for both)."""
    from kdacupy.validation import pool as pool_checks
    from ..decode_inputs import make_decode

    class Reached(Exception):
        pass

    def check(*a, **k):
        raise Reached

    monkeypatch.setattr(pool_checks, "check_indices", check)
    x, opts, pool = make_decode(N=2, T=1, H=1, K=64, V=64)
    with pytest.raises(Reached):
        kdacupy.kda_decode(**x, **opts, state_pool=pool)
    with pytest.raises(Reached):
        kdacupy.kda_forward(**x, **{n: v for n, v in opts.items() if n != "state_indices"}, state_pool=pool,
                            state_indices=opts["state_indices"])

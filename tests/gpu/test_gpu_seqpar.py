"""Sequence parallelism on a GPU: the maps against the precision model, the
split against the serial run and the model's split (``kdacupy.numerics.parity.GPU``)
and against the float64 reference (no worse than serial), no host sync (CUDA graph
capture), the auto choice. Skipped without a GPU."""
import numpy as np
import pytest

import kdacupy
from kdacupy import seqpar
from kdacupy.numerics.dtypes import BF16
from kdacupy.numerics.parity import GPU, mismatch

from ..cases import CASES, case_inputs
from ..inputs import make_inputs, rmse_ratio
from ..seqpar_checks import check_split

cp = pytest.importorskip("cupy", reason="CuPy is not installed")


def to_dev(d):
    return {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in d.items()}


def host(x):
    return None if x is None else cp.asnumpy(x)


def agree(x, ref):
    why = mismatch(x, ref, GPU)
    assert why is None, why


@pytest.mark.parametrize("name", list(CASES))
def test_split_matches_serial(name):
    """Split against serial, against the model's split (a bug shared by the GPU's split and
    serial paths shows there) and no worse than serial against the float64 reference: the
    check test_seqpar.py runs on the emulated kernels (tests/seqpar_checks.py). Rehearsed at
    these sizes under KDACUPY_EMULATE_NUMERICS=hardware: split against the model's split at
    most 1.5e-3 of the range, RMS ratio 1.2e-4 (GPU allows 2^-5, 2^-8)."""
    longer = {"cu_seqlens": [150, 0, 77, 300, 1]} if "cu_seqlens" in CASES[name][0] else {"T": 300}
    x, opts = case_inputs(name, "bf16", **longer)

    def run(x, opts, n):
        o, s = kdacupy.kda_forward(**dict(to_dev(x), **to_dev(opts)), sequence_parallel=n)
        return host(o), host(s)
    check_split(run, x, opts, 5, GPU, GPU)


def test_maps_match_the_model():
    x, opts = make_inputs(cu_seqlens=[300, 0, 77], H=2, HV=4, K=128, V=128)
    M, B = seqpar.state_maps(**to_dev(x), **to_dev(opts))
    Mm, Bm = seqpar.state_maps(**x, **opts, backend="model")
    assert isinstance(M, cp.ndarray) and M.dtype == np.float32
    agree(host(M), Mm)
    agree(host(B), Bm)
    np.testing.assert_array_equal(host(M)[1], np.broadcast_to(np.eye(128), (4, 128, 128)))


def test_long_sequence_accuracy_no_worse_than_serial():
    from kdacupy.cli.accuracy import OPTIONS, make_inputs as sweep_inputs
    from kdacupy.numerics.reference import kda_reference
    x = sweep_inputs(8192, 4, 128, 128, "N(0,8)", "U(-8,8)", seed=1)
    ref_o, ref_s = kda_reference(**x, **{n: v for n, v in OPTIONS.items() if n != "state_dtype"})
    d = dict(to_dev(x), **to_dev(OPTIONS))
    o1, s1 = (host(a) for a in kdacupy.kda_forward(**d, sequence_parallel=1))
    for n in (8, 32):
        o2, s2 = (host(a) for a in kdacupy.kda_forward(**d, sequence_parallel=n))
        assert rmse_ratio(o2, ref_o) <= 1.05 * rmse_ratio(o1, ref_o) + 1e-4
        assert rmse_ratio(s2, ref_s) <= 1.05 * rmse_ratio(s1, ref_s) + 1e-4


def test_capture_runs_serially_and_an_explicit_split_is_refused():
    """The split allocates per-call temporaries a captured graph would keep after CuPy's
    pool reuses them: under capture the auto choice is serial, an explicit n >= 2 an error."""
    x, opts = make_inputs(T=20000, H=1, HV=1, K=128, V=128, state=BF16, state_layout="vk")
    d = dict(to_dev(x), **to_dev(opts))
    out = cp.zeros(x["v"].shape, dtype=BF16)
    ref_o, ref_s = kdacupy.kda_forward(**d, output_final_state=True, sequence_parallel=1)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        kdacupy.kda_forward(**d, output_final_state=True, out=out)  # compile, allocate
        stream.begin_capture()
        try:
            with pytest.raises(ValueError, match="sequence_parallel: expected None or 1 while the current stream"):
                kdacupy.kda_forward(**d, output_final_state=True, sequence_parallel=4, out=out)
            o, s = kdacupy.kda_forward(**d, output_final_state=True, out=out)
        finally:
            graph = stream.end_capture()
        junk = [cp.full(x["v"].shape, 7, dtype=BF16) for _ in range(4)]  # reuse freed blocks
        out.fill(0)
        graph.launch(stream)
        stream.synchronize()
    del junk
    np.testing.assert_array_equal(host(out), host(ref_o))
    np.testing.assert_array_equal(host(s), host(ref_s))


def test_auto_choice_on_this_device():
    x, opts = make_inputs(T=16, H=1, K=64, V=64)
    n, why = seqpar.explain(**to_dev(x), **to_dev(opts))
    assert n == 1 and why.startswith("off")  # 16 tokens never pay


@pytest.mark.parametrize("producers", [None, 1])
def test_the_split_makes_its_last_segments_in_the_final_launch(producers, monkeypatch):
    """sm_90a: the split with its maps' launch and its final launch as the fused forward's builds (the maps'
    producers writing the workspace of every segment but the last, the final launch's making the last segments
    through the ring; cooperative launches; no prepare launch) is the plain split bit for bit, with every block
    the device holds beside the chains producing and with one producer; two sequences, so two streams a head."""
    import kdacupy.ops.forward.fused as fused
    import kdacupy.ops.forward.kernels as kernels
    from kdacupy.jit import targets
    from kdacupy.ops.forward.tuning import TileConfig

    if targets.runtime_arch(targets.device_cc()) != "sm_90a":
        pytest.skip("the split's fused final launch is sm_90a's (the wgmma chain)")
    x, opts = make_inputs(B=2, T=1500, H=2, HV=4, K=128, V=128, state=np.float32)
    monkeypatch.setattr(kernels, "select_tiles", lambda p, **kw: TileConfig(64, 3, "wgmma"))
    d = dict(to_dev(x), **to_dev(opts))

    def run():
        o, s = kdacupy.kda_forward(**d, output_final_state=True, sequence_parallel=4)
        return host(o), host(s)

    monkeypatch.setenv("KDACUPY_FORWARD_FUSED", "off")
    plain = run()
    launched = []
    real = fused.launch_fused
    monkeypatch.setattr(fused, "launch_fused", lambda *a, **kw: launched.append(kw.get("seg_n")) or real(*a, **kw))
    if producers is not None:
        monkeypatch.setattr(fused, "split_producers", lambda *a: producers)
    monkeypatch.setenv("KDACUPY_FORWARD_FUSED", "on")
    got = run()
    assert launched == [4, 4]  # the maps' launch, then the final one
    np.testing.assert_array_equal(got[0].view(np.uint16), plain[0].view(np.uint16))
    np.testing.assert_array_equal(got[1].view(np.uint32), plain[1].view(np.uint32))

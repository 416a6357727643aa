"""``python -m kdacupy.bench --shapes decode`` without a GPU: what it finds in
the installed FLA (a faked ``fla`` package with fla-core 0.6.0's signature of
``fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd``, an older one, one
without a pool), the keywords it would pass (every one a named parameter of
that signature, none lost in ``**kwargs``), the three times it reports per step
and how the host's share follows from them, and ``--decode-n``."""
import functools
import inspect
import sys
import types

import numpy as np
import pytest

import kdacupy.cli.bench as bench
import kdacupy.cli.bench_decode as bd
import kdacupy.cli.peers as peers
import kdacupy.cli.timing as timing


def fwd_060(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None, output_final_state=False,
            inplace_final_state=True, state_v_first=False, cu_seqlens=None, ssm_state_indices=None,
            num_accepted_tokens=None, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, out=None, **kwargs):
    """fla-core 0.6.0's fused_recurrent_kda_fwd signature (fla/ops/kda/fused_recurrent.py)."""


def fwd_old(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None, output_final_state=False,
            inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, lower_bound=None,
            transpose_state_layout=False, use_beta_sigmoid_in_kernel=False, **kwargs):
    """An older release: transpose_state_layout, no out."""


def public_only(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
                cu_seqlens=None, **kwargs):
    """A module whose fused_recurrent_kda_fwd takes no pool."""


def dispatched(fn):
    """Like FLA's @dispatch("kda"): a wrapper with functools.wraps."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@pytest.fixture
def fake_fla(monkeypatch):
    def install(fwd, version="0.6.0"):
        mods = {n: types.ModuleType(n) for n in ("fla", "fla.ops", "fla.ops.kda", "fla.ops.kda.fused_recurrent")}
        mods["fla"].__version__ = version
        if fwd is not None:
            mods["fla.ops.kda.fused_recurrent"].fused_recurrent_kda_fwd = dispatched(fwd)
        mods["fla.ops.kda.fused_recurrent"].fused_recurrent_kda = dispatched(public_only)
        for n, m in mods.items():
            monkeypatch.setitem(sys.modules, n, m)
        monkeypatch.setattr(peers, "fla_importable", lambda: None)  # torch need not be installed
    return install


def test_fla_060_pool_decode_is_found(fake_fla):
    fake_fla(fwd_060)
    f = bd.detect_fla()
    assert f["error"] is None and f["call"] == "fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd"
    assert f["layout_keyword"] == "state_v_first" and f["verify"] and f["version"] == "0.6.0"
    label = bd.fla_label(f)
    assert "fused_recurrent_kda_fwd(ssm_state_indices=, inplace_final_state=True" in label
    assert "num_accepted_tokens= (verify)" in label and "state_v_first=True" in label


def test_an_older_fla_takes_the_old_layout_keyword(fake_fla):
    fake_fla(fwd_old, "0.4.2")
    f = bd.detect_fla()
    assert f["error"] is None and f["layout_keyword"] == "transpose_state_layout"


def test_fla_without_a_pool_entry_point_is_not_timed(fake_fla):
    fake_fla(None)
    f = bd.detect_fla()
    assert f["error"] == "fla.ops.kda.fused_recurrent has no fused_recurrent_kda_fwd"
    assert bd.fla_label(f).startswith("FLA not timed: ")
    fake_fla(public_only)
    f = bd.detect_fla()
    assert "takes no inplace_final_state, ssm_state_indices (no state pool)" in f["error"]
    assert bd.fla_decode(f, dict(N=1, HV=16, T=1), {}, {}) == f["error"]


def test_no_fla_installed():
    f = bd.detect_fla() if peers.fla_importable() else None
    if f is None:
        pytest.skip("torch and fla are installed here")
    assert f["error"] in ("torch is not installed", "fla is not installed")


@pytest.mark.parametrize("fwd, T", [(fwd_060, 1), (fwd_060, 4), (fwd_old, 4)])
def test_the_keywords_bind_to_named_parameters(fake_fla, fwd, T):
    """Every keyword the benchmark passes is a named parameter of the installed
    signature (so none vanishes into **kwargs) and says what kdacupy's call says."""
    fake_fla(fwd)
    f = bd.detect_fla()
    s = dict(N=3, HV=2, T=T, pool=np.dtype(np.float32))
    a, o = bd.make_case(s)
    kw = bd.fla_kwargs(f, a, o, lambda x: x, lambda x: np.array(x, order="C"), np.empty_like)
    named = {n for n, p in inspect.signature(fwd).parameters.items() if p.kind is not p.VAR_KEYWORD}
    assert set(kw) <= named, set(kw) - named
    inspect.signature(fwd).bind(**kw)
    assert kw["inplace_final_state"] is True and kw["ssm_state_indices"] is o["state_indices"]
    assert kw["use_gate_in_kernel"] and kw["use_beta_sigmoid_in_kernel"] and kw["use_qk_l2norm_in_kernel"]
    assert kw["lower_bound"] == -5.0 and kw["dt_bias"].shape == (2 * 128,)
    assert ("num_accepted_tokens" in kw) == (T > 1)
    assert kw["initial_state"] is not o["state_pool"] and kw["initial_state"].flags.c_contiguous
    if f["layout_keyword"] == "state_v_first":
        assert kw["state_v_first"] is True and "out" in kw
        np.testing.assert_array_equal(kw["initial_state"], o["state_pool"])  # [P, HV, V, K], as ours
    else:  # no layout keyword named state_v_first: the older name, and FLA's own [K, V] when neither
        assert kw["transpose_state_layout"] is True and "out" not in kw


def test_the_pool_goes_to_fla_in_its_kv_layout_without_a_layout_keyword(fake_fla):
    fake_fla(fwd_060)
    f = dict(bd.detect_fla(), layout_keyword=None)
    a, o = bd.make_case(dict(N=2, HV=2, T=1, pool=np.dtype(np.float32)))
    kw = bd.fla_kwargs(f, a, o, lambda x: x, lambda x: np.array(x, order="C"), np.empty_like)
    assert kw["initial_state"].flags.c_contiguous and "state_v_first" not in kw
    np.testing.assert_array_equal(kw["initial_state"], o["state_pool"].swapaxes(-1, -2))


def test_measure_reports_device_stream_and_host_time(monkeypatch):
    calls = []
    monkeypatch.setattr(timing, "host_us_per_call", lambda call: 30.0)
    monkeypatch.setattr(timing, "time_steps", lambda call, steps, repeats, clock: (0.012, 0.011))
    monkeypatch.setattr(timing, "time_graph", lambda call, steps, repeats, clock: (0.005, 0.004))
    m = bd.measure(lambda: calls.append(1), "cupy", warmup=3, repeats=4)
    assert len(calls) == 3  # the warm-up; the timing functions are replaced
    assert m["device_us"] == pytest.approx(5.0) and m["stream_us"] == pytest.approx(12.0)
    assert m["host_us_per_call"] == 30.0 and m["host_overhead_us"] == pytest.approx(7.0) and m["host_bound"]

    def no_graph(call, steps, repeats, clock):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(timing, "time_graph", no_graph)
    m = bd.measure(lambda: None, "torch", warmup=0)
    assert m["device_us"] is None and "not permitted" in m["graph_error"] and m["stream_us"] == pytest.approx(12.0)


def test_decode_n_keeps_those_sequence_counts(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(timing, "gpu_available", lambda: True)
    monkeypatch.setattr(bd, "host_overhead", lambda calls: [])
    monkeypatch.setattr(bd, "forward_validation_us", lambda calls: 1.0)
    monkeypatch.setattr(bd, "bench_gpu", lambda shapes, warmup, iters, fla_on, on_row=None: seen.extend(shapes))
    assert bench.main(["--shapes", "decode", "--decode-n", "1", "512", "--json", str(tmp_path / "d.json")]) == 0
    assert {s["N"] for s in seen} == {1, 512} and len(seen) == 16

"""kda_forward's edges a new user meets first: float64 on the reference
backend, FLA-style keywords, errors that report values."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.reference import kda_reference

from ..inputs import make_inputs


def f64(d):
    return {n: a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for n, a in d.items()}


def test_float64_runs_on_the_reference_and_stays_float64():
    x, opts = make_inputs(T=20, H=2, HV=4, K=64, V=64, dtype=np.float64, state=np.float64)
    o, s = kdacupy.kda_forward(**x, **opts, output_final_state=True)
    ref_o, ref_s = kda_reference(**x, **opts, output_final_state=True)
    assert o.dtype == np.float64 and s.dtype == np.float64
    np.testing.assert_array_equal(o, ref_o)  # no rounding through float32 on the way out
    np.testing.assert_array_equal(s, ref_s)
    x, opts = make_inputs(T=20, H=2, HV=4, K=64, V=64, dtype=np.float64)  # no initial state: float64 final state
    assert kdacupy.kda_forward(**f64(x), **f64(opts), output_final_state=True)[1].dtype == np.float64


@pytest.mark.parametrize("backend", ["model", "emulate"])
def test_other_backends_refuse_float64_and_name_the_reference(backend):
    x, opts = make_inputs(T=20, H=2, K=64, V=64, dtype=np.float64)
    with pytest.raises(TypeError, match=r"q: expected dtype bfloat16 or float16 or float32 "
                                        r"\(float64 runs only on backend='reference'\), got float64"):
        kdacupy.kda_forward(**x, **opts, backend=backend)


@pytest.mark.parametrize("name, value, hint", [
    ("use_qk_l2norm_in_kernel", True, "qk_l2norm=True"),
    ("use_gate_in_kernel", True, "gate='softplus'"),
    ("use_beta_sigmoid_in_kernel", True, "beta_sigmoid=True"),
    ("transpose_state_layout", True, "state_layout='vk'"),
])
def test_fla_keywords_get_kdacupys_name(name, value, hint):
    x, opts = make_inputs(T=20, H=2, K=64, V=64)
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{name}': kdacupy spells it {hint}.*"
                                        r"keyword mapping tables in docs/guide/forward.md"):
        kdacupy.kda_forward(**x, **opts, **{name: value})


def test_an_unknown_keyword_points_at_the_mapping():
    x, opts = make_inputs(T=20, H=2, K=64, V=64)
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk_size'; see the keyword mapping tables"):
        kdacupy.kda_forward(**x, **opts, chunk_size=64)


def test_log_gate_parameters_report_the_value():
    x, opts = make_inputs(T=20, H=2, K=64, V=64, gate="log")
    with pytest.raises(ValueError, match=r"lower_bound: expected None with gate='log' .*, got -1.0$"):
        kdacupy.kda_forward(**x, **opts, lower_bound=-1.0)
    with pytest.raises(ValueError, match=r"A_log: expected None .*, got numpy.ndarray of shape \(2,\) and dtype "
                                         r"float32$"):
        kdacupy.kda_forward(**x, **opts, A_log=np.zeros(2, np.float32))


def test_float64_g_with_bf16_q_is_refused_without_the_backend_hint():
    x, opts = make_inputs(T=20, H=2, K=64, V=64)
    with pytest.raises(TypeError, match=r"g: expected dtype bfloat16 or float32, got float64$"):
        kdacupy.kda_forward(**dict(x, g=x["g"].astype(np.float64)), **opts)

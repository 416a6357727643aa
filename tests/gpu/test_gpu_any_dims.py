"""Any head size on the GPU (skipped without one, tests/conftest.py): the any-size variants of the
forward and the backward against the NumPy models, as the emulated suites hold them on the CPU
(tests/emulate/test_forward_any_dims.py, test_backward_any_dims.py), within parity.GPU, and the
forward against the float64 reference with its tile-size case's bound. One shape each, FLA's 60
and 100 (rows off 16 bytes): the device script runs this file in its backward step, whose box
holds its few compiles."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import kdacupy  # noqa: E402
from kdacupy.numerics.backward_model import kda_backward_model  # noqa: E402
from kdacupy.numerics.parity import GPU, mismatch  # noqa: E402
from kdacupy.numerics.precision import kda_model  # noqa: E402

from ..emulate.test_backward_any_dims import inputs as bwd_inputs  # noqa: E402
from ..emulate.test_forward_any_dims import ANY_CASES, any_inputs  # noqa: E402
from ..cases import MODEL_REF_ERROR, REF_BOUND_FACTOR  # noqa: E402
from ..inputs import rmse_ratio  # noqa: E402
from .test_gpu_backward import free_device_memory, to_dev  # noqa: E402,F401  (the autouse fixture too)

pytestmark = pytest.mark.gpu  # skipped without a GPU (tests/conftest.py)


def agree(x, ref, what):
    why = mismatch(x, ref, GPU)
    assert why is None, f"{what}: {why}"


@pytest.mark.parametrize("precision", ["bf16"])
@pytest.mark.parametrize("name", ["K60-V100-gva-sigmoid"])
def test_forward_at_any_head_dims(name, precision):
    from kdacupy.numerics.reference import kda_reference
    x, opts = any_inputs(name, precision)
    o, s = (cp.asnumpy(a) for a in kdacupy.kda_forward(**to_dev(x), **to_dev(opts)))
    om, sm = kda_model(**x, **opts)
    agree(o, om, "o")
    agree(s, sm, "final state")
    ro, rs = kda_reference(**x, **{n: v for n, v in opts.items() if n not in ("state_dtype", "state_precision")})
    bound_o, bound_s = (REF_BOUND_FACTOR * e for e in MODEL_REF_ERROR[ANY_CASES[name][2]])
    assert rmse_ratio(o, ro) <= bound_o and rmse_ratio(s, rs) <= bound_s


@pytest.mark.parametrize("name", ["K60-V100-sigmoid-gva-l2norm-neg-eigval"])
def test_backward_at_any_head_dims(name):
    x, opts, do, ds = bwd_inputs(name)
    got = kdacupy.kda_backward(cp.asarray(do), **to_dev(x), dfinal_state=None if ds is None else cp.asarray(ds),
                               **to_dev(opts))
    want = kda_backward_model(do, **x, dfinal_state=ds, **opts)
    for field, a, b in zip(kdacupy.KDAGradients._fields, got, want):
        assert (a is None) == (b is None), field
        if b is not None:
            agree(cp.asnumpy(a), b, field)

"""T = 8192 on the GPU over the gate/bias sweep, fixed-length and varlen: the
full run against the float64 reference, and the same tokens cut into segments
started from the model's states, element-wise against the model (tests/longseq.py
says why both). Skipped without a GPU; benchmarks/device_check.sh runs it last.
test_long_emulate.py rehearses the same check on the CPU under
KDACUPY_EMULATE_NUMERICS=hardware."""
import os

import numpy as np
import pytest

import kdacupy
from kdacupy.parity import GPU

from .longseq import check_long

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
cp = pytest.importorskip("cupy", reason="CuPy is not installed")
try:
    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # noqa: BLE001  (no driver)
    HAVE_GPU = False
if not HAVE_GPU:
    pytest.skip("no CUDA GPU here: these tests run on the lent device (benchmarks/device_check.sh)",
                allow_module_level=True)


def gpu_run(x, opts):
    dev = {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in {**x, **opts}.items()}
    o, s = kdacupy.kda_forward(**dev)
    return cp.asnumpy(o), cp.asnumpy(s)


@pytest.mark.parametrize("seqs", [None, [1300, 547, 2048, 963, 271, 3063]], ids=["fixed", "varlen"])
@pytest.mark.parametrize("state_precision", ["bf16", "fp32"])
def test_long_sequences_on_the_sweep(seqs, state_precision):
    from kdacupy.accuracy import BIAS_REGIMES, G_REGIMES, OPTIONS, make_inputs
    for gr, br in zip(G_REGIMES, BIAS_REGIMES):
        x = make_inputs(8192, 4, 128, 128, gr, br, seed=5)
        m = check_long(gpu_run, x, dict(OPTIONS, state_precision=state_precision), GPU, seqs=seqs)
        print(f"g={gr} bias={br} state={state_precision}: {m}")
    cp.get_default_memory_pool().free_all_blocks()

"""Shared inputs for the framework-face tests: the suite's NumPy cases as torch tensors."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from tests.conftest import MARKERS
from tests.inputs import make_inputs


def import_torch():
    """torch, or a skip with the marker's reason."""
    return pytest.importorskip("torch", reason=MARKERS["torch"])


@contextlib.contextmanager
def one_thread():
    """One thread for torch's OpenMP pool and NumPy's OpenBLAS while the block runs. The
    tests' arrays are small, and on the suite's 2 shared cores the two pools' spinning
    workers starve each other (measured on the FLA grid: 10-14 s with one thread each,
    35-82 s with the default two)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # (installed with the test-frameworks extra; without it the tests only run slower)
        yield
        return
    with threadpool_limits(1):
        yield

#: the options sets the faces are checked on: every gate, beta mode, layout, varlen, GVA
CASES = {
    "log-raw-beta": dict(B=2, T=9, H=1, HV=2, gate="log", beta="raw", state=np.float64),
    "softplus-varlen-vk": dict(B=1, H=1, HV=1, gate="softplus", beta="logits", state=np.float64,
                               state_layout="vk", cu_seqlens=[3, 0, 6]),
    "sigmoid-gva-l2norm": dict(B=1, T=7, H=1, HV=2, gate="sigmoid", beta="logits", unit_qk=False),
    # head dims off the tiles, K != V (every path takes K, V in [16, 256])
    "softplus-K60-V20": dict(B=1, T=6, H=1, HV=1, gate="softplus", beta="raw", K=60, V=20),
}


def numpy_case(name, dtype=np.float64, seed=0):
    """(inputs, options) as NumPy float64 arrays (scale and qk_l2norm per case)."""
    spec = dict(CASES[name])
    x, opts = make_inputs(**{"K": 64, "V": 64, **spec}, dtype=np.float64, seed=seed)
    if not spec.get("unit_qk", True):
        opts["qk_l2norm"] = True
    if name == "log-raw-beta":
        opts["scale"] = 0.3
    if name == "sigmoid-gva-l2norm":
        opts["allow_neg_eigval"] = True
    for n in ("A_log", "dt_bias"):  # float64 parameters with float64 inputs (gradcheck)
        if n in opts:
            opts[n] = opts[n].astype(np.float64)
    return x, opts

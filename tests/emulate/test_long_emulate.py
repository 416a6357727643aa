"""The GPU suite's long-sequence check (tests/longseq.py, test_gpu_long.py) rehearsed
on the CPU: the real kernels through the emulation under
KDACUPY_EMULATE_NUMERICS=hardware (.approx results perturbed within the PTX ISA
bounds, tensor-core truncated sums, FTZ), with parity.GPU. One head and the
slowest-decay regime of the sweep (g = -8, dt_bias = +4: the state remembers
longest, so one-ulp differences travel furthest): T = 8192 fixed-length, and the
first two sequences of the varlen sweep (~30 s and ~15 s on one core)."""
import numpy as np
import pytest

import kdacupy
from kdacupy.emulate import find_compiler
from kdacupy.numerics.parity import GPU

from ..longseq import check_long

try:
    find_compiler()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"no host C++ compiler for the emulation: {e}", allow_module_level=True)


def emulate(x, opts):
    return kdacupy.kda_forward(**x, **opts, backend="emulate")


@pytest.mark.parametrize("T, seqs", [(8192, None), (1847, [1300, 547])], ids=["fixed-8192", "varlen"])
def test_long_sequence_check_passes_under_hardware_numerics(T, seqs, monkeypatch):
    from kdacupy.cli.accuracy import OPTIONS, make_inputs
    monkeypatch.setenv("KDACUPY_EMULATE_NUMERICS", "hardware")
    x = make_inputs(T, 1, 128, 128, "-8", "+4", seed=5)
    m = check_long(emulate, x, dict(OPTIONS), GPU, seqs=seqs)
    # the reason for the segments: the full run has drifted from the model by more than a
    # segment-long run has (and, at this decay, by about the model's own error)
    assert m["full_vs_model"][1] > m["seg_o"][1]

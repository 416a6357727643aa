"""The GPU suite's long-sequence check (tests/longseq.py, test_gpu_long.py) rehearsed
on the CPU: the real kernels through the emulation under
KDACUPY_EMULATE_NUMERICS=hardware (.approx results perturbed within the PTX ISA
bounds, tensor-core truncated sums, FTZ), with parity.GPU. One head and the
slowest-decay regime of the sweep (g = -8, dt_bias = +4: the state remembers
longest, so one-ulp differences travel furthest): the first two sequences of the
varlen sweep, and T = 8192 fixed-length (with --sweeps, tests/sweeps.py: its 16 s of
emulation add length only, on the same build).

Cost: the emulation runs ~1 ms a token here, so the fixed-length case's segmented
check runs five of its 32 segments (the first two, the middle one, the last two:
each is the same check from the model's state at another point, the last ones
from the largest state) and the varlen case four of nine (each sequence's first
and ragged last); the full-length runs against the reference, which is what only
long sequences show, run whole. The GPU suite runs every segment."""
import pytest

import kdacupy
from kdacupy.emulate import find_compiler
from kdacupy.numerics.parity import GPU

from ..longseq import check_long
from ..sweeps import sample

try:
    find_compiler()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"no host C++ compiler for the emulation: {e}", allow_module_level=True)


def emulate(x, opts):
    return kdacupy.kda_forward(**x, **opts, backend="emulate")


# segments: 8192 = 32 x 256; 1300 = 5 x 256 + 20 and 547 = 2 x 256 + 35 (segments 0-5 and 6-8):
# the first and the ragged last of each sequence. The default run: varlen, the same build
# (cover=False: the fixed-length point adds length only, 16 s of emulation)
@pytest.mark.parametrize("T, seqs, segments",
                         sample([pytest.param(8192, None, [0, 1, 16, 30, 31], id="fixed-8192"),
                                 pytest.param(1847, [1300, 547], [0, 5, 6, 8], id="varlen")],
                                lambda T, seqs, segments: seqs is not None, cover=False))
def test_long_sequence_check_passes_under_hardware_numerics(T, seqs, segments, monkeypatch):
    from kdacupy.cli.accuracy import OPTIONS, make_inputs
    monkeypatch.setenv("KDACUPY_EMULATE_NUMERICS", "hardware")
    x = make_inputs(T, 1, 128, 128, "-8", "+4", seed=5)
    m = check_long(emulate, x, dict(OPTIONS), GPU, seqs=seqs, segments=segments)
    assert m["segments"] == len(segments)
    # the reason for the segments: the full run has drifted from the model by more than a
    # segment-long run has (and, at this decay, by about the model's own error)
    assert m["full_vs_model"][1] > m["seg_o"][1]

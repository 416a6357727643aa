"""Size ``kdacupy.numerics.parity.GPU``: the kernels through the emulation under
KDACUPY_EMULATE_NUMERICS=hardware against the precision model, over the GPU
suite's option matrix (tests/cases.py, both state precisions, the suite's two
sizes) and the long-sequence segments (tests/longseq.py, T = 8192, one head,
every regime of the sweep). Prints the worst (max |diff| / range, RMS ratio).

    KDACUPY_EMULATE_NUMERICS=hardware PYTHONPATH=. python benchmarks/size_parity.py [--long]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kdacupy  # noqa: E402
from kdacupy.numerics.precision import kda_model  # noqa: E402
from tests.cases import CASES, case_inputs  # noqa: E402
from tests.longseq import check_long, measure  # noqa: E402


def main():
    assert os.environ.get("KDACUPY_EMULATE_NUMERICS") == "hardware", "run under KDACUPY_EMULATE_NUMERICS=hardware"
    worst = [0.0, 0.0]
    for name in CASES:
        for precision in ("bf16", "fp32"):
            longer = {"cu_seqlens": [150, 0, 77, 300, 1]} if "cu_seqlens" in CASES[name][0] else {"T": 300}
            for size in ({}, longer):
                x, opts = case_inputs(name, precision, **size)
                o, s = kdacupy.kda_forward(**x, **opts, backend="emulate")
                om, sm = kda_model(**x, **opts)
                for what, a, b in (("o", o, om), ("state", s, sm)):
                    mx, rms = measure(a, b)
                    worst = [max(worst[0], mx), max(worst[1], rms)]
                    print(f"{name:28s} {precision} {str(size):32s} {what:5s} max/range {mx:.3g} rms {rms:.3g}",
                          flush=True)
    print(f"option matrix worst: max/range {worst[0]:.3g} rms {worst[1]:.3g}")
    if "--long" in sys.argv:
        from kdacupy.cli.accuracy import BIAS_REGIMES, G_REGIMES, OPTIONS, make_inputs
        lw = [0.0, 0.0]
        for gr, br in zip(G_REGIMES, BIAS_REGIMES):
            x = make_inputs(8192, 1, 128, 128, gr, br, seed=5)
            m = check_long(lambda x, o: kdacupy.kda_forward(**x, **o, backend="emulate"), x, dict(OPTIONS),
                           dict(rms=1.0, max=1.0))
            lw = [max(lw[0], m["seg_o"][0], m["seg_s"][0]), max(lw[1], m["seg_o"][1], m["seg_s"][1])]
            print(f"long g={gr} bias={br}: {m}", flush=True)
        print(f"long segments worst: max/range {lw[0]:.3g} rms {lw[1]:.3g}")


if __name__ == "__main__":
    main()

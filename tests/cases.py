"""The option matrix the kernel parity suites run (emulation on the CPU, CUDA on a GPU)."""
import numpy as np

from kdacupy.numerics.dtypes import BF16, F16, F32

from .inputs import make_inputs

CASES = {
    # name: (input case, options)
    "fixed-gva-sigmoid": (dict(B=2, T=37, H=1, HV=2, K=64, V=64, state=np.float32), {}),
    "varlen-ragged-zero-vk-bf16": (dict(cu_seqlens=[5, 0, 21, 16, 3], H=2, K=64, V=64, state=BF16,
                                        state_layout="vk"), {}),
    "softplus-raw-beta": (dict(T=33, H=1, K=128, V=128, gate="softplus", beta="raw", state=np.float32), {}),
    "log-gate-no-beta": (dict(T=20, H=2, HV=4, K=64, V=128, gate="log", beta=None), {}),
    "fp16-inputs": (dict(T=29, H=1, K=128, V=64, dtype=F16), dict(state_dtype=np.float32)),
    "fp32-inputs": (dict(T=18, H=1, K=64, V=64, dtype=F32, state=np.float32), {}),
    "pair-form-extreme-decay": (dict(T=40, H=1, K=64, V=64, gate="log", g_scale=60.0, state=np.float32), {}),
    "K256": (dict(T=20, H=1, K=256, V=64, state=np.float32), {}),
    "V256": (dict(T=20, B=2, H=1, K=64, V=256, state=BF16), dict(state_dtype=np.float32)),
    "no-l2norm-neg-eigval": (dict(T=24, H=1, K=64, V=64), dict(qk_l2norm=False, allow_neg_eigval=True)),
    "g-and-beta-fp32": (dict(T=24, H=1, K=64, V=64), {}),
}


def case_inputs(name, precision, **size):
    """Inputs and options of one case; ``size`` overrides the case's shape."""
    case, extra = CASES[name]
    x, opts = make_inputs(**{**case, **size})
    if name == "g-and-beta-fp32":
        x["g"], x["beta"] = x["g"].astype(np.float32), x["beta"].astype(np.float32)
    opts.update(output_final_state=True, state_precision=precision, qk_l2norm=True)
    opts.update(extra)
    return x, opts




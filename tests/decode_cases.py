"""The decode option matrix the kernel parity suites run (emulation on the CPU, CUDA on a GPU)."""
import numpy as np

from kdacupy.numerics.dtypes import BF16, F16, F32

from .decode_inputs import make_decode

DECODE_CASES = {
    # name: make_decode arguments; "accepted": num_accepted_tokens for [N, T] indices
    "vk-fp32-pool-gva": dict(N=3, T=1, H=1, HV=2, K=64, V=64),
    "vk-bf16-pool-verify": dict(N=2, T=3, H=1, K=64, V=64, pool_dtype=BF16, indices="NT", accepted=[2, 3]),
    "kv-fp32-pool-verify": dict(N=2, T=3, H=1, HV=2, K=64, V=64, layout="kv", indices="NT", accepted=[3, 1]),
    "kv-bf16-pool": dict(N=3, T=2, H=1, K=64, V=64, layout="kv", pool_dtype=BF16),
    "softplus-raw-beta-128": dict(N=2, T=2, H=1, K=128, V=128, gate="softplus", beta="raw"),
    "log-gate-no-beta": dict(N=2, T=1, H=2, HV=4, K=64, V=128, gate="log", beta=None),
    "fp16-inputs": dict(N=2, T=2, H=1, K=128, V=64, dtype=F16),
    "fp32-inputs": dict(N=2, T=2, H=1, K=64, V=64, dtype=F32, layout="kv"),
    "K256": dict(N=2, T=2, H=1, K=256, V=64, pool_dtype=BF16),
    "V256": dict(N=1, T=2, H=1, K=64, V=256, layout="kv"),
    "no-l2norm-neg-eigval": dict(N=2, T=2, H=1, K=64, V=64, qk_l2norm=False, allow_neg_eigval=True),
    "g-and-beta-fp32": dict(N=2, T=2, H=1, K=64, V=64, f32_gate_beta=True),
    # head dims outside {64, 128, 256} (the key tile's variant, the sizes at run time): padded keys
    # (16 -> 32, 60 -> 64, 100 -> 128), value rows past V in the last CTA (100, 60 over BV = 8),
    # K != V both ways, dt_bias over padded keys (softplus), and K, V multiples of 32 (96, 192)
    "K16-V16": dict(N=2, T=1, H=1, K=16, V=16),
    "K60-V100-kv-bf16-verify": dict(N=2, T=2, H=1, K=60, V=100, layout="kv", pool_dtype=BF16, indices="NT",
                                    accepted=[2, 1]),
    "K100-V60-softplus-gva": dict(N=1, T=2, H=1, HV=2, K=100, V=60, gate="softplus", beta="raw"),
    "K96-V96-bf16-pool": dict(N=2, T=2, H=1, K=96, V=96, pool_dtype=BF16),
    "K192-V192-kv": dict(N=1, T=1, H=1, K=192, V=192, layout="kv"),
}
#: the decode cases the emulated parity suites run by default: [N] and [N, T] indices, both layouts and pool
#: dtypes, GVA, K = V = 128 (four of them the checked suite's cases, whose plain builds it makes too),
#: any-size keys and values, and two value heads a query head (log-gate-no-beta: the interleave a planted bug
#: gets wrong, which the others pass); the other cases are a sweep (tests/sweeps.py)
DECODE_SAMPLE = {"vk-fp32-pool-gva", "vk-bf16-pool-verify", "kv-fp32-pool-verify", "softplus-raw-beta-128",
                 "K60-V100-kv-bf16-verify", "log-gate-no-beta"}

#: the pool slots each case writes, by hand (not through decode_plan): [N] indices are slots
#: 1, 3, ..., 2N - 1 (make_decode), each written once, after the last token; [N, T] indices are
#: slots 1 .. N * T, every token's state stored whatever num_accepted_tokens says
WRITTEN = {
    "vk-fp32-pool-gva": {1, 3, 5},
    "vk-bf16-pool-verify": {1, 2, 3, 4, 5, 6},
    "kv-fp32-pool-verify": {1, 2, 3, 4, 5, 6},
    "kv-bf16-pool": {1, 3, 5},
    "softplus-raw-beta-128": {1, 3},
    "log-gate-no-beta": {1, 3},
    "fp16-inputs": {1, 3},
    "fp32-inputs": {1, 3},
    "K256": {1, 3},
    "V256": {1},
    "no-l2norm-neg-eigval": {1, 3},
    "g-and-beta-fp32": {1, 3},
    "K16-V16": {1, 3},
    "K60-V100-kv-bf16-verify": {1, 2, 3, 4},
    "K100-V60-softplus-gva": {1},
    "K96-V96-bf16-pool": {1, 3},
    "K192-V192-kv": {1},
}


def written_slots(name, N=None):
    """WRITTEN[name], or for another N the same rule by hand: odd slots up to 2N - 1 ([N]
    indices), slots 1 .. N * T ([N, T])."""
    case = DECODE_CASES[name]
    if N is None or N == case["N"]:
        return WRITTEN[name]
    return set(range(1, N * case["T"] + 1)) if case.get("indices") == "NT" else set(range(1, 2 * N, 2))


def decode_case(name, **size):
    """(inputs, options, pool) of one case; ``size`` overrides its arguments."""
    case = dict(DECODE_CASES[name], **size)
    accepted = case.pop("accepted", None)
    form = case.pop("indices", "N")
    neg = case.pop("allow_neg_eigval", False)
    f32gb = case.pop("f32_gate_beta", False)
    N, T = case["N"], case["T"]
    if form == "NT":
        case["P"] = N * T + 1
        case["indices"] = np.arange(1, N * T + 1, dtype=np.int64).reshape(N, T)
    x, opts, pool = make_decode(**case)
    if accepted is not None:
        opts["num_accepted_tokens"] = np.array(accepted, np.int32)
    if neg:
        opts["allow_neg_eigval"] = True
    if f32gb:
        x["g"], x["beta"] = x["g"].astype(F32), x["beta"].astype(F32)
    return x, opts, pool

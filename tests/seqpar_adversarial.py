"""Adversarial inputs for the split-vs-serial accuracy checks: repeated and
near-collinear keys, no or slow decay, beta near 0, 1 and 2 (NumPy, bf16)."""
import numpy as np

from kdacupy.numerics.dtypes import BF16

FAMILIES = ("repeated-key-no-decay", "collinear-1e-2-slow-decay", "collinear-1e-3-beta2", "beta-near-0",
            "random-slow-decay")


def adversarial_inputs(name, T, H=2, K=64, V=64, seed=0):
    """(inputs, options) of one family; always l2-normalised q/k, fp32 final state."""
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q = unit(rng.standard_normal((1, T, H, K)))
    k0 = rng.standard_normal((1, 1, H, K))
    noise = {"repeated-key-no-decay": 0.0, "collinear-1e-2-slow-decay": 1e-2, "collinear-1e-3-beta2": 1e-3}
    k = unit(k0 + noise.get(name, 1.0) * rng.standard_normal((1, T, H, K)))
    if name not in noise:
        k = unit(rng.standard_normal((1, T, H, K)))
    v = rng.standard_normal((1, T, H, V))
    opts = dict(qk_l2norm=True, output_final_state=True, state_dtype=np.float32)
    x = dict(q=q.astype(BF16), k=k.astype(BF16), v=v.astype(BF16))
    if name == "repeated-key-no-decay":
        x["g"] = np.zeros((1, T, H, K), BF16)
        x["beta"] = np.full((1, T, H), 0.999, BF16)
    else:  # sigmoid gate; dt_bias = -8: exp(g) ~ 1 - 5e-4 per token (slow decay)
        x["g"] = rng.standard_normal((1, T, H, K)).astype(BF16)
        opts.update(gate="sigmoid", lower_bound=-5.0, A_log=np.zeros(H, np.float32),
                    dt_bias=np.full((H, K), -8.0, np.float32), beta_sigmoid=True)
        # beta near 2 as 2 sigmoid(4) ~ 1.96: closer to 2 the delta rule no longer damps
        # the bf16 rounding of repeated keys (README, Numerics), for serial and split alike
        logit = {"collinear-1e-3-beta2": 4.0, "beta-near-0": -8.0}.get(name, 4.0)
        x["beta"] = (logit + 0.5 * rng.standard_normal((1, T, H))).astype(BF16)
        opts["allow_neg_eigval"] = name == "collinear-1e-3-beta2"
    return x, opts

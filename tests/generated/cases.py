"""Strategies for generated cases (hypothesis) over kdacupy's option space, biased toward the edges
where fixed matrices miss bugs: head dims at and around the tiles (16, 17, 60, 63, 64, 65, 96, 100,
127, 128, 129, 255, 256), token counts at chunk boundaries (0, 1, 15, 16, 17, 31, 32, 33, 63, 64,
65), empty and one-token sequences, slot 0, the null slot repeated, padding first / last /
between, checkpoints every 16 to 64 tokens with boundaries at a sequence's end.

A case is a dict of plain values (ints, strings, lists, a seed for the arrays), so a failing one
is saved as JSON (tests/generated/found/) and replayed by every run (tests/generated/test_found.py).
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

EDGE_DIMS = (16, 17, 60, 63, 64, 65, 96, 100, 127, 128, 129, 255, 256)
EDGE_LENS = (0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65)

dims = st.one_of(st.sampled_from(EDGE_DIMS), st.integers(16, 256))
lens = st.one_of(st.sampled_from(EDGE_LENS), st.integers(0, 80))
seeds = st.integers(0, 2 ** 16)
gates = st.sampled_from(["log", "softplus", "sigmoid", "sigmoid0"])  # sigmoid0: lower_bound 0
betas = st.sampled_from(["logits", "raw", None])


@st.composite
def heads(draw):
    H = draw(st.integers(1, 2))
    return dict(H=H, HV=H * draw(st.integers(1, 2)), K=draw(dims), V=draw(dims))


@st.composite
def slot_table(draw, n, P, null):
    """n slots of a pool of P: distinct live slots (slot 0 often, as it is the first an engine
    fills), and padding (the null slot, repeated, or any slot at or below it) first, last or
    between."""
    live = draw(st.lists(st.integers(0, P - 1), min_size=n, max_size=n, unique=True))
    pad = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return [draw(st.integers(-3, null)) if p else s for s, p in zip(live, pad)]


@st.composite
def decode_cases(draw):
    h = draw(heads())
    N = draw(st.integers(1, 4))
    null = draw(st.sampled_from([-1, 0]))
    P = draw(st.integers(N + 1, N + 3))
    return dict(kind="decode", **h, N=N, T=draw(st.integers(1, 3)), P=P, null=null,
                slots=draw(slot_table(N, P, null)), layout=draw(st.sampled_from(["vk", "kv"])),
                pool_dtype=draw(st.sampled_from(["float32", "bfloat16"])), gate=draw(gates), beta=draw(betas),
                l2=draw(st.booleans()), dtype=draw(st.sampled_from(["bfloat16", "float32"])), seed=draw(seeds))


@st.composite
def prefill_cases(draw):
    h = draw(heads())
    n = draw(st.integers(1, 4))
    P = draw(st.integers(n + 1, n + 3))
    every = draw(st.sampled_from([None, 16, 32, 48, 64]))
    return dict(kind="prefill", **h, lens=draw(st.lists(lens, min_size=n, max_size=n)), P=P,
                slots=draw(slot_table(n, P, -1)), layout=draw(st.sampled_from(["vk", "kv"])),
                pool_dtype=draw(st.sampled_from(["float32", "bfloat16"])), gate=draw(gates), beta=draw(betas),
                l2=draw(st.booleans()), every=every, seed=draw(seeds))


def arrays(case, B, T):
    """The per-token inputs and options of a case (tests/inputs.py's distributions), in its dtype."""
    from kdacupy.numerics.dtypes import BF16

    from ..inputs import make_inputs

    dtype = BF16 if case.get("dtype", "bfloat16") == "bfloat16" else np.float32
    gate = "sigmoid" if case["gate"] == "sigmoid0" else case["gate"]
    x, opts = make_inputs(B=B, T=T, H=case["H"], HV=case["HV"], K=case["K"], V=case["V"], dtype=dtype, gate=gate,
                          beta=case["beta"], seed=case["seed"])
    if case["gate"] == "sigmoid0":
        opts["lower_bound"] = 0.0
    opts["qk_l2norm"] = case["l2"]
    return x, opts


def pool_of(case, rng=None):
    from kdacupy.numerics.dtypes import BF16

    rng = rng or np.random.default_rng(case["seed"] + 7)
    HV, K, V = case["HV"], case["K"], case["V"]
    shape = (case["P"], HV, V, K) if case["layout"] == "vk" else (case["P"], HV, K, V)
    return (0.5 * rng.standard_normal(shape)).astype(BF16 if case["pool_dtype"] == "bfloat16" else np.float32)


@st.composite
def tree_cases(draw):
    """A tree verify: N sequences of T draft tokens, each token's parent in [-1, t) (-1: a second
    root from the start slot), the start slots live or padding."""
    case = draw(decode_cases())
    T = draw(st.integers(2, 6))
    parents = [[0] + [draw(st.integers(-1, t - 1)) for t in range(1, T)] for _ in range(case["N"])]
    return dict(case, kind="tree", T=T, parents=parents, null=-1,
                slots=[s if s > case["null"] else -1 for s in case["slots"]])


"""The context-parallel cases the mpiexec workers run, and how each cuts its
tokens into the ranks' slices (pure Python: tests/dist/test_distributed.py
checks, without MPI, that the cases at RANKS ranks hold every edge case of the
piece plan)."""
import numpy as np

from kdacupy.numerics.dtypes import BF16, F32, F64

#: the ranks the workers run with: enough for an empty rank, a one-token rank, a rank
#: wholly inside a sequence and a chain of two maps (test_the_cases_cover_every_edge_case)
RANKS = 3


def cuts_for(T, style, ranks):
    """Slice boundaries: even, or uneven (rank 0 holds one token, rank 1 none
    when there are 3+ ranks, the rest growing shares of the remainder)."""
    if style == "even":
        return np.linspace(0, T, ranks + 1).astype(int)
    head = [0, 1] + ([1] if ranks > 2 else [])
    rest = ranks + 1 - len(head)
    w = np.cumsum(np.arange(1, rest + 1, dtype=float))
    return np.concatenate([head, 1 + np.round(w / w[-1] * (T - 1))]).astype(int)


CASES = [
    # name, make_inputs kwargs, extra options, slicing, backend, exact
    ("fixed even model", dict(B=2, T=70, H=1, HV=2, K=64, V=64, state=F32), dict(qk_l2norm=True), "even", "model", False),
    ("fixed uneven model vk bf16", dict(B=2, T=53, H=2, K=64, V=64, state=BF16, state_layout="vk"),
     dict(qk_l2norm=True), "uneven", "model", False),
    ("varlen spanning model", dict(cu_seqlens=[7, 0, 90, 3, 0, 41], H=2, K=64, V=64, state=F32),
     dict(qk_l2norm=True), "uneven", "model", False),
    ("varlen across every rank model", dict(cu_seqlens=[5, 120, 3], H=1, K=64, V=64, state=BF16),
     dict(qk_l2norm=True), "even", "model", False),
    ("varlen softplus model fp32-state", dict(cu_seqlens=[33, 64, 1], H=1, HV=2, K=64, V=128, gate="softplus",
                                                beta="raw"), dict(qk_l2norm=True, state_precision="fp32"),
     "even", "model", False),
    ("varlen reference exact", dict(cu_seqlens=[20, 0, 77, 9], H=1, K=64, V=64, dtype=F32, state=F32),
     {}, "uneven", "reference", True),
    ("fixed reference exact", dict(B=2, T=45, H=1, K=64, V=64, dtype=F32, state=F32), {}, "even", "reference", True),
    ("varlen emulate", dict(cu_seqlens=[19, 50, 0, 12], H=1, K=64, V=64, state=F32), dict(qk_l2norm=True),
     "uneven", "emulate", False),
    ("fixed emulate slow decay", dict(B=1, T=40, H=1, K=64, V=64, state=BF16, gate="log", g_scale=0.05, beta="raw"),
     dict(qk_l2norm=True), "even", "emulate", False),
    ("varlen emulate any head dims", dict(cu_seqlens=[19, 50, 0, 12], H=1, K=60, V=100, state=F32),
     dict(qk_l2norm=True), "uneven", "emulate", False),
]


#: the backward's cases, as CASES (exact: the float64 reference, to 1e-10): every gate, both
#: layouts and state precisions, initial and final states, grouped value heads, varlen
#: sequences across rank boundaries and inside one rank, fixed-length slices
BACKWARD_CASES = [
    ("bwd varlen spanning model sigmoid vk", dict(cu_seqlens=[7, 0, 50, 3, 0, 30], H=1, HV=2, K=64, V=64, state=BF16,
                                                  state_layout="vk"), dict(qk_l2norm=True), "uneven", "model", False),
    ("bwd fixed model softplus fp32-state", dict(B=2, T=40, H=1, K=64, V=64, gate="softplus", beta="raw", state=F32),
     dict(state_precision="fp32"), "even", "model", False),
    ("bwd varlen across every rank model log", dict(cu_seqlens=[5, 70, 3], H=1, K=64, V=64, gate="log", beta=None),
     dict(qk_l2norm=True), "even", "model", False),
    ("bwd varlen reference float64", dict(cu_seqlens=[20, 0, 30, 40], H=1, HV=2, K=64, V=64, dtype=F64, state=F64),
     dict(qk_l2norm=True, allow_neg_eigval=True), "even", "reference", True),
    ("bwd fixed reference float64 vk", dict(B=2, T=37, H=1, K=64, V=64, dtype=F64, gate="softplus", state=F64,
                                            state_layout="vk"), {}, "even", "reference", True),
    ("bwd varlen model any head dims", dict(cu_seqlens=[7, 0, 50, 3], H=1, HV=2, K=60, V=100, state=F32),
     dict(qk_l2norm=True), "uneven", "model", False),
]


def case_tokens(inputs):
    """(T, cu_seqlens or None) of a case's make_inputs arguments."""
    lens = inputs.get("cu_seqlens")
    if lens is None:
        return inputs["T"], None
    return int(sum(lens)), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

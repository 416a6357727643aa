"""Generated engine calls (tests/generated/cases.py's decode cases, as vLLM's and SGLang's layers
make them) equal the core call each maps to, bit for bit on the same backend: vLLM's
``fused_recurrent_kda`` (slot 0 its null block, repeated; the bounded gate in the kernel) is
``kdacupy.kda_decode(..., null_slot=0)``; SGLang's ``fused_sigmoid_gating_delta_rule_update`` (-1
padding, the softplus gate from the raw one) is ``kdacupy.kda_decode`` with that gate. The pools
come out the same, slots not named untouched."""
import numpy as np
import pytest
from hypothesis import given, settings

import kdacupy

from .cases import decode_cases, pool_of
from .properties import same
from .record import checked, examples

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _inputs(case):
    rng = np.random.default_rng(case["seed"])
    N, T, H, HV, K, V = case["N"], case["T"], case["H"], case["HV"], case["K"], case["V"]
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(q=f(N, T, H, K), k=f(N, T, H, K), v=f(N, T, HV, V), raw=f(N, T, HV, K), b=f(N, T, HV),
                A_log=rng.uniform(0, 1, HV).astype(np.float32), dt_bias=f(HV * K))


def check_vllm_face(case):
    from kdacupy.compat import vllm
    x = _inputs(case)
    pool = pool_of(dict(case, layout="vk", pool_dtype="float32"))
    slots = np.array([s if s > 0 else 0 for s in case["slots"]], np.int32)  # vLLM pads with its null block 0
    t = {n: torch.from_numpy(a.copy()) for n, a in x.items()}
    got_pool = torch.from_numpy(pool.copy())
    o, _ = vllm.fused_recurrent_kda(t["q"], t["k"], t["v"], t["raw"], t["b"], initial_state=got_pool,
                                    ssm_state_indices=torch.from_numpy(slots), use_qk_l2norm_in_kernel=True,
                                    sigmoid_beta=True, a_log=t["A_log"], g_bias=t["dt_bias"], compute_gate=True,
                                    lower_bound=-5.0)
    want_pool = pool.copy()
    opts = dict(qk_l2norm=True, beta_sigmoid=True, gate="sigmoid", lower_bound=-5.0, A_log=x["A_log"],
                dt_bias=x["dt_bias"], state_layout="vk", backend="reference")
    if case["T"] == 1:  # one token a sequence: a decode step with vLLM's null block as padding
        want = kdacupy.kda_decode(x["q"], x["k"], x["v"], x["raw"], x["b"], state_pool=want_pool, state_indices=slots,
                                  null_slot=0, **opts)
    else:  # several: one pooled forward from each slot (fp32 through the chunks), the null block's rows zero
        want, _ = kdacupy.kda_forward(x["q"], x["k"], x["v"], x["raw"], x["b"], state_pool=want_pool,
                                      state_indices=np.where(slots > 0, slots, -1), state_precision="fp32", **opts)
        want[slots <= 0] = 0
    assert same(o.numpy(), want), "vLLM's face differs from the core call it maps to"
    assert same(got_pool.numpy(), want_pool), "vLLM's face left another pool"


def check_sglang_face(case):
    from kdacupy.compat import sglang
    x = _inputs(case)
    pool = pool_of(dict(case, layout="vk", pool_dtype="float32"))
    slots = np.array([s if s > case["null"] else -1 for s in case["slots"]], np.int32)  # SGLang pads with -1
    N, T = case["N"], case["T"]
    t = {n: torch.from_numpy(a.copy()) for n, a in x.items()}
    got_pool = torch.from_numpy(pool.copy())
    pack = lambda a: a.reshape((1, N * T) + a.shape[2:])  # noqa: E731
    o = sglang.fused_sigmoid_gating_delta_rule_update(
        t["A_log"], pack(t["raw"]).reshape(1, N * T, -1), t["dt_bias"], 1.0, 20.0, pack(t["q"]), pack(t["k"]),
        pack(t["v"]), pack(t["b"]), got_pool, torch.from_numpy(slots), use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(0, N * T + 1, T), is_kda=True)
    want_pool = pool.copy()
    want = kdacupy.kda_decode(x["q"], x["k"], x["v"], x["raw"], x["b"], state_pool=want_pool, state_indices=slots,
                              qk_l2norm=True, beta_sigmoid=True, gate="softplus", A_log=x["A_log"],
                              dt_bias=x["dt_bias"], state_layout="vk", backend="reference")
    assert same(o.numpy().reshape(want.shape), want), "SGLang's face differs from the core call it maps to"
    assert same(got_pool.numpy(), want_pool), "SGLang's face left another pool"


@settings(max_examples=examples(8))
@given(decode_cases())
def test_vllms_decode_call_is_the_core_call(case):
    checked("vllm-face", check_vllm_face, case)


@settings(max_examples=examples(8))
@given(decode_cases())
def test_sglangs_decode_call_is_the_core_call(case):
    checked("sglang-face", check_sglang_face, case)

"""Keywords the public calls do not take: a TypeError that names kdacupy's spelling of
FLA's, FlashKDA's and FlashInfer's keywords (the keyword mapping tables, docs/guide/forward.md), or says
why the call has no such option."""
from __future__ import annotations

#: keywords of FLA's chunk_kda and of FlashKDA, and what kda_forward calls them (docs/guide/forward.md, "Keyword mapping")
FOREIGN_KEYWORDS = {
    "use_qk_l2norm_in_kernel": "qk_l2norm=True",
    "use_beta_sigmoid_in_kernel": "beta_sigmoid=True",
    "use_gate_in_kernel": "gate='softplus' (or gate='sigmoid' with lower_bound=; False: gate='log')",
    "safe_gate": "gate='sigmoid' with lower_bound= (FLA chooses the sigmoid gate by lower_bound alone)",
    "transpose_state_layout": "state_layout='vk'",
    "state_v_first": "state_layout='vk'",
    "final_state": "output_final_state=True (the state is returned)",
    "head_first": "[B, T, H, K] arrays (kdacupy takes no head-first layout)",
    "ssm_state_indices": "state_indices= (with state_pool=, for chunked prefill)",
    "inplace_final_state": "state_pool= with state_indices= (the pool is updated in place)",
}

#: ... and what kda_decode calls FLA's fused_recurrent_kda / FlashInfer's decode keywords
DECODE_KEYWORDS = {
    **{n: FOREIGN_KEYWORDS[n] for n in ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel",
                                        "use_gate_in_kernel", "safe_gate", "head_first")},
    "ssm_state_indices": "state_indices",
    "initial_state_indices": "state_indices",
    "output_state_indices": "state_indices ([N]: one slot read and written per sequence; [N, T]: the state "
                            "after each token to its own slot)",
    "initial_state": "state_pool= (the pool of states, read and updated in place)",
    "inplace_final_state": "state_pool= (kda_decode always updates the pool in place)",
    "state_v_first": "state_layout='vk' (kda_decode's default)",
    "transpose_state_layout": "state_layout='vk' (kda_decode's default)",
    "use_qk_l2norm": "qk_l2norm=True",
    "output_final_state": "nothing: each state goes back to its state_pool slot",
    "final_state": "nothing: each state goes back to its state_pool slot",
    "state_dtype": "nothing: states are stored in the pool's dtype",
    "state_precision": "nothing: kda_decode keeps the state in fp32 across a call's tokens and rounds it to the "
                       "pool's dtype when it stores it",
    "sequence_parallel": "nothing: a decode step is one launch",
    "output": "out=",
}

WHERE = "see the keyword mapping tables in docs/guide/forward.md"


def check_keywords(unknown: dict, fn: str = "kda_forward", hints: dict = FOREIGN_KEYWORDS):
    """TypeError for the first keyword ``fn`` does not take, with kdacupy's name for it where it has one."""
    name = next(iter(unknown))
    hint = hints.get(name)
    if hint:
        raise TypeError(f"{fn}() got an unexpected keyword argument {name!r}: kdacupy spells it {hint}; {WHERE}")
    raise TypeError(f"{fn}() got an unexpected keyword argument {name!r}; {WHERE}")

"""Keywords the public calls do not take: a TypeError with kdacupy's name for
FLA's and FlashKDA's (the README's keyword mapping tables)."""
from __future__ import annotations

#: keywords of FLA's chunk_kda and of FlashKDA, and what kdacupy calls them (README "Keyword mapping")
FOREIGN_KEYWORDS = {
    "use_qk_l2norm_in_kernel": "qk_l2norm=True",
    "use_beta_sigmoid_in_kernel": "beta_sigmoid=True",
    "use_gate_in_kernel": "gate='softplus' (or gate='sigmoid' with lower_bound=; False: gate='log')",
    "safe_gate": "gate='sigmoid' with lower_bound=",
    "transpose_state_layout": "state_layout='vk'",
    "final_state": "output_final_state=True (the state is returned)",
    "head_first": "[B, T, H, K] arrays (kdacupy takes no head-first layout)",
}


def check_keywords(unknown: dict):
    """TypeError for keywords kda_forward does not take, with kdacupy's name for FLA's and FlashKDA's."""
    name = next(iter(unknown))
    hint = FOREIGN_KEYWORDS.get(name)
    where = "see the README's keyword mapping table"
    if hint:
        raise TypeError(f"kda_forward() got an unexpected keyword argument {name!r}: kdacupy spells it {hint}; "
                        f"{where}")
    raise TypeError(f"kda_forward() got an unexpected keyword argument {name!r}; {where}")

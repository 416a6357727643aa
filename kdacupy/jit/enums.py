"""Every enumerated option a kernel template specialises on, in one table that
both sides read. Python passes the codes (``GATE_CODE["sigmoid"]``); ``render``
writes every name as a ``#define`` in front of each variant
(``#define KDA_GATE_SIGMOID 2``), so the ``.cu`` compares against names
(``KDA_GATE == KDA_GATE_SIGMOID``) and a code is written down once, here.
"""
from __future__ import annotations

from ..numerics.dtypes import BF16, F16, F32

#: prefix -> (option name, code); rendered as #define <prefix>_<NAME> <code>
TABLE = {
    "KDA": (("bf16", 0), ("f16", 1), ("f32", 2)),  # element types: KDA_BF16 ...
    "KDA_GATE": (("log", 0), ("softplus", 1), ("sigmoid", 2)),
    "KDA_BETA": (("none", 0), ("raw", 1), ("sigmoid", 2), ("sigmoid2", 3)),  # sigmoid2: 2 * sigmoid
    "KDA_STATE": (("none", 0), ("bf16", 1), ("f32", 2)),  # state arrays passed at run time
    "KDA_MMA": (("sync", 0), ("wgmma", 1), ("tcgen05", 2)),  # the recurrence's MMA family (TileConfig.mma)
}


def defines() -> dict:
    """{macro name: code} of every enum."""
    return {f"{prefix}_{name.upper()}": code for prefix, items in TABLE.items() for name, code in items}


def _codes(prefix: str) -> dict:
    return dict(TABLE[prefix])


DTYPE_CODE = {BF16: _codes("KDA")["bf16"], F16: _codes("KDA")["f16"], F32: _codes("KDA")["f32"]}
GATE_CODE = _codes("KDA_GATE")
BETA_CODE = _codes("KDA_BETA")
MMA_CODE = _codes("KDA_MMA")
STATE_DTYPE_CODE = {None: _codes("KDA_STATE")["none"], BF16: _codes("KDA_STATE")["bf16"],
                    F32: _codes("KDA_STATE")["f32"]}

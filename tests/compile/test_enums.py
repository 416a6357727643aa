"""Enum options are written down once (kdacupy/jit/enums.py): every variant's
source carries them as named #defines and the kernels compare against names."""
import re
from pathlib import Path

from kdacupy.jit import enums, render
from kdacupy.numerics.dtypes import BF16, F32
from kdacupy.ops.forward.kernels import PrepareVariant

ROOT = Path(__file__).resolve().parents[2]


def test_every_variant_carries_the_enum_names():
    var = PrepareVariant(64, BF16, F32, F32, "sigmoid", "sigmoid2", True)
    src = render.render(var.kernel, var.config())
    for name, code in enums.defines().items():
        assert f"#define {name} {code}\n" in src
    assert f"#define KDA_GATE {enums.GATE_CODE['sigmoid']}\n" in src
    assert f"#define KDA_BETA_MODE {enums.BETA_CODE['sigmoid2']}\n" in src
    assert f"#define KDA_G_DT {enums.DTYPE_CODE[F32]}\n" in src


def test_codes_are_distinct_within_each_enum():
    for prefix, items in enums.TABLE.items():
        codes = [c for _, c in items]
        assert len(set(codes)) == len(codes), prefix


def test_kernels_compare_enums_by_name_only():
    bare = re.compile(r"\b(KDA_GATE|KDA_BETA_MODE|KDA_DT|KDA_G_DT|KDA_BETA_DT|DT|dtype|s_in_dtype|s_out_dtype)"
                      r"\s*(==|!=|>=|<=|<|>)\s*\d")
    for path in sorted((ROOT / "kernels").glob("*.cu*")):
        hits = [ln for ln in path.read_text().splitlines() if bare.search(ln)]
        assert not hits, f"{path.name}: {hits}"

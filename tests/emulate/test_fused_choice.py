"""Which calls the fused forward serves and takes (kdacupy/ops/forward/fused.py): the consumers' family per
target, tcgen05's consumer tile and its tensor memory (two consumers an SM must fit), and the columns the
Python side assumes against what the emulated kernel allocates."""
import dataclasses

import pytest

import kdacupy.ops.forward.fused as fused
from kdacupy.cli.shapes import validated
from kdacupy.emulate.profile import counting
from kdacupy.ops.forward import kernels
from kdacupy.ops.forward.tuning import TileConfig

from ..inputs import make_inputs

B200_SMS, H200_SMS = 148, 132


def problem(H=64, K=128, V=128, lens=None, fp32=False):
    x, opts = make_inputs(T=32 if lens is None else sum(lens), H=H, HV=H, K=K, V=V, cu_seqlens=lens)
    opts["state_precision"] = "fp32" if fp32 else "bf16"
    return validated(x, opts, "emulate")[0]


def test_the_families_and_the_consumers_tile():
    one, many = problem(), problem(lens=[16] * 6)
    assert fused.pays(one, H200_SMS, "sm_90a") and fused.pays(one, B200_SMS, "sm_100a")
    assert not fused.pays(one, 108, "sm_80")
    # a row a thread where V allows; half rows where that leaves too few consumers of several sequences
    assert fused.consumer_bv(one, "tcgen05", B200_SMS) == 128 and fused.consumer_bv(one, "wgmma", H200_SMS) == 64
    assert fused.consumer_bv(many, "tcgen05", B200_SMS) == 64
    assert fused.tiles_of(TileConfig(64, 3, "tcgen05"), one, B200_SMS) == TileConfig(128, 3, "tcgen05")
    assert fused.tiles_of(TileConfig(64, 2, "sync"), one) == TileConfig(64, 3, "wgmma")
    # half-row consumers are served, and taken as whole rows are: from TCGEN05_MIN_MEAN_CHUNKS a sequence
    assert fused.supported(many, TileConfig(64, 3, "tcgen05")) and not fused.pays(many, B200_SMS, "sm_100a")
    assert fused.pays(dataclasses.replace(many, T=6 * 16 * fused.TCGEN05_MIN_MEAN_CHUNKS), B200_SMS, "sm_100a")
    # 96 whole-row consumers: several sequences pay from TCGEN05_MIN_MEAN_CHUNKS chunks a sequence on average
    wide = problem(H=96, lens=[16] * 6)
    assert not fused.pays(wide, B200_SMS, "sm_100a")
    assert fused.pays(dataclasses.replace(wide, T=6 * 16 * fused.TCGEN05_MIN_MEAN_CHUNKS), B200_SMS, "sm_100a")
    assert not fused.pays(dataclasses.replace(wide, T=6 * 16 * fused.TCGEN05_MIN_MEAN_CHUNKS - 16), B200_SMS,
                          "sm_100a")
    assert fused.consumers(one, 128) == 64 and fused.blocks_per_sm(one, "tcgen05") == 2


def test_two_tcgen05_consumers_share_an_sm():
    """The fp32 state at BV = 128 and K = 128 takes all 512 columns: a second consumer on the SM would wait
    in tcgen05.alloc, so the launch refuses it; its shared memory keeps a third block off every SM."""
    fp32 = problem(fp32=True)
    assert fused.tcgen05_columns(128, 128, True) == 512 and not fused.supported(fp32, TileConfig(128, 3, "tcgen05"))
    assert fused.supported(fp32, TileConfig(64, 3, "tcgen05")) and fused.consumer_bv(fp32, "tcgen05") == 64
    var = kernels.fused_variant(problem(), TileConfig(128, 3, "tcgen05"))
    assert var.only_arch == "sm_100a" and var.smem == fused.TCGEN05_SMEM_FLOOR
    per_sm, reserved = 233472, 1024  # an sm_100 SM's shared memory, and a block's reservation
    assert 3 * (var.smem + reserved) > per_sm >= 2 * (var.smem + reserved)
    assert kernels.fused_variant(problem(), TileConfig(64, 3, "wgmma")).only_arch == "sm_90a"


@pytest.mark.emulate
@pytest.mark.parametrize("K, BV, precision", [(64, 128, "fp32"), (64, 64, "bf16"), (128, 64, "fp32")])
def test_the_columns_are_what_the_kernel_allocates(K, BV, precision):
    x, opts = make_inputs(T=16, H=1, HV=1, K=K, V=128)
    opts["state_precision"] = precision
    p, a = validated(x, opts, "emulate")
    with counting() as recs:
        kernels.forward(p, a, TileConfig(BV, 2, "tcgen05"))
    rec = next(r for r in recs if r["kernel"] == "kda_recurrence")
    assert rec["tmem_cols"] / rec["ctas"] == fused.tcgen05_columns(K, BV, p.state_precision == "fp32")


def test_a_problem_of_another_head_dim_is_not_served():
    p = dataclasses.replace(problem(), K=256)
    assert not fused.supported(p, TileConfig(128, 3, "tcgen05")) and not fused.pays(p, B200_SMS, "sm_100a")

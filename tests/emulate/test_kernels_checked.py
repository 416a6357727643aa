"""The emulated kernel suite again, with every check on (KDACUPY_EMULATE_CHECK=all): each test
of test_kernels_emulate.py is collected here too and runs under the autouse fixture below; every
parity case gives results bit-identical to the unchecked run, also in the stress modes
(cp.async landing at issue, threads in reverse order) on a subset of the cases."""
import numpy as np
import pytest

import kdacupy

from ..cases import CASES, case_inputs
from .test_kernels_emulate import *  # noqa: F401,F403  (the whole suite, re-collected under the checks)


@pytest.fixture(autouse=True)
def every_check(monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    monkeypatch.delenv("KDACUPY_EMULATE_CP_ASYNC", raising=False)
    monkeypatch.delenv("KDACUPY_EMULATE_ORDER", raising=False)


def forward(name, precision, monkeypatch, **env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    x, opts = case_inputs(name, precision)
    return kdacupy.kda_forward(**x, **opts, backend="emulate")


STRESS = {"eager": {"KDACUPY_EMULATE_CP_ASYNC": "eager"}, "reverse": {"KDACUPY_EMULATE_ORDER": "reverse"}}
STRESS_CASES = ["fixed-gva-sigmoid", "varlen-ragged-zero-vk-bf16", "fp32-inputs", "V256"]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(CASES))
def test_checked_results_are_bit_identical(name, precision, monkeypatch):
    checked = forward(name, precision, monkeypatch)
    plain = forward(name, precision, monkeypatch, KDACUPY_EMULATE_CHECK="")
    for a, b in zip(checked, plain):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("stress", list(STRESS))
@pytest.mark.parametrize("name", STRESS_CASES)
def test_checked_stress_modes_are_bit_identical(name, stress, monkeypatch):
    plain = forward(name, "bf16", monkeypatch, KDACUPY_EMULATE_CHECK="")
    monkeypatch.setenv("KDACUPY_EMULATE_CHECK", "all")
    stressed = forward(name, "bf16", monkeypatch, **STRESS[stress])
    for a, b in zip(stressed, plain):
        np.testing.assert_array_equal(a, b)

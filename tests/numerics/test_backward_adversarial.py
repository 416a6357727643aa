"""The backward's precision model on the adversarial inputs (``kdacupy.accuracy.ADVERSARIAL``):
finite, and each gradient within these bounds (RMSE ratio against the float64 reference;
u = 2^-9, the 10u of test_backward_model for random keys):

- keys in a chunk that are all alike: the gradients' rows add coherent terms, as the output's
  do (test_adversarial.py): x F, F = sqrt(mean(i + 1)) ~ 2.9, so 10u F = 5.7e-2;
- beta near 2: the inverse's entries stop decaying, each U_j an alternating sum of terms of
  twice its size (test_adversarial.py): another x 2F (0.33);
- the initial state's gradient under a fast decay (the "fast" and "softplus" families, beta =
  sigmoid(4 + noise) ~ 0.98 on collinear q and k): only the first tokens reach S0, and there
  q_dec do^T and k_dec dX^T nearly cancel, to (1 - beta) of their size; their bf16 roundings
  (u each, about four in series) do not: 4u / (1 - sigmoid(4)) = 0.43;
- dbeta with one token repeated (raw beta 0.999): X = v - S^T k is v minus the state's
  memory of the same token, so every token's dbeta is a cancellation whose rounding (u |v|)
  stays while the exact value decays after the first token: the ratio grows as sqrt(T/16)
  (chunks), 10u F sqrt(T/16).

Measured (T = 256, one head, K = V = 64): 1.3e-2 outside those families; 9.3e-2 with beta ~ 2;
dS0 0.15 under fast decay; dbeta 0.11 for the repeated token; the emulated kernels give the
model's values bit for bit on these inputs too (tests/emulate/test_backward_emulate.py), since
they do the same arithmetic.
"""
import math

import numpy as np
import pytest

from kdacupy.cli.accuracy import ADVERSARIAL, adversarial_inputs
from kdacupy.cli.accuracy_backward import FIELDS, loss_inputs
from kdacupy.numerics.backward_model import kda_backward_model
from kdacupy.numerics.backward_reference import kda_backward_reference

from .test_backward_model import measured

U_BF16 = 2.0 ** -9  # the error unit u (tests/numerics/test_precision.py)
F = math.sqrt(np.mean(np.arange(1, 17)))
T_TEST = 256
#: one case per family the bounds distinguish (the other short cases measure alike: the accuracy report)
CASES = ["repeat-token g=0 beta=.999", "collinear 1e-3 g=0", "repeat-key slow", "collinear 1e-3 fast",
         "collinear 1e-3 beta~2", "zero-keys slow", "collinear 1e-3 softplus"]


def bound(name, field, T):
    keys, _noise, gate, beta_logit, neg, _ = ADVERSARIAL[name]
    b = 10 * U_BF16 * F * (2 * F if neg else 1.0)
    if field == "dinitial_state" and gate in ("fast", "softplus"):
        b = max(b, 4 * U_BF16 / (1.0 - 1.0 / (1.0 + math.exp(-beta_logit))))
    if field == "dbeta" and keys == "token":
        b *= math.sqrt(T / 16)
    return b


@pytest.mark.parametrize("name", CASES)
def test_model_is_finite_and_within_bound(name):
    x, opts = adversarial_inputs(name, T_TEST, 1, 64, 64, seed=1)
    args, o = loss_inputs(x, opts, seed=1)
    refs = kda_backward_reference(**args, **o)
    got = kda_backward_model(**args, **o)
    for f, e in measured(got, refs).items():
        if e is None:
            continue
        assert np.isfinite(np.asarray(got[FIELDS.index(f)], np.float64)).all(), f
        if f != "dA_log":  # its bound is its sum's condition (test_backward_model.py), checked on the sweep
            assert e < bound(name, f, T_TEST), (f, e, bound(name, f, T_TEST))

"""Every variant of the forward's two kernels the library can launch, registered
with ``kdacupy.jit.registry`` (what ``python -m kdacupy.compile`` builds)."""
from __future__ import annotations

import itertools

from ...jit import registry
from ..inputs import DTYPES, input_option_space
from .limits import DIMS
from .kernels import PrepareVariant, RecurrenceVariant
from .tuning import candidates


def prepare_variants():
    for K, options in itertools.product(DIMS, input_option_space()):
        yield PrepareVariant(K, *options)


def recurrence_variants():
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in candidates(V):
            yield RecurrenceVariant(K, V, dt, fp32, tiles)


registry.register("kda_prepare", prepare_variants)
registry.register("kda_recurrence", recurrence_variants)

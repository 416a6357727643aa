"""Every variant of the forward's two kernels the library can launch, registered
with ``kdacupy.jit.registry`` (what ``python -m kdacupy.compile`` builds)."""
from __future__ import annotations

import itertools

from ...jit import registry
from ...numerics.dtypes import BF16, F16, F32
from .limits import DIMS
from .kernels import BETA_CODE, GATE_CODE, PrepareVariant, RecurrenceVariant
from .tuning import TILE_SPACE

DTYPES = (BF16, F16, F32)



def prepare_variants():
    for K, dt, gate, l2 in itertools.product(DIMS, DTYPES, GATE_CODE, (False, True)):
        for gdt in dict.fromkeys((dt, F32)):
            for beta_mode in BETA_CODE:
                for bdt in ((dt,) if beta_mode == "none" else dict.fromkeys((dt, F32))):
                    yield PrepareVariant(K, dt, gdt, bdt, gate, beta_mode, l2)


def recurrence_variants():
    for K, V, dt, fp32 in itertools.product(DIMS, DIMS, DTYPES, (False, True)):
        for tiles in TILE_SPACE:
            if tiles.BV <= V:
                yield RecurrenceVariant(K, V, dt, fp32, tiles)


registry.register("kda_prepare", prepare_variants)
registry.register("kda_recurrence", recurrence_variants)

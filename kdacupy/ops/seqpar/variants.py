"""Sequence parallelism's kernel variants, registered with ``kdacupy.jit.registry``
(``python -m kdacupy.compile --kernel seqpar``): the recurrence's map variants
(fp32 state, no output; mma.sync, wgmma on sm_90a, tcgen05 on sm_100a) and the scan kernel."""
from __future__ import annotations

import itertools

from ...jit import registry
from ..forward.kernels import RecurrenceVariant
from ..forward.limits import DIMS
from ..forward.tuning import candidates
from ..inputs import DTYPES
from .split import ScanVariant


def map_variants(any_dims=False):
    """Every tile of mma.sync, and of wgmma (sm_90a alone: ``RecurrenceVariant.only_arch``) and tcgen05
    (sm_100a alone) at the sizes they serve (K <= 128, the tiles' head dims)."""
    for K, V, dt in itertools.product(DIMS, DIMS, DTYPES):
        tiles = candidates(V, None if any_dims else "sm_90a", K)
        if not any_dims:
            tiles += [t for t in candidates(V, "sm_100a", K) if t.mma == "tcgen05"]
        for t in tiles:
            yield RecurrenceVariant(K, V, dt, True, t, no_output=True, any_dims=any_dims)


def scan_variants(any_dims=False):
    for K, V in itertools.product(DIMS, DIMS):
        yield ScanVariant(K, V, any_dims)


registry.register("kda_seqpar_maps", map_variants)
registry.register("kda_seqpar_scan", scan_variants)
# the any-size variants (KDA_ANY_DIMS), shared by every head dim that rounds up to their tiles
registry.register("kda_seqpar_maps_any", lambda: map_variants(any_dims=True))
registry.register("kda_seqpar_scan_any", lambda: scan_variants(any_dims=True))

"""Context parallelism's local steps for a framework that runs the collectives itself
(kdacupy.jax: ``jax.lax.all_gather`` inside ``shard_map``; docs/design.md section 7.3).

Between two of its collectives a rank runs one step and never raises: ``capture`` turns a
failure into a fixed-size status row that travels with the step's data, and the next step
first ``check``s every rank's row, so every rank raises the same error naming the failed
rank and step, in the same step, and none waits in a collective for one that failed. The
steps are those of ``Shard`` (kdacupy/distributed/shard.py): ``forward_rows`` -> gather ->
``forward``; ``backward_rows`` -> gather -> ``backward``, each rank summing the shares.
"""
from __future__ import annotations

import numpy as np

from .agree import failure_of, raise_collective, status_row
from .call import LocalCall, exchange_dtype
from .comm import STATUS_BYTES, unpack
from .shard import Shard, plans_for, rows_shape

__all__ = ["STATUS_BYTES", "capture", "check", "exchange_dtype", "rows_shape", "shard_of"]


def shard_of(fn: str, rank: int, tokens, q, k, v, g, beta=None, **call):
    """Rank ``rank``'s ``Shard`` of a call whose ranks hold ``tokens`` tokens each (a list, in
    rank order); ``call``: LocalCall's keywords (cu_seqlens, initial_state, options, do, ...)."""
    local = LocalCall(q, k, v, g, beta, **call)
    return Shard(local, plans_for(local, list(tokens), fn), rank)


def capture(step, validating=False):
    """``(step(), status row)``; on any exception ``(None, the failure's row)``."""
    try:
        return step(), status_row(None)
    except Exception as e:  # noqa: BLE001  (every rank must hear of it, none may stop here alone)
        return None, status_row(failure_of(e, validating))


def check(fn: str, what: str, rows):
    """Raise, the same on every rank, when any rank's status row ([ranks, STATUS_BYTES]) holds a
    failure: bad input as the single-process call raises it (ValueError / TypeError, "rank r:
    ..."), anything else as a ContextParallelError naming the rank and the step ``what``."""
    if not isinstance(rows, np.ndarray) and hasattr(rows, "get"):  # CuPy: XLA's device buffer on a GPU
        rows = rows.get()
    statuses = [unpack(np.asarray(r, np.uint8)) for r in rows]
    inputs = all(s is None or s[0] in ("ValueError", "TypeError") for s in statuses)
    raise_collective(fn, None if inputs else what, statuses)

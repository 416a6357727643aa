"""The NumPy backends' checkpoints (``kda_forward(checkpoint_every=, checkpoints=)``, docs/design.md
section 7.1): the state after every ``every`` tokens of each sequence, from its own first token,
as the chunked forms (the precision model, the float64 reference) pass each chunk's end.

``collector`` gives the callback the forms call after each chunk (``on_chunk(end, S)``: S
[N, HV, K, V] after each sequence's first ``end`` tokens, shorter sequences padded neutrally) and
the boundary states it keeps; ``store`` writes them to the destination rows, rounded to its dtype
through fp32 as a final state is."""
from __future__ import annotations

import numpy as np

from .reference import state_from_kv


def collector(every, lengths, per_seq):
    """(on_chunk, states): states[(n, j)] is sequence n's state at boundary j (1 <= j <= per_seq,
    j * every <= its length)."""
    lengths = np.asarray(lengths)
    states = {}

    def on_chunk(end, S):
        if end % every or end // every > per_seq:
            return
        for n in np.flatnonzero(lengths >= end):
            states[int(n), end // every] = np.array(S[n], dtype=np.float64)

    return on_chunk, states


def store(ck, states, layout):
    """Boundary states into ``ck.array`` (rows [R, HV, ., .]) at ``ck.indices[n, j - 1]`` (dense:
    n * per_seq + j - 1); rows outside [0, R) are skipped."""
    rows = None if ck.indices is None else np.asarray(ck.indices).astype(np.int64)
    for (n, j), S in states.items():
        row = n * ck.per_seq + j - 1 if rows is None else int(rows[n, j - 1])
        if 0 <= row < ck.rows:
            ck.array[row] = state_from_kv(S, layout).astype(np.float32).astype(ck.array.dtype)

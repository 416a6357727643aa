"""NumPy model of kernels/kda_seqpar_scan.cu's rounding, bit for bit (docs/design.md section 7.2).

The scan gives the start state of every segment, ``S[0] = S0``, ``S[s + 1] = M_s S[s] + B_s``,
all in fp32 (``M_s`` [K, K], ``B_s`` [K, V], kv orientation). The kernel's order, which this
model follows exactly:

* ``S[0]``: the initial state converted to fp32 (exact from bf16), or zeros;
* each element ``S[s + 1][k, v]`` is one ``fmaf`` chain that starts at ``B_s[k, v]`` and runs
  over the keys ``i = 0, 1, ..., K - 1`` in order: ``acc = fmaf(M_s[k, i], S[s][i, v], acc)``.
  The kernel stages M in blocks of ``split.scan_ti(K)`` keys and walks the blocks in ascending order, each
  block's keys ascending, into the same accumulator: no partial sums, no reassociation.

Rounding points: each ``fmaf`` (one rounding of the exact ``a * b + c``, ``backward_arith.fma32``);
nothing else rounds (the stores copy fp32 words). Values are the emulation's default numerics
(``KDACUPY_EMULATE_NUMERICS=exact``): subnormals are not flushed, which on the GPU's ``-ftz=true``
build differs only below 2^-126. Head dims other than the tiles: the model, as the kernel, runs on the
tiles with zeros past the true sizes, then cuts the result back (a padded key adds fmaf(0, 0, acc),
which leaves every chain's value as it is but for the sign of an exact zero).
"""
from __future__ import annotations

import numpy as np

from .backward_arith import fma_chain
from .tiles import exact_dims, pad_to, tile_of


def scan_model(M, B, S0, n):
    """Start states ``[N * n, HV, K, V]`` (fp32, kv) of ``n`` segments per sequence, as the scan
    kernel computes them: ``M`` [N * n, HV, K, K], ``B`` [N * n, HV, K, V] (fp32), ``S0``
    [N, HV, K, V] (kv, fp32 values; zeros for no initial state)."""
    S0 = np.asarray(S0, np.float32)
    N, HV, K, V = S0.shape
    M = np.asarray(M, np.float32).reshape(N, n, HV, K, K).astype(np.float64)
    B = np.asarray(B, np.float32).reshape(N, n, HV, K, V).astype(np.float64)
    if not exact_dims(K, V):  # the kernel's tiles: keys and columns past the true sizes zeros
        KT, VT = tile_of(K), tile_of(V)
        pad = lambda x, k, v: pad_to(pad_to(x, -2, k), -1, v)  # noqa: E731
        return scan_model(pad(M, KT, KT).reshape(N * n, HV, KT, KT), pad(B, KT, VT).reshape(N * n, HV, KT, VT),
                          pad(S0, KT, VT), n)[..., :K, :V].copy()
    S = np.empty((N, n, HV, K, V), np.float64)
    S[:, 0] = S0
    for s in range(n - 1):
        # key i: M_s[k, i] against S[s][i, v], i ascending, into acc[k, v] from B_s[k, v]
        S[:, s + 1] = fma_chain(M[:, s, :, :, :, None], S[:, s, :, None, :, :], axis=-2, start=B[:, s])
    return S.astype(np.float32).reshape(N * n, HV, K, V)

"""The launchers' allocations of scratch memory and of the outputs they create.

On the GPU a plain ``cupy.empty``. On the CPU emulation ``kdacupy.emulate.loader.empty``: under
the checks (KDACUPY_EMULATE_CHECK) every byte starts as a NaN pattern, so a read of scratch no
kernel wrote, or an output element no kernel wrote, fails every checked run instead of only
those that find unlucky leftovers.
"""
from __future__ import annotations

import numpy as np


def empty(xp, shape, dtype):
    if xp is np:
        from ..emulate.loader import empty as emulated_empty
        return emulated_empty(shape, dtype)
    return xp.empty(shape, dtype=dtype)

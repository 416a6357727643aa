"""The state options: layout, precision, the initial state and the final state's dtype."""
from __future__ import annotations

from ..numerics.dtypes import F32, F64, STATE_DTYPES, as_dtype, dtype_name
from .arrays import check_dtype, check_shape, fail

LAYOUTS = ("kv", "vk")
STATE_PRECISIONS = ("bf16", "fp32")


def check_state(arrays, state_layout, state_precision, state_dtype, dims, output_final_state):
    """(initial state array or None, final state dtype or None)."""
    if state_layout not in LAYOUTS:
        fail("state_layout", "'kv' or 'vk'", repr(state_layout))
    if state_precision not in STATE_PRECISIONS:
        fail("state_precision", "'bf16' or 'fp32'", repr(state_precision))
    N, HV, K, V = dims
    s0 = arrays["initial_state"]
    state_shape = (N, HV, K, V) if state_layout == "kv" else (N, HV, V, K)
    allowed = STATE_DTYPES + ((F64,) if arrays["q"].dtype == F64 else ())  # float64 calls (the reference)
    if s0 is not None:
        check_shape("initial_state", s0, state_shape, f"([N, HV, {'K, V' if state_layout == 'kv' else 'V, K'}] "
                    f"for state_layout={state_layout!r})")
        check_dtype("initial_state", s0, allowed)
    if state_dtype is not None:
        try:
            sd = as_dtype(state_dtype)
        except TypeError:
            sd = None
        if sd not in allowed:
            fail("state_dtype", ", ".join(map(dtype_name, allowed)) + " or None", repr(state_dtype), TypeError)
        state_dtype = sd
    if not output_final_state:
        return s0, None
    default = F64 if arrays["q"].dtype == F64 else F32
    return s0, state_dtype or (s0.dtype if s0 is not None else default)

"""One rank's validated part of a context-parallel call: its slice's arrays, the global
``cu_seqlens`` on the host, the states' and gradients' shapes, and the signature every rank
must share (docs/design.md section 7.3)."""
from __future__ import annotations

import hashlib
import inspect

import numpy as np

from .. import api
from ..backward import validated as backward_validated
from ..numerics.dtypes import F32, F64, STATE_DTYPES, as_dtype, dtype_name
from ..validation import as_array, fail, is_device, validate

#: kda_forward keywords a CP call takes through **options (the rest are CP's own; a state
#: pool has no meaning across ranks)
OWN = ("cu_seqlens", "initial_state", "output_final_state", "state_layout", "state_dtype", "out")
REFUSED = ("state_pool", "state_indices")
FORWARD_OPTIONS = tuple(n for n, p in inspect.signature(api.kda_forward).parameters.items()
                        if p.kind is p.KEYWORD_ONLY and n not in OWN + REFUSED)
#: the options that change the result, which kda_backward takes (and so kda_backward_cp)
BACKWARD_OPTIONS = ("scale", "qk_l2norm", "beta_sigmoid", "allow_neg_eigval", "gate", "A_log", "dt_bias",
                    "lower_bound", "state_precision", "backend")
#: kda_backward_cp's own keywords beside them
BACKWARD_OWN = ("cu_seqlens", "initial_state", "state_layout", "dfinal_state", "shared_grads")
_DEFAULTS = dict(scale=None, qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None,
                 dt_bias=None, lower_bound=None, state_precision="bf16", backend=None)
SHARED_GRADS = ("total", "local")


def exchange_dtype(p):
    """The dtype the maps, start states and state gradients travel and chain in: float32, or
    float64 for float64 inputs (the float64 reference, exact to its rounding)."""
    return F64 if p.dtype == F64 else F32


def check_options(options, fn, allowed, own):
    refused = sorted(set(options) & set(REFUSED))
    if refused:
        raise TypeError(f"{refused[0]}: not supported by {fn} (each rank's states come from the maps of the "
                        f"ranks before it; use initial_state)")
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"unexpected keyword {unknown[0]!r}; {fn} takes the keywords of "
                        f"{'kda_forward' if fn == 'kda_forward_cp' else 'kda_backward'}: "
                        f"{', '.join(tuple(allowed) + tuple(own))}")


class LocalCall:
    """This rank's validated call (raises the usual ValueError / TypeError). ``do`` given: a
    backward call (``dfinal_state`` then the final state's gradient, ``shared_grads`` its mode)."""

    def __init__(self, q, k, v, g, beta, *, cu_seqlens=None, initial_state=None, output_final_state=False,
                 state_layout="kv", state_dtype=None, out=None, options=None, do=None, dfinal_state=None,
                 shared_grads="total"):
        options = dict(options or {})
        self.backward = do is not None
        fn = "kda_backward_cp" if self.backward else "kda_forward_cp"
        check_options(options, fn, BACKWARD_OPTIONS if self.backward else FORWARD_OPTIONS,
                      BACKWARD_OWN if self.backward else OWN)
        kw = {n: options.get(n, x) for n, x in _DEFAULTS.items()}  # (sequence_parallel: the local forward's own)
        if self.backward:
            if shared_grads not in SHARED_GRADS:
                fail("shared_grads", "'total' or 'local'", repr(shared_grads))
            self.p, self.a = backward_validated(do, q, k, v, g, beta, state_layout=state_layout, **kw)
        else:
            self.p, self.a = validate(q, k, v, g, beta, initial_state=None, output_final_state=False,
                                      cu_seqlens=None, state_layout=state_layout, state_dtype=state_dtype, out=out,
                                      path="seqpar", **kw)
        p = self.p
        self.options = options
        self.shared_grads = shared_grads
        self.cu = None if cu_seqlens is None else host_cu_seqlens(cu_seqlens, p.B)
        self.N = p.B if self.cu is None else len(self.cu) - 1
        self.xdtype = exchange_dtype(p)
        self.s0 = self._state("initial_state", initial_state)
        self.ds = self._state("dfinal_state", dfinal_state) if self.backward else None
        self.output_final_state = bool(output_final_state)
        if state_dtype is not None and not self.output_final_state:  # as kda_forward
            raise ValueError(f"state_dtype: expected None without output_final_state=True (it is the final "
                             f"state's dtype), got {state_dtype!r}")
        self.state_out = None
        if self.output_final_state:
            self.state_out = (as_dtype(state_dtype) if state_dtype is not None
                              else self.s0.dtype if self.s0 is not None else self.xdtype)

    @property
    def state_shape(self):
        p = self.p
        return (self.N, p.HV, p.K, p.V) if p.state_layout == "kv" else (self.N, p.HV, p.V, p.K)

    def _state(self, name, s):
        """initial_state / dfinal_state: [N, HV, ...] in the layout, bf16 or fp32 (float64 for float64 q)."""
        if s is None:
            return None
        p = self.p
        s = as_array(name, s)
        if is_device(s) != p.device:
            fail(name, "an array of the same kind as q (NumPy or CuPy)", type(s).__name__)
        if tuple(s.shape) != self.state_shape:
            fail(name, f"shape {self.state_shape} ([N, HV, ...] for state_layout={p.state_layout!r})",
                 tuple(s.shape))
        allowed = STATE_DTYPES + ((F64,) if p.dtype == F64 else ())
        if s.dtype not in allowed:
            fail(name, "dtype " + " or ".join(map(dtype_name, allowed)), dtype_name(s.dtype), TypeError)
        return s

    def kv(self, s):
        """A state of the call's layout as [.., K, V] in the exchange dtype."""
        xp = _xp(self.p.device)
        s = s if self.p.state_layout == "kv" else s.swapaxes(-1, -2)
        return xp.ascontiguousarray(s, dtype=self.xdtype)

    def from_kv(self, s, dtype):
        """A [N, HV, K, V] state back in the call's layout and ``dtype``."""
        xp = _xp(self.p.device)
        s = s if self.p.state_layout == "kv" else s.swapaxes(-1, -2)
        return xp.ascontiguousarray(s).astype(dtype)

    def signature(self) -> dict:
        """What must agree on every rank (the token count need not)."""
        p, a = self.p, self.a
        sig = dict(batch=p.B, heads=(p.H, p.HV), dims=(p.K, p.V), dtypes=(str(p.dtype), str(p.g_dtype),
                   str(p.beta_dtype)), gate=(p.gate, p.lower_bound), beta_mode=p.beta_mode,
                   qk_l2norm=p.qk_l2norm, scale=p.scale, state_layout=p.state_layout,
                   state_precision=p.state_precision, backend=p.backend, device=p.device,
                   output_final_state=(self.output_final_state, str(self.state_out)),
                   initial_state=None if self.s0 is None else (tuple(self.s0.shape), str(self.s0.dtype)),
                   cu_seqlens=None if self.cu is None else Values(self.cu))
        for n in ("A_log", "dt_bias"):
            x = a[n]
            sig[n] = None if x is None else (tuple(x.shape), None if is_device(x) else Values(x))
        if self.backward:
            ds = self.ds
            sig["shared_grads"] = self.shared_grads
            # with "total" every rank holds the whole loss's gradient: the same values (host arrays)
            same = self.shared_grads == "total" and ds is not None and not is_device(ds)
            sig["dfinal_state"] = None if ds is None else (tuple(ds.shape), str(ds.dtype),
                                                           Values(ds) if same else None)
        return sig


def _xp(device):
    if device:
        import cupy
        return cupy
    return np


class Values:
    """A host array in a rank's signature: compared by content hash, shown by its values
    (the first and last few of a long one), so a mismatch message says what differs."""

    def __init__(self, x):
        x = np.ascontiguousarray(x)
        self.digest = hashlib.sha256(x.tobytes()).hexdigest()[:16]
        flat = x.ravel()
        if flat.size <= 16:
            self.shown = "[" + ", ".join(map(str, flat.tolist())) + "]"
        else:
            head = ", ".join(map(str, flat[:6].tolist()))
            tail = ", ".join(map(str, flat[-6:].tolist()))
            self.shown = f"[{head}, ..., {tail}] ({flat.size} values)"

    def __eq__(self, other):
        return isinstance(other, Values) and other.digest == self.digest

    def __repr__(self):
        return self.shown


def host_cu_seqlens(cu, B):
    if hasattr(cu, "get") and not isinstance(cu, np.ndarray):  # CuPy: the plan needs the values on the host
        cu = cu.get()
    cu = np.asarray(cu)
    if cu.dtype.kind not in "iu":
        fail("cu_seqlens", "integers (the global packed offsets)", f"dtype {cu.dtype}", TypeError)
    if cu.ndim != 1 or cu.shape[0] < 2:
        fail("cu_seqlens", "a 1-D array [N + 1] with N >= 1", f"shape {tuple(cu.shape)}")
    if B != 1:
        fail("q", "B == 1 with cu_seqlens (sequences packed in one row)", f"B = {B}")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        fail("cu_seqlens", "first value 0", int(cu[0]))
    if np.any(np.diff(cu) < 0):
        i = int(np.argmax(np.diff(cu) < 0))
        fail("cu_seqlens", "non-decreasing values", f"cu_seqlens[{i}] = {int(cu[i])} > "
             f"cu_seqlens[{i + 1}] = {int(cu[i + 1])}")
    return cu


def looks_device(x) -> bool:
    try:
        return is_device(as_array("q", x))
    except Exception:  # noqa: BLE001  (validation on every rank reports a bad q)
        return False

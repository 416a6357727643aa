"""FlashKDA's forward call on kdacupy: ``fwd`` and ``fwd_cp`` with FlashKDA's signatures, layouts,
in-place outputs and state dtypes, for code that calls ``flash_kda.fwd``: ``from
kdacupy.compat.flashkda import fwd`` replaces FlashKDA's import; ``patch()`` makes ``import
flash_kda`` give these (FlashKDA's own functions swapped out where it is installed), ``unpatch()``
restores it.

Matched revision (FlashKDA's public repository, MoonshotAI/FlashKDA): ``flash_kda/__init__.py`` and
``flash_kda/cp.py`` at ab67c75ae3005d6599cd409cfbc5d0b485ea32d0, called as its
``tests/test_fwd.py`` calls them.

What FlashKDA always does, and kdacupy's ``kda_forward`` does only when asked (docs/guide/frameworks.md,
"FlashKDA"): q and k are l2-normalised (``qk_l2norm=True``), ``beta`` holds logits
(``beta_sigmoid=True``), ``g`` is the raw gate, ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``
(``gate="sigmoid"``), and states are ``[N, H, V, K]`` (``state_layout="vk"``). This face states all
four, so a FlashKDA state is never read transposed (with K = V its shape cannot tell). The output is
written into ``out`` and the final state into ``final_state`` (its dtype: bf16 or fp32, the
``initial_state``'s when both are given), as FlashKDA does; nothing is returned. kdacupy takes more
than FlashKDA (which needs K = V = 128, bf16, int64 ``cu_seqlens``): any head size kdacupy runs,
fp16 / fp32 inputs, int32 offsets, grouped value heads. Everything is checked before anything is
written; an error names the argument.

``fwd_cp`` is FlashKDA's intra-card context parallelism: kdacupy's sequence parallelism
(``sequence_parallel=None``, the library's choice, exact: no decay warm-up assumed), off with
``auto_cp=False``. ``fwd`` makes the same choice, so both give ``kda_forward``'s result bit for bit.
On the GPU the result is computed on torch's current stream and copied into ``out`` (one extra pass
over o: kdacupy's torch ops return new tensors). CPU tensors run on kdacupy's NumPy backends
(``backend=``, kdacupy's keyword, picks one; FlashKDA has none).
"""
from __future__ import annotations

import sys
import types

from kdacupy.torch import kda as _kda
from kdacupy.torch.tensors import STATE_DTYPES, is_tensor, no_grad, tensors

from .patching import Patcher
from .pool import check_out, overlaps

__all__ = ["fwd", "fwd_cp", "patch", "unpatch", "REVISION"]

REVISION = "ab67c75ae3005d6599cd409cfbc5d0b485ea32d0"
"""FlashKDA's commit whose public calls this face matches."""


def _check_final_state(final_state, initial_state, q, v, cu_seqlens, inputs):
    """FlashKDA's final_state: [N, H, V, K] in bf16 or fp32 (the initial state's dtype when both
    are given), apart from every input but the initial state it may replace in place."""
    if final_state is None:
        return
    N = q.shape[0] if cu_seqlens is None or not hasattr(cu_seqlens, "shape") else cu_seqlens.shape[0] - 1
    want = (N, v.shape[2], v.shape[3], q.shape[3])
    if tuple(final_state.shape) != want:
        raise ValueError(f"final_state: expected shape {want} ([N, H, V, K], FlashKDA's state layout), got "
                         f"{tuple(final_state.shape)}")
    if final_state.dtype not in STATE_DTYPES:
        raise TypeError(f"final_state: expected dtype bfloat16 or float32, got {final_state.dtype}")
    if initial_state is not None and initial_state.dtype != final_state.dtype:
        raise TypeError(f"final_state: expected the initial_state's dtype {initial_state.dtype} (FlashKDA: when "
                        f"both are provided their dtypes must match), got {final_state.dtype}")
    same = initial_state is not None and final_state.data_ptr() == initial_state.data_ptr() and \
        final_state.shape == initial_state.shape and final_state.stride() == initial_state.stride()
    for name, x in inputs.items():
        if name == "initial_state" and same:
            continue  # the state updated in place: read whole before it is written
        if x is not None and overlaps(final_state, x):
            raise ValueError(f"final_state: expected memory separate from {name}, got a tensor overlapping {name}")


def _run(fn, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
         sequence_parallel, backend):
    tensors(dict(q=q, k=k, v=v, g=g, beta=beta, out=out),
            dict(A_log=A_log, dt_bias=dt_bias, initial_state=initial_state, final_state=final_state))
    if v.dim() != 4 or q.dim() != 4:
        raise ValueError(f"{'v' if v.dim() != 4 else 'q'}: expected [B, T, H, {'V' if v.dim() != 4 else 'K'}], "
                         f"got shape {tuple((v if v.dim() != 4 else q).shape)}")
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
                  cu_seqlens=cu_seqlens if is_tensor(cu_seqlens) else None)
    check_out(out, v, final_state=final_state, **inputs)
    _check_final_state(final_state, initial_state, q, v, cu_seqlens, dict(inputs, out=out))
    with no_grad():  # FlashKDA's forward is inference only
        o, final = _kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                        output_final_state=final_state is not None, cu_seqlens=cu_seqlens, qk_l2norm=True,
                        beta_sigmoid=True, gate="sigmoid", A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                        state_layout="vk", state_dtype=None if final_state is None else final_state.dtype,
                        sequence_parallel=sequence_parallel, backend=backend)
        out.copy_(o)
        if final_state is not None:
            final_state.copy_(final)


def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
        cu_seqlens=None, *, backend=None):
    """FlashKDA's ``flash_kda.fwd`` on kdacupy: o written into ``out`` [B, T, H, V], the final state
    (if ``final_state`` is given) into it, [N, H, V, K]; returns None. q, k [B, T, H, K]; g the raw
    gate [B, T, H, K]; beta logits [B, T, H]; A_log [H], dt_bias [H, K] (float32); lower_bound in
    [-5, 0]; ``cu_seqlens`` [N + 1] with B = 1."""
    _run("fwd", q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
         None, backend)


def fwd_cp(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
           cu_seqlens=None, auto_cp=True, *, backend=None):
    """FlashKDA's ``flash_kda.fwd_cp``: ``fwd`` with kdacupy's exact sequence parallelism where the
    library's heuristic says it pays (``auto_cp=True``), or without it (``auto_cp=False``)."""
    if not isinstance(auto_cp, bool):
        raise TypeError(f"auto_cp: expected a bool, got {auto_cp!r}")
    _run("fwd_cp", q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
         cu_seqlens, None if auto_cp else 1, backend)


# ---------------------------------------------------------------------------
# patch / unpatch

_OURS = {"fwd": fwd, "fwd_cp": fwd_cp}
_state = {"patcher": None, "shim": None}


def patch():
    """Make ``flash_kda.fwd`` / ``flash_kda.fwd_cp`` kdacupy's: swapped into an installed FlashKDA
    (and every loaded ``flash_kda`` module holding them), or, where FlashKDA is not installed (it
    builds only with CUDA on SM90+), a ``flash_kda`` module that holds them, so ``import flash_kda``
    works unchanged. Calling it again does nothing; ``unpatch()`` restores what was there."""
    if _state["patcher"] is not None or _state["shim"] is not None:
        return
    try:
        import flash_kda  # noqa: F401
    except ImportError:
        shim = types.ModuleType("flash_kda")
        shim.__doc__ = "kdacupy.compat.flashkda standing in for FlashKDA (not installed)"
        shim.fwd, shim.fwd_cp = fwd, fwd_cp
        sys.modules["flash_kda"] = _state["shim"] = shim
        return
    patcher = Patcher("flash_kda", ("flash_kda", "flash_kda.cp"), _OURS)
    patcher.patch()
    _state["patcher"] = patcher


def unpatch():
    """Restore FlashKDA's functions (or remove the stand-in ``flash_kda`` module)."""
    if _state["shim"] is not None:
        if sys.modules.get("flash_kda") is _state["shim"]:
            del sys.modules["flash_kda"]
        _state["shim"] = None
    if _state["patcher"] is not None:
        _state["patcher"].unpatch()
        _state["patcher"] = None

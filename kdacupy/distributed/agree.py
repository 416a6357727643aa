"""No rank may hang on another's failure (docs/design.md section 7.3): every local step between
two collectives ends in a small agreement, each rank's status (None, or its failure's type and
message) gathered by every rank; on any failure every rank raises the same error naming the
failed rank(s) and the step. The engines agree through ``agree`` (an allgather of a fixed-size
pickle); frameworks that run their own collectives (kdacupy.jax's all_gather) carry the same
status as a fixed-size byte row (``status_row``, read back by ``steps.check``)."""
from __future__ import annotations

import numpy as np

from .comm import NCCL_NEEDS_DEVICE, STATUS_BYTES, cut_status, pack
from ..validation import fail


class ContextParallelError(RuntimeError):
    """A rank of a context-parallel call failed (out of memory, a compile failure, a bug):
    raised on every rank with the same message, naming the rank(s) and the step, so no rank
    waits for a collective the failed one never joins. On the failed rank the original
    exception is the ``__cause__``."""


def failure_of(e: BaseException, validating: bool = False):
    """What a rank tells the others of its exception: bad input found by the validation keeps
    its kind (ValueError / TypeError, as the single-process call raises it); anything else
    becomes a ContextParallelError naming the original type."""
    if validating and isinstance(e, (ValueError, TypeError)):
        return ("TypeError" if isinstance(e, TypeError) else "ValueError", str(e))
    return ("ContextParallelError", f"{type(e).__name__}: {e}")


def raise_collective(fn: str, what: str | None, statuses, cause=None):
    """Every rank raises the same error from the gathered statuses (``what``: the step; None
    for the validation, whose error reads as the single-process call's)."""
    bad = [(r, s) for r, s in enumerate(statuses) if s is not None]
    if not bad:
        return
    r, (kind, msg) = bad[0]
    if what is None:
        more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
        text = f"{fn}: rank {r}: {msg}{more}"
    else:
        text = f"{fn}: rank {r} failed {what}: {msg}" + "".join(
            f"; rank {r2}: {m2}" for r2, (_, m2) in bad[1:4]) + (
            f"; and {len(bad) - 4} more rank(s)" if len(bad) > 4 else "")
    input_error = all(k in ("ValueError", "TypeError") for _, (k, _m) in bad)
    exc = (TypeError if kind == "TypeError" else ValueError) if input_error else ContextParallelError
    raise exc(text) from cause


def agreed(eng, fn: str, what: str, step):
    """This rank's local work between two collectives: run ``step``, then agree with every rank
    that all went well (one small allgather) before anyone goes on to the next collective."""
    result, failure, cause = None, None, None
    try:
        result = step()
    except Exception as e:  # noqa: BLE001  (whatever it is, the other ranks must hear of it)
        failure, cause = failure_of(e), e
    raise_collective(fn, what, eng.agree(failure), cause)
    return result


def collective_check(eng, fn: str, local_fn):
    """Validate on every rank, then agree: every rank raises the same error when any rank's
    input is bad (or its validation fails in any other way) or the ranks disagree. Returns
    this rank's LocalCall and every rank's token count."""
    local, failure, cause, sig, tokens = None, None, None, None, None
    try:
        local = local_fn()
        if eng.requires_device and not local.p.device:
            fail("comm", *NCCL_NEEDS_DEVICE, TypeError)
        sig, tokens = local.signature(), local.p.T
    except Exception as e:  # noqa: BLE001
        failure, cause = failure_of(e, validating=True), e
    if failure is not None:
        failure = (failure[0], failure[1][:4000])
    infos = eng.allgather_obj(dict(error=failure, sig=sig, tokens=tokens))
    errors = [i["error"] for i in infos]
    unexpected = any(e is not None and e[0] not in ("ValueError", "TypeError") for e in errors)
    raise_collective(fn, "validating its input" if unexpected else None, errors, cause)
    first = infos[0]["sig"]
    for r, i in enumerate(infos[1:], 1):
        for key, val in first.items():
            if i["sig"][key] != val:
                raise ValueError(f"{fn}: the ranks disagree on {key}: rank 0 has {val!r}, "
                                 f"rank {r} has {i['sig'][key]!r}")
    return local, [i["tokens"] for i in infos]


def status_row(failure) -> np.ndarray:
    """A rank's status (None or ``(kind, message)``) as ``uint8[STATUS_BYTES]``, for an
    all_gather of the engine's own."""
    return np.frombuffer(pack(cut_status(failure), STATUS_BYTES), np.uint8).copy()


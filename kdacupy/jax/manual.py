"""``shard_map``'s manual axes for the buffer callbacks (docs/design.md section 10.3).

Inside ``jax.shard_map`` (with its default ``check_vma=True``) every value's type says over
which mesh axes it varies. A buffer callback's results carry no such axes (XLA fills them per
device, the type system cannot see how), so a callback that reads a shard gives results typed
as equal on every device: a ``custom_vjp`` backward then hands back gradients whose types do
not match the arguments', which JAX refuses. So the callbacks' results are cast to vary over
every axis their inputs vary over (``varying`` / ``to_varying``, no data moves), and each
gradient is summed (``psum``) over the axes its argument does not vary over (``like``): the
gradient of an argument shared by the shards (A_log, say) is the sum of the shards' parts.
Outside ``shard_map`` nothing varies and all three do nothing.
"""
from __future__ import annotations

import jax


def varying(*xs) -> frozenset:
    """The manual mesh axes any of ``xs`` (None skipped) varies over."""
    axes = set()
    for x in xs:
        if x is None:
            continue
        aval = jax.typeof(x)
        vma = getattr(aval, "vma", None)
        if vma is None:
            vma = getattr(getattr(aval, "manual_axis_type", None), "varying", ())
        axes |= set(vma)
    return frozenset(axes)


def to_varying(x, axes):
    """``x`` typed as varying over ``axes`` too (its values unchanged)."""
    missing = tuple(sorted(frozenset(axes) - varying(x)))
    if not missing:
        return x
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        return pcast(x, missing, to="varying")
    return jax.lax.pvary(x, missing)


def like(grad, primal, axes):
    """``grad`` (varying over ``axes``) as the cotangent of ``primal``: summed over the axes
    ``primal`` does not vary over."""
    extra = tuple(sorted(frozenset(axes) - varying(primal)))
    return jax.lax.psum(grad, extra) if extra else grad

"""``kda_backward``: the gradients of ``kda_forward`` (docs/design.md section 9): validation, then
dispatch to a backend."""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .numerics.dtypes import F32, F64, STATE_DTYPES, dtype_name, row_alignment
from .validation import as_array, check_kernel_layout, fail, is_device, validate


class KDAGradients(NamedTuple):
    """Gradients with respect to the arguments of ``kda_forward`` as passed; None for one not given."""
    dq: Any
    dk: Any
    dv: Any
    dg: Any
    dbeta: Any
    dinitial_state: Any
    dA_log: Any
    ddt_bias: Any


def kda_backward(
    do, q, k, v, g, beta=None, *, dfinal_state=None, scale=None, initial_state=None, cu_seqlens=None,
    qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
    lower_bound=None, state_layout="kv", state_precision="bf16", backend=None, saved=None, **unknown,
):
    """Kimi Delta Attention backward: the gradients of
    ``sum(o * do) + sum(final_state * dfinal_state)``, where ``o, final_state`` are what
    ``kda_forward`` returns for the same arguments, with respect to q, k, v, g, beta,
    initial_state, A_log and dt_bias as passed (through qk_l2norm, the beta sigmoid and the
    gate activations). Stateless: everything is recomputed from the inputs.

    do: like the output o ([B, T, HV, V], v's dtype); dfinal_state: None (no loss on the final
    state) or like the final state ([N, HV, K, V], ``"vk"``: [N, HV, V, K]; bf16 or fp32).
    The other arguments mean what they mean in ``kda_forward`` (docs/design.md section 1).

    Returns ``KDAGradients(dq, dk, dv, dg, dbeta, dinitial_state, dA_log, ddt_bias)``, each in
    its argument's dtype and shape (ddt_bias in dt_bias's shape), None where the argument was
    None. Grouped value heads: dq and dk sum over the HV // H value heads of each query head.

    backend: None picks by array type (CuPy -> "cuda", NumPy -> "reference"); "reference" is
    the float64 gradient (float64 inputs give float64 gradients, the others are rounded to
    their argument's dtype); "model" the NumPy precision model of the backward kernels
    (kdacupy/numerics/backward_model.py), bit for bit what they compute on the CPU emulation.
    state_precision: the forward's (it decides the states the backward recomputes).
    saved: None (recompute), or what ``kda_forward(..., save_for_backward=True)`` returned for these
    same arguments (the same arrays, options and sizes; anything else raises before a launch): its
    workspace and chunk states are read instead of recomputed (docs/design.md section 9.5).
    """
    if unknown:
        name = next(iter(unknown))
        raise TypeError(f"kda_backward() got an unexpected keyword argument {name!r}; it takes kda_forward's "
                        "options that change the result (docs/guide/training.md)")
    problem, a = validated(
        do, q, k, v, g, beta, dfinal_state=dfinal_state, scale=scale, initial_state=initial_state,
        cu_seqlens=cu_seqlens, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval,
        gate=gate, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_layout=state_layout,
        state_precision=state_precision, backend=backend)
    from .saved import kept_views
    kept = kept_views(saved, problem, dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                           cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias))
    if problem.backend == "reference":
        return _as_given(_reference(problem, a), A_log, dt_bias)
    if problem.backend == "model":
        return _as_given(_model(problem, a), A_log, dt_bias)
    from .ops.backward.kernels import backward  # launchers import the JIT machinery: load it only when used
    grads = backward(problem, a, kept=kept)
    return _as_given(KDAGradients(**grads), A_log, dt_bias)


def _as_given(grads, A_log, dt_bias):
    """dA_log and ddt_bias in their argument's shape and dtype: validation reads A_log [1, 1, HV, 1]
    as [HV] and bf16 / fp16 parameters as float32 (validation/options.py), the backends answer in those."""
    fixed = {}
    for n, grad, x in (("dA_log", grads.dA_log, A_log), ("ddt_bias", grads.ddt_bias, dt_bias)):
        if grad is not None:
            x = as_array(n[1:], x)
            if (grad.shape, grad.dtype) != (x.shape, x.dtype):
                fixed[n] = grad.reshape(x.shape).astype(x.dtype)
    return grads._replace(**fixed)


def validated(do, q, k, v, g, beta=None, *, dfinal_state=None, scale=None, initial_state=None, cu_seqlens=None,
              qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
              lower_bound=None, state_layout="kv", state_precision="bf16", backend=None):
    """``kda_backward``'s checks: its Problem and its arrays (do and dfinal_state among them), as the
    launchers take them (kdacupy/ops/backward/kernels.py; the profiler launches them with its own tiles)."""
    problem, a = validate(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=dfinal_state is not None,
        cu_seqlens=cu_seqlens, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, allow_neg_eigval=allow_neg_eigval,
        gate=gate, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_layout=state_layout,
        state_dtype=None, state_precision=state_precision, out=None, backend=backend, path="backward")
    a["do"] = _check_do(do, a, problem)
    a["dfinal_state"] = _check_dfinal(dfinal_state, a, problem)
    return problem, a


def _same_kind(name, x, q):
    if is_device(x) != is_device(q):
        fail(name, f"a {'CuPy (device)' if is_device(q) else 'NumPy (host)'} array like q",
             f"a {'CuPy (device)' if is_device(x) else 'NumPy (host)'} array")
    if is_device(x) and x.device.id != q.device.id:
        fail(name, f"an array on q's CUDA device {q.device.id}", f"device {x.device.id}")


def _check_do(do, a, p):
    if do is None:
        fail("do", "the gradient of o (an array like o)", "None", TypeError)
    do = as_array("do", do)
    _same_kind("do", do, a["q"])
    if tuple(do.shape) != tuple(a["v"].shape):
        fail("do", f"shape {tuple(a['v'].shape)} (the shape of o, i.e. of v)", tuple(do.shape))
    if do.dtype != a["v"].dtype:
        fail("do", f"dtype {dtype_name(a['v'].dtype)} (o's dtype, i.e. v's)", dtype_name(do.dtype), TypeError)
    check_kernel_layout("do", do, row_alignment(do))  # on every backend, as the forward's inputs: what runs on "model" runs on "cuda"
    return do


def _check_dfinal(ds, a, p):
    if ds is None:
        return None
    ds = as_array("dfinal_state", ds)
    _same_kind("dfinal_state", ds, a["q"])
    shape = (p.N, p.HV, p.K, p.V) if p.state_layout == "kv" else (p.N, p.HV, p.V, p.K)
    if tuple(ds.shape) != shape:
        dims = "K, V" if p.state_layout == "kv" else "V, K"
        fail("dfinal_state", f"shape {shape} ([N, HV, {dims}], the final state's for "
             f"state_layout={p.state_layout!r})", tuple(ds.shape))
    allowed = STATE_DTYPES + ((F64,) if p.dtype == F64 else ())
    if ds.dtype not in allowed:
        fail("dfinal_state", "dtype " + " or ".join(map(dtype_name, allowed)), dtype_name(ds.dtype), TypeError)
    if not ds.flags.c_contiguous:
        fail("dfinal_state", "a C-contiguous array", f"strides {ds.strides}")
    return ds


def _round(x, like):
    """A float64 gradient in the dtype of its argument (float64 arguments keep float64)."""
    if x is None:
        return None
    dt = np.dtype(like.dtype)
    return x if dt == F64 else x.astype(F32).astype(dt)


def _options(p, a) -> dict:
    return dict(dfinal_state=a["dfinal_state"], scale=p.scale, initial_state=a["initial_state"],
                cu_seqlens=a["cu_seqlens"], qk_l2norm=p.qk_l2norm, beta_sigmoid=p.beta_mode in ("sigmoid", "sigmoid2"),
                allow_neg_eigval=p.beta_mode == "sigmoid2", gate=p.gate, A_log=a["A_log"], dt_bias=a["dt_bias"],
                lower_bound=p.lower_bound, state_layout=p.state_layout)


def _model(p, a) -> KDAGradients:
    from .numerics.backward_model import kda_backward_model
    return KDAGradients(*kda_backward_model(a["do"], a["q"], a["k"], a["v"], a["g"], a["beta"], **_options(p, a),
                                            state_precision=p.state_precision))


def _reference(p, a) -> KDAGradients:
    from .numerics.backward_reference import kda_backward_reference
    grads = kda_backward_reference(a["do"], a["q"], a["k"], a["v"], a["g"], a["beta"], **_options(p, a))
    likes = [a[n] for n in ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")]
    return KDAGradients(*(_round(x, like) if like is not None else None for x, like in zip(grads, likes)))

"""``chunk_kda(..., cp_context=...)``: FLA's context parallelism (fla/ops/cp) on
kdacupy.torch.kda_cp (docs/design.md section 7.3).

FLA's ``FLACPContext`` holds the process group and this rank's slice of the packed stream
as rank-local ``cu_seqlens`` (``build_cp_context`` cuts the global offsets into equal
shares), and ``pre_num_ranks > 0`` when the slice's first sequence began on an earlier rank.
With ``layout="zigzag"`` rank r holds parts r and 2W-1-r of 2W equal parts (``[front; back]``):
two contiguous passes, the back parts swapped between ranks r and W-1-r
(kdacupy.torch.cp.fla_zigzag).
As in FLA: q, k, v, g, beta are this rank's slice (B = 1), ``cu_seqlens`` is taken from the
context, and there is no initial or final state. kda_cp takes the global offsets: they are
rebuilt from every rank's local ones (one small all_gather of Python lists per call).
Gradients: the slice's, and this rank's shares of A_log's and dt_bias's (summed over the
group they are the whole loss's, as FLA's training loops sum replicated parameters').
"""
from __future__ import annotations

from kdacupy.torch import kda_cp
from kdacupy.torch.cp import fla_cu_seqlens, fla_zigzag


def cp_call(cp_context, q, initial_state, output_final_state, return_intermediate_states, use_graph, *, options,
            check_beta):
    """FLA's checks of a CP call, with its messages; then (the rank-local cu_seqlens, which
    chunk_kda's own checks read as FLA's do, and the forward to run instead of chunk_kda's).
    ``options``, ``check_beta``: compat.fla's keyword mapping and beta check."""
    # fla-core's AssertionErrors, in its order, raised as such under python -O too
    if initial_state is not None:
        raise AssertionError("Initial state is not supported for CP")
    if output_final_state is not False:
        raise AssertionError("Output final state is not supported for CP")
    if cp_context.cu_seqlens is None:
        raise AssertionError("cu_seqlens is required for CP")
    if return_intermediate_states:
        raise NotImplementedError("return_intermediate_states: not with cp_context (an inference-mode output; "
                                  "context parallelism is for training)")
    if use_graph:
        raise ValueError("use_graph: fla-core does not support cp_context with use_graph")

    def forward(fn, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, **fla):
        if fla["allow_neg_eigval"] and not fla["use_beta_sigmoid_in_kernel"]:
            raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
        check_beta(beta, v)
        if getattr(cp_context, "layout", "contiguous") == "zigzag":
            return fla_zigzag(cp_context, q, k, v, g, beta, options(fn, **fla)), None
        o, _ = kda_cp(q, k, v, g, beta, group=cp_context.group, cu_seqlens=fla_cu_seqlens(cp_context, q.shape[1]),
                      **options(fn, **fla))
        return o, None

    return cp_context.cu_seqlens, forward

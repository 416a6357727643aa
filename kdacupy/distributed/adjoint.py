"""The gradient at a piece's start state alone: ``dS_start = M^T dS_end + D`` (docs/design.md
section 7.3), where ``D``, the gradient of the piece's ``sum(o * do)`` with respect to its start
state, does not depend on that state. It is what ``kda_backward`` returns as
``dinitial_state``, computed with the single-process backward's own building blocks and no
more of them: the state's gradient runs backward through the chunks without the states
(section 9.1: ``dS`` never reads ``S``), so on "cuda" / "emulate" it is kda_prepare and
kda_bwd_chain (two of the backward's five launches: no recurrence, no kda_bwd_chunk), on
"model" the precision model's prepare and chain steps (R1, C1-C6), on "reference" the float64
gradient itself.
"""
from __future__ import annotations

import numpy as np

from ..backward import kda_backward, validated
from ..numerics.dtypes import F32


def state_adjoint(do, q, k, v, g, beta, *, dfinal_state, cu_seqlens, options, xdtype):
    """``dS_start`` of every sequence of the given arrays ([N, HV, K, V], ``xdtype``, "kv"
    states): ``dfinal_state`` (None: zeros) is the gradient at their ends. ``options``: the
    call's kda_backward options (those that change the result)."""
    p, a = validated(do, q, k, v, g, beta, dfinal_state=dfinal_state, cu_seqlens=cu_seqlens, state_layout="kv",
                     **options)
    if p.backend == "reference":
        xp = np
        zero = xp.zeros((p.N, p.HV, p.K, p.V), xdtype)
        return kda_backward(do, q, k, v, g, beta, dfinal_state=dfinal_state, initial_state=zero,
                            cu_seqlens=cu_seqlens, state_layout="kv", **options).dinitial_state
    if p.backend == "model":
        return _model(p, a).astype(xdtype)
    return _kernels(p, a)


def _model(p, a):
    """kda_backward_model's R1 and C1-C5 (numerics/backward_model.py), and C6's D in kv; head dims
    other than the tiles on the tiles, over arrays padded with zeros (the gate after activation), as
    the model and the kernels run them."""
    from ..numerics.backward_model import chain
    from ..numerics.backward_recompute import l2norm_exact, prepare_exact
    from ..numerics.precision import Chunks, beta_f32, gate_f32, scale_f32
    from ..numerics.tiles import pad_to, tile_of

    B, T, H, K = a["q"].shape
    HV, V = a["v"].shape[2:]
    KT, VT = tile_of(K), tile_of(V)
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    qn, kn = pad_to(f64(a["q"]), -1, KT), pad_to(f64(a["k"]), -1, KT)
    if p.qk_l2norm:
        qn, kn = l2norm_exact(qn)[0], l2norm_exact(kn)[0]
    g2 = pad_to(gate_f32(f64(a["g"]), p.gate, a["A_log"], a["dt_bias"], p.lower_bound), -1, KT)
    b = beta_f32(a["beta"], (B, T, HV), p.beta_mode in ("sigmoid", "sigmoid2"), p.beta_mode == "sigmoid2")
    ch = Chunks.of(B, T, a["cu_seqlens"])
    rep = lambda x: np.repeat(x, HV // H, axis=2)  # noqa: E731
    qc, kc, gcn, bc, doc = (ch.split(x) for x in (rep(qn), rep(kn), g2, b, pad_to(f64(a["do"]), -1, VT)))
    ops = prepare_exact(qc, kc, gcn, bc, scale_f32(p.scale, K))
    ops["beta"] = bc
    ds = a["dfinal_state"]
    dSL = np.zeros((ch.N, HV, VT, KT)) if ds is None else pad_to(pad_to(np.swapaxes(f64(ds), -1, -2), -2, VT), -1, KT)
    _, D0 = chain(ops, doc, dSL, ch.nchunks)
    D0 = np.where((ch.lengths == 0)[:, None, None, None], dSL, D0)
    return np.ascontiguousarray(np.swapaxes(D0, -1, -2)[..., :K, :V]).astype(F32)


def _kernels(p, a):
    """kda_prepare into the forward's workspace, then kda_bwd_chain writing dinitial_state (fp32, kv)."""
    from ..jit.loaders import loader
    from ..ops.alloc import empty
    from ..ops.backward.kernels import launch_chain, scratch_layout
    from ..ops.forward import kernels as fwd
    from ..ops.backward.tiles import backward_tiles

    xp = np
    if p.device:
        import cupy as xp
    run = loader("cuda" if p.device else "emulate")
    tiles = backward_tiles(p)
    nslots, per_seq = fwd.slots(p)
    lay = scratch_layout(p, nslots)
    if p.device:
        from ..ops.forward.workspace import device_workspace
        buf = device_workspace(lay["total"])
    else:
        buf = empty(xp, lay["total"], np.uint8)
    part = lambda name: buf[lay[name][0]:lay[name][0] + lay[name][1]]  # noqa: E731
    sc = dict(ws=part("ws"), dstates=part("dstates"))
    cu = a["cu_seqlens"]
    if cu is not None and not cu.flags.c_contiguous:
        a = dict(a, cu_seqlens=xp.ascontiguousarray(cu))
    dinit = empty(xp, (p.N, p.HV, p.K, p.V), F32)
    if nslots:
        fwd.launch_prepare(run, p, a, sc["ws"], nslots, per_seq)
    launch_chain(run, p, a, sc, dinit, nslots, per_seq, tiles)
    return dinit

"""One rank's local work of a context-parallel call, between its collectives (docs/design.md
section 7.3). The engines of kdacupy/distributed (kda_forward_cp, kda_backward_cp) and
kdacupy.jax's shard_map calls (whose collectives are XLA's) run the same steps:

forward   rows = forward_rows()          the carried piece's maps (M | B)
          <allgather rows>
          o, share = forward(gathered)    start states from the earlier ranks' maps, the local forward
          <sum the shares>                -> final_state(total)
backward  rows = backward_rows(dfinal)    (M | B | A): the carried piece's maps and the first
                                          piece's adjoint A = M^T dS_end + D (adjoint.py)
          <allgather rows>
          grads, shares = backward(gathered, dfinal)
          <sum the shares>                -> shared_gradients(totals)

Every state, map and state gradient is "kv" ([K, V]) in the exchange dtype (fp32; float64 for
float64 inputs); ``dfinal`` is the whole loss's final-state gradient in that form (or None).
"""
from __future__ import annotations

import inspect

import numpy as np

from .. import api
from ..backward import KDAGradients, kda_backward
from ..seqpar import state_maps
from ..validation import as_array
from .adjoint import state_adjoint
from .call import BACKWARD_OPTIONS, LocalCall
from .plan import end_gradient_sources, plan_fixed, plan_varlen, start_state_sources

#: the options the state maps depend on (kdacupy.seqpar.state_maps)
MAP_OPTIONS = tuple(n for n, p in inspect.signature(state_maps).parameters.items() if p.kind is p.KEYWORD_ONLY
                    and n != "cu_seqlens")


def plans_for(call: LocalCall, tokens, fn: str):
    """Every rank's pieces, from the ranks' token counts (the same on every rank)."""
    p = call.p
    if call.cu is not None and int(call.cu[-1]) != sum(tokens):
        raise ValueError(f"{fn}: cu_seqlens: expected last value {sum(tokens)} (the tokens of all ranks together), "
                         f"got {int(call.cu[-1])}")
    return plan_varlen(call.cu, tokens) if call.cu is not None else plan_fixed(p.B, tokens)


def rows_shape(B, HV, K, V, varlen, backward):
    """The shape of one rank's gathered rows: [C, HV, K, K + V] (+ V for the backward's adjoint),
    C = B for fixed-length input, else 1 (only a slice's last piece can go on, only its first
    can come from an earlier rank)."""
    return (1 if varlen else B, HV, K, K + V + (V if backward else 0))


class Shard:
    """Rank ``rank``'s steps of ``call`` under ``plans`` (every rank's pieces)."""

    def __init__(self, call: LocalCall, plans, rank: int):
        self.c, self.plans, self.rank = call, plans, rank
        self.mine = plans[rank]
        self.fixed = call.cu is None
        p = call.p
        self.xp = np
        if p.device:
            import cupy
            self.xp = cupy
        self.shape = rows_shape(p.B, p.HV, p.K, p.V, not self.fixed, call.backward)
        given = {n: call.a[n] for n in ("A_log", "dt_bias") if call.options.get(n) is not None}
        self.kernel_options = {**call.options, **given}  # the gate parameters as validated (fp32, [HV])

    @property
    def carries(self) -> bool:
        """Does any rank carry a sequence past its slice (else there is nothing to gather)?"""
        return any(pl.carry for pl in self.plans)

    def _opts(self, names):
        return {n: x for n, x in self.kernel_options.items() if n in names}

    def _slice(self, lo, hi, names=("q", "k", "v", "g", "beta")):
        sl = (slice(None), slice(lo, hi))
        return {n: None if self.c.a[n] is None else self.c.a[n][sl] for n in names}

    def _local_cu(self):
        return None if self.fixed else self.mine.local_cu_seqlens

    def _zeros(self, shape):
        return self.xp.zeros(shape, self.c.xdtype)

    # -- the maps and the start states

    def _carried_maps(self, buf):
        """The carried piece's (M, B) into ``buf``'s first K + V columns."""
        if not self.mine.carry:
            return
        p = self.c.p
        lo, hi = (0, p.T) if self.fixed else (self.mine.pieces[-1].lo, self.mine.pieces[-1].hi)
        M, Bm = state_maps(**self._slice(lo, hi), **self._opts(MAP_OPTIONS))
        buf[..., :p.K] = M
        buf[..., p.K:p.K + p.V] = Bm

    def forward_rows(self):
        buf = self._zeros(self.shape)
        self._carried_maps(buf)
        return buf

    def _initial_kv(self, n):
        p = self.c.p
        if self.c.s0 is None:
            return self._zeros((p.HV, p.K, p.V))
        return self.c.kv(self.c.s0[n])

    def start_states(self, gathered):
        """Start states of this rank's pieces, ``[pieces, HV, K, V]``."""
        p = self.c.p
        out = self._zeros((len(self.mine.pieces), p.HV, p.K, p.V))
        sources = start_state_sources(self.plans, self.rank)
        for i, piece in enumerate(self.mine.pieces):
            S = self._initial_kv(piece.seq)
            for r, j in sources.get(piece.seq, []) if not piece.starts else []:
                row = gathered[r, piece.seq if self.fixed else j]
                S = self.xp.matmul(row[..., :p.K], S) + row[..., p.K:p.K + p.V]
            out[i] = S
        return out

    # -- the forward

    def forward(self, gathered):
        """This rank's output, and its share of every final state (None without
        output_final_state): the sequences that end here; on rank 0 the empty ones too."""
        c, a = self.c, self.c.a
        o, final_local = None, None
        if self.mine.pieces:
            o, final_local = api.kda_forward(
                a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=self.start_states(gathered),
                cu_seqlens=self._local_cu(), output_final_state=c.output_final_state, state_layout="kv",
                state_dtype=c.state_out, out=a["out"], **self.kernel_options)
        elif a["out"] is not None:
            o = a["out"]
        else:
            o = self.xp.empty(a["v"].shape, a["v"].dtype)
        if not c.output_final_state:
            return o, None
        p = c.p
        share = self._zeros((c.N, p.HV, p.K, p.V))
        for i, piece in enumerate(self.mine.pieces):
            if piece.ends:
                share[piece.seq] = final_local[i]
        self._empty_sequences(share, self._initial_kv)
        return o, share

    def _empty_sequences(self, share, value):
        """Rank 0 holds the share of the sequences without tokens (no rank has a piece of them)."""
        if self.rank != 0:
            return
        held = {piece.seq for plan in self.plans for piece in plan.pieces}
        for n in range(self.c.N):
            if n not in held:
                share[n] = value(n)

    def final_state(self, total):
        """The final states from the sum of every rank's share: the call's layout and dtype."""
        return self.c.from_kv(total, self.c.state_out)

    # -- the backward

    def backward_rows(self, dfinal):
        """(M | B | A): the carried piece's maps, and the adjoint of the first piece when it
        comes from an earlier rank: ``A = dS_start`` with the final-state gradient at its end
        when the sequence ends here, else with none (``D`` alone)."""
        p, pieces = self.c.p, self.mine.pieces
        buf = self._zeros(self.shape)
        self._carried_maps(buf)
        if pieces and not pieces[0].starts:
            first = pieces[0]
            lo, hi = (0, p.T) if self.fixed else (first.lo, first.hi)
            ds = None
            if first.ends and dfinal is not None:
                ds = dfinal if self.fixed else dfinal[first.seq:first.seq + 1]
            x = self._slice(lo, hi, ("do", "q", "k", "v", "g", "beta"))
            buf[..., p.K + p.V:] = state_adjoint(**x, dfinal_state=ds, cu_seqlens=None,
                                                 options=self._opts(BACKWARD_OPTIONS), xdtype=self.c.xdtype)
        return buf

    def end_states(self, gathered, dfinal):
        """The gradient at the end of each of this rank's pieces: the final state's where the
        sequence ends here, else the chain of the later ranks' adjoints (dS = M^T dS + A)."""
        p = self.c.p
        out = self._zeros((len(self.mine.pieces), p.HV, p.K, p.V))
        sources = end_gradient_sources(self.plans, self.rank, self.fixed)
        for i, piece in enumerate(self.mine.pieces):
            if piece.ends:
                if dfinal is not None:
                    out[i] = dfinal[piece.seq]
                continue
            dS = None
            for r, row in reversed(sources[piece.seq]):
                R = gathered[r, row]
                A = R[..., p.K + p.V:]
                dS = A if dS is None else self.xp.matmul(R[..., :p.K].swapaxes(-1, -2), dS) + A
            out[i] = dS
        return out

    def backward(self, gathered, dfinal):
        """This rank's gradients: its slice's dq, dk, dv, dg, dbeta, and its shares of the
        shared arguments' (dinitial_state [N, HV, K, V] "kv", dA_log, ddt_bias: None where not
        given), which sum over the ranks to the whole loss's."""
        c, a, p = self.c, self.c.a, self.c.p
        xp = self.xp
        names = ("q", "k", "v", "g", "beta")
        if self.mine.pieces:
            grads = kda_backward(a["do"], *(a[n] for n in names), dfinal_state=self.end_states(gathered, dfinal),
                                 initial_state=self.start_states(gathered), cu_seqlens=self._local_cu(),
                                 state_layout="kv", **self._opts(BACKWARD_OPTIONS))
        else:  # an empty slice: nothing of the loss depends on it
            grads = KDAGradients(*(None if a[n] is None else xp.zeros_like(a[n]) for n in names),
                                 None, *(None if a[n] is None else xp.zeros(a[n].shape, c.xdtype)
                                         for n in ("A_log", "dt_bias")))
        dinit = None
        if c.s0 is not None:
            dinit = self._zeros((c.N, p.HV, p.K, p.V))
            for i, piece in enumerate(self.mine.pieces):
                if piece.starts:
                    dinit[piece.seq] = grads.dinitial_state[i]
            if dfinal is not None:  # an empty sequence's final state is its initial state
                self._empty_sequences(dinit, lambda n: dfinal[n])
        shares = dict(dinitial_state=dinit, dA_log=_share(grads.dA_log, c.xdtype, xp),
                      ddt_bias=_share(grads.ddt_bias, c.xdtype, xp))
        return grads[:5], shares

    def shared_gradients(self, totals):
        """(dinitial_state, dA_log, ddt_bias) from summed shares: each in its argument's dtype,
        shape and layout (None where the argument was not given)."""
        c = self.c
        dinit = None if totals["dinitial_state"] is None else c.from_kv(totals["dinitial_state"], c.s0.dtype)
        out = [dinit]
        for n in ("dA_log", "ddt_bias"):
            x, given = totals[n], c.options.get(n[1:])
            if x is None:
                out.append(None)
                continue
            given = as_array(n[1:], given)
            out.append(x.reshape(given.shape).astype(given.dtype))
        return tuple(out)


def _share(x, dtype, xp):
    return None if x is None else xp.ascontiguousarray(x, dtype=dtype)

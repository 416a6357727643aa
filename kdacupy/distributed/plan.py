"""Which piece of which sequence each rank holds, from the ranks' token counts.

Pure host arithmetic on information every rank has after one allgather (each
rank's token count, and the global ``cu_seqlens``, which is the same
everywhere), so every rank computes every rank's plan identically and nothing
about the plan needs to be communicated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Piece:
    """Tokens ``[lo, hi)`` of the rank's slice (local coordinates) belonging to sequence ``seq``."""
    seq: int
    lo: int
    hi: int
    starts: bool  # the sequence's first token is here: its start state is initial_state
    ends: bool  # its last token is here: this rank produces its final state


@dataclass(frozen=True)
class RankPlan:
    rank: int
    begin: int  # global offset of the slice
    end: int
    pieces: tuple[Piece, ...]
    carry: tuple[int, ...]  # sequences that continue past this slice, whose maps this rank sends

    @property
    def local_cu_seqlens(self) -> np.ndarray:
        """The slice's pieces as packed sequences, in local token offsets."""
        return np.array([0] + [p.hi for p in self.pieces], dtype=np.int64)


def rank_offsets(tokens_per_rank) -> np.ndarray:
    """``[ranks + 1]`` global offsets of the ranks' slices (communicator order)."""
    return np.concatenate([[0], np.cumsum(np.asarray(tokens_per_rank, dtype=np.int64))])


def plan_varlen(cu_seqlens: np.ndarray, tokens_per_rank) -> list[RankPlan]:
    """Packed sequences (global ``cu_seqlens``) cut by the ranks' slices.

    Zero-length sequences belong to no rank (their final state is their
    initial state); a sequence may span any number of ranks."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    offs = rank_offsets(tokens_per_rank)
    plans = []
    for r in range(len(offs) - 1):
        b, e = int(offs[r]), int(offs[r + 1])
        pieces, carry = [], []
        if e > b:
            first = int(np.searchsorted(cu, b, side="right")) - 1  # sequence holding token b
            for n in range(first, len(cu) - 1):
                s0, s1 = int(cu[n]), int(cu[n + 1])
                if s0 >= e:
                    break
                lo, hi = max(s0, b), min(s1, e)
                if hi <= lo:
                    continue  # zero-length sequence
                pieces.append(Piece(n, lo - b, hi - b, starts=s0 >= b, ends=s1 <= e))
                if s1 > e:
                    carry.append(n)
        plans.append(RankPlan(r, b, e, tuple(pieces), tuple(carry)))
    return plans


def plan_fixed(batch: int, tokens_per_rank) -> list[RankPlan]:
    """``batch`` sequences of equal length, each cut into the same slices."""
    offs = rank_offsets(tokens_per_rank)
    total = int(offs[-1])
    plans = []
    for r in range(len(offs) - 1):
        b, e = int(offs[r]), int(offs[r + 1])
        pieces = tuple(Piece(n, 0, e - b, starts=b == 0, ends=e == total) for n in range(batch)) if e > b else ()
        carry = tuple(range(batch)) if e > b and e < total else ()
        plans.append(RankPlan(r, b, e, pieces, carry))
    return plans


def start_state_sources(plans: list[RankPlan], rank: int) -> dict[int, list[tuple[int, int]]]:
    """For each sequence whose piece on ``rank`` does not start there: the
    ``(rank, index in that rank's carry)`` maps to apply, in order, to its
    initial state to get the piece's start state."""
    need = {p.seq: [] for p in plans[rank].pieces if not p.starts}
    for r in range(rank):
        for i, n in enumerate(plans[r].carry):
            if n in need:
                need[n].append((r, i))
    return need


def end_gradient_sources(plans: list[RankPlan], rank: int, fixed: bool) -> dict[int, list[tuple[int, int]]]:
    """For each sequence ``rank`` carries past its slice: the ``(rank, row)`` adjoint maps of the
    later ranks that hold its next pieces, in order, the last one holding its end. The gradient
    at the end of ``rank``'s piece is their chain applied from the last back to the first
    (``dS = M^T dS + A``, docs/design.md section 7.3); ``row`` is the sequence's row in that
    rank's gathered buffer: the sequence for fixed-length input, else 0 (only a slice's first
    piece can come from an earlier rank)."""
    need = {n: [] for n in plans[rank].carry}
    for r in range(rank + 1, len(plans)):
        pieces = plans[r].pieces if fixed else plans[r].pieces[:1]
        for piece in pieces:
            if piece.seq in need and not piece.starts:
                need[piece.seq].append((r, piece.seq if fixed else 0))
    return need

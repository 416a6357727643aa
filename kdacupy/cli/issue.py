"""Instructions each warp issues, from the SASS of the variant that ran, weighted by how often the
emulation says each basic block executes for that warp (docs/design.md section 11.4).

The SASS (NVRTC for the GPU's arch with -lineinfo, ``nvdisasm -g -gi``; jit/sass_cfg.py) is cut
into basic blocks. The emulation counts, per warp of the CTA, the executions of its *anchors*
(profile.h): loads, stores, atomics and the twins of the PTX wrappers and CUDA intrinsics, per
code address and calling context. An anchor of the host and one of the SASS are the same
instruction when they have the same class and the host's source lines (inlined frames and calls,
outermost first) begin the SASS's; each such key gives one equation:

    sum over its SASS instructions of the executions of their blocks  =  the host's count

(a guarded instruction executes at most as often as its block). The block counts also obey the
control flow: the entry runs once per CTA; a block runs as often as it is entered, except where
BSSY says a diverged warp reconverges (once for all paths); a branch sends the warp down one
successor, or down several when it diverges. A linear program (scipy's HiGHS) finds the counts
that fit the anchors best (least absolute misfit) and, among those, issue the fewest instructions;
the misfit is reported. Every instruction of a block counts once per execution, guarded or not,
uniform datapath included (each takes an issue slot).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..jit import sass_cfg

#: the fit's tolerance of misfit between its two stages (anchor executions per CTA)
_SLACK = 1e-6


@dataclass
class IssueCount:
    """Instructions issued per CTA, per warp of the CTA (a launch's mean), and what they are."""
    kernel: str
    arch: str
    static: int                    # instructions of the kernel reachable from its entry
    warps: list                    # per warp of the CTA: instructions issued per CTA
    weight: float                  # the host's anchors per CTA, weighted as the fit weighs them (WEIGHTS)
    misfit: float                  # the fit's weighted absolute misfit per CTA (of weight; all warps)
    unmatched: float               # the weight of the host's anchors no SASS instruction matched
    opcodes: dict = field(default_factory=dict)  # SASS mnemonic -> issued per CTA (all warps)
    lines: list = field(default_factory=list)    # (rendered line, issued per CTA), most first


#: weights of the fit's equations, per unit of their measure: an anchor's execution, or for loads,
#: stores and atomics (measured in bytes per lane, as host and GPU compilers vectorise differently,
#: and as they may also hoist or merge them) an eighth per byte. Per key: "coarse" sums a class's
#: anchors by the innermost source line the host saw (robust to the GPU's line attribution across
#: the call sites of one helper), "fine" by the whole calling context (which tells call sites
#: apart where the attribution holds), "zero" a SASS anchor whose line the host never executed.
WEIGHTS = {"coarse": 1.0, "fine": 0.25, "zero": 0.5}
BYTE_WEIGHT = 1 / 8
#: classes matched over the whole function, not by line: ptxas moves the warpgroup MMAs' line attribution
#: (since the descriptors are a 64-bit add, the o^T and U^T products carry the first product loop's line),
#: so per line they miss; their count per warp does not
BY_CLASS = ("wgmma",)
ALL_LINES = "*"


def host_keys(rec: dict) -> dict:
    """{(class, source lines outermost first): {warp: measure}} of a record's anchors: each
    anchor's lines are its code address's inlined frames below its callers' (addr2line), those of
    the rendered kernel source only; classes whose SASS is another's are renamed
    (sass_cfg.HOST_ALIASES). The measure: executions by the warp (by its lanes for the lane-level
    classes), bytes per lane for loads, stores and atomics."""
    from ..emulate.sources import inline_chains

    lib = Path(rec["library"])
    own = lib.with_suffix(".cpp").name
    offsets = {a[0] for a in rec["anchors"]} | {c for a in rec["anchors"] for c in a[6]}
    chains = inline_chains(lib, offsets)
    lines = {o: [ln for f, ln in chains[o] if f.rsplit("/", 1)[-1] == own] for o in offsets}
    out: dict = defaultdict(lambda: defaultdict(float))
    for pc, cls, warp, wexec, lexec, nbytes, callers in rec["anchors"]:
        inner = list(lines[pc])  # innermost first
        for c in reversed(callers):
            inner += lines[c]
        if not inner:
            continue  # the emulator's own code
        cls = sass_cfg.HOST_ALIASES.get(cls, cls)
        key = tuple(reversed(inner))
        if cls in sass_cfg.LANE_CLASSES:  # the lanes run the SASS's lane loop; the warp enters it wexec times
            out[(cls, key)][warp] += lexec
            out[(cls + ENTRIES, key)][warp] += wexec
        else:
            out[(cls, key)][warp] += wexec * nbytes if cls in sass_cfg.BYTE_CLASSES else wexec
    return out


#: the suffix of a lane-level class's key that counts the warp's entries into the lane loop
ENTRIES = ":entries"


def _match(keys_of_class: set, outer: tuple):
    """The longest host key that begins ``outer`` (a SASS instruction's lines, outermost first)."""
    for n in range(len(outer), 0, -1):
        if outer[:n] in keys_of_class:
            return outer[:n]
    return None


@dataclass
class Equation:
    kind: str            # coarse, fine or zero (WEIGHTS)
    weight: float
    terms: list          # (SASS instruction index, coefficient: bytes per lane or 1)
    host: dict           # {warp: the host's measure, all CTAs}; empty for "zero"
    entries: bool = False  # the terms count their block's entries (runs less its own loop's trips)


def equations(fn, reach: list, host: dict) -> list:
    """The fit's equations between a function's SASS anchors and the host's (see WEIGHTS)."""
    coarse_host: dict = defaultdict(lambda: defaultdict(float))
    fine_sets: dict = defaultdict(set)
    for (cls, lines), per_warp in host.items():
        if not cls.endswith(ENTRIES) and cls not in BY_CLASS:
            fine_sets[cls].add(lines)
        for w, x in per_warp.items():
            coarse_host[(cls, ALL_LINES if cls in BY_CLASS else lines[-1])][w] += x
    coarse_lines: dict = defaultdict(set)
    for cls, line in coarse_host:
        coarse_lines[cls].add(line)
    groups: dict = defaultdict(list)
    for b in reach:
        blk = fn.blocks[b]
        for i in range(blk.first, blk.end):
            ins = fn.instrs[i]
            cls = sass_cfg.anchor_class(ins)
            if cls is None:
                continue
            coef = sass_cfg.access_bytes(ins) if cls in sass_cfg.BYTE_CLASSES else 1
            line = (ALL_LINES if ALL_LINES in coarse_lines[cls] else None) if cls in BY_CLASS else next(
                (ln for ln in ins.lines if ln in coarse_lines[cls]), None)
            if line is None:
                groups[("zero", cls, ins.lines[0] if ins.lines and cls not in BY_CLASS else 0)].append((i, coef))
            else:
                groups[("coarse", cls, line)].append((i, coef))
            fine = _match(fine_sets[cls], tuple(reversed(ins.lines)))
            if fine is not None:
                groups[("fine", cls, fine)].append((i, coef))
    out = []
    for (kind, cls, key), terms in groups.items():
        weight = WEIGHTS[kind] * (BYTE_WEIGHT if cls in sass_cfg.BYTE_CLASSES else 1.0)
        got = {} if kind == "zero" else coarse_host[(cls, key)] if kind == "coarse" else host[(cls, key)]
        out.append(Equation(kind, weight, terms, dict(got)))
        if cls in sass_cfg.LANE_CLASSES:  # ... and the warp's entries into the lane loop
            got = {} if kind == "zero" else coarse_host[(cls + ENTRIES, key)] if kind == "coarse" \
                else host[(cls + ENTRIES, key)]
            out.append(Equation(kind, weight, [(i, 1) for i, _ in terms], dict(got), entries=True))
    return out


def count(rec: dict, arch: str, source: str, ctas: int | None = None) -> IssueCount:
    """The issue of one emulated launch record on ``arch``; ``ctas``: the CTAs the emulation ran
    (default the record's: pass it for a record whose counts were scaled)."""
    if rec.get("anchors_dropped"):
        raise RuntimeError(f"{rec['kernel']}: {rec['anchors_dropped']} issue anchor rows did not fit the emulation's "
                           "table (kdacupy.emulate.profile.ANCHORS)")
    funcs = sass_cfg.kernel_sass(source, arch)
    if rec["kernel"] not in funcs:
        raise KeyError(f"{rec['kernel']} is not in the SASS for {arch} (functions: {', '.join(funcs)})")
    fn = funcs[rec["kernel"]]
    ctas = max(1, int(ctas or rec["ctas"]))
    host = host_keys(rec)
    reach = fn.reachable()
    eqs = equations(fn, reach, host)
    nwarps = max(1, -(-int(np.prod(rec["block"])) // 32))
    per_warp = []
    misfit = 0.0
    block_exec = np.zeros(len(fn.blocks))
    fits: dict = {}  # warps whose anchors are met alike (most of a CTA's) share one fit: the same program
    for w in range(nwarps):
        targets = tuple(e.host.get(w, 0.0) / ctas for e in eqs)
        if targets not in fits:
            fits[targets] = _fit(fn, reach, eqs, list(targets))
        counts, miss = fits[targets]
        misfit += miss
        per_warp.append(float(sum(fn.blocks[b].size * counts[b] for b in reach)))
        block_exec += counts
    weigh = lambda cls: WEIGHTS["coarse"] * (BYTE_WEIGHT if cls in sass_cfg.BYTE_CLASSES else 1.0)  # noqa: E731
    weight = sum(weigh(cls) * x for (cls, _), per in host.items() for x in per.values()) / ctas
    unmatched = weight - sum(e.weight * sum(e.host.values()) for e in eqs if e.kind == "coarse") / ctas
    opcodes: Counter = Counter()
    lines: Counter = Counter()
    for b in reach:
        if block_exec[b] <= 0:
            continue
        blk = fn.blocks[b]
        for i in range(blk.first, blk.end):
            ins = fn.instrs[i]
            opcodes[ins.base] += block_exec[b]
            lines[ins.lines[0] if ins.lines else 0] += block_exec[b]
    return IssueCount(rec["kernel"], arch, sum(fn.blocks[b].size for b in reach), per_warp, weight, misfit,
                      max(0.0, unmatched), {k: float(v) for k, v in opcodes.most_common()},
                      [(int(k), float(v)) for k, v in lines.most_common(40)])


def _fit(fn, reach: list, eqs: list, targets: list) -> tuple[np.ndarray, float]:
    """Block executions per CTA of one warp that fit its anchors best (least weighted absolute
    misfit), then issue the least; (counts per block of the function, the weighted misfit).

    A flow may circulate in a loop it never entered (the anchors are met without the path into the
    loop): as LLVM's profile inference does, such components get their entry forced (at least
    once, or their own count where that is less) and the fit is solved again."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, vstack

    lp = _Program(fn, reach, eqs, targets)
    extra: list = []  # (edge indices into a component, least flow)
    for _ in range(8):
        A_ub, b_ub = lp.ub(extra)
        first = linprog(lp.weight, A_ub=A_ub, b_ub=b_ub, A_eq=lp.A_eq, b_eq=lp.b_eq, bounds=(0, None), method="highs")
        if first.status != 0:
            raise RuntimeError(f"issue fit of {fn.name}: {first.message}")
        best = float(first.fun)
        second = linprog(lp.issue, A_ub=vstack([A_ub, coo_matrix(lp.weight[None, :])]).tocsr(),
                         b_ub=[*b_ub, best * (1 + 1e-9) + _SLACK], A_eq=lp.A_eq, b_eq=lp.b_eq, bounds=(0, None),
                         method="highs")
        x = (second if second.status == 0 else first).x
        cut = lp.unentered(x)
        if not cut:
            break
        extra += cut
    counts = np.zeros(len(fn.blocks))
    counts[reach] = x[:lp.nb]
    return counts, best


class _Program:
    """The linear program of one warp's fit: variables [block counts, edge flows, guarded anchors'
    executions, misfit above, misfit below]; equalities and inequalities of the control flow and the
    anchors (count's docstring)."""

    def __init__(self, fn, reach: list, eqs: list, targets: list):
        from scipy.sparse import coo_matrix

        self.fn, self.reach = fn, reach
        block_of = fn.block_of()
        self.pos = pos = {b: k for k, b in enumerate(reach)}
        self.nb = nb = len(reach)
        self.edges = edges = []  # (from block, to block or -1 for leaving, is a call edge, guarded call)
        for b in reach:
            blk = fn.blocks[b]
            for s in blk.succ:
                edges.append((b, s, False, False))
            if blk.leaves:
                edges.append((b, -1, False, False))
            for s, guarded in blk.calls:
                edges.append((b, s, True, guarded))
        ne = len(edges)
        guarded = sorted({i for e in eqs for i, _ in e.terms if fn.instrs[i].guard})
        ny, nk = len(guarded), len(eqs)
        self.nvar = nvar = nb + ne + ny + 2 * nk
        self.X = X = nb
        R, RP, RN = nb + ne, nb + ne + ny, nb + ne + ny + nk
        rows = {"eq": ([], [], [], []), "ub": ([], [], [], [])}

        def add(kind, terms, rhs):
            r_, c_, v_, b_ = rows[kind]
            r = len(b_)
            for c, v in terms:
                r_.append(r), c_.append(c), v_.append(v)
            b_.append(rhs)

        into: dict = defaultdict(list)
        out_flow: dict = defaultdict(list)
        self.outs = outs_all = defaultdict(list)  # every edge out of a block, calls included
        for e, (src, dst, call, guarded_call) in enumerate(edges):
            outs_all[src].append(e)
            if dst >= 0:
                into[dst].append(e)
            if call:  # a call runs with its instruction: as often (at most, when guarded)
                add("ub" if guarded_call else "eq", [(X + e, 1.0), (pos[src], -1.0)], 0.0)
            else:
                out_flow[src].append(e)
        self.into = into
        # a warp leaves the kernel once: what a diverged branch adds re-joins at a reconvergence
        # point (a part that leaves early, @P EXIT, leaves no issue behind: it takes the way on)
        add("eq", [(X + e, 1.0) for e, (src, dst, call, _) in enumerate(edges)
                   if dst < 0 and not call and not fn.blocks[src].returns], 1.0)
        latches = fn.latches()
        for b in reach:
            blk = fn.blocks[b]
            src = 1.0 if b == fn.entry else 0.0
            arrivals = [(X + e, -1.0) for e in into[b]]
            if blk.reconverges:  # once for all the paths that arrived, at least once per arrival
                add("ub", [(pos[b], 1.0), *arrivals], src)
                for e in into[b]:
                    add("ub", [(X + e, 1.0), (pos[b], -1.0)], 0.0)
            else:
                add("eq", [(pos[b], 1.0), *arrivals], src)
            outs = out_flow[b]
            if len(outs) == 1:
                add("eq", [(X + outs[0], 1.0), (pos[b], -1.0)], 0.0)
            elif outs:  # each successor at most once per run; all together at least once (diverged: more)
                for e in outs:
                    add("ub", [(X + e, 1.0), (pos[b], -1.0)], 0.0)
                # a uniform branch, or a loop's (its diverged lanes' trips run as one warp's): one way
                add("eq" if blk.uniform or b in latches else "ub", [(pos[b], 1.0), *[(X + e, -1.0) for e in outs]], 0.0)
        gvar = {i: R + j for j, i in enumerate(guarded)}
        for i, v in gvar.items():  # a guarded instruction acts at most as often as its block runs
            add("ub", [(v, 1.0), (pos[block_of[i]], -1.0)], 0.0)
        self_loop = {src: X + e for e, (src, dst, call, _) in enumerate(edges) if src == dst and not call}
        for k, (e, t) in enumerate(zip(eqs, targets)):
            if e.entries:  # a block's entries: its runs less its own loop's
                terms = []
                for b in sorted({block_of[i] for i, _ in e.terms}):
                    terms += [(pos[b], 1.0)] + ([(self_loop[b], -1.0)] if b in self_loop else [])
            else:
                terms = [(gvar[i], c) if i in gvar else (pos[block_of[i]], c) for i, c in e.terms]
            add("eq", [*terms, (RP + k, -1.0), (RN + k, 1.0)], t)

        def matrix(kind):
            r_, c_, v_, b_ = rows[kind]
            return coo_matrix((v_, (r_, c_)), shape=(len(b_), nvar)).tocsr(), list(b_)

        self.A_eq, self.b_eq = matrix("eq")
        self._ub = rows["ub"]
        self.weight = np.zeros(nvar)
        self.weight[RP:RN] = self.weight[RN:] = [e.weight for e in eqs]
        self.issue = np.zeros(nvar)
        self.issue[:nb] = [fn.blocks[b].size for b in reach]

    def ub(self, extra: list):
        """The inequalities, with each forced entry: the flow into a component at least its least."""
        from scipy.sparse import coo_matrix

        r_, c_, v_, b_ = (list(x) for x in self._ub)
        for edges, least in extra:
            r = len(b_)
            for e in edges:
                r_.append(r), c_.append(self.X + e), v_.append(-1.0)
            b_.append(-least)
        return coo_matrix((v_, (r_, c_)), shape=(len(b_), self.nvar)).tocsr(), b_

    def unentered(self, x: np.ndarray, tol: float = 1e-6) -> list:
        """Components of blocks that run (count > tol) but that no flow from the entry reaches: per
        component, (the edges into it from outside, the flow they must carry at least)."""
        count = {b: x[self.pos[b]] for b in self.reach}
        live = {b for b, c in count.items() if c > tol}
        seen, todo = {self.fn.entry}, [self.fn.entry]
        while todo:
            b = todo.pop()
            for e in self.outs[b]:
                d = self.edges[e][1]
                if d >= 0 and d not in seen and x[self.X + e] > tol:
                    seen.add(d)
                    todo.append(d)
        orphans = live - seen
        out = []
        while orphans:  # the orphans' weakly connected components, each entered from outside
            comp, todo = set(), [orphans.pop()]
            while todo:
                b = todo.pop()
                comp.add(b)
                for e in [*self.outs[b], *self.into[b]]:
                    s, d = self.edges[e][0], self.edges[e][1]
                    for o in (s, d):
                        if o in orphans:
                            orphans.discard(o)
                            todo.append(o)
            entries = [e for b in comp for e in self.into[b] if self.edges[e][0] not in comp]
            if entries:
                out.append((entries, min(1.0, max(count[b] for b in comp))))
        return out



def where(source: str, line: int) -> str:
    """'kernels/x.cuh:N `code`' of a rendered source line (jit.render.line_origins)."""
    from ..jit.render import origin_of

    text = source.split("\n")
    code = text[line - 1].strip() if 0 < line <= len(text) else ""
    return f"{origin_of(source, line)} `{code[:80]}`"

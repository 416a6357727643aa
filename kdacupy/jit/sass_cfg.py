"""The SASS of a kernel as basic blocks and a control-flow graph, with each instruction's source
lines (``nvdisasm -g -gi`` of a cubin built with ``-lineinfo``, which leaves the code unchanged):
what the issue-aware profile (kdacupy/cli/issue.py, docs/design.md section 11.4) counts.

Control flow: a block ends at a branch, EXIT, RET or trap, and starts at every label a branch,
call or BSSY names. A guarded branch (``@P0 BRA``, ``BRA P1, ...``, ``BRA.DIV``) falls through
as well; ``CALL`` adds an edge to its callee and falls through; EXIT and RET leave the graph.
BSSY's label is where a diverged warp reconverges (the block runs once for the warp, however
many of its paths arrived).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from . import sass

nvdisasm = sass.nvdisasm  # whether the SASS can be read here (None: nvdisasm is not installed)

_LOC = re.compile(r'^\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*(?:/\*.*\*/)?\s*$")
_LABEL = re.compile(r"^([.$\w][\w.$]*):\s*$")
_TARGET = re.compile(r"`\(([^)]+)\)")
_GUARD = re.compile(r"^@(!?)(U?P(?:T|\d+))\s+")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([\w$]+),")

#: terminators: control does not fall through them unless guarded
_BRANCHES = ("BRA", "BRX", "JMP", "JMX")
_LEAVES = ("EXIT", "RET", "KILL")


@dataclass
class Instr:
    addr: int
    guard: str | None    # "@P0", "@!UP1"; None when always executed (or @PT)
    op: str              # the mnemonic with its modifiers ("HGMMA.64x16x16.F32.BF16")
    text: str
    lines: tuple         # source lines of the rendered kernel, innermost first (inlining)

    @property
    def base(self) -> str:
        return self.op.split(".")[0]

    @property
    def targets(self) -> list[str]:
        return _TARGET.findall(self.text)


@dataclass
class Block:
    first: int            # index of its first instruction in Function.instrs
    end: int              # one past its last
    succ: list = field(default_factory=list)   # successor block indices (fall-through and branch targets)
    calls: list = field(default_factory=list)  # (callee block, guarded) of its CALL instructions
    leaves: bool = False  # control may leave the kernel (or a subroutine) from it
    returns: bool = False  # ... by RET: it leaves a subroutine, not the kernel
    uniform: bool = False  # its branch cannot split the warp (.U, a uniform predicate)
    reconverges: bool = False  # a BSSY names it: a diverged warp runs it once

    @property
    def size(self) -> int:
        return self.end - self.first


@dataclass
class Function:
    name: str
    instrs: list
    blocks: list
    entry: int = 0

    def reachable(self) -> list[int]:
        """Block indices reachable from the entry (through branches and calls)."""
        seen, todo = {self.entry}, [self.entry]
        while todo:
            b = self.blocks[todo.pop()]
            for s in [*b.succ, *(c for c, _ in b.calls)]:
                if s not in seen:
                    seen.add(s)
                    todo.append(s)
        return sorted(seen)

    def latches(self) -> set:
        """Blocks that branch back to a block dominating them (a loop's end, a self-loop): a warp
        leaves such a loop once per entry, however its lanes' trips differ."""
        return self._latches

    @cached_property
    def _latches(self) -> set:  # computed once per function: every warp's fit asks
        reach = self.reachable()
        preds: dict = {b: [] for b in reach}
        for b in reach:
            for s in self.blocks[b].succ:
                preds[s].append(b)
        dom = {b: set(reach) for b in reach}
        dom[self.entry] = {self.entry}
        changed = True
        while changed:  # the iterative dominator sets (small graphs: hundreds of blocks)
            changed = False
            for b in reach:
                if b == self.entry:
                    continue
                new = set.intersection(*(dom[p] for p in preds[b])) | {b} if preds[b] else {b}
                if new != dom[b]:
                    dom[b], changed = new, True
        return {b for b in reach if any(s in dom[b] for s in self.blocks[b].succ)}

    def block_of(self) -> list[int]:
        """The block index of every instruction."""
        return self._block_of

    @cached_property
    def _block_of(self) -> list[int]:
        out = [0] * len(self.instrs)
        for k, b in enumerate(self.blocks):
            for i in range(b.first, b.end):
                out[i] = k
        return out


def disassemble(cubin: bytes) -> str:
    """``nvdisasm -c -g -gi``: code sections with source lines and inlining."""
    return sass.disassemble(cubin, "-c", "-g", "-gi")


def parse(text: str, source_name: str = "kernel.cu") -> dict:
    """{function name: Function} of a disassembly; each instruction's lines are those of the file
    named ``source_name`` (the NVRTC program), innermost first."""
    funcs: dict = {}
    cur = None
    chain: list = []
    pending: list = []
    labels: dict = {}
    for raw in text.split("\n"):
        m = _SECTION.match(raw)
        if m:
            cur = funcs[m.group(1)] = dict(instrs=[], labels={})
            labels = cur["labels"]
            chain, pending = [], []
            continue
        if cur is None:
            continue
        m = _LOC.match(raw)
        if m:  # a chain is printed innermost first, one "inlined at" per line, ending with the outermost
            pending.append((m.group(1), int(m.group(2))))
            if m.group(3) is None:
                chain = [ln for f, ln in pending if f.rsplit("/", 1)[-1] == source_name]
                pending = []
            continue
        m = _LABEL.match(raw.strip())
        if m and not raw.startswith("        /*"):
            labels[m.group(1)] = len(cur["instrs"])
            continue
        m = _INSTR.match(raw)
        if m:
            body = m.group(2).strip()
            if body.startswith("."):
                continue
            guard = None
            g = _GUARD.match(body)
            if g:
                body = body[g.end():]
                if g.group(2) != "PT" or g.group(1):
                    guard = f"@{g.group(1)}{g.group(2)}"
            op = body.split()[0] if body else ""
            cur["instrs"].append(Instr(int(m.group(1), 16), guard, op, body, tuple(chain)))
    return {name: _blocks(name, f["instrs"], f["labels"]) for name, f in funcs.items() if f["instrs"]}


def _is_branch(ins: Instr) -> bool:
    return ins.base in _BRANCHES


def _conditional(ins: Instr) -> bool:
    """A branch that may fall through: guarded, with a predicate operand, or .DIV / .CONV."""
    if ins.guard:
        return True
    ops = ins.text[len(ins.op):].split("`")[0]
    return bool(re.search(r"\b!?U?P\d\b", ops)) or ".DIV" in ins.op or ".CONV" in ins.op


def _blocks(name: str, instrs: list, labels: dict) -> Function:
    by_label = {k: v for k, v in labels.items() if v < len(instrs)}
    leaders = {0}
    for i, ins in enumerate(instrs):
        for t in ins.targets:
            if t in by_label:
                leaders.add(by_label[t])
        if _is_branch(ins) or ins.base in _LEAVES or ins.op.startswith("BPT.TRAP"):
            leaders.add(i + 1)
    starts = sorted(x for x in leaders if x < len(instrs))
    index = {s: k for k, s in enumerate(starts)}
    blocks = [Block(s, e) for s, e in zip(starts, [*starts[1:], len(instrs)])]
    for k, b in enumerate(blocks):
        last = instrs[b.end - 1]
        falls = True
        for i in range(b.first, b.end):
            ins = instrs[i]
            if ins.base == "CALL":
                for t in ins.targets:
                    if t in by_label:
                        b.calls.append((index[by_label[t]], ins.guard is not None))
            if ins.base == "BSSY":
                for t in ins.targets:
                    if t in by_label:
                        blocks[index[by_label[t]]].reconverges = True
        if _is_branch(last) and last.op.startswith("BRA.DIV"):
            # to ptxas' fallback for a warp that reaches warp-synchronous code diverged: the kernels run
            # such code converged (the emulation checks every shfl / vote mask), so it is never taken
            pass
        elif _is_branch(last):
            cond = _conditional(last)
            falls = cond
            for t in last.targets:
                if t in by_label:
                    b.succ.append(index[by_label[t]])
            if not last.targets:  # an indirect branch: its targets are unknown
                b.leaves = True
            b.uniform = ".U" in last.op or bool(last.guard and "UP" in last.guard) or not cond
        elif last.base in _LEAVES or last.op.startswith("BPT.TRAP"):
            b.leaves = True
            b.returns = last.base == "RET"
            falls = last.guard is not None
        if falls and k + 1 < len(blocks):
            if k + 1 not in b.succ:
                b.succ.append(k + 1)
        elif falls:
            b.leaves = True
    return Function(name, instrs, blocks)


#: SASS mnemonic -> issue-anchor class (kdacupy/emulate/profile.h's): the instructions whose
#: execution counts the emulation measures per warp
ANCHOR_OPS = {
    "LDS": "load", "LDG": "load", "LD": "load",
    "STS": "store", "STG": "store", "ST": "store",
    "ATOMS": "atomic", "ATOMG": "atomic", "ATOM": "atomic", "RED": "atomic", "REDG": "atomic",
    "LDSM": "ldmatrix", "LDGSTS": "cp_async", "LDGDEPBAR": "cp_commit", "DEPBAR": "cp_wait",
    "HMMA": "mma", "SHFL": "shfl", "VOTE": "vote", "BAR": "bar",
    "HGMMA": "wgmma", "UBLKCP": "bulk",
}
_MUFU = {"EX2": "ex2", "LG2": "lg2", "RSQ": "rsqrt", "RCP": "rcp", "TANH": "tanh"}
_PREFIXED = (("WARPGROUP.ARRIVE", "wg_fence"), ("WARPGROUP.DEPBAR", "wg_wait"), ("SYNCS.EXCH", "mb_init"),
             ("SYNCS.ARRIVE", "mb_arrive"), ("SYNCS.PHASECHK", "mb_wait"), ("FENCE.VIEW.ASYNC", "fence_proxy"))
#: classes a warp executes once per active lane (ptxas loops over the lanes: uniform operands)
LANE_CLASSES = ("bulk",)
#: host classes counted as another's SASS (test_wait and try_wait are both SYNCS.PHASECHK)
HOST_ALIASES = {"mb_test": "mb_wait"}


#: classes measured in bytes per lane (host and SASS may split or merge the accesses differently)
BYTE_CLASSES = ("load", "store", "atomic")


def access_bytes(ins: Instr) -> int:
    """Bytes per lane of a load, store or atomic (its width modifier; 32 bits without one)."""
    mods = ins.op.split(".")[1:]
    for m, n in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("16", 2), ("U8", 1), ("S8", 1), ("8", 1)):
        if m in mods:
            return n
    return 4


def anchor_class(ins: Instr) -> str | None:
    """The issue-anchor class of a SASS instruction, or None (local memory, constants, ALU, ...)."""
    for prefix, cls in _PREFIXED:
        if ins.op.startswith(prefix):
            return cls
    if ins.base == "MUFU":
        return _MUFU.get(ins.op.split(".")[1] if "." in ins.op else "")
    if ins.base == "DEPBAR" and "SB0" not in ins.text:
        return None  # scoreboard waits other than cp.async's group counter
    return ANCHOR_OPS.get(ins.base)


#: what the SASS is read from: NVRTC's build with line tables, whose code and resources are the
#: runtime build's (tests/compile/test_sass_cfg.py compares the two)
LINEINFO = ("-lineinfo",)


@lru_cache(maxsize=64)
def compiled(source: str, arch: str):
    """NVRTC's CompileResult of a rendered source for ``arch`` with line tables (one build per
    process serves the profile's compile report and its SASS)."""
    from .nvrtc import nvrtc_compile

    return nvrtc_compile(source, arch, LINEINFO)


@lru_cache(maxsize=64)
def kernel_sass(source: str, arch: str) -> dict:
    """{function: Function} of a rendered source built by NVRTC for ``arch`` with -lineinfo."""
    from .nvrtc import CompileError

    res = compiled(source, arch)
    if not res.ok:
        raise CompileError(f"NVRTC for {arch}:\n{res.log}")
    return parse(disassemble(res.cubin))

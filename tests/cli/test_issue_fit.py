"""kdacupy/cli/issue.py's fit on control-flow graphs written by hand (sass_cfg.parse of small
listings), whose block counts are known: a diamond split by its anchors, a loop entered through an
anchor-free block (no circulation), a diverged warp running both arms and reconverging once, arms
without anchors (the fewer instructions), a warp that leaves once, a lane loop's trips and entries;
and the equations' keys (docs/design.md section 11.4)."""
import pytest

pytest.importorskip("scipy", reason="the issue fit needs scipy (pip install 'kdacupy[profile]')")

from kdacupy.cli import issue  # noqa: E402
from kdacupy.jit import sass_cfg  # noqa: E402


def listing(body: str):
    """A function 'k' of the given instructions ('label:' lines and '[@guard ]OP operands' lines);
    every instruction on source line 1."""
    out = ['\t.section\t.text.k,"ax",@progbits', "k:", '\t//## File "/x/kernel.cu", line 1']
    addr = 0
    for line in body.strip().split("\n"):
        line = line.strip()
        if line.endswith(":"):
            out.append(line)
        else:
            out.append(f"        /*{addr:04x}*/                   {line} ;")
            addr += 16
    return sass_cfg.parse("\n".join(out))["k"]


def fit(fn, eqs, targets):
    """The fit's block counts, to the fit's tolerance (issue._SLACK)."""
    counts, miss = issue._fit(fn, fn.reachable(), eqs, targets)
    return [round(float(c), 4) for c in counts], miss


def eq(fn, op, kind="coarse", entries=False):
    """An equation over the instructions whose mnemonic starts with ``op``."""
    return issue.Equation(kind, 1.0, [(i, 1) for i, ins in enumerate(fn.instrs) if ins.op.startswith(op)], {}, entries)


def test_a_diamond_split_by_its_anchors():
    fn = listing("""
        ISETP.GE.AND P0, PT, R0, 0x10, PT
        @P0 BRA `(.L_x_0)
        LDS R1, [R2]
        IADD3 R1, R1, 1, RZ
        BRA `(.L_x_1)
        .L_x_0:
        STS [R2], R1
        STS [R2+0x4], R1
        .L_x_1:
        EXIT
    """)
    counts, miss = fit(fn, [eq(fn, "LDS"), eq(fn, "STS")], [0.25, 1.5])  # two STS per run of their block
    assert counts == [1, 0.25, 0.75, 1] and miss == pytest.approx(0)


def test_a_loop_is_entered_not_circulated():
    """The loop's anchor says 7 trips; its way in holds no anchor, and is taken anyway."""
    fn = listing("""
        ISETP.GE.AND P0, PT, R0, RZ, PT
        @!P0 BRA `(.L_x_1)
        MOV R5, RZ
        MOV R6, RZ
        MOV R7, RZ
        .L_x_0:
        LDG.E R2, desc[UR4][R2.64]
        IADD3 R9, R9, 1, RZ
        @!P1 BRA `(.L_x_0)
        .L_x_1:
        EXIT
    """)
    counts, _ = fit(fn, [eq(fn, "LDG")], [7.0])
    assert counts == [1, 1, 7, 1]


def test_arms_without_anchors_take_the_one_that_issues_less():
    fn = listing("""
        @P0 BRA `(.L_x_0)
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        BRA `(.L_x_1)
        .L_x_0:
        MOV R1, RZ
        .L_x_1:
        STG.E desc[UR4][R2.64], R1
        EXIT
    """)
    counts, _ = fit(fn, [eq(fn, "STG")], [1.0])
    assert counts == [1, 0, 1, 1]


def test_a_diverged_warp_runs_both_arms_and_reconverges_once():
    """Both arms' anchors ran once: the warp diverged, and runs the join BSSY names once."""
    fn = listing("""
        BSSY B0, `(.L_x_1)
        @P0 BRA `(.L_x_0)
        STS [R2], R1
        BRA `(.L_x_1)
        .L_x_0:
        LDS R1, [R2]
        .L_x_1:
        BSYNC B0
        EXIT
    """)
    counts, miss = fit(fn, [eq(fn, "STS"), eq(fn, "LDS")], [1.0, 1.0])
    assert counts == [1, 1, 1, 1] and miss == pytest.approx(0)


def test_extra_flow_from_a_diverged_branch_cannot_leave_early():
    """A loop's way round (9 instructions, no anchor) could be run half as often by letting a
    branch inside it diverge, both ways feeding the anchored block, and the surplus leave the
    kernel: a warp leaves once, so the loop runs as often as its anchor."""
    fn = listing("""
        MOV R1, RZ
        .L_x_0:
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        @P1 BRA `(.L_x_1)
        NOP
        .L_x_1:
        LDG.E R2, desc[UR4][R2.64]
        @!P0 BRA `(.L_x_0)
        EXIT
    """)
    assert [b.succ for b in fn.blocks] == [[1], [3, 2], [3], [1, 4], []]
    counts, miss = fit(fn, [eq(fn, "LDG")], [8.0])
    assert counts[1] == 8 and counts[3] == 8 and counts[2] == 0 and miss == pytest.approx(0)


def test_a_warp_leaves_once_unless_it_diverged():
    """An anchor-free early exit could skip the rest cheaply: the warp went on where the anchor
    after the guarded EXIT says so; with none there it left early; both, diverged, left twice."""
    fn = listing("""
        @P0 EXIT
        IADD3 R1, R1, 1, RZ
        IADD3 R1, R1, 1, RZ
        STG.E desc[UR4][R2.64], R1
        EXIT
    """)
    assert fn.blocks[0].leaves and fn.blocks[0].succ == [1]
    counts, _ = fit(fn, [eq(fn, "STG")], [1.0])
    assert counts == [1, 1]
    counts, _ = fit(fn, [eq(fn, "STG")], [0.0])  # no store: the early exit
    assert counts == [1, 0]
    counts, miss = fit(fn, [eq(fn, "STG")], [0.5])  # half the warps stored: the others left early
    assert counts == [1, 0.5] and miss == pytest.approx(0)


def test_a_lane_loop_by_its_lanes_and_entries():
    """ptxas's loop over the lanes of a UBLKCP: 16 lanes in 2 entries (two copies of 8 lanes)."""
    fn = listing("""
        MOV R1, RZ
        .L_x_0:
        ELECT P1, URZ, PT
        UBLKCP.S.G [UR26], [UR24], UR4
        @P0 BRA.U.ANY `(.L_x_0)
        @P2 BRA `(.L_x_1)
        BRA `(.L_x_0)
        .L_x_1:
        EXIT
    """)
    counts, miss = fit(fn, [eq(fn, "UBLKCP"), eq(fn, "UBLKCP", entries=True)], [16.0, 2.0])
    assert counts[1] == 16 and counts[2] == 2 and miss == pytest.approx(0)


def test_equations_match_coarse_fine_and_zero_keys():
    """Coarse keys by the host's innermost line (found anywhere in the SASS's lines), fine keys by
    the whole context (the host's lines begin the SASS's, outermost first), zero keys for SASS
    anchors of lines the host never ran; bytes per lane for loads and stores."""
    text = ['\t.section\t.text.k,"ax",@progbits', "k:"]
    for addr, (op, chain) in enumerate([("LDS.128 R4, [R2]", (40, 30, 20)), ("LDS R4, [R2]", (30, 21)),
                                        ("STS [R2], R4", (50,)), ("EXIT", (20,))]):
        for k, ln in enumerate(chain):
            tail = f' inlined at "/x/kernel.cu", line {chain[k + 1]}' if k + 1 < len(chain) else ""
            text.append(f'\t//## File "/x/kernel.cu", line {ln}{tail}')
        text.append(f"        /*{16 * addr:04x}*/                   {op} ;")
    fn = sass_cfg.parse("\n".join(text))["k"]
    host = {("load", (20, 30)): {0: 64.0}, ("load", (21, 30)): {0: 8.0}, ("store", (60,)): {1: 4.0}}
    eqs = {(e.kind, tuple(i for i, _ in e.terms)): e for e in issue.equations(fn, fn.reachable(), host)}
    assert eqs[("coarse", (0, 1))].host == {0: 64.0 + 8.0}  # both loads' innermost host line is 30
    assert eqs[("coarse", (0, 1))].terms == [(0, 16), (1, 4)]
    assert eqs[("fine", (0,))].host == {0: 64.0}  # (20, 30) begins (20, 30, 40)
    assert eqs[("fine", (1,))].host == {0: 8.0}  # the whole of (21, 30)
    assert eqs[("zero", (2,))].host == {}  # the host stored at line 60, never at 50
    assert eqs[("zero", (2,))].weight == issue.WEIGHTS["zero"] * issue.BYTE_WEIGHT


def test_a_record_whose_anchors_overflowed_gets_no_issue_term():
    with pytest.raises(RuntimeError, match="3 issue anchor rows did not fit"):
        issue.count(dict(kernel="k", anchors=[], anchors_dropped=3, ctas=1, block=[32, 1, 1]), "sm_90a", "")

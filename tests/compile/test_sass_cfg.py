"""kdacupy/jit/sass_cfg.py on a disassembly written by hand in nvdisasm's format: blocks, control
flow (guarded and unguarded branches, BSSY's reconvergence, calls and returns, exits), source lines
with inlining, the issue anchors' classes and widths; and on a real kernel's SASS (NVRTC, nvdisasm)."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from kdacupy.jit import sass_cfg

LISTING = r"""
	.target	sm_90a
//--------------------- .text.k      --------------------------
	.section	.text.k,"ax",@progbits
        .global         k
k:
.text.k:
	//## File "/any/kernel.cu", line 10
        /*0000*/                   S2R R0, SR_TID.X ;
	//## File "/any/kernel.cu", line 3 inlined at "/any/kernel.cu", line 7
	//## File "/any/kernel.cu", line 7 inlined at "/any/kernel.cu", line 11
	//## File "/any/kernel.cu", line 11
        /*0010*/                   ISETP.GE.AND P0, PT, R0, 0x10, PT ;
        /*0020*/                   BSSY B0, `(.L_x_1) ;
        /*0030*/              @P0 BRA `(.L_x_0) ;
	//## File "/any/other.cu", line 99 inlined at "/any/kernel.cu", line 12
	//## File "/any/kernel.cu", line 12
        /*0040*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0050*/                   STS.U16 [R1], R4 ;
.L_x_0:
        /*0060*/                   BSYNC B0 ;
.L_x_1:
        /*0070*/                   MUFU.EX2 R5, R4 ;
        /*0080*/          @!UP0 BRA.U.ANY `(.L_x_1) ;
        /*0090*/              @!P0 EXIT ;
        /*00a0*/                   CALL.REL.NOINC `($sub) ;
        /*00b0*/                   EXIT ;
$sub:
        /*00c0*/              @PT  HGMMA.64x16x16.F32.BF16 R24, R124, gdesc[UR20], RZ, !UPT ;
        /*00d0*/                   RET.REL.NODEC R20 `(k) ;
.L_x_2:
        /*00e0*/                   BRA `(.L_x_2);
        /*00f0*/                   NOP;
.L_x_3:
"""


@pytest.fixture(scope="module")
def fn():
    funcs = sass_cfg.parse(LISTING)
    assert list(funcs) == ["k"]
    return funcs["k"]


def test_instructions_guards_and_source_lines(fn):
    ops = [i.op for i in fn.instrs]
    assert ops == ["S2R", "ISETP.GE.AND", "BSSY", "BRA", "LDG.E.128", "STS.U16", "BSYNC", "MUFU.EX2", "BRA.U.ANY", "EXIT",
                   "CALL.REL.NOINC", "EXIT", "HGMMA.64x16x16.F32.BF16", "RET.REL.NODEC", "BRA", "NOP"]
    assert [i.guard for i in fn.instrs[:4]] == [None, None, None, "@P0"]
    assert fn.instrs[8].guard == "@!UP0" and fn.instrs[9].guard == "@!P0"
    assert fn.instrs[12].guard is None  # @PT: always
    # innermost first; a chain holds until the next one; lines of other files are left out
    assert fn.instrs[0].lines == (10,) and fn.instrs[1].lines == (3, 7, 11) and fn.instrs[3].lines == (3, 7, 11)
    assert fn.instrs[4].lines == (12,)


def test_blocks_edges_reconvergence_calls_and_exits(fn):
    starts = [fn.instrs[b.first].addr for b in fn.blocks]
    assert starts == [0x00, 0x40, 0x60, 0x70, 0x90, 0xA0, 0xC0, 0xE0, 0xF0]
    b = {s: blk for s, blk in zip(starts, fn.blocks)}
    index = {s: k for k, s in enumerate(starts)}
    assert b[0x00].succ == [index[0x60], index[0x40]]  # @P0 BRA: the target, and the fall-through
    assert b[0x40].succ == [index[0x60]]  # falls into the BSYNC
    assert b[0x70].reconverges and not b[0x60].reconverges  # BSSY names .L_x_1
    assert b[0x70].succ == [index[0x70], index[0x90]] and b[0x70].uniform  # a uniform loop over .L_x_1
    assert b[0x90].leaves and b[0x90].succ == [index[0xA0]]  # a guarded EXIT falls through
    assert b[0xA0].calls == [(index[0xC0], False)] and b[0xA0].leaves and not b[0xA0].returns
    assert b[0xC0].leaves and b[0xC0].returns and not b[0xC0].succ  # the subroutine returns
    assert fn.reachable() == [index[s] for s in (0x00, 0x40, 0x60, 0x70, 0x90, 0xA0, 0xC0)]  # not the pad
    assert sum(fn.blocks[k].size for k in fn.reachable()) == 14
    assert fn.block_of()[4] == index[0x40]


DIVERGENT = r"""
	.section	.text.d,"ax",@progbits
        .global         d
d:
.text.d:
        /*0000*/                   FFMA R8, R6, R6, RZ ;
        /*0010*/                   BRA.DIV UR5, `(.L_x_9) ;
        /*0020*/                   SHFL.BFLY PT, R9, R8, 0x4, 0x1f ;
.L_x_8:
        /*0030*/                   EXIT ;
.L_x_9:
        /*0040*/                   WARPSYNC.COLLECTIVE R34, `(.L_x_10) ;
.L_x_10:
        /*0050*/                   SHFL.BFLY P3, R31, R35, R36, R37 ;
        /*0060*/                   ENDCOLLECTIVE ;
        /*0070*/                   BRA `(.L_x_8) ;
"""


def test_a_divergent_warp_fallback_is_not_reached():
    """BRA.DIV goes to ptxas' copy of a shuffle for a diverged warp: the kernels shuffle converged, so
    the issue count never enters it (its SHFL would otherwise take a share of the measured ones)."""
    f = sass_cfg.parse(DIVERGENT)["d"]
    starts = [f.instrs[b.first].addr for b in f.blocks]
    assert f.blocks[0].succ == [starts.index(0x20)]  # the fall-through alone
    assert [starts[k] for k in f.reachable()] == [0x00, 0x20, 0x30]


def test_anchor_classes_and_widths(fn):
    classes = [sass_cfg.anchor_class(i) for i in fn.instrs]
    assert classes[4:8] == ["load", "store", None, "ex2"] and classes[12] == "wgmma"
    assert [sass_cfg.access_bytes(fn.instrs[i]) for i in (4, 5)] == [16, 2]
    for op, cls in (("SYNCS.PHASECHK.TRANS64.TRYWAIT", "mb_wait"), ("SYNCS.ARRIVE.TRANS64.A1T0", "mb_arrive"),
                    ("WARPGROUP.ARRIVE", "wg_fence"), ("WARPGROUP.DEPBAR.LE", "wg_wait"), ("UBLKCP.S.G", "bulk"),
                    ("LDSM.16.M88.4", "ldmatrix"), ("LDGSTS.E.BYPASS.128", "cp_async"), ("HMMA.16816.F32.BF16", "mma"),
                    ("LDL", None), ("STL.64", None), ("LDC.64", None), ("MUFU.RCP", "rcp"), ("ATOMS.ADD", "atomic")):
        assert sass_cfg.anchor_class(sass_cfg.Instr(0, None, op, op, ())) == cls, op
    dep = sass_cfg.Instr(0, None, "DEPBAR.LE", "DEPBAR.LE SB0, 0x0", ())
    assert sass_cfg.anchor_class(dep) == "cp_wait"
    assert sass_cfg.anchor_class(sass_cfg.Instr(0, None, "DEPBAR.LE", "DEPBAR.LE SB1, 0x2", ())) is None
    assert sass_cfg.access_bytes(sass_cfg.Instr(0, None, "LDS", "LDS R1, [R2]", ())) == 4


@pytest.mark.nvrtc
def test_a_real_kernel_parses_whole():
    """The wgmma recurrence on sm_90a: every instruction in one function, the 19 HGMMA, blocks that
    tile it, and source lines on nearly every instruction."""
    if sass_cfg.nvdisasm() is None:
        pytest.skip("nvdisasm is not installed (pip install 'kdacupy[test]')")
    from kdacupy.jit import registry
    from kdacupy.jit.render import render
    from kdacupy.ops.forward import variants  # noqa: F401  (registers the kernels)

    var = next(v for v in registry.variants("kda_recurrence_wgmma") if "K=128 V=128 dt=bfloat16 state=bf16 BV=64" in v.label())
    fn = sass_cfg.kernel_sass(render(var.kernel, var.config()), "sm_90a")["kda_recurrence"]
    assert sum(i.base == "HGMMA" for i in fn.instrs) == 19
    assert [b.first for b in fn.blocks] == sorted(b.first for b in fn.blocks) and fn.blocks[-1].end == len(fn.instrs)
    assert all(fn.blocks[k].end == fn.blocks[k + 1].first for k in range(len(fn.blocks) - 1))
    assert sum(bool(i.lines) for i in fn.instrs) > 0.95 * len(fn.instrs)
    assert any(b.reconverges for b in fn.blocks) and any(b.leaves for b in fn.blocks)


@pytest.mark.nvrtc
def test_line_tables_leave_the_code_and_resources_alone():
    """The profile reads the SASS and the resources of the build with -lineinfo: the runtime's
    build has the same instructions and the same registers, spills and shared memory."""
    if sass_cfg.nvdisasm() is None:
        pytest.skip("nvdisasm is not installed (pip install 'kdacupy[test]')")
    from kdacupy.jit import registry
    from kdacupy.jit.nvrtc import nvrtc_compile
    from kdacupy.jit.render import render
    from kdacupy.ops.forward import variants  # noqa: F401  (registers the kernels)

    var = registry.variants("kda_prepare")[0]
    src = render(var.kernel, var.config())
    def code(cubin):
        return [i.text for f in sass_cfg.parse(sass_cfg.disassemble(cubin)).values() for i in f.instrs]
    with ThreadPoolExecutor(2) as pool:  # the two builds, then the two disassemblies, at once (both leave the GIL)
        plain, lined = pool.map(lambda build: build(src, "sm_90a"), (nvrtc_compile, sass_cfg.compiled))
        assert (plain.regs, plain.spill_stores, plain.spill_loads, plain.static_smem) == \
            (lined.regs, lined.spill_stores, lined.spill_loads, lined.static_smem)
        plain_code, lined_code = pool.map(code, (plain.cubin, lined.cubin))
    assert plain_code == lined_code and len(plain_code) > 1000


def test_a_disassembly_is_kept_by_its_cubin_and_flags(tmp_path, monkeypatch):
    """nvdisasm runs once per cubin and flags: a second disassembly is read from the cache directory, other
    flags or another cubin run it again, and a cache that cannot be written only costs the run."""
    import subprocess

    from kdacupy.jit import sass
    from kdacupy.jit.nvrtc import nvrtc_compile

    if sass.nvdisasm() is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    cubins = [nvrtc_compile(f'extern "C" __global__ void k(float* x) {{ x[threadIdx.x] *= {c}.0f; }}', "sm_90a").cubin
              for c in (2, 3)]
    runs = []
    real = subprocess.run
    monkeypatch.setattr(sass.subprocess, "run", lambda cmd, **kw: runs.append(cmd[1:-1]) or real(cmd, **kw))
    first = sass.disassemble(cubins[0], "-c")
    assert ".text.k" in first and sass.disassemble(cubins[0], "-c") == first
    sass.disassemble(cubins[0], "-c", "-g")
    sass.disassemble(cubins[1], "-c")
    assert [r for r in runs if r != ["--version"]] == [["-c"], ["-c", "-g"], ["-c"]]
    assert len(list((tmp_path / "nvdisasm").glob("*.txt"))) == 3
    blocked = tmp_path / "a-file"  # no cache directory can be made under it: the disassembly stands, unkept
    blocked.write_text("")
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(blocked))
    assert sass.disassemble(cubins[1], "-c") == sass.disassemble(cubins[1], "-c") != first
    assert [r for r in runs if r != ["--version"]][3:] == [["-c"], ["-c"]]

"""PTX conformance on the GPU: the twin tests' kernels (tests/emulate/test_ptx_twins.py)
compiled with the runtime's NVRTC options and run on the device, checked against
what the CPU twins (kdacupy/emulate/ptx_twins.h) assume:
- bit for bit: cvt (every special float, every half), the f32x2 pairs, ldmatrix (4 forms),
  cp.async (the entries the group protocol defines), integer-valued mma, the
  wrappers composed into a GEMM tile;
- within the PTX ISA bounds: ex2 / lg2 / rsqrt / rcp / tanh .approx (and their
  ftz special values exactly);
- a probe of the mma fp32 accumulation: which model (block size, guard bits,
  final rounding) reproduces the tensor cores bit for bit; the hardware-numerics
  twin's model must be one of them;
- on compute capability 9.0, Hopper's asynchronous twins (tests/emulate/test_ptx_twins_async.py's
  kernels, built for sm_90a as the runtime builds them): wgmma's fragment and shared-memory
  layouts and matrix descriptor bit for bit (integer-valued sums, N = 8..128, both majors, no
  swizzle and 128B), its accumulation per k16 instruction (the same model table as mma's), the
  group protocol of wait_group, the mbarrier phases and bulk-copy bytes.
Skipped without a GPU."""
import itertools

import ml_dtypes
import numpy as np
import pytest

from kdacupy.jit.nvrtc import NVRTC_OPTIONS
from kdacupy.emulate.numerics import MMA_BLOCK, MMA_GUARD, REL_BOUND, mma_dot

from ..emulate import test_ptx_twins_async as hopper_twins
from ..emulate.test_ptx_twins import (TEST_KERNELS, approx_inputs, gather_d, kernel_source,
                             ldmatrix_expected, pair_operands, scatter_a, scatter_b, scatter_c, special_floats)

cp = pytest.importorskip("cupy", reason="CuPy is not installed")
try:
    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # noqa: BLE001
    HAVE_GPU = False
if not HAVE_GPU:
    pytest.skip("no CUDA GPU here: benchmarks/device_check.sh runs these on a GPU machine",
                allow_module_level=True)

F32 = np.float32
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast", "ignore:invalid value encountered in cast")


class Gpu:
    """The test kernels as cupy.RawModule builds them at run time (same options as kdacupy.jit)."""

    def __init__(self):
        self.mod = cp.RawModule(code=kernel_source(TEST_KERNELS), options=NVRTC_OPTIONS)

    def __call__(self, name, grid, block, args, shared_mem=0):
        dev = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        fn = self.mod.get_function(name)
        if shared_mem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = shared_mem
        fn(grid if isinstance(grid, tuple) else (grid,), block if isinstance(block, tuple) else (block,),
           tuple(dev), shared_mem=shared_mem)
        cp.cuda.Device().synchronize()
        return [cp.asnumpy(d) if isinstance(a, np.ndarray) else None for a, d in zip(args, dev)]


@pytest.fixture(scope="module")
def gpu():
    return Gpu()


def unary(gpu, words, op, n_out=None):
    words = np.ascontiguousarray(words, dtype=np.uint32)
    n = len(words) if n_out is None else n_out
    return gpu("k_unary", 64, 128, (words, np.zeros(n, np.uint32), np.int32(n), np.int32(op)))[1]


# ---- bit for bit -------------------------------------------------------------------------------
def canonical(ref_bits, x):
    ref = ref_bits.copy()  # NaN -> the canonical 0x7FFF the twins give
    ref[np.isnan(x)] = 0x7FFF
    return ref


def test_runtime_builds_flush_subnormals():
    """The FTZ claim of docs/design.md section 2, on the device: a RawModule kernel built with
    the runtime's options (CuPy adds -ftz=true) flushes a subnormal product to zero; the same
    product in NumPy is the subnormal 1e-40 (the multiply is not folded: operands at run time)."""
    a = np.array([1e-20, 1e-20], np.float32)
    assert 0 < np.float32(a[0] * a[1]) < np.finfo(np.float32).tiny
    mod = cp.RawModule(code='extern "C" __global__ void mul(const float* a, float* o) { o[0] = a[0] * a[1]; }',
                       options=NVRTC_OPTIONS)
    o = cp.full(1, 7.0, cp.float32)
    mod.get_function("mul")((1,), (1,), (cp.asarray(a), o))
    assert float(o.get()[0]) == 0.0


@pytest.mark.parametrize("op, dt", [(0, ml_dtypes.bfloat16), (1, np.float16)], ids=["bf16", "f16"])
def test_cvt_rn_to_16_bit(gpu, op, dt):
    w = special_floats()
    x = w.view(F32)
    ref = canonical(x.astype(dt).view(np.uint16).astype(np.uint32), x)
    got = unary(gpu, w, op)
    bad = np.flatnonzero(got != ref)
    assert bad.size == 0, [(hex(w[i]), hex(got[i]), hex(ref[i])) for i in bad[:8]]


def test_cvt_f16_to_f32_every_half(gpu):
    h = np.arange(1 << 16, dtype=np.uint32)
    x = h.astype(np.uint16).view(np.float16)
    got = unary(gpu, h, 2).view(F32)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), x[~nan].astype(F32).view(np.uint32))
    assert np.isnan(got[nan]).all()


@pytest.mark.parametrize("op, dt", [(3, ml_dtypes.bfloat16), (4, np.float16)], ids=["bf16x2", "f16x2"])
def test_cvt_pack_x2(gpu, op, dt):
    w = special_floats()
    w = w[: len(w) // 2 * 2]
    x = w.view(F32)
    lo = canonical(x[0::2].astype(dt).view(np.uint16).astype(np.uint32), x[0::2])
    hi = canonical(x[1::2].astype(dt).view(np.uint16).astype(np.uint32), x[1::2])
    np.testing.assert_array_equal(unary(gpu, w, op, n_out=len(w) // 2), lo | (hi << 16))


@pytest.mark.parametrize("op", ["fma2", "sub2", "mul2", "add2"])
def test_f32x2_pairs_bit_for_bit(gpu, op):
    """fma / sub / mul / add .rn.ftz.f32x2 (sm_100: FFMA2, FADD2, FMUL2; elsewhere the scalar pair): each lane
    its scalar operation rounded once, subnormal inputs and results flushed (the -ftz=true build)."""
    from kdacupy.numerics.backward_arith import fma32

    def flush(x):
        x = np.asarray(x, np.float64)
        return np.where(np.abs(x) < 2.0 ** -126, np.copysign(0.0, x), x)
    a, b, c = pair_operands()
    out = gpu("k_pair2", 64, 128, (a, b, c, np.zeros(a.size, F32), np.int32(a.size // 2),
                                    np.int32(["fma2", "sub2", "mul2", "add2"].index(op))))[3]
    fa, fb, fc = (flush(x) for x in (a, b, c))
    with np.errstate(all="ignore"):
        ref = flush({"fma2": lambda: fma32(fa, fb, fc), "sub2": lambda: fa - fb, "mul2": lambda: fa * fb,
                     "add2": lambda: fa + fb}[op]()).astype(F32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32))


@pytest.mark.parametrize("mode, nm, trans", [(0, 4, False), (1, 4, True), (2, 2, False), (3, 2, True)],
                         ids=["x4", "x4.trans", "x2", "x2.trans"])
def test_ldmatrix(gpu, mode, nm, trans):
    rng = np.random.default_rng(10 + mode)
    rows = rng.integers(0, 1 << 16, size=(32, 8), dtype=np.uint16)
    rowidx = rng.permutation(32).astype(np.int32)
    out = gpu("k_ldmatrix", 1, 32, (rows, rowidx, np.zeros((32, 4), np.uint32), np.int32(mode)), 512)[2]
    mats = np.stack([rows[rowidx[8 * m: 8 * m + 8]] for m in range(nm)])
    np.testing.assert_array_equal(out[:, :nm], ldmatrix_expected(mats, trans)[:, :nm])


def test_cp_async_group_protocol(gpu):
    n = 32
    g = np.arange(3 * n * 4, dtype=np.uint32) + 1
    out = gpu("k_cp_async", 1, n, (g, np.zeros((4, 3, n, 4), np.uint32)), 3 * n * 16)[1]
    src = g.reshape(3, n, 4)
    zfilled = src[1].copy()
    zfilled[1::2] = 0
    # defined by the ISA: after wait_group 1 group 0 landed; after wait_group 0 groups 0 and 1;
    # after the last commit + wait all three (before a wait, or uncommitted, nothing is defined)
    np.testing.assert_array_equal(out[1, 0], src[0])
    np.testing.assert_array_equal(out[2, 0], src[0])
    np.testing.assert_array_equal(out[2, 1], zfilled)
    for r, want in enumerate([src[0], zfilled, src[2]]):
        np.testing.assert_array_equal(out[3, r], want)


def run_mma(gpu, A, B, C, f16):
    args = (scatter_a(A.view(np.uint16)), scatter_b(B.view(np.uint16)), scatter_c(C), np.zeros((32, 4), F32),
            np.int32(f16))
    return gather_d(gpu("k_mma", 1, 32, args)[3])


@pytest.mark.parametrize("f16", [0, 1], ids=["bf16", "f16"])
def test_integer_valued_mma_is_exact(gpu, f16):
    rng = np.random.default_rng(20 + f16)
    dt = np.float16 if f16 else ml_dtypes.bfloat16
    A = (rng.integers(-256, 257, (16, 16)) / 64.0).astype(dt)  # every partial sum exact in 24 bits
    B = (rng.integers(-256, 257, (16, 8)) / 64.0).astype(dt)
    C = rng.integers(-1000, 1000, (16, 8)).astype(F32)
    ref = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(F32)
    np.testing.assert_array_equal(run_mma(gpu, A, B, C, f16), ref)


def test_wrappers_compose_into_a_gemm_tile(gpu):
    rng = np.random.default_rng(30)
    M, N, K = 128, 192, 96
    A = (rng.integers(-256, 257, (M, K)) / 64.0).astype(ml_dtypes.bfloat16)
    B = (rng.integers(-256, 257, (K, N)) / 64.0).astype(ml_dtypes.bfloat16)
    C = gpu("k_gemm", (N // 64, M // 64), 128, (A.view(np.uint16), B.view(np.uint16), np.zeros((M, N), F32),
                                                  np.int32(N), np.int32(K)), 2 * 2 * 64 * 32 * 2)[2]
    np.testing.assert_array_equal(C, (A.astype(np.float64) @ B.astype(np.float64)).astype(F32))


# ---- .approx within the ISA bounds ----------------------------------------------------------------
RNG = np.random.default_rng(11)
APPROX = {
    "ex2": (5, RNG.uniform(-125, 127, 20000)),
    "lg2": (6, np.concatenate([RNG.uniform(0.5, 2.0, 10000), np.exp(RNG.uniform(-85, 85, 10000))])),
    "rsqrt": (7, np.exp(RNG.uniform(-85, 85, 20000))),
    "rcp": (8, np.concatenate([RNG.uniform(-1e3, 1e3, 10000), np.exp(RNG.uniform(-85, 85, 10000))])),
    "tanh": (9, RNG.uniform(-9, 9, 20000)),
}


@pytest.mark.parametrize("name", list(APPROX))
def test_approx_within_isa_bounds(gpu, name):
    op, x = APPROX[name]
    x = x.astype(F32)
    got = unary(gpu, x.view(np.uint32), op).view(F32).astype(np.float64)
    xd = x.astype(np.float64)
    if name == "ex2":
        cr = np.exp2(xd).astype(F32)
        err = np.abs(got.astype(F32).view(np.int32).astype(np.int64) - cr.view(np.int32))
        print(f"ex2: max {err.max()} ulp of the correctly rounded result")
        assert err.max() <= 2
        return
    if name == "rcp":
        ref = 1.0 / xd
        err = np.abs(got - ref) / np.spacing(np.abs(got.astype(F32))).astype(np.float64)
        print(f"rcp: max {err.max():.3f} ulp")
        assert err.max() <= 1.0
        return
    ref = {"lg2": np.log2, "rsqrt": lambda v: 1.0 / np.sqrt(v), "tanh": np.tanh}[name](xd)
    if name == "lg2":
        mid = (xd > 0.5) & (xd < 2.0)
        abs_err, rel_err = np.abs(got - ref)[mid].max(), (np.abs(got - ref) / np.abs(ref))[~mid].max()
        print(f"lg2: max abs error {abs_err:.3g} in (0.5, 2) (bound 2^-22), max rel {rel_err:.3g}")
        assert abs_err <= 2.0 ** -22 and rel_err <= 2.0 ** -22
        return
    nz = ref != 0
    rel = (np.abs(got - ref)[nz] / np.abs(ref[nz])).max()
    print(f"{name}: max relative error {rel:.3g} = 2^{np.log2(rel):.2f} (bound {REL_BOUND[name]:.3g})")
    assert rel <= REL_BOUND[name]


def test_approx_special_values(gpu):
    tiny = 2.0 ** -126
    x = approx_inputs(-1, 1)[-9:]  # 0, -0, 1e-40, -1e-40, inf, -inf, nan, 1, -1
    ex2 = unary(gpu, x.view(np.uint32), 5).view(F32)
    assert list(ex2[[0, 1, 2, 3, 4, 5, 7]]) == [1, 1, 1, 1, np.inf, 0, 2]
    edge = np.array([-126.0, -126.5, -127.0], F32)
    assert list(unary(gpu, edge.view(np.uint32), 5).view(F32)) == [tiny, 0, 0]  # results below 2^-126 flush
    lg2 = unary(gpu, x.view(np.uint32), 6).view(F32)
    assert lg2[0] == -np.inf and lg2[2] == -np.inf and lg2[7] == 0 and np.isnan(lg2[8])
    rsq = unary(gpu, x.view(np.uint32), 7).view(F32)
    assert rsq[0] == np.inf and rsq[1] == -np.inf and rsq[2] == np.inf and rsq[4] == 0
    rcp = unary(gpu, np.array([0.0, -0.0, 2.0 ** 127, -(2.0 ** 126), -1e-40], F32).view(np.uint32), 8).view(F32)
    assert list(rcp) == [np.inf, -np.inf, 0, -tiny, -np.inf]


# ---- the mma accumulation probe --------------------------------------------------------------------
def mma_trials(f16, n=60, seed=50):
    rng = np.random.default_rng(seed + f16)
    dt = np.float16 if f16 else ml_dtypes.bfloat16
    for _ in range(n):
        scale = 2.0 ** rng.integers(-8, 9, (16, 1))  # rows of different magnitudes: alignment shows
        A = (rng.standard_normal((16, 16)) * scale).astype(dt)
        B = rng.standard_normal((16, 8)).astype(dt)
        C = (rng.standard_normal((16, 8)) * 2.0 ** rng.integers(-4, 5)).astype(F32)
        yield A, B, C


@pytest.mark.parametrize("f16", [0, 1], ids=["bf16", "f16"])
def test_mma_accumulation_probe(gpu, f16):
    models = {f"block={b} guard={g} {r}{' C-last' if c else ''}": (b, g, r, c)
              for b, g, r, c in itertools.product((4, 8, 16), (0, 1, 2, 3, 4, 5, 8), ("rz", "rn"), (False, True))}
    models["exact sum, rn"] = (16, None, "rn", False)
    hits = dict.fromkeys(models, 0)
    total = 0
    worst = 0.0
    for A, B, C in mma_trials(f16):
        D = run_mma(gpu, A, B, C, f16)
        total += D.size
        big = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) + np.abs(C)
        worst = max(worst, float((np.abs(D - (A.astype(np.float64) @ B.astype(np.float64) + C)) / big).max()))
        for name, (b, g, r, c) in models.items():
            hits[name] += int(np.sum(mma_dot(A, B, C, block=b, guard=g, final=r, c_last=c) == D))
    table = sorted(((h / total, name) for name, h in hits.items()), reverse=True)
    print("mma accumulation: fraction of outputs each model reproduces bit for bit")
    for frac, name in table[:12]:
        print(f"  {frac:8.4f}  {name}")
    print(f"  largest |D - exact| / sum|terms| = {worst:.3g}")
    assert worst <= 2.0 ** -20  # a few fp32 ulps of the largest term, whatever the model
    ours = f"block={MMA_BLOCK} guard={MMA_GUARD} rz"
    assert hits[ours] == total, (f"the hardware twin's model ({ours}) reproduces {hits[ours] / total:.4f} of the "
                                 f"outputs; best: {table[0]}")


# ---- Hopper (sm_90a): wgmma, mbarrier, cp.async.bulk -------------------------------------------------
class Hopper(Gpu):
    """tests/emulate/test_ptx_twins_async.py's kernels, built for sm_90a by the runtime's loader."""

    def __init__(self):
        from kdacupy.jit.loaders import cuda_module

        self.mod, _ = cuda_module(kernel_source(hopper_twins.ASYNC_KERNELS), "sm_90a", "the sm_90a probes")


@pytest.fixture(scope="module")
def hopper():
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("sm_90a probes: compute capability 9.0 only")
    return Hopper()


def test_the_runtime_builds_sm_90a_here():
    from kdacupy.jit.nvrtc import arch_of_device

    arch = arch_of_device()
    print(f"the runtime's target on this device: {arch}")
    if cp.cuda.Device().compute_capability == "90":
        assert arch == "sm_90a"


def run_wgmma_gpu(hopper, A, B, C, n_major, swizzle, flags=2):
    args, smem = hopper_twins.wgmma_args(A, B, C, n_major, swizzle, flags)
    d = hopper("k_wgmma", 1, 128, args, smem)[6]
    return hopper_twins.gather_d(d, B.shape[1])


@pytest.mark.parametrize("n", [8, 16, 64, 128])
@pytest.mark.parametrize("n_major", [0, 1], ids=["B K-major", "B N-major"])
@pytest.mark.parametrize("swizzle", ["none", "128B"])
@pytest.mark.parametrize("bulk", [0, 1], ids=["stores", "bulk copy"])
def test_wgmma_layouts_bit_exact(hopper, n, n_major, swizzle, bulk):
    """Integer-valued A, B and C (every sum exact under any model): the fragments, the layouts,
    the descriptor and the chaining of two k16 steps are the ISA's."""
    rng = np.random.default_rng(200 + n + 7 * n_major + len(swizzle))
    A, B, _ = hopper_twins.wgmma_inputs(n, 2, rng)
    C = rng.integers(-1000, 1000, (64, n)).astype(F32)
    D = run_wgmma_gpu(hopper, A, B, C, n_major, swizzle, flags=2 | bulk)
    np.testing.assert_array_equal(D, (A.astype(np.float64) @ B.astype(np.float64) + C).astype(F32))


def test_wgmma_accumulation_probe(hopper):
    """Which model reproduces wgmma's fp32 sums over two chained k16 instructions (C of full
    precision, rows of different magnitudes): per block of products (4, 8, 16; 32 = both
    instructions fused), guard bits, final rounding. The hardware twin's model (per k16
    instruction, as for mma) must reproduce every output; the exact twin's (each instruction's
    exact sum rounded to nearest) is listed for comparison."""
    models = {f"block={b} guard={g} {r}{' C-last' if c else ''}": (b, g, r, c)
              for b, g, r, c in itertools.product((4, 8, 16, 32), (0, 1, 2, 3, 4, 5, 8), ("rz", "rn"), (False, True))}
    models["exact per k16, rn (the exact twin)"] = (16, None, "rn", False)
    hits, total, worst = dict.fromkeys(models, 0), 0, 0.0
    rng = np.random.default_rng(60)
    for _ in range(8):  # 32768 outputs (the models' sums: ~0.3 s a trial on the CPU)
        A, B, C = hopper_twins.wgmma_inputs(64, 2, rng, exact=False)
        C = C * F32(2.0 ** rng.integers(-4, 5))
        D = run_wgmma_gpu(hopper, A, B, C, 0, "128B")
        total += D.size
        big = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) + np.abs(C)
        worst = max(worst, float((np.abs(D - (A.astype(np.float64) @ B.astype(np.float64) + C)) / big).max()))
        for name, (b, g, r, c) in models.items():
            hits[name] += int(np.sum(mma_dot(A, B, C, block=b, guard=g, final=r, c_last=c) == D))
    table = sorted(((h / total, name) for name, h in hits.items()), reverse=True)
    print("wgmma accumulation: fraction of outputs each model reproduces bit for bit")
    for frac, name in table[:12]:
        print(f"  {frac:8.4f}  {name}")
    print(f"  exact twin's model: {hits['exact per k16, rn (the exact twin)'] / total:.4f}")
    print(f"  largest |D - exact| / sum|terms| = {worst:.3g}")
    assert worst <= 2.0 ** -20
    ours = f"block={MMA_BLOCK} guard={MMA_GUARD} rz"
    assert hits[ours] == total, (f"the hardware twin's model ({ours}) reproduces {hits[ours] / total:.4f} of the "
                                 f"outputs; best: {table[0]}")


def test_wgmma_wait_group_protocol(hopper):
    rng = np.random.default_rng(70)
    A, B, _ = hopper_twins.wgmma_inputs(16, 2, rng)
    img, lbo, sbo, _ = hopper_twins.image(B[:16].view(np.uint16), 0, "none")
    a = np.concatenate([hopper_twins.scatter_a(A[:, s:s + 16].view(np.uint16)) for s in (0, 16)])
    mid, end = hopper("k_wgmma_groups", 1, 128, (a, img, np.int32(img.size), np.array([lbo, sbo, 0], np.int32),
                                                 np.zeros((128, 16), F32), np.zeros((128, 16), F32)),
                      1040 + img.size)[4:6]
    x, y = ((A[:, s:s + 16].astype(np.float64) @ B[:16].astype(np.float64)).astype(F32) for s in (0, 16))
    # defined by the ISA: after wait_group 1 the older group; after wait_group 0 both
    np.testing.assert_array_equal(hopper_twins.gather_d(mid[:, :8], 16), x)
    np.testing.assert_array_equal(hopper_twins.gather_d(end[:, :8], 16), x)
    np.testing.assert_array_equal(hopper_twins.gather_d(end[:, 8:], 16), y)


def test_matrix_descriptor_on_the_device(hopper):
    offs = np.array([0, 16, 2048, 4096, 60000], np.uint32)
    out = hopper("k_desc", 1, 32, (np.zeros(3 + len(offs), np.uint32), np.int32(4096), np.int32(1024), np.int32(1),
                                   offs, np.int32(len(offs))), 61000)[0]
    desc = int(out[1]) | int(out[2]) << 32
    print(f"dynamic shared memory + 256 at shared address 0x{int(out[0]):x}")
    assert desc == ((int(out[0]) & 0x3FFFF) >> 4) | (4096 >> 4) << 16 | (1024 >> 4) << 32 | 1 << 62
    assert list(out[3:]) == [1] * len(offs)  # wgmma_desc_add: the descriptor built at the tile + offset


def test_elect_one_sync_on_the_device(hopper):
    out = hopper("k_elect", 1, 96, (np.zeros(96, np.uint32), np.int32(0)), 0)[0]
    print("elected lanes:", hopper_twins.elected_lanes(out))  # which lane: the twin says 31, kernels assume none


def test_blocks_hand_data_over_on_the_device(hopper):
    nb = 5  # five blocks of 64 threads: co-resident on any GPU
    data, flag, out = np.zeros(nb * 64, np.uint32), np.zeros(nb, np.uint32), np.zeros((nb - 1) * 64, np.uint32)
    got = hopper("k_handoff", nb, 64, (data, flag, out), 128 + (nb - 1) * 256)
    np.testing.assert_array_equal(got[2], hopper_twins.handoff_expected(nb))


def test_mbarrier_phases_and_bulk_copy_bytes(hopper):
    g = (np.arange(64, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)
    out = hopper("k_mbar_phases", 1, 64, (g, np.zeros(64, np.uint32), np.int32(0)), 512)[1]
    assert list(out[:9]) == hopper_twins.PHASES
    np.testing.assert_array_equal(out[16:64], g[:48])


def test_bulk_copy_ring(hopper):
    g = np.random.default_rng(14).integers(0, 1 << 32, 5 * 1024 // 4, dtype=np.uint64).astype(np.uint32)
    out = hopper("k_bulk_ring", 1, 128, (g.view(np.uint8), np.zeros_like(g), np.int32(5), np.int32(1024),
                                         np.int32(0)), 128 + 2 * 1024)[1]
    np.testing.assert_array_equal(out, g)


# ---- the chunk ring between blocks (kernels/chunk_ring.cuh; sm_90 on: bulk copies) ------------------------
@pytest.mark.parametrize("ns, ncons, R, producers", [(2, 2, 1, 1), (3, 1, 2, 3), (2, 2, 3, 2), (8, 2, 2, 16)])
def test_chunk_ring_on_the_device(gpu, ns, ncons, R, producers):
    from kdacupy.jit.loaders import cuda_module
    from kdacupy.jit.nvrtc import arch_of_device

    from ..emulate import test_chunk_ring as ring

    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("the chunk ring's bulk copies: compute capability 9.0 on")
    mod, _ = cuda_module(ring.ring_source(), arch_of_device(), "the chunk ring probe")
    nchunks = 64
    arrays, scalars = ring.ring_args(ns, ncons, R, nchunks)
    dev = [cp.asarray(a) for a in arrays]
    mod.get_function("k_ring")((ns * ncons + producers,), (64,), (*dev, *scalars), shared_mem=128 + 256)
    cp.cuda.Device().synchronize()  # blocks of 64 threads, a few dozen: all resident at once on any GPU
    ring.check_ring([cp.asnumpy(d) for d in dev], ns, ncons, R, producers, nchunks)


# ---- Blackwell (sm_100a): tcgen05, tensor memory -----------------------------------------------------
class Blackwell(Gpu):
    """tests/emulate/test_ptx_twins_tcgen05.py's kernels, built for sm_100a by the runtime's loader."""

    def __init__(self):
        from kdacupy.jit.loaders import cuda_module

        from ..emulate import test_ptx_twins_tcgen05 as blackwell_twins
        self.mod, _ = cuda_module(kernel_source(blackwell_twins.KERNELS), "sm_100a", "the sm_100a probes")


@pytest.fixture(scope="module")
def blackwell():
    if cp.cuda.Device().compute_capability != "100":
        pytest.skip("sm_100a probes: compute capability 10.0 only")
    return Blackwell()


@pytest.mark.parametrize("m, n", [(64, 8), (64, 64), (128, 16), (128, 128)])
@pytest.mark.parametrize("b_mn", [0, 1], ids=["B K-major", "B N-major"])
@pytest.mark.parametrize("bulk", [0, 16], ids=["stores", "bulk copy"])
def test_umma_layouts_bit_exact(blackwell, m, n, b_mn, bulk):
    """Integer-valued operands (every sum exact under any model): the sm_100 descriptors, the
    instruction descriptor's M / N / majors, the data-path layouts of M = 64 and 128 and tcgen05.ld's
    32x32b lanes are what the twins assume (tests/emulate/test_ptx_twins_tcgen05.py)."""
    from ..emulate import test_ptx_twins_tcgen05 as blackwell_twins

    A, B = blackwell_twins.operands(m, n, 2, np.random.default_rng(300 + m + n + b_mn))
    want = (A.astype(np.float64) @ B.astype(np.float64)).astype(F32)
    np.testing.assert_array_equal(blackwell_twins.run(blackwell, A, B, b_mn, flags=bulk), want)


@pytest.mark.parametrize("m, n, b_mn, lane0", [(128, 16, 0, 0), (128, 128, 1, 0), (64, 16, 0, 0), (64, 16, 1, 16)])
def test_umma_with_a_from_tensor_memory_bit_exact(blackwell, m, n, b_mn, lane0):
    """A stored to tensor memory by tcgen05.st and read by tcgen05.mma from there: what the twin assumes
    (two bf16 a 32-bit column, even k in the low half; M = 64's rows in the first or last 16 lanes of each
    quarter, A and D at the same lane field)."""
    from ..emulate import test_ptx_twins_tcgen05 as blackwell_twins

    A, B = blackwell_twins.operands(m, n, 3, np.random.default_rng(400 + m + n + lane0))
    want = (A.astype(np.float64) @ B.astype(np.float64)).astype(F32)
    np.testing.assert_array_equal(blackwell_twins.run_ts(blackwell, A, B, b_mn, lane0), want)


def test_umma_descriptor_words_and_allocation(blackwell):
    """The wrappers' descriptors as built on the device, and tcgen05.alloc's addresses (lane 0, columns
    0 and 64 for 64 then 32 columns in a fresh CTA: the twin's first fit)."""
    out = blackwell("k_umma_desc", 1, 32, (np.zeros(4, np.uint32), np.int32(4096), np.int32(256), np.int32(2)),
                    1024)[0]
    assert int(out[1]) >> (46 - 32) & 7 == 1 and int(out[1]) >> (61 - 32) == 2
    got = blackwell("k_tmem", 1, 32, (np.zeros(2, np.uint32), np.int32(0)), 64)[0]
    print(f"tcgen05.alloc's addresses: {list(got)}")
    assert got[0] >> 16 == 0 and got[1] >> 16 == 0 and got[0] != got[1]


def test_the_16_lane_shapes_bit_exact(blackwell):
    """tcgen05.ld / st .16x256b and .16x128b (the state update's, kernels/recurrence_tcgen05.cuh) move the cells
    the twin assumes, each thread's registers to and from other threads' lanes, landed by the warp's wait::st."""
    from ..emulate import test_ptx_twins_tcgen05 as blackwell_twins

    blackwell_twins.check_shapes(blackwell)


def test_tensor_memory_store_and_load_round_trip(blackwell):
    """tcgen05.st then (after wait::st) tcgen05.ld of each warp's quarter: the values written, bit for bit."""
    x = np.random.default_rng(6).standard_normal((128, 8)).astype(F32)
    out = blackwell("k_tmem_st", 1, 128, (x, np.zeros_like(x), np.int32(0)), 64)[1]
    np.testing.assert_array_equal(out, x * 2 + 1)

"""The PTX twins under KDACUPY_EMULATE_NUMERICS=hardware: .approx results within
their PTX ISA bounds, deterministic, and different from the exact twins; mma sums
as kdacupy.emulate.numerics.mma_dot models the tensor cores; FTZ during a launch
(and only then)."""
import ml_dtypes
import numpy as np
import pytest

from kdacupy.emulate import EmulatedModule, EmulationError, find_compiler
from kdacupy.emulate.numerics import REL_BOUND, VARIABLE, mma_dot

from .test_ptx_twins import NAMES, TEST_KERNELS, gather_d, kernel_source, run_unary, scatter_a, scatter_b, scatter_c

try:
    find_compiler()
except Exception as e:  # noqa: BLE001
    pytest.skip(f"no host C++ compiler for the emulation: {e}", allow_module_level=True)

F32 = np.float32
FTZ_KERNEL = r"""
extern "C" __global__ void k_mul(const float* a, const float* b, float* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) out[i] = a[i] * b[i];
}
"""


def build(mode, monkeypatch):
    monkeypatch.setenv(VARIABLE, mode)
    return EmulatedModule(kernel_source(TEST_KERNELS + FTZ_KERNEL), NAMES + ["k_mul"])


@pytest.fixture(scope="module")
def mods():
    with pytest.MonkeyPatch.context() as mp:
        return build("exact", mp), build("hardware", mp)


def approx(mod, x, op):
    return run_unary(mod, np.asarray(x, F32).view(np.uint32), op).view(F32)


def ulps(a, b):
    """Distance in fp32 units in the last place (same-sign finite values)."""
    ia, ib = (np.asarray(v, F32).view(np.int32).astype(np.int64) for v in (a, b))
    return np.abs(ia - ib)


def test_unknown_mode_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(VARIABLE, "fast")
    with pytest.raises(EmulationError, match=f"{VARIABLE}='fast' is not valid: expected exact or hardware"):
        EmulatedModule(kernel_source(FTZ_KERNEL), ["k_mul"])


RNG = np.random.default_rng(11)
CASES = {  # op code in k_unary, inputs
    "ex2": (5, RNG.uniform(-120, 120, 4000)),
    "lg2": (6, np.concatenate([RNG.uniform(0.5, 2.0, 2000), np.exp(RNG.uniform(-80, 80, 2000))])),
    "rsqrt": (7, np.exp(RNG.uniform(-80, 80, 4000))),
    "rcp": (8, RNG.uniform(-1e3, 1e3, 4000)),
    "tanh": (9, RNG.uniform(-6, 6, 4000)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_approx_within_the_isa_bounds_deterministic_and_not_exact(mods, name):
    exact_mod, hw_mod = mods
    op, x = CASES[name]
    x = x.astype(F32)
    got = approx(hw_mod, x, op)
    np.testing.assert_array_equal(got.view(np.uint32), approx(hw_mod, x, op).view(np.uint32))  # deterministic
    exact = approx(exact_mod, x, op)
    xd = x.astype(np.float64)
    if name == "ex2":
        assert ulps(got, exact).max() <= 2  # 2 ulp of the correctly rounded result
    elif name == "rcp":
        assert np.all(np.abs(got - 1.0 / xd) <= np.spacing(np.abs(got)).astype(np.float64))  # 1 ulp
    else:
        ref = {"lg2": np.log2, "rsqrt": lambda v: 1.0 / np.sqrt(v), "tanh": np.tanh}[name](xd)
        err = np.abs(got - ref)
        if name == "lg2":
            mid = (xd > 0.5) & (xd < 2.0)
            assert err[mid].max() <= 2.0 ** -22  # absolute inside (0.5, 2)
            assert (err[~mid] / np.abs(ref[~mid])).max() <= 2.0 ** -22
        else:
            assert (err / np.abs(ref)).max() <= REL_BOUND[name]
    changed = np.mean(got != exact)
    assert changed > 0.3, changed  # perturbed, not the exact twin


def test_approx_special_values_keep_their_meaning(mods):
    _, hw = mods
    assert list(approx(hw, [0.0, 1.0, -3.0, 1e-40, -200.0], 5)) == [1.0, 2.0, 0.125, 1.0, 0.0]  # ex2
    assert list(approx(hw, [1.0, 8.0, 0.25], 6)) == [0.0, 3.0, -2.0]  # lg2 of powers of two
    assert np.isnan(approx(hw, [-1.0], 6)[0]) and approx(hw, [0.0], 6)[0] == -np.inf
    assert list(approx(hw, [4.0, 0.0], 7)) == [0.5, np.inf] and list(approx(hw, [2.0, 0.0], 8)) == [0.5, np.inf]
    assert abs(approx(hw, [20.0], 9)[0]) <= 1.0
    assert approx(hw, [1e-40], 9)[0] == F32(1e-40)  # tanh passes subnormals through


def run_mma(mod, A, B, C, f16=0):
    d = np.zeros((32, 4), F32)
    args = (scatter_a(A.view(np.uint16)), scatter_b(B.view(np.uint16)), scatter_c(C), d, np.int32(f16))
    mod.get_function("k_mma")(1, 32, args)
    return gather_d(d)


@pytest.mark.parametrize("f16", [0, 1])
def test_mma_sums_as_the_tensor_core_model(mods, f16):
    exact_mod, hw_mod = mods
    dt = np.float16 if f16 else ml_dtypes.bfloat16
    rng = np.random.default_rng(40 + f16)
    differs = 0
    for trial in range(20):
        scale = 2.0 ** rng.integers(-6, 7, (16, 1))  # rows of different magnitudes: alignment matters
        A = (rng.standard_normal((16, 16)) * scale).astype(dt)
        B = rng.standard_normal((16, 8)).astype(dt)
        C = (rng.standard_normal((16, 8)) * 4).astype(F32)
        got = run_mma(hw_mod, A, B, C, f16)
        np.testing.assert_array_equal(got, mma_dot(A, B, C))
        exact = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(F32)
        np.testing.assert_array_equal(run_mma(exact_mod, A, B, C, f16), exact)
        # truncation: each of the 17 terms loses < 2^-26 of the largest, the sum one fp32 ulp
        big = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) + np.abs(C)
        assert np.all(np.abs(got - exact) <= big * 2.0 ** -20)
        differs += int(np.sum(got != exact))
    assert differs > 0


def test_integer_valued_mma_is_exact_in_both_modes(mods):
    rng = np.random.default_rng(3)
    A = (rng.integers(-256, 257, (16, 16)) / 64.0).astype(ml_dtypes.bfloat16)
    B = (rng.integers(-256, 257, (16, 8)) / 64.0).astype(ml_dtypes.bfloat16)
    C = rng.integers(-1000, 1000, (16, 8)).astype(F32)
    ref = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(F32)
    for mod in mods:
        np.testing.assert_array_equal(run_mma(mod, A, B, C), ref)


def test_ftz_during_a_launch_and_not_after(mods):
    exact_mod, hw_mod = mods
    a = np.array([1e-20, 1e-40, 3.0, -1e-20], F32)
    b = np.array([1e-20, 1.0, 2.0, 1e-20], F32)
    out = np.zeros(4, F32)
    exact_mod.get_function("k_mul")(1, 32, (a, b, out, np.int32(4)))
    assert out[0] != 0 and out[1] != 0 and out[2] == 6  # subnormal results and inputs kept
    hw_mod.get_function("k_mul")(1, 32, (a, b, out, np.int32(4)))
    assert list(out) == [0.0, 0.0, 6.0, 0.0] and np.signbit(out[3])  # flushed, sign kept
    assert np.float32(1e-20) * np.float32(1e-20) != 0  # the caller's thread got its mode back


def test_ftz_on_every_worker_thread(mods, monkeypatch):
    monkeypatch.setenv("KDACUPY_EMULATE_THREADS", "4")  # blocks spread over 4 OS threads
    n = 64 * 32
    a = np.full(n, 1e-20, F32)
    out = np.ones(n, F32)
    mods[1].get_function("k_mul")(64, 32, (a, a, out, np.int32(n)))
    assert not out.any()


def test_the_mode_is_part_of_the_build_key(monkeypatch, tmp_path):
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    src = kernel_source(FTZ_KERNEL) + "\n// build-key test\n"
    a = np.array([1e-20], F32)
    outs = []
    for mode in ("exact", "hardware"):
        monkeypatch.setenv(VARIABLE, mode)
        out = np.zeros(1, F32)
        EmulatedModule(src, ["k_mul"]).get_function("k_mul")(1, 1, (a, a, out, np.int32(1)))
        outs.append(out[0])
    assert len(list((tmp_path / "emulate").glob("*.so"))) == 2  # two builds, not one reused
    assert outs[0] != 0 and outs[1] == 0

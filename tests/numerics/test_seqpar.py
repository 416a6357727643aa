"""Sequence parallelism (kdacupy/seqpar.py): the state maps against the float64
definition, the split forward against the serial one on every backend, the
choice of the segment count and the argument checks.

Tolerances: split vs serial is held to ``kdacupy.parity.GPU``: the split
replaces the serial run's state at each segment start by the fp32 map chain's,
which moves some bf16 rounding decisions of the state the way the GPU's
approximate instructions do (measured: up to 2.1e-3 RMS ratio on the state, vs
the 3.9e-3 bound), and on top of that the split must be as accurate against the
float64 reference as the serial run. The same algorithm on the emulated kernels
and on the model is held to ``EMULATE``. Maps from the fp32-state runs against
the float64 definition: 2^-7 relative (their operands are bf16, as in every
state matmul of the kernels).

Each emulated case builds its own variants (1-5 s of the cold run), so the default
run takes a sample of the emulated points, on shared builds; the rest is a sweep
(tests/sweeps.py).
"""
import dataclasses
import itertools

import numpy as np
import pytest

import kdacupy
from kdacupy import seqpar
from kdacupy.ops.seqpar import split
from kdacupy.numerics.dtypes import BF16, F32
from kdacupy.numerics.parity import EMULATE, GPU, mismatch
from kdacupy.numerics.reference import activate_beta, activate_gate, kda_reference, l2normalize

from ..cases import CASES, case_inputs
from ..inputs import make_inputs, rmse_ratio
from ..seqpar_adversarial import FAMILIES, adversarial_inputs
from ..seqpar_checks import check_split
from ..sweeps import sample

try:
    from kdacupy.emulate import find_compiler
    find_compiler()
    HAVE_EMU = True
except Exception:  # noqa: BLE001
    HAVE_EMU = False
needs_emu = pytest.mark.skipif(not HAVE_EMU, reason="no host C++ compiler for the emulation")
# more segments than chunks (empty segments) is a case these tests run on purpose
pytestmark = pytest.mark.filterwarnings("ignore::kdacupy.seqpar.SegmentWarning")

STATE_OPTS = ("initial_state", "state_layout", "output_final_state", "state_dtype", "state_precision")


def close(x, ref, tol=EMULATE):
    why = mismatch(x, ref, tol)
    assert why is None, why


def no_less_accurate(x, serial, ref):
    assert rmse_ratio(x, ref) <= 1.05 * rmse_ratio(serial, ref) + 1e-4


def map_inputs(**kw):
    x, opts = make_inputs(**kw)
    s0 = opts.pop("initial_state", None)
    opts.pop("state_layout", None)
    return x, opts, s0


def definition_maps(x, opts):
    """(M, B) per sequence straight from the definition: M the product of the
    tokens' transition matrices (I - beta k k^T) diag(exp g), B the run from zero."""
    q, k, v, g = (np.asarray(x[n], np.float64) for n in "qkvg")
    B_, T, H, K = k.shape
    HV, V = v.shape[2:]
    if opts.get("qk_l2norm"):
        k = l2normalize(k)
    k = np.repeat(k, HV // H, axis=2)
    ga = activate_gate(g, opts.get("gate", "log"), opts.get("A_log"), opts.get("dt_bias"), opts.get("lower_bound"))
    beta = activate_beta(x.get("beta"), (B_, T, HV), opts.get("beta_sigmoid", False),
                         opts.get("allow_neg_eigval", False))
    cu = opts.get("cu_seqlens")
    bounds = [(b, 0, T) for b in range(B_)] if cu is None else [(0, int(a), int(c)) for a, c in zip(cu[:-1], cu[1:])]
    Ms, Bs = [], []
    for b, t0, t1 in bounds:
        Mh, Bh = [], []
        for h in range(HV):
            M, Bm = np.eye(K), np.zeros((K, V))
            for t in range(t0, t1):
                kt = k[b, t, h]
                A = (np.eye(K) - beta[b, t, h] * np.outer(kt, kt)) @ np.diag(np.exp(ga[b, t, h]))
                M, Bm = A @ M, A @ Bm + beta[b, t, h] * np.outer(kt, v[b, t, h])
            Mh.append(M)
            Bh.append(Bm)
        Ms.append(Mh)
        Bs.append(Bh)
    return np.array(Ms), np.array(Bs)


# ---------------------------------------------------------------------------
# maps


MAP_CASES = {
    "varlen-gva-zero": dict(cu_seqlens=[21, 0, 35], H=1, HV=2, K=64, V=64),
    "fixed-b2-softplus": dict(B=2, T=19, H=1, K=64, V=128, gate="softplus", beta="raw"),
    "k128-v64-log-nobeta": dict(T=18, H=1, K=128, V=64, gate="log", beta=None),
}


@pytest.mark.parametrize("name", list(MAP_CASES))
def test_reference_maps_are_the_definition(name):
    x, opts, _ = map_inputs(**MAP_CASES[name])
    opts["qk_l2norm"] = True
    M, B = seqpar.state_maps(**x, **opts, backend="reference")
    Md, Bd = definition_maps(x, opts)
    assert M.dtype == np.float64 and M.shape == Md.shape and B.shape == Bd.shape
    np.testing.assert_allclose(M, Md, atol=1e-10)
    np.testing.assert_allclose(B, Bd, atol=1e-10)


# the default run: every case on the model, the varlen one on the emulated kernels (the split's builds below)
@pytest.mark.parametrize("name, backend", sample(
    [(n, "model") for n in MAP_CASES] + [pytest.param(n, "emulate", marks=needs_emu) for n in MAP_CASES],
    lambda n, b: b == "model" or n == "varlen-gva-zero"))
def test_maps_give_the_final_state_from_any_start(name, backend):
    kw = dict(MAP_CASES[name], state=np.float32)
    x, opts, s0 = map_inputs(**kw)
    opts["qk_l2norm"] = True
    M, B = seqpar.state_maps(**x, **opts, backend=backend)
    assert M.dtype == F32 and B.dtype == F32
    Md, Bd = definition_maps(x, opts)
    assert rmse_ratio(M, Md) < 2.0 ** -7
    assert rmse_ratio(B, Bd) < 2.0 ** -7
    _, ref = kda_reference(**x, **opts, initial_state=s0, output_final_state=True)
    assert rmse_ratio(M.astype(np.float64) @ s0 + B, ref) < 2.0 ** -7
    if backend == "emulate":  # the kernels' maps are the precision model's
        Mm, Bm = seqpar.state_maps(**x, **opts, backend="model")
        close(M, Mm)
        close(B, Bm)


def test_zero_length_sequences_map_to_identity_and_zero():
    x, opts, _ = map_inputs(cu_seqlens=[0, 17, 0], H=1, K=64, V=64)
    for backend in ["reference", "model"] + (["emulate"] if HAVE_EMU else []):
        M, B = seqpar.state_maps(**x, **opts, backend=backend)
        for n in (0, 2):
            np.testing.assert_array_equal(M[n, 0], np.eye(64))
            np.testing.assert_array_equal(B[n, 0], 0.0)
        assert np.abs(M[1] - np.eye(64)).max() > 1e-3  # the real sequence moves the state


def test_maps_k256_v256_on_the_model():
    x, opts, s0 = map_inputs(T=20, H=1, K=256, V=256, state=np.float32)
    M, B = seqpar.state_maps(**x, **opts, backend="model")
    assert M.shape == (1, 1, 256, 256) and B.shape == (1, 1, 256, 256)
    _, ref = kda_reference(**x, **opts, initial_state=s0, output_final_state=True)
    assert rmse_ratio(M.astype(np.float64) @ s0 + B, ref) < 2.0 ** -7


def test_maps_reject_bad_input():
    x, opts, _ = map_inputs(T=16, H=1, K=64, V=64)
    with pytest.raises(ValueError, match="backend"):
        seqpar.state_maps(**x, **opts, backend="tpu")
    with pytest.raises(ValueError, match="cu_seqlens"):
        seqpar.state_maps(**x, **opts, cu_seqlens=np.array([0, 5, 3, 16]), backend="model")


# ---------------------------------------------------------------------------
# segments


def test_segment_boundaries_are_whole_chunks():
    cu = np.array([0, 70, 70, 107, 112])
    seg = split.segment_cu_seqlens(cu, 3)
    assert seg.dtype == np.int64 and seg.shape == (13,)
    # 70 tokens = 5 chunks -> 1, 2, 2 chunks (the last ragged); 0 -> empty; 37 -> 3 chunks: 1, 1, 1; 5 -> 0, 0, 1
    np.testing.assert_array_equal(seg, [0, 16, 48, 70, 70, 70, 70, 86, 102, 107, 107, 107, 112])


# ---------------------------------------------------------------------------
# the split forward


def split_vs_serial(backend, x, opts, n, out=None):
    o1, s1 = kdacupy.kda_forward(**x, **opts, backend=backend)
    o2, s2 = kdacupy.kda_forward(**x, **opts, backend=backend, sequence_parallel=n, out=out)
    assert o2.dtype == o1.dtype and o2.shape == o1.shape
    if s1 is None:
        assert s2 is None
    else:
        assert s2.dtype == s1.dtype and s2.shape == s1.shape
    return (o1, s1), (o2, s2)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(CASES))
def test_split_matches_serial_on_the_model(name, precision):
    x, opts = case_inputs(name, precision)
    (o1, s1), (o2, s2) = split_vs_serial("model", x, opts, 3)
    close(o2, o1, GPU)
    close(s2, s1, GPU)
    ref = {n: v for n, v in opts.items() if n not in ("state_dtype", "state_precision")}
    ro, rs = kda_reference(**x, **ref)
    no_less_accurate(o2, o1, ro)
    no_less_accurate(s2, s1, rs)


EMU_CASES = ["fixed-gva-sigmoid", "varlen-ragged-zero-vk-bf16", "fp16-inputs", "V256"]
# the fp32 state on two of them (the model's split runs every case in both precisions): each case and
# precision is its own emulated build. The default run: varlen in the vk layout at the bf16 state and the
# grouped heads at the fp32 state, on builds the other tests here share; the rest is a sweep
EMU_PRECISIONS = [(name, "bf16") for name in EMU_CASES] + [(name, "fp32") for name in EMU_CASES[:2]]
EMU_SAMPLE = {("varlen-ragged-zero-vk-bf16", "bf16"), ("fixed-gva-sigmoid", "fp32")}


@needs_emu
# (cover=False: fp16 inputs (4 builds) and V = 256 (3) are the sweep's; K = V = 256 splits by default below)
@pytest.mark.parametrize("name, precision", sample(EMU_PRECISIONS, lambda n, p: (n, p) in EMU_SAMPLE, cover=False))
def test_split_matches_serial_on_the_emulated_kernels(name, precision):
    """tests/seqpar_checks.py's check, the one the GPU suite runs: split against serial, against
    the model's split, and no less accurate than serial against the float64 reference."""
    x, opts = case_inputs(name, precision)

    def run(x, opts, n):
        return kdacupy.kda_forward(**x, **opts, backend="emulate", sequence_parallel=n)
    check_split(run, x, opts, 2, GPU, EMULATE)


def segment_maps(x, opts, n, segments, launches):
    """The split forward's maps of ``n`` segments a sequence on the emulated kernels (``segments``: the
    split's, which run what its scan reads; None: every map, as state_maps), the grids launched into
    ``launches``."""
    p, a = seqpar.validate(**x, **dict(seqpar._VALIDATE_DEFAULTS, state_layout="kv", backend="emulate") | opts)
    ps, b = split._flatten(p, a, n)
    run = split.KernelRun(ps, b, segments=segments)
    loader, bvs = run.run, iter([t.BV for name, t in run.tiles.items() if name != "forward"])

    class Spy:  # each launch's value rows a head: its CTAs times its tiles' BV
        get = loader.get

        @staticmethod
        def launch(fn, grid, *rest):
            launches.append(grid[0] * next(bvs))
            return loader.launch(fn, grid, *rest)
    run.run = Spy()
    return [np.array(m) for m in run.maps()]


@needs_emu
# K = V: M and B merged into one launch; K != V: apart. The default run: the latter without a state, the
# former from one (its fp32 maps: the builds of the emulated split above); the other two are a sweep
@pytest.mark.parametrize("with_state, K, V", sample([(w, 64, v) for w in (False, True) for v in (64, 128)],
                                                    lambda w, K, V: w == (V == K)))
def test_the_split_runs_only_the_maps_its_scan_reads(K, V, with_state):
    """The last segment's maps and the first one's M map never reach the scan: no CTA runs them (the
    work list of kernels/kda_recurrence.cu), and every other map is the full run's bit for bit; with an
    initial state the first segment's B map is the fp32 run from it (the serial forward's final state
    there, bit for bit) and its M zero, so the scan's M_0 S_0 + B_0 is that run's end."""
    n, lens = 3, [70, 45]
    x, opts = make_inputs(cu_seqlens=lens, H=1, HV=2, K=K, V=V, state=BF16 if with_state else None)
    trimmed, full = [], []
    M, B = segment_maps(x, opts, n, n, trimmed)
    Mf, Bf = segment_maps(x, opts, n, None, full)
    rows = 2 * ((n - 2) * K + (n - 1) * V)  # value rows a head: 2 sequences
    assert sum(trimmed) == rows and sum(full) == 2 * n * (K + V) and len(trimmed) == (1 if V == K else 2)
    bounds = split.segment_cu_seqlens(np.array([0] + list(np.cumsum(lens))), n)
    for q, s in itertools.product(range(2), range(n - 1)):
        i = q * n + s
        if s:
            np.testing.assert_array_equal(M[i], Mf[i])
            np.testing.assert_array_equal(B[i], Bf[i])
        elif not with_state:
            np.testing.assert_array_equal(M[i], np.broadcast_to(np.eye(K), M[i].shape))  # left the identity
            np.testing.assert_array_equal(B[i], Bf[i])
        else:
            np.testing.assert_array_equal(M[i], 0.0)
            t0, t1 = bounds[i], bounds[i + 1]
            piece = {name: a[:, t0:t1] for name, a in x.items()}
            one = {k: v for k, v in opts.items() if k != "cu_seqlens"}  # the piece: one fixed-length sequence
            _, fin = kdacupy.kda_forward(**piece, **dict(one, initial_state=opts["initial_state"][q:q + 1]),
                                         state_precision="fp32", output_final_state=True, state_dtype=np.float32,
                                         backend="emulate")
            np.testing.assert_array_equal(B[i], fin[0])


@needs_emu
def test_split_on_the_kernels_is_the_split_on_the_model():
    x, opts = make_inputs(cu_seqlens=[70, 0, 37, 5], H=1, HV=2, K=64, V=64, state=BF16, state_layout="vk")
    opts.update(output_final_state=True, state_dtype=np.float32)
    out = np.full(x["v"].shape, np.nan, dtype=BF16)  # poison: every element must be written
    o, s = kdacupy.kda_forward(**x, **opts, backend="emulate", sequence_parallel=4, out=out)
    om, sm = kdacupy.kda_forward(**x, **opts, backend="model", sequence_parallel=4)
    assert o is out
    close(o, om)
    close(s, sm)
    # the zero-length sequence's final state is its initial state, unrounded
    np.testing.assert_array_equal(s[1], opts["initial_state"][1].astype(np.float32))


def test_split_reference_is_exact():
    x, opts = make_inputs(cu_seqlens=[50, 0, 33, 16], H=1, HV=2, K=64, V=64, state=np.float32)
    (o1, s1), (o2, s2) = split_vs_serial("reference", x, dict(opts, output_final_state=True), 4)
    np.testing.assert_allclose(o2.astype(np.float64), o1.astype(np.float64), atol=1e-6)
    np.testing.assert_allclose(s2, s1, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_any_segment_count_on_the_model(n):
    x, opts = make_inputs(B=2, T=75, H=2, HV=4, K=64, V=64, state=np.float32, state_layout="vk")
    opts.update(output_final_state=True)
    out = np.zeros(x["v"].shape, dtype=BF16)[:, :, :]
    (o1, s1), (o2, s2) = split_vs_serial("model", x, opts, n, out=out)
    assert o2 is out
    close(o2, o1, GPU)
    close(s2, s1, GPU)


def test_split_without_state():
    x, opts = make_inputs(cu_seqlens=[40, 9], H=1, K=64, V=64)
    (o1, s1), (o2, s2) = split_vs_serial("model", x, opts, 3)
    assert s1 is None and s2 is None
    close(o2, o1, GPU)


# ---------------------------------------------------------------------------
# choice and checks


def test_cpu_backends_run_serially_unless_asked():
    x, opts = make_inputs(T=40, H=1, K=64, V=64)
    for backend in ("reference", "model", "emulate"):
        p, _ = kdacupy.validation.validate(
            *(x[n] for n in "qkvg"), x.get("beta"), scale=None, initial_state=None, output_final_state=False,
            cu_seqlens=None, qk_l2norm=False, beta_sigmoid=True, allow_neg_eigval=False, gate=opts["gate"],
            A_log=opts["A_log"], dt_bias=opts["dt_bias"], lower_bound=opts["lower_bound"], state_layout="kv",
            state_dtype=None, state_precision="bf16", out=None, backend=backend)
        assert seqpar.choose_segments(p, None) == 1
        assert seqpar.choose_segments(p, 5) == 5


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError),
                                      ("4", TypeError), (seqpar.MAX_SEGMENTS + 1, ValueError)])
def test_bad_sequence_parallel_is_rejected_before_any_write(bad, exc):
    x, opts = make_inputs(T=20, H=1, K=64, V=64)
    out = np.full(x["v"].shape, 7.0, dtype=BF16)
    with pytest.raises(exc, match="sequence_parallel"):
        kdacupy.kda_forward(**x, **opts, backend="model", out=out, sequence_parallel=bad)
    assert np.all(out.astype(np.float32) == 7.0)


@needs_emu
def test_split_writes_into_a_fixed_length_out():
    x, opts = make_inputs(B=2, T=50, H=1, K=64, V=64, state=np.float32)
    qk = np.concatenate([x["q"], x["k"]], axis=-1)  # q and k as strided views of one projection
    x = dict(x, q=qk[..., :64], k=qk[..., 64:])
    for out in (np.full(x["v"].shape, np.nan, dtype=BF16),  # contiguous: written in place
                np.full((2, 100, 1, 64), np.nan, dtype=BF16)[:, ::2]):  # strided: written through a copy
        o, _ = kdacupy.kda_forward(**x, **opts, backend="emulate", sequence_parallel=2, out=out)
        om, _ = kdacupy.kda_forward(**x, **opts, backend="model", sequence_parallel=2)
        assert o is out
        close(o, om)


def device_problem(N=1, HV=16, T=65536, V=128, varlen=False, precision="bf16"):
    """A validated GPU-shaped problem (faked on the CPU: only its shape fields matter here)."""
    x, _ = make_inputs(T=16, H=1, K=64, V=64)
    p, _ = kdacupy.validation.validate(
        *(x[n] for n in "qkvg"), None, scale=None, initial_state=None, output_final_state=False,
        cu_seqlens=None, qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None,
        dt_bias=None, lower_bound=None, state_layout="kv", state_dtype=None, state_precision=precision, out=None,
        backend="model")
    return dataclasses.replace(p, N=N, B=1 if varlen else N, HV=HV, T=T, K=128, V=V, varlen=varlen, device=True)


def test_auto_choice_follows_its_rule_over_a_grid():
    """seqpar.auto_segments' rule, checked over a grid of shapes rather than at a few of its
    outputs: serial below AUTO_MIN_CHUNKS chunks per sequence; otherwise the candidate
    (n = 2, 4, ... <= AUTO_MAX with >= AUTO_SEG_CHUNKS chunks per segment) of least predicted
    time, taken only when it beats serial by AUTO_MIN_GAIN; and where the serial run's warps
    already fill the SMs, never a split (each of its three runs would cost the serial time)."""
    seen = {"short": 0, "on": 0, "off below the gain": 0, "a gain under 1.5x": 0, "full SMs": 0}
    for sm, N, HV, per_seq, varlen, V, precision in itertools.product(
            (108, 132), (1, 2, 8), (1, 4, 12, 16, 32, 64, 96), (4096, 16384, 65536, 131072), (False, True),
            (64, 128), ("bf16", "fp32")):
        if varlen and N == 1:
            continue
        p = device_problem(N=N, HV=HV, T=per_seq * (N if varlen else 1), V=V, varlen=varlen, precision=precision)
        n, why = seqpar.auto_segments(p, sm)
        chunks = per_seq // 16
        if chunks < seqpar.AUTO_MIN_CHUNKS:
            assert n == 1 and why.startswith("off"), (p, n, why)
            seen["short"] += 1
            continue
        cands = [c for c in (2 ** i for i in range(1, 11)) if c <= seqpar.AUTO_MAX and chunks // c >= seqpar.AUTO_SEG_CHUNKS]
        t = {c: seqpar._predicted_time(p, c, sm) for c in [1] + cands}
        best = min([1] + cands, key=t.get)  # serial first: a tie stays serial
        gain = t[1] / t[best]
        assert float(why.split("gain ")[1].split("x")[0]) == pytest.approx(gain, abs=0.006), why
        if gain >= seqpar.AUTO_MIN_GAIN:
            assert n == best and why.startswith("on"), (p, n, why)
            seen["on"] += 1
        else:
            assert n == 1 and why.startswith("off"), (p, n, why)
            seen["off below the gain"] += 1
            seen["a gain under 1.5x"] += gain > 1.0
        if N * HV * V / 16 <= seqpar.WARPS_PER_SM[precision] * sm:  # latency-bound: the chain length
            assert t[1] == pytest.approx(chunks)
        capacity = seqpar.WARPS_PER_SM["fp32"] * sm  # the split's runs keep the state in fp32
        if N * HV * V / 16 >= capacity:
            assert n == 1 and all(t[c] > t[1] for c in cands), (p, n, t)
            seen["full SMs"] += 1
    assert all(seen.values()), seen  # every branch of the rule is exercised


def test_auto_choice_on_wgmma_follows_its_rule_over_a_grid():
    """On sm_90a with the wgmma runs, auto_segments takes _predicted_time_wgmma's fastest candidate from
    WGMMA_MIN_CHUNKS chunks when it beats serial by WGMMA_MIN_GAIN; sizes the wgmma recurrence does not
    serve (K > 128) keep mma.sync's rule; and a serial run whose warpgroups already fill the SMs is never
    split (each of the split's runs then costs at least the serial time)."""
    seen = {"short": 0, "on": 0, "off": 0, "full SMs": 0}
    for sm, N, HV, per_seq, V in itertools.product((114, 132), (1, 2), (1, 8, 12, 16, 64, 96), (4096, 8192, 65536),
                                                   (64, 128)):
        p = device_problem(N=N, HV=HV, T=per_seq, V=V, varlen=False, precision="bf16")
        n, why = seqpar.auto_segments(p, sm, "sm_90a")
        assert why.endswith("wgmma)") or why.startswith("off: ") and "chunks per sequence (<" in why, why
        chunks = per_seq // 16
        if chunks < seqpar.WGMMA_MIN_CHUNKS:
            assert n == 1, (p, n, why)
            seen["short"] += 1
            continue
        cands = [c for c in range(2, seqpar.AUTO_MAX + 1) if chunks // c >= seqpar.AUTO_SEG_CHUNKS]
        t = {c: seqpar._predicted_time_wgmma(p, c, sm) for c in [1] + cands}
        best = min([1] + cands, key=t.get)
        gain = t[1] / t[best]
        if gain >= seqpar.WGMMA_MIN_GAIN:
            assert n == best > 1, (p, n, why)
            seen["on"] += 1
        else:
            assert n == 1, (p, n, why)
            seen["off"] += 1
        if N * HV * V / 64 >= sm:
            assert n == 1
            seen["full SMs"] += 1
    assert all(seen.values()), seen
    # the serving shape: 4 segments, the maps' 120 warpgroups (2 M and 3 B runs of 24) and the forward's 96
    # in one wave on 132 SMs (issue-aware profile before the scan's first step went: 4: 0.103 ms, 3: 0.118, 5: 0.119,
    # where 168 map runs take two)
    assert seqpar.auto_segments(device_problem(N=1, HV=12, T=8192, V=128, varlen=False, precision="bf16"), 132,
                                "sm_90a")[0] == 4
    # K = 256: mma.sync's runs, mma.sync's rule (serial under AUTO_MIN_CHUNKS)
    wide = dataclasses.replace(device_problem(N=1, HV=12, T=8192, V=128, varlen=False, precision="bf16"), K=256)
    assert seqpar.auto_segments(wide, 132, "sm_90a") == seqpar.auto_segments(wide, 132)
    assert seqpar.auto_segments(wide, 132)[0] == 1


def test_explain_shows_the_choice():
    x, opts = make_inputs(T=64, H=1, K=64, V=64)
    assert seqpar.explain(**x, **opts)[0] == 1  # NumPy arrays: serial unless asked
    assert seqpar.explain(**x, **opts, sequence_parallel=3) == (3, "requested")
    n, why = seqpar.explain(**x, **opts, sm_count=132)
    assert n == 1 and why.startswith("off")
    with pytest.raises(ValueError, match="sequence_parallel"):
        seqpar.explain(**x, **opts, sequence_parallel=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_split_on_adversarial_inputs_is_no_worse_than_serial(family):
    """Repeated / near-collinear keys, no or slow decay, beta near 0 or 2: both runs
    are finite (the fp32 forward substitution has no overflow to hide behind; the
    fp16 Neumann inverse it replaced gave NaN here) and the split is as accurate
    against the float64 reference as the serial run."""
    x, opts = adversarial_inputs(family, 192)
    ro, rs = kda_reference(**x, **{n: v for n, v in opts.items() if n != "state_dtype"})
    (o1, s1), (o2, s2) = split_vs_serial("model", x, opts, 4)
    for a in (o1, s1, o2, s2):
        assert np.isfinite(np.asarray(a, np.float64)).all()
    no_less_accurate(o2, o1, ro)
    no_less_accurate(s2, s1, rs)


def test_verbose_prints_the_gpu_choice_once_per_shape(monkeypatch, capsys):
    import kdacupy.ops.forward.tuning as tuning
    monkeypatch.setattr(tuning, "device_facts", lambda: (0, "NVIDIA H200", 132))
    monkeypatch.setattr(tuning, "current_arch", lambda: "sm_90a")
    monkeypatch.setenv("KDACUPY_JIT_VERBOSE", "1")
    monkeypatch.setattr(seqpar, "_announced", set())
    monkeypatch.setattr(seqpar, "_capturing", lambda: False)  # a device problem faked on the CPU
    x, _ = make_inputs(T=16, H=1, K=64, V=64)
    p, _ = kdacupy.validation.validate(
        *(x[n] for n in "qkvg"), None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
        lower_bound=None, state_layout="kv", state_dtype=None, state_precision="bf16", out=None, backend="model")
    p = dataclasses.replace(p, T=65536, HV=16, K=128, V=128, device=True, backend="cuda")
    auto = seqpar.auto_segments(p, 132, "sm_90a")[0]
    assert auto > 1  # few heads, a long sequence: the split is on
    assert seqpar.choose_segments(p, None) == auto
    assert seqpar.choose_segments(p, None) == auto
    err = capsys.readouterr().err
    assert err.count("[kdacupy.seqpar]") == 1 and f"{auto} segment(s) per sequence; on: predicted gain" in err
    assert seqpar.choose_segments(p, 1) == 1  # an explicit request is not second-guessed


@needs_emu
def test_k256_v256_split_on_the_emulated_kernels():
    """K = V = 256: the M run has 256 value rows of its own (two map launches, never a [K, K + V] state)."""
    x, opts = make_inputs(T=40, H=1, K=256, V=256, state=np.float32)
    opts["output_final_state"] = True
    o, s = kdacupy.kda_forward(**x, **opts, backend="emulate", sequence_parallel=2)
    om, sm = kdacupy.kda_forward(**x, **opts, backend="model", sequence_parallel=2)
    close(o, om)
    close(s, sm)


@pytest.mark.parametrize("backend", ["reference", "model", pytest.param("emulate", marks=needs_emu)])
def test_split_of_empty_sequences_returns_the_initial_state(backend):
    x, opts = make_inputs(cu_seqlens=[0, 0], H=1, K=64, V=64, state=BF16)
    o, s = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend=backend, state_dtype=np.float32,
                               sequence_parallel=3)
    assert o.shape == (1, 0, 1, 64)
    np.testing.assert_array_equal(s, opts["initial_state"].astype(np.float32))
    x, opts = make_inputs(B=2, T=0, H=1, K=64, V=64, state=np.float32)
    o, s = kdacupy.kda_forward(**x, **opts, output_final_state=True, backend=backend, sequence_parallel=2)
    assert o.shape == (2, 0, 1, 64)
    np.testing.assert_array_equal(s, opts["initial_state"])


def test_under_graph_capture_the_split_stays_off(monkeypatch):
    """The split's per-call temporaries cannot live in a CUDA graph: while the stream
    captures, the auto choice is serial and an explicit split is refused."""
    import kdacupy.ops.forward.tuning as tuning
    monkeypatch.setattr(tuning, "device_facts", lambda: (0, "NVIDIA H200", 132))
    monkeypatch.setattr(tuning, "current_arch", lambda: "sm_90a")
    x, _ = make_inputs(T=16, H=1, K=64, V=64)
    p, _ = kdacupy.validation.validate(
        *(x[n] for n in "qkvg"), None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None,
        lower_bound=None, state_layout="kv", state_dtype=None, state_precision="bf16", out=None, backend="model")
    p = dataclasses.replace(p, T=65536, HV=16, K=128, V=128, device=True, backend="cuda")
    monkeypatch.setattr(seqpar, "_capturing", lambda: False)
    assert seqpar.choose_segments(p, None) == seqpar.auto_segments(p, 132, "sm_90a")[0] > 1
    monkeypatch.setattr(seqpar, "_capturing", lambda: True)
    assert seqpar.choose_segments(p, None) == 1
    assert seqpar.choose_segments(p, 1) == 1
    with pytest.raises(ValueError, match="sequence_parallel: expected None or 1 while the current stream captures"):
        seqpar.choose_segments(p, 4)

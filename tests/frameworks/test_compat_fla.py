"""kdacupy.compat.fla against fla-core 0.6.0 itself: its signatures, patch()/unpatch() on the
imported fla.ops.kda, and results (and chunk_kda's gradients, through kdacupy.kda_backward)
against fla-core's own naive references (fla.ops.kda.naive, fla.ops.kda.gate, differentiated
by torch's autograd) on the grid of fla-core's tests/ops/test_kda.py.

fla-core's public functions run only on Triton GPUs (on the CPU they fail inside Triton even
under TRITON_INTERPRET=1), so here the references are its naive torch functions, in float32 as
fla-core writes them; kdacupy runs its float64 reference and rounds to the inputs' dtype. The
grid's sequences are capped at 80 tokens (fla-core's go to 2048 tokens on a GPU; the float64
NumPy reference pays per token): head dims 64, 128 and 256 only (kdacupy's), every option
combination of the grid kept. The error bound for float32 inputs, rmse ratio 2e-6, is float32
rounding over <= 80 recurrence steps (measured ~2e-7); for float16 / bfloat16 outputs it is the
output's own rounding, half an ulp relative (2^-11 / 2^-8), as both round a float32-accurate
value once.
"""
import importlib
import importlib.metadata
import importlib.util
import inspect
from pathlib import Path

import pytest

from tests.conftest import MARKERS
from tests.frameworks.common import import_torch, one_thread

pytestmark = [pytest.mark.torch, pytest.mark.fla]
torch = import_torch()


def fla_core_version():
    try:
        return importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:
        return None


if importlib.util.find_spec("fla") is None or fla_core_version() != "0.6.0":
    pytest.skip(MARKERS["fla"], allow_module_level=True)

import torch.nn.functional as F  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _fla_imports():
    """fla-core's modules, imported when the module's first test runs, not at collection: importing
    fla.ops costs seconds (Triton's decorators), and every pytest-xdist worker collects every module."""
    pytest.importorskip("fla.ops.kda", reason=MARKERS["fla"])


def fla_kda():
    return importlib.import_module("fla.ops.kda")


def fla_fused_recurrent_kda_fwd(*args, **kw):
    return importlib.import_module("fla.ops.kda.fused_recurrent").fused_recurrent_kda_fwd(*args, **kw)


def naive_kda_gate(*args, **kw):
    return importlib.import_module("fla.ops.kda.gate").naive_kda_gate(*args, **kw)


def naive_kda_lowerbound_gate(*args, **kw):
    return importlib.import_module("fla.ops.kda.gate").naive_kda_lowerbound_gate(*args, **kw)


def naive_recurrent_kda(*args, **kw):
    return importlib.import_module("fla.ops.kda.naive").naive_recurrent_kda(*args, **kw)


import kdacupy.compat.fla as compat  # noqa: E402

TOL = {torch.float32: 2e-6, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
CAP = 80

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def rmse_ratio(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm()).item()


def short(T):
    return min(T, CAP)


def short_cu(cu):
    scale = min(1.0, CAP / cu[-1])
    return [round(c * scale) for c in cu]


def unit(x):
    """x / ||x|| along K, computed in float32 and stored in x's dtype (what a caller passes
    without use_qk_l2norm_in_kernel)."""
    return F.normalize(x.float(), p=2, dim=-1).to(x.dtype)


def naive(q, k, v, g, beta, scale, h0, cu=None, normalize=True):
    """fla-core's naive recurrent reference (per sequence for packed inputs); with ``normalize``
    q and k are normalised first, in float32 (as kdacupy's l2norm is not rounded to q's dtype)."""
    if normalize:
        q, k = F.normalize(q.float(), p=2, dim=-1), F.normalize(k.float(), p=2, dim=-1)
    if cu is None:
        return naive_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True)
    outs, finals = [], []
    for i in range(len(cu) - 1):
        s = slice(cu[i], cu[i + 1])
        o, ht = naive_recurrent_kda(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], scale=scale,
                                    initial_state=h0[i:i + 1], output_final_state=True)
        outs.append(o)
        finals.append(ht)
    return torch.cat(outs, 1), torch.cat(finals, 0)


def check(o, ht, ref, ref_ht, dtype):
    assert o.dtype == dtype and ht.dtype == torch.float32
    assert rmse_ratio(o, ref) < TOL[dtype]
    assert rmse_ratio(ht, ref_ht) < TOL[torch.float32]


def gradients(o, ht, leaves, seed=7):
    """The leaves' gradients of sum(o * do) + sum(ht * dht) for fixed random do, dht (fla-core's test loss)."""
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen).to(o.dtype)
    dht = torch.randn(ht.shape, generator=gen).to(ht.dtype)
    return torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)


def check_gradients(ours, ref):
    """Each gradient in its leaf's dtype, within that dtype's bound of TOL (for float32 leaves the
    naive float32 reverse sweep's own rounding; measured: at most 0.3 of the bound)."""
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert a.dtype == b.dtype, i
        assert rmse_ratio(a, b) < TOL[a.dtype], (i, rmse_ratio(a, b))


def test_signatures_are_fla_cores():
    fused_recurrent = importlib.import_module("fla.ops.kda.fused_recurrent")
    for ours, theirs in ((compat.chunk_kda, fla_kda().chunk_kda), (compat.fused_recurrent_kda, fla_kda().fused_recurrent_kda),
                         (compat.fused_recurrent_kda_fwd, fused_recurrent.fused_recurrent_kda_fwd)):
        a, b = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        assert [(p.name, p.kind, p.default) for p in a.values()] == [(p.name, p.kind, p.default) for p in b.values()]


def test_patch_swaps_the_imported_functions_and_unpatch_restores_them():
    import fla.ops
    import fla.ops.kda.chunk
    import fla.ops.kda.fused_recurrent
    where = [(fla_kda(), "chunk_kda"), (fla_kda(), "fused_recurrent_kda"), (fla.ops, "chunk_kda"),
             (fla.ops, "fused_recurrent_kda"), (fla.ops.kda.chunk, "chunk_kda"),
             (fla.ops.kda.fused_recurrent, "fused_recurrent_kda"), (fla.ops.kda.fused_recurrent, "fused_recurrent_kda_fwd")]
    originals = [getattr(m, n) for m, n in where]
    compat.patch()
    try:
        compat.patch()  # twice: still one patch
        assert all(getattr(m, n) is getattr(compat, n) for m, n in where)
        q = torch.rand(1, 16, 1, 64)
        o, ht = fla.ops.kda.chunk_kda(q, q, q, -torch.rand(1, 16, 1, 64), torch.rand(1, 16, 1),
                                      output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert o.shape == (1, 16, 1, 64) and ht.dtype == torch.float32  # ran on CPU tensors: kdacupy's
    finally:
        compat.unpatch()
    assert all(getattr(m, n) is f for (m, n), f in zip(where, originals))


def inputs(B, T, H, HV, D, dtype, seed=42, g_dtype=torch.float32):
    torch.manual_seed(seed)
    q, k = torch.rand(B, T, H, D, dtype=dtype), torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, HV, D, dtype=dtype)
    g = torch.randn(B, T, HV, D, dtype=g_dtype)
    beta = torch.rand(B, T, HV, dtype=dtype).sigmoid()
    h0 = torch.randn(B, HV, D, D)
    return q, k, v, g, beta, h0


# fla-core's test_fused_recurrent and test_fused_recurrent_state_v_first (D in 64/128):
# B, T, H, HV, D, scale, gate_logit_normalizer, use_qk_l2norm_in_kernel, state_v_first
# (FLA's own grid, tests/ops/test_kda.py, adds head dims 60 and 100: the last two rows)
FUSED_RECURRENT = [(1, 64, 1, 1, 64, 1, 1, False, False), (4, 1024, 4, 4, 128, 0.1, 1, False, False),
                   (2, 1024, 2, 8, 128, 0.1, 1, True, False), (1, 64, 1, 1, 64, 1, 1, False, True),
                   (4, 1024, 4, 4, 128, 0.1, 1, False, True), (2, 512, 3, 3, 60, 1, 1, False, False),
                   (3, 1000, 4, 4, 100, 0.1, 1, True, False)]


@pytest.mark.parametrize("fn", ["fused_recurrent_kda", "chunk_kda"])
@pytest.mark.parametrize("B,T,H,HV,D,scale,norm,l2,v_first", FUSED_RECURRENT)
def test_log_gate_against_naive(fn, B, T, H, HV, D, scale, norm, l2, v_first):
    q, k, v, g, beta, h0 = inputs(B, short(T), H, HV, D, torch.float32)
    g = F.logsigmoid(g) / norm
    if not l2:
        q, k = unit(q), unit(k)
    ref, ref_ht = naive(q, k, v, g, beta, scale, h0, normalize=l2)
    o, ht = getattr(compat, fn)(q, k, v, g, beta, scale=scale, initial_state=h0.transpose(-1, -2) if v_first else h0,
                                output_final_state=True, use_qk_l2norm_in_kernel=l2, state_v_first=v_first)
    check(o, ht.transpose(-1, -2) if v_first else ht, ref, ref_ht, torch.float32)


# fla-core's test_fused_recurrent_use_beta_sigmoid_in_kernel and test_chunk_use_beta_sigmoid_in_kernel
@pytest.mark.parametrize("B,T,H,D,allow_neg_eigval,dtype", [(2, 256, 4, 64, False, torch.float32),
                                                            (2, 256, 4, 64, True, torch.float32),
                                                            (2, 96, 2, 64, True, torch.float16)])
def test_beta_sigmoid_against_naive(B, T, H, D, allow_neg_eigval, dtype):
    q, k, v, g, _, h0 = inputs(B, short(T), H, H, D, dtype)
    g = F.logsigmoid(g)
    beta_raw = torch.randn(B, short(T), H, dtype=dtype)
    q, k = unit(q), unit(k)
    ref, ref_ht = naive(q, k, v, g, beta_raw.float().sigmoid() * (2 if allow_neg_eigval else 1), None, h0,
                        normalize=False)
    for fn in (compat.chunk_kda, compat.fused_recurrent_kda):
        o, ht = fn(q, k, v, g, beta_raw, initial_state=h0,
                   output_final_state=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=allow_neg_eigval)
        check(o, ht, ref, ref_ht, dtype)


# fla-core's test_fused_recurrent_gate_in_kernel:
# B, T, H, HV, D, scale, has_a_log, has_dt_bias, safe_gate (lower_bound -5), dtype
GATE_IN_KERNEL = [(1, 64, 1, 1, 64, 1, True, False, False, torch.float32),
                  (2, 256, 2, 2, 64, 1, True, True, False, torch.float32),
                  (2, 512, 2, 4, 64, 0.1, True, True, True, torch.float16),
                  (3, 1000, 2, 8, 128, 1, True, False, False, torch.float16),
                  (4, 1024, 4, 4, 128, 0.1, True, True, True, torch.float16),
                  (1, 64, 1, 1, 64, 1, False, False, True, torch.float32),
                  (2, 256, 2, 4, 64, 1, False, True, True, torch.float32)]


@pytest.mark.parametrize("B,T,H,HV,D,scale,has_a_log,has_dt_bias,safe_gate,dtype", GATE_IN_KERNEL)
def test_gate_in_kernel_against_naive_gate(B, T, H, HV, D, scale, has_a_log, has_dt_bias, safe_gate, dtype):
    q, k, v, g_raw, beta, h0 = inputs(B, short(T), H, HV, D, dtype)
    A_log = torch.log(torch.empty(HV).uniform_(1, 16)) if has_a_log else None
    dt_bias = torch.randn(HV * D) if has_dt_bias else None
    lower_bound = -5.0 if safe_gate else None
    g_ref = naive_kda_lowerbound_gate(g_raw, A_log, dt_bias) if safe_gate else naive_kda_gate(g_raw, A_log, dt_bias)
    ref, ref_ht = naive(q, k, v, g_ref, beta, scale, h0)
    o, ht = compat.fused_recurrent_kda(q, k, v, g_raw, beta, A_log=A_log, dt_bias=dt_bias, scale=scale,
                                       initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                       use_gate_in_kernel=True, lower_bound=lower_bound)
    check(o, ht, ref, ref_ht, dtype)
    if has_a_log or safe_gate:  # chunk_kda: A_log and dt_bias through **kwargs, safe_gate checked
        o, ht = compat.chunk_kda(q, k, v, g_raw, beta, scale=scale, initial_state=h0, output_final_state=True,
                                 use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, safe_gate=safe_gate,
                                 lower_bound=lower_bound, A_log=A_log, dt_bias=dt_bias)
        check(o, ht, ref, ref_ht, dtype)


# fla-core's test_chunk (D in 64/128): B, T, H, HV, D, scale, gate_logit_normalizer, mask_p,
# use_qk_l2norm_in_kernel, use_gate_in_kernel, dtype, safe_gate, chunk_size
CHUNK = [(1, 63, 1, 1, 64, 1, 1, 0, False, False, torch.float16, True, 64),
         (2, 1000, 3, 3, 64, 0.1, 1, 0.5, False, False, torch.float16, False, 64),
         (4, 1024, 4, 4, 128, 0.1, 1, 0, True, False, torch.float16, True, 64),
         (2, 1500, 4, 4, 128, 0.1, 10, 0, False, True, torch.float16, False, 64),
         (4, 2048, 8, 8, 64, 0.1, 1, 0, False, True, torch.float16, True, 64),
         (2, 1024, 2, 4, 64, 0.1, 1, 0, False, False, torch.float16, False, 64),
         (2, 1024, 4, 8, 128, 0.1, 1, 0, True, True, torch.float16, False, 64),
         (2, 160, 2, 4, 64, 0.1, 1, 0, False, True, torch.float16, True, 32),
         (2, 1024, 2, 4, 64, 0.1, 1, 0, True, True, torch.bfloat16, True, 64),
         (2, 1024, 2, 8, 128, 0.1, 1, 0, True, True, torch.bfloat16, False, 64),
         # FLA's own grid (tests/ops/test_kda.py) adds head dims 60 and 100
         (2, 500, 3, 3, 60, 1, 1, 0, False, False, torch.float16, False, 64),
         (3, 1024, 4, 4, 100, 1, 0.1, 0, False, False, torch.float16, False, 64)]


@pytest.mark.parametrize("B,T,H,HV,D,scale,norm,mask_p,l2,gate_in_kernel,dtype,safe_gate,chunk_size", CHUNK)
def test_chunk_against_naive(B, T, H, HV, D, scale, norm, mask_p, l2, gate_in_kernel, dtype, safe_gate, chunk_size):
    q, k, v, g, beta, h0 = inputs(B, short(T), H, HV, D, dtype, g_dtype=dtype if gate_in_kernel else torch.float32)
    A_log = dt_bias = None
    if gate_in_kernel:
        A_log, dt_bias = torch.randn(HV), torch.randn(HV * D)
    else:
        g = F.logsigmoid(g) / norm
        g = g * (torch.rand_like(g) > mask_p)
    lower_bound = -5.0 if safe_gate else None
    if safe_gate and not gate_in_kernel:
        g = g.clamp(-5, 0)
    gate = naive_kda_lowerbound_gate if safe_gate else naive_kda_gate
    if not l2:
        q, k = unit(q), unit(k)
    leaves = [x.requires_grad_() for x in (q, k, v, g, beta, h0, A_log, dt_bias) if x is not None]
    ref, ref_ht = naive(q, k, v, gate(g, A_log, dt_bias) if gate_in_kernel else g, beta, scale, h0, normalize=l2)
    ref_grads = gradients(ref, ref_ht, leaves)
    o, ht = compat.chunk_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=h0,
                             output_final_state=True, use_qk_l2norm_in_kernel=l2, use_gate_in_kernel=gate_in_kernel,
                             safe_gate=safe_gate, lower_bound=lower_bound, disable_recompute=True,
                             chunk_size=chunk_size)
    check(o, ht, ref, ref_ht, dtype)
    check_gradients(gradients(o, ht, leaves), ref_grads)


# fla-core's test_chunk_varlen / test_chunk_varlen_prefill (D in 64/128/256):
# H, D, mask_p, cu_seqlens, use_gate_in_kernel, safe_gate
VARLEN = [(4, 64, 0.9, [0, 256, 500, 1000], True, False), (4, 128, 0.5, [0, 256, 500, 1000], False, False),
          (4, 256, 0, [0, 100, 300, 1200, 3000, 4096], False, True),
          # FLA's own grid adds head dims 60 and 100
          (4, 60, 0, [0, 15], False, False), (4, 100, 0, [0, 15, 100, 300, 1200, 2000], False, False)]


@pytest.mark.parametrize("H,D,mask_p,cu,gate_in_kernel,safe_gate", VARLEN)
def test_chunk_varlen_against_naive(H, D, mask_p, cu, gate_in_kernel, safe_gate):
    cu = short_cu(cu)
    torch.manual_seed(42)
    T, N, dtype = cu[-1], len(cu) - 1, torch.float16
    q = unit(torch.randn(1, T, H, D, dtype=dtype))
    k = unit(torch.randn(1, T, H, D, dtype=dtype))
    v = torch.randn(1, T, H, D, dtype=dtype)
    g = torch.randn(1, T, H, D, dtype=dtype if gate_in_kernel else torch.float32)
    A_log = dt_bias = None
    if gate_in_kernel:
        A_log, dt_bias = torch.log(torch.empty(1, 1, H, 1).uniform_(1, 16)), torch.randn(H * D)
    else:
        g = F.logsigmoid(g) * (torch.rand_like(g) > mask_p)
    mask = torch.rand_like(g) > mask_p
    g = g * mask + (~mask) * (-1000)
    if safe_gate:
        g = g.clamp(-5, 0)
    beta = torch.rand(1, T, H, dtype=dtype).sigmoid()
    h0 = torch.randn(N, H, D, D)
    leaves = [x.requires_grad_() for x in (q, k, v, g, beta, h0, A_log, dt_bias) if x is not None]
    g_ref = naive_kda_gate(g.float(), A_log, dt_bias) if gate_in_kernel else g
    ref, ref_ht = naive(q, k, v, g_ref, beta, None, h0, cu, normalize=False)
    ref_grads = gradients(ref, ref_ht, leaves)
    cu_t = torch.tensor(cu, dtype=torch.long)
    o, ht = compat.chunk_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias,
                             initial_state=h0, output_final_state=True, cu_seqlens=cu_t, cu_seqlens_cpu=cu_t,
                             use_gate_in_kernel=gate_in_kernel, safe_gate=safe_gate)
    check(o, ht, ref, ref_ht, dtype)
    check_gradients(gradients(o, ht, leaves), ref_grads)


# fla-core's test_fused_recurrent_vllm_decode (which fla-core runs only on CUDA/NPU):
# B, H, D, scale, gate_logit_normalizer, use_qk_l2norm_in_kernel, use_gate_in_kernel, safe_gate, dtype
VLLM_DECODE = [(16, 16, 128, 0.1, 1.0, True, False, False, torch.bfloat16),
               (32, 8, 64, 1.0, 1.0, False, False, False, torch.float16),
               (7, 32, 128, 0.5, 0.5, True, False, False, torch.bfloat16),
               (16, 16, 128, 0.1, 1.0, True, True, False, torch.bfloat16),
               (32, 8, 64, 1.0, 1.0, False, True, False, torch.float16),
               (7, 32, 128, 0.5, 0.5, True, True, True, torch.bfloat16)]


@pytest.mark.parametrize("B,H,D,scale,norm,l2,gate_in_kernel,safe_gate,dtype", VLLM_DECODE)
def test_vllm_decode_against_naive(B, H, D, scale, norm, l2, gate_in_kernel, safe_gate, dtype):
    """Continuous batching into a float32 pool: slots not addressed hold 1e30 and stay untouched."""
    torch.manual_seed(42)
    slots = B * 3
    pool = torch.randn(slots, H, D, D)
    idx = torch.randperm(slots)[:B].int()
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[idx.long()] = False
    pool[untouched] = 1e30
    q, k, v = (torch.rand(1, B, H, D, dtype=dtype) for _ in range(3))
    g = torch.randn(1, B, H, D, dtype=dtype if gate_in_kernel else torch.float32)
    A_log = dt_bias = lower_bound = None
    if gate_in_kernel:
        A_log = torch.log(torch.empty(H).uniform_(1, 16))
        dt_bias, lower_bound = torch.randn(H * D), (-5.0 if safe_gate else None)
        g_ref = (naive_kda_lowerbound_gate if safe_gate else naive_kda_gate)(g, A_log, dt_bias)
    else:
        g = g_ref = F.logsigmoid(g) / norm
    beta = torch.randn(1, B, H, dtype=dtype).sigmoid()
    if not l2:
        q, k = unit(q), unit(k)
    ref_pool, outs = pool.clone(), []
    for i in range(B):
        o_i, ht_i = naive(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], g_ref[:, i:i + 1], beta[:, i:i + 1], scale,
                          ref_pool[idx[i]].unsqueeze(0), normalize=l2)
        outs.append(o_i)
        ref_pool[idx[i]] = ht_i[0]
    ours = pool.clone()
    o, final = compat.fused_recurrent_kda_fwd(
        q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, initial_state=ours, scale=scale, inplace_final_state=True,
        cu_seqlens=torch.arange(B + 1, dtype=torch.int32), ssm_state_indices=idx, use_qk_l2norm_in_kernel=l2,
        use_gate_in_kernel=gate_in_kernel, lower_bound=lower_bound)
    assert final is ours
    assert rmse_ratio(o, torch.cat(outs, 1)) < TOL[dtype]
    assert rmse_ratio(ours[idx.long()], ref_pool[idx.long()]) < TOL[torch.float32]
    assert torch.equal(ours[untouched], ref_pool[untouched])


@pytest.mark.parametrize("v_first", [False, True])
def test_speculative_verify_against_naive(v_first):
    """[N, C] slots (C = 4 > T = 3 tokens) and num_accepted_tokens: sequence n starts from
    slot idx[n, a_n - 1], the state after token t goes to idx[n, t], as fla-core's kernel does."""
    torch.manual_seed(0)
    N, T, H, D = 3, 3, 2, 64
    pool = torch.randn(16, H, D, D)
    idx = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], dtype=torch.int32)
    acc = torch.tensor([1, 3, 2], dtype=torch.int32)
    q, k, v = (torch.rand(1, N * T, H, D) for _ in range(3))
    g, beta = F.logsigmoid(torch.randn(1, N * T, H, D)), torch.rand(1, N * T, H).sigmoid()
    ref_pool = pool.clone()
    outs = []
    for n in range(N):
        S = ref_pool[idx[n, acc[n] - 1]].unsqueeze(0)
        for t in range(T):
            s = slice(n * T + t, n * T + t + 1)
            o_t, S = naive(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], None, S)
            outs.append(o_t)
            ref_pool[idx[n, t]] = S[0]
    ours = pool.transpose(-1, -2).contiguous() if v_first else pool.clone()
    o, _ = compat.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=ours, state_v_first=v_first,
                                          cu_seqlens=torch.arange(0, N * T + 1, T), ssm_state_indices=idx,
                                          num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    ours = ours.transpose(-1, -2) if v_first else ours
    assert rmse_ratio(o, torch.cat(outs, 1)) < TOL[torch.float32]
    assert rmse_ratio(ours, ref_pool) < TOL[torch.float32]
    assert torch.equal(ours[12:], pool[12:])


def test_inplace_without_indices_updates_each_sequences_state():
    q, k, v, g, beta, h0 = inputs(2, 20, 1, 2, 64, torch.float32)
    g = F.logsigmoid(g)
    ref, ref_ht = naive(q, k, v, g, beta, None, h0)
    pool = h0.clone()
    o, final = compat.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool, use_qk_l2norm_in_kernel=True,
                                              out=torch.empty_like(v))
    assert final is pool
    check(o, pool, ref, ref_ht, torch.float32)
    o2, ht2 = compat.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=h0, inplace_final_state=False,
                                             output_final_state=True, use_qk_l2norm_in_kernel=True)
    check(o2, ht2, ref, ref_ht, torch.float32)


def test_fla_cores_assertions_hold_under_python_O():
    """The faces raise fla-core's AssertionErrors themselves, so `python -O` still refuses (return_intermediate_states
    with gradients would silently lose them). -O drops only `assert` statements and `if __debug__:` blocks: the faces
    hold none, and each refusal is raised by a frame of kdacupy.compat (not by an assert of fla-core's)."""
    import ast

    from kdacupy.compat import fla, fla_cp
    faces = Path(fla.__file__).resolve().parent
    for path in sorted(faces.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        gone = [n.lineno for n in ast.walk(tree)
                if isinstance(n, ast.Assert) or isinstance(n, ast.Name) and n.id == "__debug__"]
        assert not gone, f"{path.name}: lines {gone} vanish under python -O"

    class Ctx:
        cu_seqlens = None

    refusals = [(lambda: fla_cp.cp_call(Ctx(), None, torch.zeros(1), False, False, False, options=None,
                                        check_beta=None), "^Initial state is not supported for CP$"),
                (lambda: fla_cp.cp_call(Ctx(), None, None, False, False, False, options=None, check_beta=None),
                 "^cu_seqlens is required for CP$"),
                (lambda: fla._forward_with_chunk_states(None, *[torch.zeros(1)] * 5, None, False, None, chunk_size=64),
                 "only allowed in inference mode")]
    for call, match in refusals:
        with pytest.raises(AssertionError, match=match) as e:
            call()
        assert Path(e.traceback[-1].path).resolve().is_relative_to(faces), e.traceback[-1]


def test_what_kdacupy_cannot_honour_raises_naming_it():
    q, k, v, g, beta, h0 = inputs(1, 16, 1, 1, 64, torch.float32)
    with pytest.raises(ValueError, match=r"`chunk_size` must be either 32 or 64"):  # fla-core's own check
        compat.chunk_kda(q, k, v, g, beta, chunk_size=16)
    with pytest.raises(AssertionError, match="only allowed in inference mode"):  # fla-core's rule
        compat.chunk_kda(q, k, v, g, beta, return_intermediate_states=True)
    with pytest.raises(AssertionError, match="^Initial state is not supported for CP$"):  # fla-core's CP rule
        compat.chunk_kda(q, k, v, g, beta, initial_state=h0, cp_context=object())  # (tests/dist runs cp_context)
    with pytest.raises(TypeError, match="'use_qk_l2norm'"):
        compat.chunk_kda(q, k, v, g, beta, use_qk_l2norm=True)
    with pytest.raises(NotImplementedError, match="^beta: .*per-channel"):
        compat.fused_recurrent_kda(q, k, v, g, v)
    with pytest.raises(ValueError, match="^A_log: fused_recurrent_kda"):
        compat.fused_recurrent_kda(q, k, v, g, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"^q: expected head dim K in \[16, 256\] \(kda_forward\), got K = 8"):
        compat.chunk_kda(q[..., :8], k[..., :8], v, g[..., :8], beta)
    with pytest.raises(NotImplementedError, match=r"^ssm_state_indices: \[N\] slots serve one token"):
        compat.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=h0, ssm_state_indices=torch.tensor([0]))
    with pytest.raises(ValueError, match="^cu_seqlens: expected 8 tokens in every sequence"):
        compat.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=torch.zeros(2, 1, 64, 64),
                                       cu_seqlens=torch.tensor([0, 6, 16]),
                                       ssm_state_indices=torch.tensor([[0] * 8, [1] * 8]))
    with pytest.warns(DeprecationWarning):  # FLA's deprecated alias, as fla-core's tests check
        compat.fused_recurrent_kda(q, k, v, g, beta, transpose_state_layout=True)
    with pytest.raises(ValueError):
        compat.fused_recurrent_kda(q, k, v, g, beta, state_v_first=True, transpose_state_layout=True)

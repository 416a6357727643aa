"""kdacupy.compat.flashkda: FlashKDA's own calls (its tests/test_fwd.py at the pinned revision, at
CPU-sized shapes), run unchanged through ``import flash_kda`` after ``patch()``, equal kdacupy's
``kda_forward`` with FlashKDA's options bit for bit; its state layout is stated, never guessed; bad
calls are refused naming the argument with every buffer untouched."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import kdacupy  # noqa: E402
from kdacupy.compat import flashkda  # noqa: E402
from kdacupy.numerics.dtypes import BF16  # noqa: E402

LOWER_BOUND = -5.0


def np_of(t):
    """A torch CPU tensor as kdacupy's NumPy input (bf16 as ml_dtypes' bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(BF16)
    return t.numpy()


def bits(x):
    x = np_of(x) if isinstance(x, torch.Tensor) else np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def flashkda_inputs(B, T, H, D, seed=0, N=None):
    """FlashKDA's test_fwd inputs (its shapes scaled to the CPU): unit q, k; randn v, g, beta;
    rand A_log, dt_bias; an arange initial state in bf16."""
    gen = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(q=F.normalize(rn(B, T, H, D), p=2, dim=-1).to(torch.bfloat16),
             k=F.normalize(rn(B, T, H, D), p=2, dim=-1).to(torch.bfloat16),
             v=rn(B, T, H, D).to(torch.bfloat16), g=rn(B, T, H, D).to(torch.bfloat16),
             beta=rn(B, T, H).to(torch.bfloat16))
    N = N or B
    h0 = (torch.arange(N * H * D * D, dtype=torch.float32).reshape(N, H, D, D) / (N * H * D * D)).to(torch.bfloat16)
    return x, torch.rand(H, generator=gen), torch.rand(H, D, generator=gen), h0


def ours(x, A_log, dt_bias, h0, cu_seqlens=None, backend=None):
    """kda_forward on the same inputs with FlashKDA's options, stated."""
    return kdacupy.kda_forward(**{n: np_of(t) for n, t in x.items()}, scale=1.0 / math.sqrt(x["q"].shape[-1]),
                               initial_state=np_of(h0), output_final_state=True, qk_l2norm=True, beta_sigmoid=True,
                               gate="sigmoid", A_log=np_of(A_log), dt_bias=np_of(dt_bias), lower_bound=LOWER_BOUND,
                               state_layout="vk", cu_seqlens=None if cu_seqlens is None else np_of(cu_seqlens),
                               backend=backend)


@pytest.fixture
def flash_kda():
    flashkda.patch()
    import flash_kda
    yield flash_kda
    flashkda.unpatch()


def test_test_fwd_call_unchanged_equals_kda_forward(flash_kda):
    B, T, H, D = 1, 80, 2, 128  # FlashKDA's test_fwd: 1, 8192, 96, 128
    x, A_log, dt_bias, initial_state = flashkda_inputs(B, T, H, D)
    scale = 1.0 / math.sqrt(D)
    final_state_kernel = torch.zeros_like(initial_state)
    out_kernel = torch.zeros_like(x["q"])
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], scale, out_kernel,
                  A_log=A_log, dt_bias=dt_bias, lower_bound=LOWER_BOUND,
                  initial_state=initial_state.clone(), final_state=final_state_kernel)
    o, fin = ours(x, A_log, dt_bias, initial_state)
    assert np.array_equal(bits(out_kernel), bits(o)) and np.array_equal(bits(final_state_kernel), bits(fin))
    assert out_kernel.abs().max() > 0


@pytest.mark.parametrize("backend", [None, "model"])
def test_test_fwd_varlen_call_equals_kda_forward(flash_kda, backend):
    seq_lens = [13, 5, 20, 9, 2, 31]  # FlashKDA's test_fwd_varlen: [1300, 547, 2048, 963, 271, 3063]
    H, D, N = 2, 128, len(seq_lens)
    cu_seqlens = torch.tensor([0] + list(np.cumsum(seq_lens)), dtype=torch.long)
    x, A_log, dt_bias, initial_state = flashkda_inputs(1, sum(seq_lens), H, D, seed=1, N=N)
    final_state_kernel = torch.zeros_like(initial_state)
    out_kernel = torch.zeros_like(x["q"])
    kw = {} if backend is None else dict(backend=backend)
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 1.0 / math.sqrt(D), out_kernel, A_log=A_log,
                  dt_bias=dt_bias, lower_bound=LOWER_BOUND, initial_state=initial_state.clone(),
                  final_state=final_state_kernel, cu_seqlens=cu_seqlens, **kw)
    o, fin = ours(x, A_log, dt_bias, initial_state, cu_seqlens, backend=backend)
    assert np.array_equal(bits(out_kernel), bits(o)) and np.array_equal(bits(final_state_kernel), bits(fin))


def test_fwd_cp_equals_fwd_and_the_state_updates_in_place(flash_kda):
    x, A_log, dt_bias, h0 = flashkda_inputs(1, 48, 2, 64, seed=2)
    runs = []
    for call in (lambda *a, **k: flash_kda.fwd(*a, **k), lambda *a, **k: flash_kda.fwd_cp(*a, **k),
                 lambda *a, **k: flash_kda.fwd_cp(*a, auto_cp=False, **k)):
        out, state = torch.zeros_like(x["v"]), h0.clone().float()
        call(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.125, out, A_log, dt_bias, LOWER_BOUND,
             initial_state=state, final_state=state)  # fp32 state, replaced in place
        runs.append((out, state))
    for out, state in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(state, runs[0][1])
    assert not torch.equal(runs[0][1], h0.float())


def test_a_flashkda_state_is_read_v_first_even_when_k_equals_v(flash_kda):
    """A [N, H, V, K] state with K = V cannot be told from a [N, H, K, V] one by its shape: the face
    states FlashKDA's layout, so the state is read as FlashKDA means it (kda_forward's default would
    read it transposed)."""
    x, A_log, dt_bias, _ = flashkda_inputs(1, 32, 2, 64, seed=3)
    h0 = torch.randn(1, 2, 64, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    out = torch.zeros_like(x["v"])
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.125, out, A_log, dt_bias, LOWER_BOUND,
                  initial_state=h0)
    opts = dict(scale=0.125, initial_state=np_of(h0), qk_l2norm=True, beta_sigmoid=True, gate="sigmoid",
                A_log=np_of(A_log), dt_bias=np_of(dt_bias), lower_bound=LOWER_BOUND)
    arrays = {n: np_of(t) for n, t in x.items()}
    vk, _ = kdacupy.kda_forward(**arrays, **opts, state_layout="vk")
    kv, _ = kdacupy.kda_forward(**arrays, **opts)  # kdacupy's default layout: the trap
    assert np.array_equal(bits(out), bits(vk)) and not np.array_equal(bits(out), bits(kv))


def test_lower_bound_zero_runs_as_flashkda_documents(flash_kda):
    x, A_log, dt_bias, _ = flashkda_inputs(1, 16, 1, 64, seed=5)
    out = torch.zeros_like(x["v"])
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.125, out, A_log, dt_bias, 0.0)
    assert torch.isfinite(out.float()).all() and out.abs().max() > 0


def _final_over_q(a):
    """final_state and q: two views of one buffer."""
    buf = torch.zeros(a["final_state"].numel() + a["q"].numel(), dtype=torch.bfloat16)
    buf[-a["q"].numel():] = a["q"].reshape(-1)
    a.update(final_state=buf[:a["final_state"].numel()].view(a["final_state"].shape),
             q=buf[a["final_state"].numel() // 2:][:a["q"].numel()].view(a["q"].shape))


def _bad_calls():
    """(name, what to change, error, the argument the message names)."""
    return [
        ("out-shape", lambda a: a.update(out=a["out"][:, :-1]), ValueError, "out"),
        ("out-dtype", lambda a: a.update(out=a["out"].float()), TypeError, "out"),
        ("out-aliases-v", lambda a: a.update(out=a["v"]), ValueError, "out"),
        ("out-not-a-tensor", lambda a: a.update(out=np.zeros(3)), TypeError, "out"),
        ("q-a-list", lambda a: a.update(q=a["q"].tolist()), TypeError, "q"),
        ("beta-none", lambda a: a.update(beta=None), TypeError, "beta"),
        ("final-dtype", lambda a: a.update(final_state=a["final_state"].float()), TypeError, "final_state"),
        ("final-shape", lambda a: a.update(final_state=a["final_state"][:, :1]), ValueError, "final_state"),
        ("final-fp16", lambda a: a.update(final_state=a["final_state"].half(), initial_state=None), TypeError,
         "final_state"),
        ("final-overlaps-q", _final_over_q, ValueError, "final_state"),
        ("lower-bound-positive", lambda a: a.update(lower_bound=0.5), ValueError, "lower_bound"),
        ("scale-string", lambda a: a.update(scale="0.1"), TypeError, "scale"),
        ("A_log-shape", lambda a: a.update(A_log=a["A_log"][:1]), ValueError, "A_log"),
        ("cu-with-B2", lambda a: a.update(cu_seqlens=torch.tensor([0, 16], dtype=torch.long),
                                          **{n: torch.cat([a[n], a[n]]) for n in ("q", "k", "v", "g", "beta",
                                                                                   "out")}), ValueError, "B"),
    ]


@pytest.mark.parametrize("name,change,error,arg", _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_a_bad_call_is_refused_naming_it_and_writes_nothing(flash_kda, name, change, error, arg):
    x, A_log, dt_bias, h0 = flashkda_inputs(1, 16, 2, 64, seed=6)
    a = dict(x, scale=0.125, out=torch.full_like(x["v"], 7.0), A_log=A_log, dt_bias=dt_bias,
             lower_bound=LOWER_BOUND, initial_state=h0, final_state=torch.full_like(h0, 3.0), cu_seqlens=None)
    change(a)
    tensors = {n: t for n, t in a.items() if isinstance(t, torch.Tensor)}
    before = {n: t.clone() for n, t in tensors.items()}
    with pytest.raises(error, match=arg):
        flash_kda.fwd(**a)
    for n, t in tensors.items():
        assert torch.equal(t, before[n]), f"{n} was written by a refused call ({name})"


def test_patch_installs_a_stand_in_and_unpatch_removes_it():
    import sys
    assert "flash_kda" not in sys.modules or not hasattr(sys.modules["flash_kda"], "fwd") or \
        sys.modules["flash_kda"].fwd is not flashkda.fwd
    flashkda.patch()
    flashkda.patch()  # twice: nothing more
    import flash_kda
    assert flash_kda.fwd is flashkda.fwd and flash_kda.fwd_cp is flashkda.fwd_cp
    flashkda.unpatch()
    assert sys.modules.get("flash_kda") is not flash_kda

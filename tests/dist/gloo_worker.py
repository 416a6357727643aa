"""``python tests/dist/gloo_worker.py DIR``: three gloo processes (forked from this one, which
imports torch and kdacupy once for all of them) run context parallelism on a
``torch.distributed`` process group: kdacupy.distributed's calls with the group as their
communicator, and kdacupy.torch.kda_cp's autograd against the single-process
kdacupy.torch.kda on the same inputs (float64 to 1e-10; the model with the CP tolerance of
tests/dist/checks.py); fault injection through kda_cp, forward and backward. Rank 0 prints
one line per check. Then an injected failure, not caught, must end every process with an
error (each writes ``DIR/rank<r>.err``); this process prints every child's exit code and
exits non-zero when any check failed. Gloo's own timeout and a watchdog per child end a hang
in seconds."""
import datetime
import faulthandler
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kdacupy.torch as kt  # noqa: E402
from kdacupy.numerics.dtypes import F64  # noqa: E402
from tests.dist import faults  # noqa: E402
from tests.dist.cases import BACKWARD_CASES, CASES, RANKS  # noqa: E402
from tests.dist.checks import U, backward_case, float64, forward_case, local_slice  # noqa: E402
from tests.dist.gather import run_everywhere  # noqa: E402
from tests.inputs import make_inputs, rmse_ratio  # noqa: E402

TIMEOUT = 60  # seconds a child may live


class Ranks:
    def __init__(self, group):
        self.group, self.rank, self.size = group, dist.get_rank(group), dist.get_world_size(group)

    def allgather(self, obj):
        out = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out


NAMES = ("q", "k", "v", "g", "beta")
PARAMS = ("initial_state", "A_log", "dt_bias")


def torch_case(ranks, group, inputs, extra, style, backend, exact):
    """kda_cp's autograd on this rank's slice against kda's on the whole input: the loss is
    the ranks' losses summed (rank 0 holds the final state's term), the shared parameters'
    gradients summed over the ranks (all_reduce), as a training step does. float64: to 1e-10;
    the model: against kda's float64 gradient and kda's model gradient within 2x the latter's
    own error (tests/dist/checks.py)."""
    x, opts = make_inputs(**inputs)
    opts.update(extra)
    if exact:
        x, opts = float64(x, opts)
    cu = opts.pop("cu_seqlens", None)
    kw = dict(opts, cu_seqlens=None if cu is None else torch.from_numpy(cu), output_final_state=True)
    one, o1, s1 = _grads(x, kw, kt.kda, backend, None)
    sl, _ = local_slice(ranks, x, x["q"].shape[1], style)
    mine, o, s = _grads(x, kw, kt.kda_cp, backend, (o1, s1), sl=sl, group=group, first=ranks.rank == 0)
    for n in PARAMS:
        if n in mine:
            dist.all_reduce(mine[n], group=group)
    ref = None
    if not exact:
        x64, o64 = float64(x, kw)
        ref = _grads(x64, o64, kt.kda, "reference", (o1, s1))[0]
    problems = []
    for n, got in mine.items():
        want = one[n][:, sl] if n in NAMES else one[n]
        if got.shape != want.shape or got.dtype != want.dtype:
            problems.append(f"d{n}: {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}")
        elif exact and got.numel():
            err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))
            problems += [f"d{n}: {err:.3g} relative to kda's float64 gradient"] if err >= 1e-10 else []
        elif got.numel():
            r = (ref[n][:, sl] if n in NAMES else ref[n]).numpy()
            got, want = got.double().numpy(), want.double().numpy()
            if np.linalg.norm(r) and max(rmse_ratio(got, r), rmse_ratio(got, want)) >= 2 * max(rmse_ratio(want, r), U):
                problems.append(f"d{n}: {rmse_ratio(got, r):.3g} from the float64 gradient, "
                                f"{rmse_ratio(got, want):.3g} from kda's, whose own is {rmse_ratio(want, r):.3g}")
    if exact and o.numel():
        e = rmse_ratio(o.double().numpy(), o1[:, sl].double().numpy())
        problems += [f"o: {e:.3g} from kda's"] if e >= 1e-12 else []
    assert not problems, "; ".join(problems)


def _grads(x, kw, fn, backend, cot, sl=slice(None), first=True, **more):
    """The gradients of sum(o * do) + sum(final * ds) (the final state's term on the ``first``
    rank only) through ``fn`` on tokens ``sl``, and (o, final); ``cot``: the (o, final) whose
    shapes the seeded do and ds take (None: ``fn``'s own)."""
    leaves = {n: _tensor(a[:, sl]).requires_grad_() for n, a in x.items()}
    params = {n: (p if isinstance(p, torch.Tensor) else _tensor(p)).clone().requires_grad_()
              for n, p in kw.items() if n in PARAMS}
    opts = {n: v for n, v in kw.items() if n not in PARAMS}
    o, s = fn(*(leaves[n] for n in NAMES), **params, backend=backend, **opts, **more)
    o_like, s_like = (o, s) if cot is None else cot
    g = torch.Generator().manual_seed(7)
    do = torch.randn(o_like.shape, generator=g, dtype=torch.float64)[:, sl]
    ds = torch.randn(s_like.shape, generator=g, dtype=torch.float64)
    ((o.double() * do).sum() + first * (s.double() * ds).sum()).backward()
    return {n: t.grad for n, t in {**leaves, **params}.items()}, o.detach(), s.detach()


def _tensor(a):
    if a.dtype.kind == "V" or str(a.dtype) == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def torch_call(ranks, group, varlen, backward):
    """faults.call through kda_cp's autograd: the forward, and the backward when asked."""
    local, opts = faults.inputs(ranks, varlen)
    leaves = {n: _tensor(a).requires_grad_(n == "q") for n, a in local.items()}
    params = {n: _tensor(opts.pop(n)) for n in ("A_log", "dt_bias") if n in opts}
    cu = opts.pop("cu_seqlens", None)
    o, s = kt.kda_cp(*(leaves[n] for n in NAMES), group=group, backend="model", output_final_state=True,
                     cu_seqlens=None if cu is None else torch.from_numpy(cu), **params, **opts)
    if backward:
        o.float().sum().backward()
    return o


def fla_context(group, cu, rank, ranks):
    """What FLA's build_cp_context (fla/ops/cp) gives this rank for the global ``cu``: equal
    shares of the packed stream, the share's rank-local offsets, and how many earlier ranks
    the share's first sequence began on (a namespace with FLACPContext's fields)."""
    import types
    part = int(cu[-1]) // ranks
    lo, hi = rank * part, (rank + 1) * part
    first = int(np.searchsorted(cu[1:], lo, side="right"))
    last = int(np.searchsorted(cu[:-1], hi, side="left"))
    local = np.unique(np.clip(cu[first:last + 1], lo, hi) - lo)
    t = torch.from_numpy(local.astype(np.int32))
    starts_on = int(cu[first]) // part
    return types.SimpleNamespace(group=group, cu_seqlens=t, cu_seqlens_cpu=t, pre_num_ranks=rank - starts_on,
                                 is_first_rank=starts_on == rank)


def generated_cp_cases(ranks, group, n=8, seed=2026):
    """Generated context-parallel cases (the same seeded draws on every rank): packed lengths with
    empty and one-token sequences and lengths at chunk boundaries, head dims around the tiles, gates,
    beta modes, state layouts, grouped heads, even and uneven slices (a rank of one token, one of
    none); kda_cp's output and every gradient equal one process's, float64 to 1e-10 (torch_case)."""
    rng = np.random.default_rng(seed)
    dims, lens = (16, 17, 60, 64, 65, 100), (0, 1, 15, 16, 17, 31, 33)
    for i in range(n):
        H = int(rng.integers(1, 3))
        inputs = dict(cu_seqlens=[int(rng.choice(lens)) if rng.random() < 0.6 else int(rng.integers(0, 40))
                                  for _ in range(int(rng.integers(2, 5)))], H=H, HV=H * int(rng.integers(1, 3)),
                      K=int(rng.choice(dims)), V=int(rng.choice(dims)), dtype=F64, state=F64,
                      gate=str(rng.choice(["log", "softplus", "sigmoid"])), beta=str(rng.choice(["logits", "raw"])),
                      state_layout=str(rng.choice(["kv", "vk"])), seed=int(rng.integers(0, 1000)))
        if sum(inputs["cu_seqlens"]) < 3:
            inputs["cu_seqlens"].append(20)
        torch_case(ranks, group, inputs, dict(qk_l2norm=bool(rng.random() < 0.5)), str(rng.choice(["even", "uneven"])),
                   "reference", True)


def fla_cp_case(ranks, group):
    """kdacupy.compat.fla.chunk_kda with FLA's cp_context on this rank's share against chunk_kda
    on the whole packed stream: the output and every gradient (float64, to 1e-10; A_log's and
    dt_bias's summed over the ranks)."""
    from kdacupy.compat.fla import chunk_kda
    x, opts = float64(*make_inputs(cu_seqlens=[10, 40, 4, 0, 21], H=1, HV=2, K=64, V=64, dtype=F64))
    cu = opts["cu_seqlens"]
    T = int(cu[-1])
    fla_kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  lower_bound=-5.0, safe_gate=True)
    ctx = fla_context(group, cu, ranks.rank, ranks.size)
    sl = slice(ranks.rank * (T // ranks.size), (ranks.rank + 1) * (T // ranks.size))
    got, want = {}, {}
    for mine, out in ((True, got), (False, want)):
        leaves = {n: torch.from_numpy(x[n][:, sl] if mine else x[n]).requires_grad_() for n in NAMES}
        params = {n: torch.from_numpy(opts[n]).requires_grad_() for n in ("A_log", "dt_bias")}
        o, _ = chunk_kda(*(leaves[n] for n in NAMES), **params, **fla_kw,
                         **(dict(cp_context=ctx) if mine else dict(cu_seqlens=torch.from_numpy(cu))))
        do = torch.from_numpy(np.random.default_rng(2).standard_normal(x["v"].shape))
        (o * (do[:, sl] if mine else do)).sum().backward()
        out.update(o=o.detach(), **{n: t.grad for n, t in {**leaves, **params}.items()})
    for n in ("A_log", "dt_bias"):
        dist.all_reduce(got[n], group=group)
    problems = []
    for n, a in got.items():
        b = want[n][:, sl] if n in NAMES + ("o",) else want[n]
        err = float((a - b).abs().max() / b.abs().max())
        problems += [f"{n}: {err:.3g}"] if err >= 1e-10 else []
    assert not problems, "; ".join(problems)


def fla_zigzag_case(ranks, group):
    """chunk_kda with FLA's own build_cp_context(layout="zigzag") (rank r holds parts r and 2W-1-r)
    against chunk_kda on the whole packed stream: the output and every gradient, float64 to 1e-10
    (A_log's and dt_bias's summed over the ranks); sequences cross the middle and the parts."""
    from fla.ops.cp import build_cp_context

    from kdacupy.compat.fla import chunk_kda
    x, opts = float64(*make_inputs(cu_seqlens=[10, 40, 4, 0, 18], H=1, HV=2, K=64, V=64, dtype=F64))
    cu = opts["cu_seqlens"]
    part = int(cu[-1]) // (2 * ranks.size)
    ctx = build_cp_context(torch.from_numpy(cu.astype(np.int64)), group=group, layout="zigzag")
    assert ctx.layout == "zigzag" and ctx.part_len == part
    r, back = ranks.rank, 2 * ranks.size - 1 - ranks.rank
    mine_of = lambda a: np.concatenate([a[:, r * part:(r + 1) * part], a[:, back * part:(back + 1) * part]], 1)  # noqa
    fla_kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  lower_bound=-5.0, safe_gate=True)
    do = np.random.default_rng(3).standard_normal(x["v"].shape)
    got, want = {}, {}
    for mine, out in ((True, got), (False, want)):
        leaves = {n: torch.from_numpy(mine_of(x[n]) if mine else x[n]).requires_grad_() for n in NAMES}
        params = {n: torch.from_numpy(opts[n]).requires_grad_() for n in ("A_log", "dt_bias")}
        o, _ = chunk_kda(*(leaves[n] for n in NAMES), **params, **fla_kw,
                         **(dict(cp_context=ctx) if mine else dict(cu_seqlens=torch.from_numpy(cu))))
        (o * torch.from_numpy(mine_of(do) if mine else do)).sum().backward()
        out.update(o=o.detach(), **{n: t.grad for n, t in {**leaves, **params}.items()})
    for n in ("A_log", "dt_bias"):
        dist.all_reduce(got[n], group=group)
    problems = []
    for n, a in got.items():
        b = torch.from_numpy(mine_of(want[n].numpy())) if n in NAMES + ("o",) else want[n]
        err = float((a - b).abs().max() / b.abs().max())
        problems += [f"{n}: {err:.3g}"] if err >= 1e-10 else []
    assert not problems, "; ".join(problems)


def opcheck_cp_ops(store):
    """torch.library.opcheck of forward_cp and backward_cp (their schemas, fakes, autograd
    registration and AOT dispatch) on a one-process gloo group, in this process once the three
    have ended: each check runs the op, collectives included, and its machinery's imports cost
    seconds per process."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    x, _ = make_inputs(T=24, H=1, K=64, V=64, dtype=F64, gate="log", beta="raw")
    t = [torch.from_numpy(x[n]).requires_grad_() for n in NAMES]
    name = kt.cp._group_name(dist.group.WORLD)
    options = (None, True, False, False, False, "log", None, "kv", None, "bf16", None)
    torch.library.opcheck(torch.ops.kdacupy.forward_cp.default, (*t, None, None, None, None, name, *options))
    do = torch.ones_like(t[2])
    ds = torch.zeros(1, 1, 64, 64, dtype=torch.float64)
    torch.library.opcheck(torch.ops.kdacupy.backward_cp.default,
                          (do, ds, *(a.detach() for a in t), None, None, None, None, name, None, False, False, False,
                           "log", None, "kv", "bf16", None))
    dist.destroy_process_group()


TORCH_CASES = [
    ("kda_cp float64 varlen spanning, states, GVA", dict(cu_seqlens=[7, 0, 30, 3, 0, 20], H=1, HV=2, K=64, V=64,
                                                         dtype=F64, state=F64), dict(qk_l2norm=True), "uneven",
     "reference", True),
    ("kda_cp float64 fixed vk softplus", dict(B=2, T=30, H=1, K=64, V=64, dtype=F64, gate="softplus", state=F64,
                                              state_layout="vk"), {}, "even", "reference", True),
    ("kda_cp model bf16 varlen", dict(cu_seqlens=[5, 50, 3], H=1, K=64, V=64, state=np.float32), dict(qk_l2norm=True),
     "even", "model", False),
]


#: the fault scenarios through kda_cp: before, between and after the collectives, forward and
#: backward (the MPI worker runs them all on the same core code)
GLOO_FAULTS = [faults.SCENARIOS[i] for i in (0, 1, 5, 6)]


def child(rank, store, out):
    faulthandler.dump_traceback_later(TIMEOUT - 5, exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS,
                            timeout=datetime.timedelta(seconds=30))
    group = dist.group.WORLD
    ranks = Ranks(group)
    failed = 0
    fwd, bwd = CASES[2], BACKWARD_CASES[-1]  # through the group as kdacupy.distributed's communicator
    jobs = [(f"engine: {fwd[0]}", lambda: forward_case(ranks, group, *fwd)),
            (f"engine: {bwd[0]}", lambda: backward_case(ranks, group, *bwd, repeat=True))]
    jobs += [(c[0], lambda c=c: torch_case(ranks, group, *c[1:])) for c in TORCH_CASES]
    jobs += [("generated context-parallel cases (8, seeded)", lambda: generated_cp_cases(ranks, group))]
    jobs += [("compat.fla chunk_kda with FLA's cp_context", lambda: fla_cp_case(ranks, group)),
             ("compat.fla chunk_kda with FLA's zigzag cp_context", lambda: fla_zigzag_case(ranks, group))]
    for name, job in jobs:
        failed += run_everywhere(ranks, job, f"{name} ({RANKS} gloo processes)")
    for name, where, failing, exc, varlen, backward, needle in GLOO_FAULTS:
        took = [float("nan")]
        fn = "kda_backward_cp" if backward else "kda_forward_cp"
        failed += run_everywhere(ranks, lambda: faults.check_scenario(
            ranks, group, fn, where, failing, exc, varlen, backward, needle, took, run=torch_call),
            lambda: f"fault through kda_cp: {name} ({took[0]:.2f} s)")
    if rank == 0:
        print(f"scenarios done on {RANKS} gloo processes", flush=True)
    if failed:
        os._exit(3)
    try:  # not caught: every process ends with the error
        if rank == 1:
            faults.shard.state_adjoint = faults.failing(np.linalg.LinAlgError("injected: uncaught"))
        torch_call(ranks, group, True, True)
    except Exception as e:
        (Path(out) / f"rank{rank}.err").write_text(f"{type(e).__name__}: {e}\n")
        os._exit(1)
    print(f"rank {rank}: returned normally", flush=True)
    os._exit(0)


def warm_up():
    """One small kda call, forward and backward, before the fork: torch's first custom-op call
    loads what it loads lazily (seconds), once here instead of in every child."""
    x, opts = make_inputs(T=16, H=1, K=64, V=64, dtype=F64, gate="log", beta="raw")
    t = [torch.from_numpy(x[n]).requires_grad_() for n in NAMES]
    o, _ = kt.kda(*t, **opts)
    o.sum().backward()


def main():
    warm_up()
    out = sys.argv[1]
    store = os.path.join(out, "store")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=child, args=(r, store, out)) for r in range(RANKS)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    print(f"exit codes {codes}", flush=True)
    t0 = time.perf_counter()  # after the children: a process group in this process before a fork would hang them
    try:
        opcheck_cp_ops(os.path.join(out, "store-opcheck"))
        took = time.perf_counter() - t0
        print(f"ok: opcheck of kdacupy::forward_cp and backward_cp (one gloo process) [{took:.2f} s]", flush=True)
    except Exception:  # noqa: BLE001
        import traceback
        print(f"FAIL: opcheck of kdacupy::forward_cp and backward_cp\n{traceback.format_exc()}", flush=True)
        codes.append(3)
    sys.exit(3 if 3 in codes or None in codes else 0)


if __name__ == "__main__":
    main()

"""``python tests/dist/jax_worker.py``: a 4-device JAX CPU mesh (its own process, so the
``--xla_force_host_platform_device_count`` flag touches no other test) runs kdacupy.jax.kda_cp
inside ``jax.shard_map`` with its default checks, forward and ``jax.grad`` under ``jit``,
against the single-process kdacupy.kda_forward / kda_backward on the same inputs (float64 to
1e-10, the model with tests/dist/checks.py's tolerance), twice to the same bits; a 2-D mesh
(the batch over one axis, the tokens over the other); kdacupy.jax.kda on batch shards under
``jax.grad`` (the shared A_log's gradient summed over the shards); and failures injected on
one device before, between and after the collectives: every call raises, in seconds, the
same error naming the device and the step (never XLA's 40 s rendezvous abort). Prints one
line per check; exits non-zero when any failed."""
import os
import sys
import time
import traceback
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import kdacupy  # noqa: E402
import kdacupy.distributed.shard as shard  # noqa: E402
import kdacupy.jax as kj  # noqa: E402
from kdacupy.numerics.dtypes import F64  # noqa: E402
from tests.dist.checks import U, float64  # noqa: E402
from tests.inputs import make_inputs, rmse_ratio  # noqa: E402

jax.config.update("jax_enable_x64", True)
NAMES = ("q", "k", "v", "g", "beta")
PARAMS = ("initial_state", "A_log", "dt_bias")


def setup(inputs, extra, exact, mesh, tokens_axis, batch_axis=None):
    """The case's arrays on the mesh, its single-process results and a jitted CP loss and grad."""
    x, opts = make_inputs(**inputs)
    opts.update(extra)
    if exact:
        x, opts = float64(x, opts)
    cu = opts.pop("cu_seqlens", None)
    o1, s1 = kdacupy.kda_forward(**x, cu_seqlens=cu, output_final_state=True, **opts)
    rng = np.random.default_rng(3)
    do = rng.standard_normal(o1.shape).astype(o1.dtype)
    ds = rng.standard_normal(s1.shape).astype(s1.dtype)
    g1 = kdacupy.kda_backward(do, **x, cu_seqlens=cu, dfinal_state=ds, **opts)
    tok, seq, rep = P(batch_axis, tokens_axis), P(batch_axis), P()  # per token, per sequence, shared
    put = lambda a, spec: jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec))  # noqa: E731
    params = [n for n in PARAMS if n in opts]
    pspec = {"initial_state": seq, "A_log": rep, "dt_bias": rep}
    args = [put(x[n], tok) for n in NAMES] + [put(opts[n], pspec[n]) for n in params]
    static = {n: v for n, v in opts.items() if n not in params}
    extras = (put(do, tok), put(ds, seq)) + ((put(cu, rep),) if cu is not None else ())
    every = (tokens_axis,) + ((batch_axis,) if batch_axis else ())

    def inner(*a):
        given = dict(zip(NAMES + tuple(params), a))
        jdo, jds = a[len(given)], a[len(given) + 1]
        jcu = a[len(given) + 2] if cu is not None else None
        o, s = kj.kda_cp(*(given[n] for n in NAMES), axis_name=tokens_axis, cu_seqlens=jcu, output_final_state=True,
                         **{n: given[n] for n in params}, **static)
        state_term = (s * jds).sum()
        if batch_axis:
            state_term = jax.lax.psum(state_term, batch_axis)
        return o, s, jax.lax.psum((o * jdo).sum(), every) + state_term

    specs = (tok,) * 5 + tuple(pspec[n] for n in params) + (tok, seq) + ((rep,) if cu is not None else ())
    sm = jax.shard_map(inner, mesh=mesh, in_specs=specs, out_specs=(tok, seq, rep))
    run = jax.jit(lambda *a: sm(*a, *extras)[:2])
    grad = jax.jit(jax.grad(lambda *a: sm(*a, *extras)[2], argnums=tuple(range(len(args)))))
    return x, opts, (o1, s1, g1), (do, ds, cu), args, params, run, grad


def cp_case(inputs, extra, exact, mesh=None, tokens_axis="t", batch_axis=None, repeat=False):
    mesh = mesh or jax.make_mesh((4,), ("t",))
    x, opts, (o1, s1, g1), (do, ds, cu), args, params, run, grad = setup(inputs, extra, exact, mesh, tokens_axis,
                                                                          batch_axis)
    o, s = (np.asarray(a) for a in run(*args))
    grads = [np.asarray(a) for a in grad(*args)]
    names = list(NAMES) + params
    ref = None
    if not exact:
        x64, o64 = float64(x, {n: a for n, a in opts.items() if n != "backend"})
        ref = kdacupy.kda_backward(do.astype(F64), **x64, cu_seqlens=cu, dfinal_state=ds.astype(F64), **o64)
    problems = [p for p in (_compare("o", o, o1, None, exact), _compare("final_state", s, s1, None, exact)) if p]
    for n, got in zip(names, grads):
        gname = "d" + n
        want = getattr(g1, gname)
        r = None if ref is None else getattr(ref, gname)
        problems += [p for p in [_compare(gname, got, want, r, exact)] if p]
    if repeat:
        again = [np.asarray(a) for a in grad(*args)]
        problems += [f"d{n} differs between runs" for n, a, b in zip(names, grads, again) if a.tobytes() != b.tobytes()]
    assert not problems, "; ".join(problems)


def _compare(name, got, want, ref, exact):
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    if exact:
        err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-300)
        return None if err < 1e-10 else f"{name}: {err:.3g} relative to the single process"
    if ref is None:  # the model's forward: the CP forward's tolerance against the single process
        e = rmse_ratio(got, want)
        return None if e < 8 * U else f"{name}: {e:.3g} from the single process"
    if not np.linalg.norm(ref):
        return None
    e_cp, e_one, e_two = rmse_ratio(got, ref), rmse_ratio(want, ref), rmse_ratio(got, want)
    if max(e_cp, e_two) >= 2 * max(e_one, U):
        return f"{name}: CP {e_cp:.3g} from float64, {e_two:.3g} from the single process, whose own is {e_one:.3g}"
    return None


def kda_on_batch_shards():
    """kdacupy.jax.kda under shard_map (B over the devices) and jax.grad, shard_map's default
    checks: the gradients are kda_backward's, A_log's and dt_bias's summed over the shards."""
    mesh = jax.make_mesh((4,), ("b",))
    x, opts = float64(*make_inputs(B=4, T=20, H=1, HV=2, K=64, V=64, dtype=F64, state=F64))
    rng = np.random.default_rng(5)
    o1, s1 = kdacupy.kda_forward(**x, output_final_state=True, **opts)
    do, ds = rng.standard_normal(o1.shape), rng.standard_normal(s1.shape)
    ref = kdacupy.kda_backward(do, **x, dfinal_state=ds, **opts)
    params = [n for n in PARAMS if n in opts]
    shard_b, rep = NamedSharding(mesh, P("b")), NamedSharding(mesh, P())
    args = [jax.device_put(jnp.asarray(x[n]), shard_b) for n in NAMES]
    args += [jax.device_put(jnp.asarray(opts[n]), shard_b if n == "initial_state" else rep) for n in params]
    static = {n: v for n, v in opts.items() if n not in params}

    def inner(*a):
        given = dict(zip(NAMES + tuple(params), a[:-2]))
        o, s = kj.kda(*(given[n] for n in NAMES), output_final_state=True, **{n: given[n] for n in params}, **static)
        return ((o * a[-2]).sum() + (s * a[-1]).sum())[None]

    specs = (P("b"),) * 5 + tuple(P("b") if n == "initial_state" else P() for n in params) + (P("b"), P("b"))
    sm = jax.shard_map(inner, mesh=mesh, in_specs=specs, out_specs=P("b"))
    cot = [jax.device_put(jnp.asarray(c), shard_b) for c in (do, ds)]
    grads = jax.jit(jax.grad(lambda *a: sm(*a, *cot).sum(), argnums=tuple(range(len(args)))))(*args)
    for n, got in zip(list(NAMES) + params, grads):
        want = getattr(ref, "d" + n)
        err = np.abs(np.asarray(got) - want).max() / np.abs(want).max()
        assert err < 1e-10, f"d{n}: {err:.3g}"


#: the fault injections: (name, the Shard step replaced, the device it fails on, backward, needle)
FAULTS = [
    ("forward, before the first collective: the maps", "forward_rows", 1, False,
     "rank 1 failed computing its state maps: BufferError: injected"),
    ("forward, between collectives: the local forward", "forward", 2, False,
     "rank 2 failed running its local forward: BufferError: injected"),
    ("backward, before its first collective: the adjoints", "backward_rows", 0, True,
     "rank 0 failed computing its state maps and adjoints: BufferError: injected"),
    ("backward, after the last collective: the local backward", "backward", 3, True,
     "rank 3 failed running its local backward: BufferError: injected"),
]


def fault(step, device, backward, needle, setup_once):
    args, run, grad = setup_once
    real = getattr(shard.Shard, step)

    def failing(self, *a, **k):
        if self.rank == device:
            raise BufferError("injected")
        return real(self, *a, **k)

    setattr(shard.Shard, step, failing)
    t0 = time.perf_counter()
    try:
        jax.block_until_ready((grad if backward else run)(*args))
    except Exception as e:  # noqa: BLE001  (JAX's runtime error carries the callback's)
        took = time.perf_counter() - t0
        assert f"kdacupy.jax.kda_cp: {needle}" in str(e), str(e)[-2000:]
        assert took < 20, f"{took:.1f} s to raise"
    else:
        raise AssertionError("no error raised")
    finally:
        setattr(shard.Shard, step, real)
    jax.block_until_ready((grad if backward else run)(*args))  # a plain call right after works


def main():
    jobs = [
        ("float64 varlen spanning devices, states, GVA", lambda: cp_case(
            dict(cu_seqlens=[7, 0, 30, 20, 0, 7], H=1, HV=2, K=64, V=64, dtype=F64, state=F64),
            dict(qk_l2norm=True), True, repeat=True)),
        ("float64 fixed, vk, softplus, a 2x2 mesh (batch x tokens)", lambda: cp_case(
            dict(B=2, T=24, H=1, K=64, V=64, dtype=F64, gate="softplus", state=F64, state_layout="vk"), {}, True,
            mesh=jax.make_mesh((2, 2), ("b", "t")), batch_axis="b")),
        ("model bf16 varlen, log gate", lambda: cp_case(
            dict(cu_seqlens=[5, 50, 9], H=1, K=64, V=64, gate="log", state=np.float32),
            dict(qk_l2norm=True, backend="model"), False)),
        ("kdacupy.jax.kda on batch shards under grad", kda_on_batch_shards),
    ]
    mesh = jax.make_mesh((4,), ("t",))
    once = {}

    def failing_setup():
        if not once:
            _, _, _, _, args, _, run, grad = setup(dict(cu_seqlens=[30, 34], H=1, K=64, V=64, dtype=F64), {}, True,
                                                   mesh, "t")
            once["v"] = (args, run, grad)
        return once["v"]

    jobs += [(f"fault: {name}", lambda s=step, d=device, b=bwd, n=needle: fault(s, d, b, n, failing_setup()))
             for name, step, device, bwd, needle in FAULTS]
    failed = 0
    for name, job in jobs:
        t0 = time.perf_counter()
        try:
            job()
            print(f"ok: {name} [{time.perf_counter() - t0:.2f} s]", flush=True)
        except Exception:  # noqa: BLE001
            failed += 1
            print(f"FAIL: {name}\n{traceback.format_exc()}", flush=True)
    # (no exit handlers: JAX would wait again, at exit, on the failed computations' tokens and print their errors)
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()

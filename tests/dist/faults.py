"""Fault injection for the context-parallel calls, whatever carries the collectives: one rank
(or two) fails with an exception no validation expects, injected by replacing one local step
on that rank only, before the first collective, between collectives and after the last one's
input. Every rank must raise the same ContextParallelError naming the failed rank(s) and step
(the failed rank's error carrying the original as its cause), and a plain call right after
must work (the ranks stayed in step)."""
import time

import numpy as np

import kdacupy.distributed.backward_cp as backward_cp
import kdacupy.distributed.cp as cp
import kdacupy.distributed.shard as shard
from kdacupy.distributed import ContextParallelError
from tests.inputs import make_inputs


def inputs(ranks, varlen):
    """Even slices of one input; every rank but the last carries a sequence past its slice."""
    if varlen:
        x, opts = make_inputs(cu_seqlens=[5, 60, 3], H=1, K=64, V=64, seed=3)
    else:
        x, opts = make_inputs(B=2, T=48, H=1, K=64, V=64, seed=3)
    T = x["q"].shape[1]
    sl = slice(ranks.rank * T // ranks.size, (ranks.rank + 1) * T // ranks.size)
    return {n: a[:, sl] for n, a in x.items()}, opts


def failing(exc):
    def step(*args, **kwargs):
        raise exc
    return step


#: name, (owner, attribute) replaced, failing ranks, the exception, varlen, backward, needle
SCENARIOS = [
    ("forward, before the first collective: validation raises MemoryError", (cp, "LocalCall"), (1,),
     MemoryError("injected: out of host memory"), False, False, "rank 1 failed validating its input: MemoryError"),
    ("forward, between collectives: the maps raise BufferError", (shard, "state_maps"), (1,),
     BufferError("injected: buffer in use"), True, False, "rank 1 failed computing its state maps: BufferError"),
    ("forward, after the last collective's input: the local forward raises OSError", (shard.Shard, "forward"), (0,),
     OSError("injected: compile failed"), False, False, "rank 0 failed running its local forward: OSError"),
    ("forward, two ranks fail", (shard.Shard, "forward"), (0, 2), KeyError("injected"), False, False,
     "rank 0 failed running its local forward: KeyError: 'injected'; rank 2: KeyError"),
    ("backward, before the first collective: validation raises MemoryError", (backward_cp, "LocalCall"), (2,),
     MemoryError("injected"), True, True, "rank 2 failed validating its input: MemoryError"),
    ("backward, between collectives: the adjoint raises RuntimeError", (shard, "state_adjoint"), (1,),
     RuntimeError("injected: out of device memory"), True, True,
     "rank 1 failed computing its state maps and adjoints: RuntimeError"),
    ("backward, after the last collective's input: the local backward raises OSError", (shard.Shard, "backward"),
     (2,), OSError("injected"), False, True, "rank 2 failed running its local backward: OSError"),
]


def call(ranks, comm, varlen, backward, **kw):
    """The plain call each scenario breaks: the forward with its final state, or the backward."""
    local, opts = inputs(ranks, varlen)
    if not backward:
        return cp.kda_forward_cp(**local, comm=comm, backend="model", output_final_state=True, **opts, **kw)
    do = np.ones(local["v"].shape, local["v"].dtype)
    return backward_cp.kda_backward_cp(do, **local, comm=comm, backend="model", **opts, **kw)


def scenario(ranks, comm, where, failed, exc, varlen, backward, run=call):
    """(every rank's message, seconds, the failed rank's error chained to the injected one)."""
    owner, name = where
    real = getattr(owner, name)
    if ranks.rank in failed:
        setattr(owner, name, failing(exc))
    t0 = time.perf_counter()
    try:
        run(ranks, comm, varlen, backward)
    except ContextParallelError as e:
        return f"ContextParallelError: {e}", time.perf_counter() - t0, e.__cause__ is exc
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} (expected ContextParallelError): {e}", time.perf_counter() - t0, False
    finally:
        setattr(owner, name, real)
    return "no error", time.perf_counter() - t0, False


def check_scenario(ranks, comm, fn, where, failed, exc, varlen, backward, needle, took, run=call):
    msg, took[0], chained = scenario(ranks, comm, where, failed, exc, varlen, backward, run)
    msgs = ranks.allgather(msg)
    run(ranks, comm, varlen, backward)  # the ranks are still in step: a plain call works
    assert all(m == msgs[0] for m in msgs), f"ranks raised different errors: {msgs}"
    assert msgs[0].startswith(f"ContextParallelError: {fn}: ") and needle in msgs[0], msgs[0]
    assert chained == (ranks.rank in failed), "the failed rank's error must carry the original as its cause"

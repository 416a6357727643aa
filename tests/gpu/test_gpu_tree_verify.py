"""Tree speculative verify and prefill checkpoints on a GPU (docs/design.md section 7.1): the
kernels against the precision models (parity.GPU), a tree verify with device parents, rows and
step states captured into a CUDA graph and replayed with new trees, and checkpoints equal to the
forward stopped at each boundary (the same kernels: bit for bit). Skipped without a GPU; the CPU
twins are tests/emulate/test_decode_tree_emulate.py and test_checkpoints_emulate.py."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.parity import GPU, mismatch

from ..checkpoint_cases import expected_boundaries, varlen_case
from ..decode_inputs import make_decode
from ..decode_trees import eagle_tree, random_tree

cp = pytest.importorskip("cupy", reason="CuPy is not installed")
F32 = np.float32


def dev(d):
    return {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in d.items()}


def agree(x, ref):
    why = mismatch(x, ref, GPU)
    assert why is None, why


def test_tree_verify_captures_into_a_cuda_graph_and_replays():
    """The engine's verify step: device parents, step rows and step states, the pool unwritten,
    captured once and replayed with new drafts and new trees copied into the same buffers."""
    N, T = 8, 15
    x, opts, pool = make_decode(N=N, T=T, H=2, HV=4, K=128, V=128, P=2 * N + 1, pool_dtype=F32)
    rng = np.random.default_rng(5)
    bufs, idx = dev(x), cp.asarray(opts["state_indices"])
    kw = {n: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for n, v in opts.items() if n != "state_indices"}
    parents = cp.asarray(np.stack([eagle_tree(2, 3)] * N).astype(np.int32))
    rows = cp.asarray(rng.permutation(N).astype(np.int32))
    steps = cp.zeros((N, T, 4, 128, 128), cp.float32)
    pd, out = cp.asarray(pool), cp.empty(x["v"].shape, dtype=x["v"].dtype)
    call = dict(state_pool=pd, state_indices=idx, parent_indices=parents, step_states=steps, step_state_indices=rows,
                update_pool=False, out=out, **kw)
    kdacupy.kda_decode(**bufs, **call)  # compile outside the capture
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        kdacupy.kda_decode(**bufs, **call)
        graph = stream.end_capture()
    for step in range(3):
        nx, _, _ = make_decode(N=N, T=T, H=2, HV=4, K=128, V=128, seed=200 + step)
        tree = np.stack([random_tree(T, rng) for _ in range(N)]).astype(np.int32)
        new_rows = rng.permutation(N).astype(np.int32)
        with stream:
            for n in bufs:
                bufs[n][...] = cp.asarray(nx[n])
            parents[...] = cp.asarray(tree)
            rows[...] = cp.asarray(new_rows)
        graph.launch(stream)
        stream.synchronize()
        sm = np.zeros((N, T, 4, 128, 128), F32)
        om = kdacupy.kda_decode(**nx, state_pool=pool.copy(), **opts, parent_indices=tree, step_states=sm,
                                step_state_indices=new_rows, update_pool=False, backend="model")
        agree(cp.asnumpy(out), om)
        agree(cp.asnumpy(steps), sm)
        np.testing.assert_array_equal(cp.asnumpy(pd), pool)


def test_checkpoints_are_the_stopped_forward():
    x, opts = varlen_case((200, 64, 0, 130), K=128, V=128)
    J, every = 4, 64
    ck = cp.full((4, J, 2, 128, 128), 5.0, cp.float32)
    kdacupy.kda_forward(**dev(x), **dev(opts), checkpoint_every=every, checkpoints=ck)
    got = cp.asnumpy(ck)
    cu = opts["cu_seqlens"]
    for n, j in expected_boundaries((200, 64, 0, 130), every, J):
        xs = {k: cp.asarray(v[:, cu[n]:cu[n] + j * every]) for k, v in x.items()}
        rest = dev({k: v for k, v in opts.items() if k not in ("cu_seqlens", "initial_state")})
        _, f = kdacupy.kda_forward(**xs, **rest, initial_state=cp.asarray(opts["initial_state"][n:n + 1]),
                                   output_final_state=True, state_dtype=F32)
        np.testing.assert_array_equal(got[n, j - 1], cp.asnumpy(f[0]))
    assert np.all(got[2] == 5.0) and np.all(got[1, 1:] == 5.0)

"""Tree speculative verify on the decode kernel, emulated (docs/design.md section 7.1): bit for bit
the decode model (fp32 and bf16 step states, both layouts, the pool written or not), every
root-to-leaf path of a topk-2, depth-4 EAGLE tree equal to that path run alone on the kernel,
device-style values the host would refuse, and the cached host path's checks of the new
arguments. Small shapes: the variants are the decode option matrix's, plus one step dtype."""
import numpy as np
import pytest

import kdacupy
from kdacupy.numerics.dtypes import BF16
from kdacupy.ops.decode import fastpath

from ..decode_inputs import make_decode
from ..decode_trees import eagle_tree, path_by_path, random_tree

pytestmark = pytest.mark.emulate
F32 = np.float32


def run(backend, x, opts, pool, steps, **kw):
    p, s = pool.copy(), steps.copy()
    o = kdacupy.kda_decode(**x, state_pool=p, **opts, step_states=s, backend=backend, **kw)
    return o, p, s


def same(a, b):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("layout,pool_dtype,step_dtype,update", [
    ("vk", F32, F32, False), ("kv", BF16, BF16, True), ("vk", BF16, BF16, True), ("vk", F32, BF16, False)])
def test_tree_verify_is_bit_for_bit_the_model(layout, pool_dtype, step_dtype, update):
    rng = np.random.default_rng(7)
    parents = np.stack([random_tree(6, rng), random_tree(6, rng), random_tree(6, rng)]).astype(np.int32)
    x, opts, pool = make_decode(N=3, T=6, H=1, HV=1, layout=layout, pool_dtype=pool_dtype)
    opts["state_indices"] = np.array([1, -1, 5], np.int32)  # a padded sequence among them
    steps = np.full((4, 7) + pool.shape[1:], 3.0, step_dtype)  # S = 7 > T; row 0 is never named
    kw = dict(parent_indices=parents, step_state_indices=np.array([3, 0, 1], np.int64), update_pool=update)
    oe, pe, se = run("emulate", x, opts, pool, steps, **kw)
    om, pm, sm = run("model", x, opts, pool, steps, **kw)
    same(oe, om)
    same(pe, pm)
    same(se, sm)
    assert np.array_equal(pe, pool) != update
    assert np.all(se[[0, 2]].astype(F32) == 3.0) and np.all(se[[1, 3], 6].astype(F32) == 3.0)
    assert not np.any(oe[1].astype(F32))


def test_every_path_of_an_eagle_tree_is_that_path_run_alone():
    parents = eagle_tree(2, 4)[None]  # 31 tokens, 16 leaves of 5
    x, opts, pool = make_decode(N=1, T=31, H=1, HV=1, pool_dtype=F32)
    steps = np.zeros((1, 31) + pool.shape[1:], F32)
    o, p, s = run("emulate", x, opts, pool, steps, parent_indices=parents, update_pool=False)
    same(p, pool)
    want_o, want_s = path_by_path(x, opts, pool, parents, F32, "emulate")
    same(o, want_o)
    same(s, want_s)


def test_device_style_values_the_host_refuses():
    """Device values are not read by the host: the kernel reads a parent outside [-1, t) as -1
    and a step row outside [0, R) as none (the tokens then run as a chain). The launcher is
    called directly, as the host checks refuse these; the model is given what they mean."""
    from kdacupy.ops.decode.fastpath import DecodeCall
    from kdacupy.validation import validate
    from kdacupy.validation.pool import Pool
    from kdacupy.validation.steps import Steps
    x, opts, pool = make_decode(N=2, T=4, H=1, HV=1, pool_dtype=F32)
    parents = np.array([[0, 0, 7, -5], [0, 0, 1, 0]], np.int32)  # 7 and -5: as -1
    rows = np.array([0, 9], np.int32)  # 9 >= R = 2: no step states, a chain
    kw = {n: v for n, v in opts.items() if n not in ("state_indices", "state_layout", "qk_l2norm", "beta_sigmoid")}
    p, a = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=None, initial_state=None,
                    output_final_state=False, cu_seqlens=None, qk_l2norm=True, beta_sigmoid=True,
                    allow_neg_eigval=False, **kw, state_layout="vk", state_dtype=None, state_precision="fp32",
                    out=None, backend="emulate")
    got_pool, steps = pool.copy(), np.zeros((2, 4) + pool.shape[1:], F32)
    arrays = (a["q"], a["k"], a["v"], a["g"], a["beta"], got_pool, opts["state_indices"], None, None, a["A_log"],
              a["dt_bias"], parents, steps, rows)
    info = Pool(pool.shape[0], pool.dtype, "vk", False, False, False, Steps(2, 4, steps.dtype, True))
    call = DecodeCall(p, info, arrays)
    assert call.checked(arrays) is None  # the host checks refuse parent 7 and row 9
    o = call.launch(arrays, [call._ptr(v) for v in arrays])
    one = lambda n: {k: v[n:n + 1] for k, v in x.items()}  # noqa: E731
    idx = opts["state_indices"]
    want_steps = np.zeros((1, 4) + pool.shape[1:], F32)
    o0 = kdacupy.kda_decode(**one(0), state_pool=pool.copy(), **dict(opts, state_indices=idx[:1]),
                            parent_indices=np.array([[0, 0, -1, -1]], np.int32), step_states=want_steps,
                            update_pool=False, backend="model")
    # sequence 1 has no row: its tokens run as the chain verify does
    o1 = kdacupy.kda_decode(**one(1), state_pool=pool.copy(), **dict(opts, state_indices=idx[1:]), update_pool=False,
                            backend="model")
    same(o, np.concatenate([o0, o1]))
    same(steps[0], want_steps[0])
    assert not np.any(steps[1])
    same(got_pool, pool)


def test_cached_calls_check_the_tree_arguments():
    """A call whose signature was seen still checks the values (the same errors as a first
    call, nothing written), and update_pool is part of the key."""
    x, opts, pool = make_decode(N=2, T=3, H=1, HV=1, pool_dtype=F32)
    parents = np.array([[0, 0, 1], [0, 0, 0]], np.int32)
    steps = np.zeros((2, 3) + pool.shape[1:], F32)
    rows = np.array([0, 1], np.int32)
    fastpath.clear()
    p = pool.copy()
    kdacupy.kda_decode(**x, state_pool=p, **opts, parent_indices=parents, step_states=steps, step_state_indices=rows,
                       backend="emulate")
    assert len(fastpath._cache) == 1 and not np.array_equal(p, pool)
    for match, change in [
        (r"parent_indices\[0, 2\] = 2", dict(parent_indices=np.array([[0, 0, 2], [0, 0, 0]], np.int32))),
        ("step_state_indices: expected distinct rows", dict(step_state_indices=np.array([1, 1], np.int32))),
        (r"step_state_indices: expected rows < R = 2", dict(step_state_indices=np.array([0, 2], np.int32)))]:
        args = dict(parent_indices=parents, step_states=steps, step_state_indices=rows)
        args.update(change)
        before, s_before = p.copy(), steps.copy()
        with pytest.raises(ValueError, match=match):
            kdacupy.kda_decode(**x, state_pool=p, **opts, **args, backend="emulate")
        same(p, before)
        same(steps, s_before)
    before = p.copy()
    kdacupy.kda_decode(**x, state_pool=p, **opts, parent_indices=parents, step_states=steps, step_state_indices=rows,
                       update_pool=False, backend="emulate")
    same(p, before)
    assert len(fastpath._cache) == 2

"""Every face refuses a bad argument before it writes anything, naming that argument: for each
face call that writes (a pool, ``out``, a final state) and each of its tensor arguments, the
argument replaced by a list, by a tensor of the wrong rank and by one of a wrong size; the error
must start with the argument's name (as the caller spells it) and every tensor of the call must
be bit for bit as before (a snapshot of each)."""
from __future__ import annotations

import pytest

from tests.frameworks.common import import_torch

pytestmark = pytest.mark.torch
torch = import_torch()

from kdacupy.compat import fla, flashkda, sglang, vllm  # noqa: E402

N, H, D, P = 2, 2, 64, 4


def _x(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _u(*shape, seed=9):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


def _decode_args():
    return dict(q=_x(N, 1, H, D, seed=1), k=_x(N, 1, H, D, seed=2), v=_x(N, 1, H, D, seed=3),
                g=-_u(N, 1, H, D), beta=_u(N, 1, H, seed=10))


FACES = {
    "vllm.fused_recurrent_kda": (vllm.fused_recurrent_kda, lambda: dict(
        _decode_args(), initial_state=_x(P, H, D, D, seed=4), ssm_state_indices=torch.tensor([1, 2]),
        out=torch.zeros(N, 1, H, D))),
    "fla.fused_recurrent_kda_fwd": (fla.fused_recurrent_kda_fwd, lambda: dict(
        _decode_args(), initial_state=_x(P, H, D, D, seed=4), ssm_state_indices=torch.tensor([1, 2]),
        out=torch.zeros(N, 1, H, D))),
    "sglang.chunk_kda": (sglang.chunk_kda, lambda: dict(
        q=_x(1, 8, H, D, seed=1), k=_x(1, 8, H, D, seed=2), v=_x(1, 8, H, D, seed=3), g=-_u(1, 8, H, D),
        beta=_u(1, 8, H, seed=10), initial_state=_x(P, H, D, D, seed=4), initial_state_indices=torch.tensor([1, 2]),
        cu_seqlens=torch.tensor([0, 5, 8]))),
    "sglang.fused_sigmoid_gating_delta_rule_update": (sglang.fused_sigmoid_gating_delta_rule_update, lambda: dict(
        A_log=_u(H, seed=11), a=_x(N, H * D, seed=5), dt_bias=_x(H * D, seed=6), softplus_beta=1.0,
        softplus_threshold=20.0, q=_x(1, N, H, D, seed=1), k=_x(1, N, H, D, seed=2), v=_x(1, N, H, D, seed=3),
        b=_x(N, H, seed=7), initial_state_source=_x(P, H, D, D, seed=4), initial_state_indices=torch.tensor([1, 2]),
        cu_seqlens=torch.arange(N + 1), is_kda=True)),
    "sglang.fused_recurrent_kda_packed_decode": (sglang.fused_recurrent_kda_packed_decode, lambda: dict(
        mixed_qkv=_x(N, 3 * H * D, seed=1), a=_x(N, H * D, seed=5), b=_x(N, H, seed=7), A_log=_u(H, seed=11),
        dt_bias=_x(H * D, seed=6), scale=0.125, initial_state=_x(P, H, D, D, seed=4), out=torch.zeros(N, 1, H, D),
        ssm_state_indices=torch.tensor([1, 2]))),
    "flashkda.fwd": (flashkda.fwd, lambda: dict(
        q=_x(1, 8, H, D, seed=1, dtype=torch.bfloat16), k=_x(1, 8, H, D, seed=2, dtype=torch.bfloat16),
        v=_x(1, 8, H, D, seed=3, dtype=torch.bfloat16), g=_x(1, 8, H, D, seed=8, dtype=torch.bfloat16),
        beta=_x(1, 8, H, seed=7, dtype=torch.bfloat16), scale=0.125, out=torch.zeros(1, 8, H, D, dtype=torch.bfloat16),
        A_log=_u(H, seed=11), dt_bias=_x(H, D, seed=6), lower_bound=-5.0, initial_state=_x(1, H, D, D, seed=4),
        final_state=torch.zeros(1, H, D, D))),
}


def _mutations(args):
    for name, x in args.items():
        if not isinstance(x, torch.Tensor) or name == "cu_seqlens":
            continue
        yield name, "list", x.tolist()
        yield name, "rank", x.unsqueeze(0)
        yield name, "size", torch.cat([x.reshape(-1), x.reshape(-1)[:1]])


CASES = [(face, name, how) for face, (_, make) in FACES.items() for name, how, _ in _mutations(make())]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _taken(name, how):
    """What the caller's library takes too, and kdacupy with it: a slot table as a list of ints; a
    per-head parameter or a gate / beta row with a leading 1 (the same elements)."""
    return (how == "list" and "indices" in name) or (how == "rank" and name in ("A_log", "dt_bias", "a", "b"))


@pytest.mark.parametrize("face,name,how", CASES, ids=[f"{f}-{n}-{h}" for f, n, h in CASES])
def test_a_bad_argument_is_named_and_nothing_is_written(face, name, how):
    call, make = FACES[face]
    good = make()
    good_result = call(**good)
    args = make()
    args[name] = next(bad for n, h, bad in _mutations(args) if (n, h) == (name, how))
    snapshot = {n: x.clone() for n, x in args.items() if isinstance(x, torch.Tensor)}
    try:
        result = call(**args)
    except (ValueError, TypeError, NotImplementedError) as err:
        assert str(err).startswith(f"{name}:"), f"{face}({name}={how}): the error does not name {name}: {err}"
        for n, x in snapshot.items():
            assert torch.equal(args[n], x), f"{face}: {n} written by a call refused for {name}"
        return
    assert _taken(name, how), f"{face} took {name} as a {how} mutation without an error"
    assert _same(result, good_result), f"{face}: {name} as a {how} mutation gave another result"
    for n, x in good.items():
        if n != name and isinstance(x, torch.Tensor):
            assert torch.equal(args[n], x), f"{face}: {n} differs from the good call's"

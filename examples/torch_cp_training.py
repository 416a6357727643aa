"""Long-context training with context parallelism: one sequence's tokens sharded over three
processes (gloo on the CPU; NCCL on GPUs is the same code), the KDA layer of
examples/torch_kda_layer.py on each process's slice, a few Adam steps. No data parallelism:
every process holds the same parameters and a contiguous slice of the one sequence.

Per step and process: the short convolutions take the previous slice's last (width - 1)
inputs (one all_gather); ``kdacupy.torch.kda_cp`` runs the attention across the slices (its
collectives carry the state maps forward and, in the backward, the state's gradient back,
docs/design.md section 7.3); each process's loss is its tokens' share of the mean, the
gradients of the replicated parameters are summed over the processes (all_reduce), and every
process takes the same optimizer step. The losses equal the single-process run's, step for
step (float64 on the CPU, the float64 reference: to rounding):

    python examples/torch_cp_training.py
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_kda_layer import KDALayer  # noqa: E402

import kdacupy.torch as kt  # noqa: E402


def forward_cp(layer: KDALayer, x, group):
    """``layer`` on this process's slice ``x`` [1, T_r, hidden] of one sequence: KDALayer.forward
    with the convolutions' halo from the previous slice and kda_cp for the attention."""
    B, T, _ = x.shape
    width = layer.q_conv.conv.kernel_size[0]
    tails = [torch.empty_like(x[:, -(width - 1):]) for _ in range(dist.get_world_size(group))]
    dist.all_gather(tails, x[:, -(width - 1):].contiguous(), group=group)
    rank = dist.get_rank(group)
    halo = tails[rank - 1] if rank else torch.zeros_like(tails[0])  # the sequence starts on rank 0
    xx = torch.cat([halo, x], dim=1)
    heads = lambda y, n: y.reshape(B, T, n, layer.D)  # noqa: E731
    conv = lambda c, p: c(p(xx))[:, width - 1:]  # noqa: E731
    q = heads(conv(layer.q_conv, layer.q_proj), layer.H)
    k = heads(conv(layer.k_conv, layer.k_proj), layer.H)
    v = heads(conv(layer.v_conv, layer.v_proj), layer.HV)
    o, _ = kt.kda_cp(q, k, v, heads(layer.f_proj(x), layer.HV), layer.b_proj(x), group=group, gate="softplus",
                     A_log=layer.A_log, dt_bias=layer.dt_bias, beta_sigmoid=True, qk_l2norm=True)
    o = layer.norm(o) * torch.sigmoid(heads(layer.g_proj(x), layer.HV))
    return layer.o_proj(o.reshape(B, T, -1))


def _layer_and_data(hidden, T, seed):
    torch.manual_seed(seed)
    layer = KDALayer(hidden, heads=1).double()
    x = torch.randn(1, T + 1, hidden, dtype=torch.float64)
    return layer, x


def _process(rank, ranks, store, steps, hidden, T, seed, lr, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=ranks)
    layer, x = _layer_and_data(hidden, T, seed)
    optimiser = torch.optim.Adam(layer.parameters(), lr=lr)
    lo, hi = rank * T // ranks, (rank + 1) * T // ranks
    inputs, targets = x[:, :-1][:, lo:hi], x[:, 1:][:, lo:hi]
    losses = []
    for _ in range(steps):
        y = forward_cp(layer, inputs, dist.group.WORLD)
        loss = ((y - targets) ** 2).sum() / (T * targets.shape[-1])  # this slice's share of the mean
        optimiser.zero_grad()
        loss.backward()
        for p in layer.parameters():  # the replicated parameters: every process's share summed
            dist.all_reduce(p.grad)
        optimiser.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    if rank == 0:
        results.put(losses)
    dist.destroy_process_group()


def train_single(steps=3, hidden=32, T=48, seed=0, lr=3e-3):
    """The same steps in one process on the whole sequence (kdacupy.torch.kda)."""
    layer, x = _layer_and_data(hidden, T, seed)
    optimiser = torch.optim.Adam(layer.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        y, _ = layer(x[:, :-1])
        loss = F.mse_loss(y, x[:, 1:])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def train_cp(steps=3, ranks=3, hidden=32, T=48, seed=0, lr=3e-3, timeout=60):
    """The steps on ``ranks`` gloo processes (forked from this one), one sequence of T tokens
    sharded over them; the global loss of every step."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        args = (ranks, os.path.join(tmp, "store"), steps, hidden, T, seed, lr, results)
        procs = [ctx.Process(target=_process, args=(r, *args)) for r in range(ranks)]
        for p in procs:
            p.start()
        losses, waited = None, 0.0
        try:
            while losses is None and waited < timeout and all(p.exitcode in (None, 0) for p in procs):
                try:
                    losses = results.get(timeout=0.2)
                except queue.Empty:
                    waited += 0.2
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
    if losses is None or any(p.exitcode for p in procs):
        raise RuntimeError(f"a process failed or timed out: exit codes {[p.exitcode for p in procs]}")
    return losses


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny shapes; and the processes are forked from this one
    one = train_single()  # first: it also loads what torch's first custom-op call loads, once for all
    cp_losses = train_cp()
    for step, (a, b) in enumerate(zip(cp_losses, one)):
        print(f"step {step}: loss {a:.12f} on 3 processes, {b:.12f} in one")
    worst = max(abs(a - b) / abs(b) for a, b in zip(cp_losses, one))
    print(f"largest relative difference {worst:.2e}")
    sys.exit(0 if worst < 1e-10 else 1)

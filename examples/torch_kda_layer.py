"""A Kimi Delta Attention layer in PyTorch on kdacupy.torch, and a few training steps.

The layer: q, k, v projections, each through a causal depthwise short convolution and SiLU;
a low-rank projection for the per-channel forget gate, activated inside the kernel
(``gate="softplus"``: ``g = -exp(A_log) * softplus(f + dt_bias)``); beta logits
(``beta_sigmoid=True``); q/k L2 normalisation in the kernel; then an RMS norm of each head's
output times a sigmoid output gate, and the output projection.

CUDA tensors run kdacupy's CUDA kernels on torch's stream; CPU tensors the float64 reference
(so this trains on a laptop, slowly):

    python examples/torch_kda_layer.py            # a few steps on the CPU
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import kdacupy.torch as kt


class ShortConv(nn.Module):
    """Causal depthwise 1-D convolution over time on [B, T, C], then SiLU."""

    def __init__(self, channels, width=4):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1, bias=False)

    def forward(self, x):
        T = x.shape[1]
        return F.silu(self.conv(x.transpose(1, 2))[..., :T].transpose(1, 2))


class KDALayer(nn.Module):
    def __init__(self, hidden, heads, head_dim=64, value_heads=None, gate_rank=16):
        super().__init__()
        self.H, self.HV, self.D = heads, value_heads or heads, head_dim
        self.q_proj = nn.Linear(hidden, self.H * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.H * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.HV * head_dim, bias=False)
        self.q_conv, self.k_conv = ShortConv(self.H * head_dim), ShortConv(self.H * head_dim)
        self.v_conv = ShortConv(self.HV * head_dim)
        self.f_proj = nn.Sequential(nn.Linear(hidden, gate_rank, bias=False),
                                    nn.Linear(gate_rank, self.HV * head_dim, bias=False))
        self.b_proj = nn.Linear(hidden, self.HV, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(self.HV).uniform_(1, 16)))
        self.dt_bias = nn.Parameter(torch.zeros(self.HV * head_dim))
        self.g_proj = nn.Sequential(nn.Linear(hidden, gate_rank, bias=False),
                                    nn.Linear(gate_rank, self.HV * head_dim, bias=True))
        self.norm = nn.RMSNorm(head_dim)
        self.o_proj = nn.Linear(self.HV * head_dim, hidden, bias=False)

    def forward(self, x, initial_state=None, output_final_state=False):
        B, T, _ = x.shape
        heads = lambda y, n: y.reshape(B, T, n, self.D)  # noqa: E731
        q = heads(self.q_conv(self.q_proj(x)), self.H)
        k = heads(self.k_conv(self.k_proj(x)), self.H)
        v = heads(self.v_conv(self.v_proj(x)), self.HV)
        f = heads(self.f_proj(x), self.HV)
        o, state = kt.kda(q, k, v, f, self.b_proj(x), gate="softplus", A_log=self.A_log, dt_bias=self.dt_bias,
                          beta_sigmoid=True, qk_l2norm=True, initial_state=initial_state,
                          output_final_state=output_final_state)
        o = self.norm(o) * torch.sigmoid(heads(self.g_proj(x), self.HV))
        return self.o_proj(o.reshape(B, T, -1)), state


def train(steps=4, hidden=64, T=24, seed=0, lr=3e-3):
    """A few Adam steps of one layer on a fixed next-token regression batch; the losses."""
    torch.manual_seed(seed)
    layer = KDALayer(hidden, heads=1)
    x = torch.randn(2, T + 1, hidden)
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


if __name__ == "__main__":
    for step, loss in enumerate(train(steps=8)):
        print(f"step {step}: loss {loss:.4f}")

"""Mixture of experts in place of the feed-forward sublayer (Shazeer et al., 2017; Switch
Transformer, Fedus et al., 2021; Mixtral, Jiang et al., 2024).

A router (a linear map d_model -> E) scores every token against E expert feed-forward
networks; each token goes to its top-k experts, and their outputs are mixed with the router's
softmax probabilities renormalised over the chosen k (Mixtral).  Parameters grow with E while
the compute per token grows only with k.

Load balancing.  Left alone, a router collapses onto a few experts.  The auxiliary loss of
Switch Transformer, ``E · Σ_e f_e · P_e`` -- f_e the fraction of routing assignments that went
to expert e, P_e the mean router probability of e -- is 1 for a perfectly even router and
grows as routing concentrates; the trainer adds it with a small weight.

Capacity.  ``capacity_factor`` = None (the default) processes every assignment: nothing is
ever dropped.  With a factor c, each expert takes at most ceil(c · N · k / E) of the N·k
assignments per batch, in token order; an assignment over the limit is *not computed*: that
expert contributes nothing to that token, whose residual connection (and its other experts)
still carry it.  The number of dropped assignments is reported in ``RouterStats`` for
every forward pass, never silently.

Shapes: N tokens (B·T flattened), C = d_model, E experts, K = top_k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.config import Activation
from aiayn.errors import UserError
from aiayn.nn.feedforward import build_feedforward
from aiayn.nn.linear import Linear


@dataclass
class RouterStats:
    """What one MoE layer did in one forward pass."""

    aux_loss: Tensor  # scalar load-balancing loss, differentiable
    load: Tensor  # (E,) assignments per expert (before capacity)
    dropped: int  # assignments not computed because an expert was over capacity


def load_balancing_loss(probs: Tensor, chosen: Tensor, n_experts: int) -> Tensor:
    """Switch Transformer's auxiliary loss: E · Σ_e f_e · P_e.

    probs: (N, E) router probabilities; chosen: (N, K) expert indices per token.
    """
    counts = torch.bincount(chosen.flatten(), minlength=n_experts).to(probs.dtype)
    f = counts / chosen.numel()  # (E,) fraction of assignments
    p = probs.mean(0)  # (E,) mean router probability
    return n_experts * (f * p).sum()


class MixtureOfExperts(nn.Module):
    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        n_experts: int,
        top_k: int,
        activation: Activation,
        bias: bool,
        capacity_factor: float | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise UserError(f"top_k={top_k} must be between 1 and n_experts={n_experts}")
        if capacity_factor is not None and capacity_factor <= 0:
            raise UserError(f"capacity_factor={capacity_factor} must be > 0 or None")
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.router = Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(
            build_feedforward(d_model, d_ff, activation, bias) for _ in range(n_experts)
        )

    def forward(self, x: Tensor) -> tuple[Tensor, RouterStats]:
        """(B, T, C) -> (B, T, C) and this pass's router statistics."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, C)
        n = flat.shape[0]
        probs = self.router(flat).float().softmax(-1)  # (N, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # (N, K) each
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        aux = load_balancing_loss(probs, chosen, self.n_experts)
        load = torch.bincount(chosen.flatten(), minlength=self.n_experts)
        capacity = (
            math.ceil(self.capacity_factor * n * self.top_k / self.n_experts)
            if self.capacity_factor is not None
            else n * self.top_k
        )
        out = torch.zeros_like(flat)
        dropped = 0
        # Assignments grouped by expert, each group in token order (a stable sort of the flat
        # (token, slot) indices): one pass, one host sync for the group sizes.
        order = chosen.flatten().argsort(stable=True)  # (N*K,)
        groups = order.split(load.tolist())
        for expert, idx in zip(self.experts, groups, strict=True):
            token, slot = idx // self.top_k, idx % self.top_k
            if token.numel() > capacity:
                dropped += token.numel() - capacity
                token, slot = token[:capacity], slot[:capacity]
            if token.numel() == 0:
                continue
            y = expert(flat[token])  # (n_e, C)
            out.index_add_(0, token, y * weights[token, slot, None])
        return out.view(shape), RouterStats(aux, load, dropped)

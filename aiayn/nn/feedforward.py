"""Position-wise feed-forward networks (§3.3, Eq. 2).

``FFN(x) = act(x W1 + b1) W2 + b2``, applied to every position separately and identically.
The paper uses ReLU with d_ff = 4·d_model; GPT-2 and BERT use GELU (Hendrycks & Gimpel, 2016;
GPT-2 the tanh approximation).  SwiGLU (Shazeer, 2020; Llama) gates the hidden layer:
``(SiLU(x W1) ⊙ x W3) W2``.

Shapes: (B, T, d_model) -> (B, T, d_ff) -> (B, T, d_model).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn import registry
from aiayn.nn.linear import Linear


class FeedForward(nn.Module):
    """Eq. (2) with a chosen element-wise activation: ``act(x W1 + b1) W2 + b2``."""

    def __init__(
        self, d_model: int, d_ff: int, act: Callable[[Tensor], Tensor] = F.relu, bias: bool = True
    ) -> None:
        super().__init__()
        self.act = act
        self.w1 = Linear(d_model, d_ff, bias=bias)
        self.w2 = Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.act(self.w1(x)))  # (B, T, F) -> (B, T, D)


class GatedFeedForward(nn.Module):
    """SwiGLU: ``(SiLU(x W1) ⊙ x W3) W2``; W1 and W3 are stored as one fused matrix."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = False) -> None:
        super().__init__()
        self.d_ff = d_ff
        self.w13 = Linear(d_model, 2 * d_ff, bias=bias)  # [W1; W3]
        self.w2 = Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).split(self.d_ff, dim=-1)  # (B, T, F) each
        return self.w2(F.silu(gate) * up)  # (B, T, D)


def relu_ffn(d_model: int, d_ff: int, bias: bool = True) -> FeedForward:
    """The paper's Eq. (2): ReLU."""
    return FeedForward(d_model, d_ff, F.relu, bias)


def gelu_ffn(d_model: int, d_ff: int, bias: bool = True) -> FeedForward:
    """BERT's GELU (exact, with erf)."""
    return FeedForward(d_model, d_ff, F.gelu, bias)


def silu_ffn(d_model: int, d_ff: int, bias: bool = True) -> FeedForward:
    """SiLU ("swish"), ungated: Marian's feed-forward."""
    return FeedForward(d_model, d_ff, F.silu, bias)


def gelu_tanh_ffn(d_model: int, d_ff: int, bias: bool = True) -> FeedForward:
    """GPT-2's GELU (tanh approximation)."""
    return FeedForward(d_model, d_ff, partial(F.gelu, approximate="tanh"), bias)


def build_feedforward(d_model: int, d_ff: int, activation: str, bias: bool) -> nn.Module:
    """The feed-forward sublayer registered as ``activation`` (aiayn/registry.py)."""
    module: nn.Module = registry.resolve("activation", activation)(d_model, d_ff, bias)
    return module
